"""Export: ExportableTree, torch.export programs and ONNX files predict as the eager model."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from conftest import planted
from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.models.export import ExportableTree, export_onnx, export_program
from xrfm_torch.numerics.special import erfinv_poly
from xrfm_torch.tree.routing import hard_route, hard_weights

FAST = LeafConfig(n_iters=2, min_iters=1, kernel_exponents=None, reg_factors=None)


def mixed_table(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """Numeric columns (one with missing cells) and a categorical column; binary labels."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 4, generator=g, dtype=torch.float64)
    X[:, 3] = torch.randint(0, 5, (n,), generator=g).double()  # category codes
    score = X[:, 0] * X[:, 1] + (X[:, 3] == 2).double() - 0.3 * X[:, 2].exp()
    X[torch.rand(n, generator=g) < 0.1, 2] = math.nan
    return X, (score > score.median()).double()


def fitted(config: str) -> tuple[xRFMTree, torch.Tensor]:
    """Three fitted float64 models: (model, test inputs)."""
    gen = torch.Generator().manual_seed(0)
    if config == "hard, two trees":
        X, y = planted(1200, d=5, dtype=torch.float64, noise=0.1)
        model = xRFMTree(
            max_leaf_size=300, n_trees=2, temperature=0.0, input_transform="identity", leaf=FAST
        )
        model.to(torch.float64).fit(X[:1000], y[:1000], generator=gen)
        return model, X[1000:]
    if config == "soft, two maps":
        X, y = planted(1200, d=5, dtype=torch.float64, noise=0.1)
        model = xRFMTree(
            max_leaf_size=300,
            n_trees=1,
            temperature=0.3,
            input_transform=["identity", "quantile+raw"],
            leaf=FAST,
        )
        model.to(torch.float64).fit(X[:1000], y[:1000], generator=gen)
        return model, X[1000:]
    X, y = mixed_table(1200)
    model = xRFMTree(
        task="classification",
        max_leaf_size=400,
        n_trees=1,
        temperature=0.2,
        input_transform="quantile",
        categorical_features=[3],
        leaf=FAST,
    )
    model.to(torch.float64).fit(X[:1000], y[:1000], generator=gen)
    return model, X[1000:]


CONFIGS = ["hard, two trees", "soft, two maps", "classification, categories, NaN"]


@pytest.fixture(scope="module", params=CONFIGS)
def model_and_x(request) -> tuple[xRFMTree, torch.Tensor, str]:
    model, x = fitted(request.param)
    return model, x, request.param


def eager(model: xRFMTree, x: torch.Tensor, proba: bool) -> torch.Tensor:
    with torch.no_grad():
        return model.predict_proba(x) if proba else model(x)


def test_three_configurations_really_differ(model_and_x):
    model, _, config = model_and_x
    if config == "hard, two trees":
        assert len(model.trees) == 2 and float(model.temperature_) == 0.0 and model.n_leaves > 2
    elif config == "soft, two maps":
        assert model.input_map.names == ["identity", "quantile+raw"]
        assert float(model.temperature_) == 0.3
    else:
        assert model.input_map.missing_columns == [2] and model.input_map.categories.width == 5


def test_exported_program_predicts_as_the_eager_model(model_and_x):
    model, x, config = model_and_x
    proba = config.startswith("classification")
    program = export_program(model, x[:4], output="proba" if proba else "predict")
    want = eager(model, x, proba)
    for rows in (x, x[:1], x[:37]):  # any number of rows, one included
        got = program.module()(rows)
        torch.testing.assert_close(got, want[: len(rows)], rtol=1e-9, atol=1e-10)
    if proba:
        torch.testing.assert_close(got.sum(1), torch.ones(len(got), dtype=got.dtype))


@pytest.mark.slow
def test_saved_program_loads_and_predicts(model_and_x, tmp_path):
    model, x, config = model_and_x
    torch.export.save(export_program(model, x[:4]), tmp_path / "m.pt2")
    loaded = torch.export.load(tmp_path / "m.pt2").module()
    # by default a classification model exports its probabilities, a regression its predictions
    want = eager(model, x, config.startswith("classification"))
    torch.testing.assert_close(loaded(x), want, rtol=1e-9, atol=1e-10)


def test_rows_the_eager_model_refuses_are_nan_and_the_others_unchanged():
    model, x = fitted("classification, categories, NaN")
    program = export_program(model, x[:4], output="proba").module()
    bad = x[:6].clone()
    bad[0, 0] = math.nan  # column 0 had no missing cell in training
    bad[1, 1] = math.inf
    bad[2, 2] = math.nan  # column 2 had: a missing cell, handled as in eager
    bad[3, 3] = math.nan  # a missing category
    bad[4, 3] = 17.0  # a category never seen
    with pytest.raises(ValueError, match="row 0, column 0"):
        model.predict_proba(bad[:1])
    with pytest.raises(ValueError, match="inf"):
        model.predict_proba(bad[1:2])
    got = program(bad)
    assert torch.isnan(got[:2]).all()
    torch.testing.assert_close(got[2:], eager(model, bad[2:], True), rtol=1e-9, atol=1e-10)
    assert torch.isfinite(got[2:]).all()


def test_float32_inputs_are_cast_to_a_float64_model():
    # an exported program takes its example's dtype; inside, the model's dtype
    model, x = fitted("hard, two trees")
    program = export_program(model, x[:4].float()).module()
    got = program(x.float())
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, eager(model, x.float(), False), rtol=1e-9, atol=1e-10)


def test_hard_weights_route_like_hard_route():
    model, x = fitted("hard, two trees")
    X, _ = planted(1000, d=5, dtype=torch.float64)
    for tree, xt in zip(model.partition_trees(), model.input_map(torch.cat([X, x]))):
        args = (xt, tree.split_vectors_, tree.thresholds_)
        w = hard_weights(*args, tree.path_sign_)
        ids = hard_route(*args, tree.children_)
        assert torch.equal(w, nn.functional.one_hot(ids, tree.n_leaves).double())


def test_erfinv_from_basic_operators_matches_torch():
    # the quantile map's levels stay 1 / n_rows away from +-1 (n_rows <= 1e7 here)
    y = torch.linspace(-1 + 1e-7, 1 - 1e-7, 100_001, dtype=torch.float64)
    torch.testing.assert_close(erfinv_poly(y), torch.erfinv(y), rtol=1e-11, atol=1e-12)
    y32 = y.float()[1:-1]
    torch.testing.assert_close(erfinv_poly(y32), torch.erfinv(y32), rtol=1e-6, atol=1e-6)


def test_unfitted_or_wrong_output_is_refused():
    with pytest.raises(RuntimeError, match="fitted"):
        ExportableTree(xRFMTree())
    model, x = fitted("hard, two trees")
    with pytest.raises(ValueError, match="classification"):
        ExportableTree(model, output="proba")
    with pytest.raises(ValueError, match="n >= 2"):
        export_program(model, x[:1])
    with pytest.raises(ValueError, match=r"\(n, 5\)"):
        ExportableTree(model)(x[:, :4])


def test_head_module_exports_with_its_encoder():
    from test_head import head_setup, quiet_trainer

    dm, module = head_setup(trainable=True)
    quiet_trainer(1).fit(module, datamodule=dm)
    module.eval()
    x = torch.from_numpy(dm.data.X_test[:200])
    serving = nn.Sequential(module.encoder, ExportableTree(module.model)).eval()
    program = torch.export.export(
        serving, (x[:4],), dynamic_shapes=({0: torch.export.Dim("n", min=1)},)
    )
    with torch.no_grad():
        want = module(x)
    torch.testing.assert_close(program.module()(x), want, rtol=2e-3, atol=2e-3)


def run_onnx(path, x: torch.Tensor) -> torch.Tensor:
    import onnxruntime  # the dev extra has it

    session = onnxruntime.InferenceSession(str(path))
    return torch.from_numpy(session.run(None, {"x": x.numpy()})[0])


@pytest.mark.slow
def test_onnx_float64_model_runs_in_onnxruntime(tmp_path):
    model, x = fitted("hard, two trees")
    path = export_onnx(model, tmp_path / "m.onnx", x[:4])
    # the ONNX exporter stores Python float constants as float32: about 1e-7 relative per constant
    torch.testing.assert_close(run_onnx(path, x), eager(model, x, False), rtol=1e-5, atol=1e-6)


def test_onnx_of_a_model_that_takes_missing_cells_anywhere(tmp_path):
    """``missing_values="any"`` (every estimator's): no column is strict, and no row is NaN.

    In float32: onnxruntime has no float64 ``Softplus`` (soft routing's log-sigmoid).
    """
    X, y = planted(300, d=4, seed=0)
    X[::7, 1] = math.nan  # training rows with missing cells in one column
    model = xRFMTree(max_leaf_size=120, leaf=LeafConfig(n_iters=1), missing_values="any")
    model.fit(X, y, generator=torch.Generator().manual_seed(0))
    x = X[:40].clone()
    x[::5, 3] = math.nan  # a column without training NaN: the mean, not a refusal
    path = export_onnx(model, tmp_path / "m.onnx", x[:4])
    out = run_onnx(path, x)
    assert not out.isnan().any()
    # float32 sums reordered by onnxruntime: a few units in the last place of each kernel sum
    torch.testing.assert_close(out, eager(model, x, False), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_onnx_float32_soft_routing_quantile_maps_and_probabilities(tmp_path):
    for config in ("soft, two maps", "classification, categories, NaN"):
        model, x = fitted(config)
        model32 = model.float()
        proba = config.startswith("classification")
        x32 = x.float()
        path = export_onnx(
            model32, tmp_path / "m.onnx", x32[:4], output="proba" if proba else "predict"
        )
        want = eager(model32, x32, proba)
        # float32 rounding: the eager model itself moves by this much between batch sizes
        torch.testing.assert_close(run_onnx(path, x32), want, rtol=2e-3, atol=2e-3)
