from __future__ import annotations

import pytest
import torch

from conftest import planted
from xrfm_torch import AGOPSplit, CARTSplit, LeafConfig, PCASplit, RandomSplit, xRFMTree
from xrfm_torch.kernels import LaplaceKernel
from xrfm_torch.kernels.distance import transform
from xrfm_torch.tree.grow import grow_tree
from xrfm_torch.tree.leaf_fits import borrow_validation_rows
from xrfm_torch.tree.splits import Split
from xrfm_torch.tree.temperature import DEFAULT_TEMPERATURE_GRID


def seeded(seed=0):
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def fitted():
    X, y = planted(1500, d=6)
    Xv, yv = planted(300, d=6, seed=1)
    model = xRFMTree(max_leaf_size=300, leaf=LeafConfig(n_iters=2)).fit(
        X, y, Xv, yv, generator=seeded()
    )
    return model, X, y


def test_leaves_respect_max_leaf_size(fitted):
    model, _, _ = fitted
    assert model.n_leaves >= 5
    assert all(leaf.support_.shape[0] <= 300 for leaf in model.leaves())


def test_beats_mean_predictor(fitted):
    model, _, _ = fitted
    Xt, yt = planted(800, d=6, seed=2)
    rmse = float(((model(Xt)[:, 0] - yt) ** 2).mean().sqrt())
    assert rmse < 0.5 * float(yt.std())


@pytest.mark.parametrize("max_soft_leaves", [2, 12])
def test_temperature_errors_match_forward(fitted, max_soft_leaves):
    # the tuning evaluates each leaf only where some temperature of the grid gives it weight;
    # each error must equal the MSE of the model's own soft-routed forward at that temperature
    model, _, y = fitted
    Xv, yv = planted(300, d=6, seed=1)
    sd = float(y.double().std(correction=0))  # the errors are of the standardized targets
    grid = [0.0, 0.05, 0.3, 2.0]
    old = (model.max_soft_leaves, float(model.temperature_))
    model.max_soft_leaves = max_soft_leaves
    try:
        errs = model.temperature_errors(Xv, yv, grid)
        for temp, err in zip(grid, errs):
            model._set_temperature(temp)
            ref = float((((model(Xv)[:, 0] - yv) / sd) ** 2).mean())
            assert err == pytest.approx(ref, rel=1e-5)
        tree = model.partition_trees()[0]
        w = tree.weights(Xv, 2.0, keep_mass=model.keep_mass, max_leaves=max_soft_leaves)
        assert int((w > 0).sum(1).max()) <= max_soft_leaves  # the truncation the mask relies on
    finally:
        model.max_soft_leaves = old[0]
        model._set_temperature(old[1])


def test_masked_leaf_predictions_are_the_leaves_on_their_rows(fitted):
    model, _, _ = fitted
    tree = model.partition_trees()[0]
    Xv, _ = planted(200, d=6, seed=3)
    mask = torch.rand(200, tree.n_leaves, generator=seeded(4)) < 0.3
    full, part = tree.leaf_predictions(Xv), tree.leaf_predictions(Xv, mask)
    # float32 kernel sums over a different row batch may round differently (~1e-5 here)
    torch.testing.assert_close(part, torch.where(mask[:, :, None], full, 0.0), rtol=1e-4, atol=1e-4)
    assert bool((part[~mask] == 0).all())


def test_temperature_is_tuned_on_the_grid(fitted):
    model, _, _ = fitted
    assert float(model.temperature_) in [pytest.approx(t) for t in DEFAULT_TEMPERATURE_GRID]


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({}, id="default"),
        pytest.param({"temperature": 0.3, "diag": False}, id="soft_full_m"),
        pytest.param({"n_trees": 2, "split_rule": RandomSplit()}, id="ensemble"),
    ],
)
def test_state_round_trip_into_fresh_module(kwargs):
    X, y = planted(800, d=5)
    kwargs = dict(kwargs)
    leaf = LeafConfig(n_iters=1, diag=kwargs.pop("diag", "auto"))
    model = xRFMTree(max_leaf_size=200, leaf=leaf, **kwargs).fit(X, y, generator=seeded())
    fresh = xRFMTree(max_leaf_size=200, leaf=leaf, **kwargs)
    fresh.load_state_dict(model.state_dict())
    Xt, _ = planted(300, d=5, seed=4)
    assert torch.equal(fresh(Xt), model(Xt))
    assert float(fresh.temperature_) == float(model.temperature_)


def test_same_seed_same_model_different_seed_different_split():
    X, y = planted(800, d=5)
    a = xRFMTree(max_leaf_size=200, leaf=LeafConfig(n_iters=1)).fit(X, y, generator=seeded(7))
    b = xRFMTree(max_leaf_size=200, leaf=LeafConfig(n_iters=1)).fit(X, y, generator=seeded(7))
    c = xRFMTree(max_leaf_size=200, leaf=LeafConfig(n_iters=1)).fit(X, y, generator=seeded(8))
    Xt, _ = planted(100, d=5, seed=4)
    assert torch.equal(a(Xt), b(Xt))
    assert not torch.equal(a.trees[0].split_vectors_, c.trees[0].split_vectors_)


@pytest.mark.parametrize(
    "kwargs",
    [
        # auto input maps, subsampled iterations (a large fit), predictive variances
        {"uncertainty": "calibrated", "large_fit_rows": 500, "large_fit_iter_rows": 120},
        {"task": "classification", "n_trees": 2},
    ],
    ids=["regression-large-fit-uncertainty", "classification-two-trees"],
)
def test_same_seed_gives_a_bit_identical_state_dict(kwargs):
    X, y = planted(900, d=5)
    if kwargs.get("task") == "classification":
        y = (y > y.median()).long()

    def fit():
        torch.manual_seed(torch.seed())  # the global generator must play no part
        model = xRFMTree(max_leaf_size=250, leaf=LeafConfig(n_iters=2), **kwargs)
        return model.fit(X, y, generator=seeded(3)).state_dict()

    a, b = fit(), fit()
    assert a.keys() == b.keys()
    for key in a:
        same = torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key]
        assert same, key


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_same_seed_gives_the_same_model_on_cuda():
    # docs/reliability.md, Determinism: with deterministic algorithms (and cuBLAS's workspace
    # setting, which conftest.py sets) two CUDA fits are bit-identical
    X, y = planted(900, d=5)
    torch.use_deterministic_algorithms(True)
    try:

        def fit():
            model = xRFMTree(max_leaf_size=250, leaf=LeafConfig(n_iters=2)).to("cuda")
            return model.fit(X.cuda(), y.cuda(), generator=seeded(3)).state_dict()

        a, b = fit(), fit()
    finally:
        torch.use_deterministic_algorithms(False)
    for key in a:
        same = torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key]
        assert same, key


def test_inputs_of_another_dtype_are_cast_to_the_model_dtype():
    X, y = planted(600, d=4)
    model = xRFMTree(max_leaf_size=200, leaf=LeafConfig(n_iters=1)).fit(X, y, generator=seeded())
    Xq = X[:20]
    for dtype in (torch.float64, torch.float16, torch.int64):
        got = model(Xq.to(dtype))
        assert got.dtype == torch.float32
        torch.testing.assert_close(got, model(Xq.to(dtype).float()), rtol=0, atol=0)
    m64 = model.to(torch.float64)
    torch.testing.assert_close(m64(Xq), m64(Xq.double()), rtol=0, atol=0)
    assert m64(Xq).dtype == torch.float64
    with pytest.raises(TypeError, match="real numbers, got dtype torch.complex64"):
        model(Xq.to(torch.complex64))


def test_to_dtype_and_hard_routing_of_single_leaf():
    X, y = planted(300, d=3)
    model = xRFMTree(leaf=LeafConfig(n_iters=1)).fit(X, y, generator=seeded())
    assert model.n_leaves == 1 and float(model.temperature_) == 0.0
    m64 = model.to(torch.float64)
    out = m64(X.double())
    assert out.dtype == torch.float64
    assert float((out[:, 0] - y.double()).abs().mean()) < 0.2


def test_multi_output():
    X, y = planted(900, d=4)
    Y = torch.stack([y, X[:, 2].clone()], 1)
    model = xRFMTree(max_leaf_size=300, leaf=LeafConfig(n_iters=1)).fit(X, Y, generator=seeded())
    Xt, yt = planted(300, d=4, seed=5)
    pred = model(Xt)
    assert pred.shape == (300, 2)
    assert float(((pred[:, 0] - yt) ** 2).mean()) < 0.3 * float(yt.var())
    assert float(((pred[:, 1] - Xt[:, 2]) ** 2).mean()) < 0.05


@pytest.mark.parametrize("rule", [PCASplit(), CARTSplit()], ids=["pca", "cart"])
def test_other_split_rules_build_bounded_trees(rule):
    X, y = planted(1000, d=4)
    model = xRFMTree(max_leaf_size=250, split_rule=rule, leaf=LeafConfig(n_iters=1)).fit(
        X, y, generator=seeded()
    )
    assert model.n_leaves >= 4
    assert all(leaf.support_.shape[0] <= 250 for leaf in model.leaves())


def test_borrow_rule():
    idx = torch.arange(1000)
    kept, borrowed = borrow_validation_rows(
        idx, 50, min_val_rows=1500, max_borrow_fraction=0.2, generator=seeded()
    )
    assert len(borrowed) == 200 and len(kept) == 800  # min(1500 - 50, 0.2 * 1000)
    assert set(kept.tolist()).isdisjoint(borrowed.tolist())
    kept, borrowed = borrow_validation_rows(
        idx, 1450, min_val_rows=1500, max_borrow_fraction=0.2, generator=seeded()
    )
    assert len(borrowed) == 50
    kept, borrowed = borrow_validation_rows(
        idx, 1600, min_val_rows=1500, max_borrow_fraction=0.2, generator=seeded()
    )
    assert len(borrowed) == 0 and len(kept) == 1000


@pytest.mark.parametrize("refit_borrowed", [True, False])
def test_iter_rows_leaves_pay_one_final_solve_that_includes_borrowed_rows(refit_borrowed):
    X, y = planted(1200, d=5, dtype=torch.float64)
    Xv, yv = planted(60, d=5, seed=1, dtype=torch.float64)
    kw = {"max_leaf_size": 600, "min_leaf_val": 100, "temperature": 0.0, "n_trees": 1}
    kw["input_transform"] = "identity"  # the leaves store the (standardized) rows themselves
    model = xRFMTree(refit_borrowed=refit_borrowed, **kw, leaf=LeafConfig(n_iters=1, iter_rows=250))
    model.fit(X, y, Xv, yv, generator=seeded())
    assert any(float(leaf.reg_) != 1e-3 for leaf in model.leaves())  # the ridge search moved
    plain = xRFMTree(refit_borrowed=refit_borrowed, **kw, leaf=LeafConfig(n_iters=1))
    plain.fit(X, y, Xv, yv, generator=seeded())
    sizes = [leaf.support_.shape[0] for leaf in model.leaves()]
    # same leaves as without iter_rows: all routed rows (or those minus the borrowed ones)
    assert sizes == [leaf.support_.shape[0] for leaf in plain.leaves()]
    borrowed = sum(100 - c for c in _val_counts(model, Xv))
    assert sum(sizes) == (1200 if refit_borrowed else 1200 - borrowed)
    ids = model.leaf_ids(X)
    # the leaves store standardized rows and fit standardized targets (training statistics)
    Xs = (X - X.mean(0)) / X.std(0, correction=0)
    ys = (y - y.mean()) / y.std(correction=0)
    for lf, leaf in enumerate(model.leaves()):
        # which training rows the leaf stores, in its order
        src = torch.cdist(leaf.support_, Xs).argmin(1)
        torch.testing.assert_close(leaf.support_, Xs[src], rtol=0, atol=1e-12)
        assert bool((ids[src] == lf).all())
        if refit_borrowed:  # all rows routed here
            assert sorted(src.tolist()) == (ids == lf).nonzero().squeeze(1).tolist()
        else:  # the borrowed rows are left out of the final solve
            assert len(src) < int((ids == lf).sum())
        # the stored alpha solves (K + reg_ I) alpha = y on the stored rows, with the leaf's ridge
        # (K: the Laplace kernel plus the constant + linear part of weight linear_mix)
        xs = transform(leaf.support_, leaf.sqrt_m_)  # diagonal or full M
        K = leaf.kernel.from_distance(leaf.kernel.distance(xs, xs))
        K = K + leaf.config.linear_mix * (1.0 + xs @ xs.T / xs.shape[1])
        rhs = K @ leaf.alpha_ + float(leaf.reg_) * leaf.alpha_
        torch.testing.assert_close(rhs[:, 0], ys[src], rtol=0, atol=1e-6)


def _val_counts(model, Xv):
    ids = model.leaf_ids(Xv)
    return [int((ids == lf).sum()) for lf in range(model.n_leaves)]


def test_duplicate_rows_do_not_recurse_forever():
    X = torch.ones(500, 3)
    y = torch.ones(500)
    model = xRFMTree(max_leaf_size=100, split_rule=PCASplit(), leaf=LeafConfig(n_iters=0)).fit(
        X, y, generator=seeded()
    )
    assert all(leaf.support_.shape[0] <= 100 for leaf in model.leaves())


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (lambda m: m(torch.ones(2, 3)), RuntimeError, "xRFMTree is not fitted"),
        (lambda m: m.fit(torch.ones(3, 2), torch.ones(3)), ValueError, "at least 4 training rows"),
        (
            lambda m: m.fit(torch.full((10, 2), float("inf")), torch.ones(10)),
            ValueError,
            "X contains 20 non-finite",
        ),
        (
            lambda m: m.fit(
                torch.ones(10, 2), torch.ones(10, 1), torch.ones(4, 2), torch.ones(4, 2)
            ),
            ValueError,
            "y_val has 2 outputs",
        ),
    ],
)
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call(xRFMTree(leaf=LeafConfig(n_iters=0)))


def test_wrong_feature_count_at_predict(fitted):
    model, _, _ = fitted
    with pytest.raises(ValueError, match=r"expected input of shape \(n, 6\), got \(2, 4\)"):
        model(torch.ones(2, 4))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"max_leaf_size": 2}, "max_leaf_size"),
        ({"n_trees": 0}, "n_trees"),
        ({"temperature": -1.0}, "temperature"),
        ({"keep_mass": 1.5}, "keep_mass"),
        ({"max_input_maps": 0}, "max_input_maps"),
        ({"input_transform": "log2"}, "input_transform"),
        ({"kernel": "rbf"}, "unknown kernel"),
        ({"overlap_fraction": 0.45}, "overlap_fraction"),
        ({"overlap_fraction": -0.1}, "overlap_fraction"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        xRFMTree(**kwargs)


def first_feature_median(X, y, X_val, y_val, *, kernel, generator):
    """Split rule for planted layouts: direction e_0, rank-balanced median cut."""
    return Split(torch.eye(X.shape[1], dtype=X.dtype)[0], None)


@pytest.mark.parametrize(
    ("n", "max_leaf_size", "expected"),
    [
        # children are leaves: 10 % overlap each way, capped so a leaf stays <= L_max
        (100, 60, [range(0, 60), range(40, 100)]),
        (100, 55, [range(0, 55), range(45, 100)]),
        # inner nodes get no overlap (it would compound), only the splits into leaves
        (200, 60, [range(0, 60), range(40, 100), range(100, 160), range(140, 200)]),
    ],
)
def test_overlap_adds_the_rows_nearest_the_cut(n, max_leaf_size, expected):
    g = seeded()
    X = torch.randperm(n, generator=g).double()[:, None] * torch.tensor([[1.0, 0.0]]) + 0.5
    X[:, 1] = torch.randn(n, generator=g, dtype=torch.float64)
    Xv = torch.linspace(0, n, 41, dtype=torch.float64)[:, None].repeat(1, 2)
    layout = grow_tree(
        X,
        X[:, :1],
        Xv,
        Xv[:, :1],
        max_leaf_size=max_leaf_size,
        split_rule=first_feature_median,
        kernel=LaplaceKernel(),
        generator=g,
        overlap_fraction=0.1,
    )
    got = [sorted(int(v) for v in X[rows, 0] - 0.5) for rows in layout.leaf_train]
    assert got == [list(r) for r in expected]
    # validation rows are routed by the thresholds alone: every row reaches exactly one leaf
    assert sorted(torch.cat(layout.leaf_val).tolist()) == list(range(41))


def test_overlap_changes_the_fit_only_through_leaf_rows():
    X, y = planted(1200, d=4)
    Xv, yv = planted(300, d=4, seed=1)
    kw = {
        "max_leaf_size": 700,
        "temperature": 0.0,
        "leaf": LeafConfig(n_iters=1, kernel_exponents=None),
        "n_trees": 1,
    }
    plain = xRFMTree(overlap_fraction=0.0, **kw).fit(X, y, Xv, yv, generator=seeded())
    over = xRFMTree(overlap_fraction=0.1, **kw).fit(X, y, Xv, yv, generator=seeded())
    assert [leaf.support_.shape[0] for leaf in plain.leaves()] == [600, 600]
    assert [leaf.support_.shape[0] for leaf in over.leaves()] == [700, 700]
    torch.testing.assert_close(over.trees[0].split_vectors_, plain.trees[0].split_vectors_)
    # overlap rows join only the final solve: M, t* and the kernel are learned on the leaf's own
    # rows, exactly as without overlap
    for a, b in zip(over.leaves(), plain.leaves()):
        torch.testing.assert_close(a.sqrt_m_, b.sqrt_m_)
        assert (int(a.best_iter_), a.kernel.q) == (int(b.best_iter_), b.kernel.q)


def test_leaf_settings_are_checked_where_they_are_given():
    with pytest.raises(ValueError, match="reg must be a finite non-negative number, got -1.0"):
        LeafConfig(reg=-1.0)
    with pytest.raises(TypeError, match="leaf must be a LeafConfig, got dict"):
        xRFMTree(leaf={"n_iters": 3})


def test_fit_without_a_generator_leaves_the_global_rng_alone():
    """No generator: the fit draws from its own, seeded by torch.manual_seed's seed."""
    X, y = planted(700, d=4)
    torch.manual_seed(11)
    before = torch.random.get_rng_state()
    a = xRFMTree(max_leaf_size=300, leaf=LeafConfig(n_iters=1)).fit(X, y)
    assert torch.equal(torch.random.get_rng_state(), before)  # neither consumed nor reset
    b = xRFMTree(max_leaf_size=300, leaf=LeafConfig(n_iters=1)).fit(X, y)
    assert torch.equal(a.trees[0].split_vectors_, b.trees[0].split_vectors_)
    same = xRFMTree(max_leaf_size=300, leaf=LeafConfig(n_iters=1))
    same.fit(X, y, generator=torch.Generator().manual_seed(11))
    assert torch.equal(a.trees[0].split_vectors_, same.trees[0].split_vectors_)
    torch.manual_seed(12)
    c = xRFMTree(max_leaf_size=300, leaf=LeafConfig(n_iters=1)).fit(X, y)
    assert not torch.equal(a.trees[0].split_vectors_, c.trees[0].split_vectors_)


def test_get_config_nests_the_leaf_settings_and_rebuilds_the_model():
    model = xRFMTree(
        "gaussian", leaf=LeafConfig(n_iters=4, diag=False, kernel_exponents=(1.0, 2.0)), n_trees=2
    )
    cfg = model.get_config()
    leaf = cfg["config"]["leaf"]
    assert leaf["_target_"] == "xrfm_torch.leaf.config.LeafConfig"
    assert leaf["kernel_exponents"] == [1.0, 2.0] and leaf["diag"] is False
    assert cfg["kernel"]["_target_"].endswith("GaussianKernel")
    again = xRFMTree.from_config(cfg)
    assert again.leaf == model.leaf and again.n_trees == 2
    assert again.get_config() == cfg
    with pytest.raises(TypeError, match="builds a LeafConfig, not a xRFMTree"):
        xRFMTree.from_config(leaf)


@pytest.mark.parametrize("factor", [1e-3, 1e6])
def test_predictions_do_not_depend_on_the_units_of_the_columns(factor):
    """Scale-free: inputs and targets are standardized with training statistics inside the model.

    In float64, so that what is compared is the model, not float32 rounding amplified by the
    leaves' ill-conditioned solves.
    """
    X, y = planted(1200, d=5, dtype=torch.float64)
    Xv, yv = planted(300, d=5, seed=1, dtype=torch.float64)
    Xt, _ = planted(200, d=5, seed=2, dtype=torch.float64)
    c = torch.tensor([factor, 1.0, factor, 1.0, factor], dtype=torch.float64)
    kw = {"max_leaf_size": 500, "leaf": LeafConfig(n_iters=2)}
    base = xRFMTree(**kw).fit(X, y, Xv, yv, generator=seeded())
    scaled = xRFMTree(**kw).fit(X * c, y, Xv * c, yv, generator=seeded())
    assert base.n_leaves == scaled.n_leaves > 1
    torch.testing.assert_close(scaled(Xt * c), base(Xt), rtol=1e-4, atol=1e-4)
    shifted = xRFMTree(**kw).fit(
        X - 5.0, factor * y + 3.0, Xv - 5.0, factor * yv + 3.0, generator=seeded()
    )
    torch.testing.assert_close(
        shifted(Xt - 5.0), factor * base(Xt) + 3.0, rtol=1e-4, atol=1e-4 * factor
    )
    # the gradients follow the units too: d f / d (c x) = (d f / d x) / c
    torch.testing.assert_close(
        scaled.input_grads(Xt[:5] * c), base.input_grads(Xt[:5]) / c, rtol=1e-4, atol=1e-8
    )


def test_constant_and_huge_columns_fit_and_predict():
    X, y = planted(600, d=4, dtype=torch.float32)
    X = torch.cat([X * 1e6, torch.full((600, 1), 7.0)], 1)  # huge units and a constant column
    model = xRFMTree(max_leaf_size=300, leaf=LeafConfig(n_iters=1)).fit(X, y, generator=seeded())
    pred = model(X[:50])
    assert torch.isfinite(pred).all()
    assert float(((pred[:, 0] - y[:50]) ** 2).mean()) < 0.5 * float(y.var())


def test_a_nan_at_prediction_is_an_error_not_a_number(fitted):
    model, _, _ = fitted  # fitted without missing cells: NaN is expected nowhere
    Xt, _ = planted(5, d=6, seed=4)
    Xt[3, 2] = float("nan")
    with pytest.raises(
        ValueError, match=r"missing value \(NaN\) at row 3, column 2, a column that had none"
    ):
        model(Xt)
    Xt[3, 2] = float("inf")
    with pytest.raises(
        ValueError, match=r"x contains 1 non-finite value\(s\), first at index \(3, 2\)"
    ):
        model(Xt)


def test_missing_cells_are_imputed_and_flagged_where_the_training_rows_had_them():
    """A planted task whose target depends on *whether* x0 is missing: the indicator carries it."""
    g = torch.Generator().manual_seed(3)
    X = torch.randn(1500, 4, generator=g, dtype=torch.float64)
    gone = torch.rand(1500, generator=g) < 0.3
    y = X[:, 1] + 3.0 * gone.double()
    X[gone, 0] = float("nan")
    model = xRFMTree(max_leaf_size=2000, leaf=LeafConfig(n_iters=2), input_transform="identity")
    model.fit(X[:1200], y[:1200], X[1200:1350], y[1200:1350], generator=seeded())
    assert model.input_map.missing_columns == [0]
    assert model.leaves()[0].support_.shape[1] == 5  # 4 standardized columns + 1 indicator
    pred = model(X[1350:])[:, 0]
    assert float(((pred - y[1350:]) ** 2).mean().sqrt()) < 0.3  # the 3.0 jump is learned
    # a missing cell is the training mean plus its indicator: the prediction does not depend on
    # what the cell held, and the indicator's importance counts for its feature
    row = X[1350:1351].clone()
    row[0, 0] = float("nan")
    filled = row.clone()
    filled[0, 0] = float(X[:1200, 0].nanmean())
    assert float(model(row)) - float(model(filled)) > 2.0
    imp = model.feature_importance()
    assert imp.shape == (4,) and float(imp.sum()) == pytest.approx(1.0)
    assert imp[2] < 0.1 and imp[3] < 0.1  # planted: no signal there
    bad = X[1350:1352].clone()
    bad[1, 3] = float("nan")
    with pytest.raises(ValueError, match=r"row 1, column 3.*handles NaN only in columns \[0\]"):
        model(bad)
    # told to expect missing cells anywhere: a NaN in column 3 is that column's training mean
    anywhere = xRFMTree(
        max_leaf_size=2000,
        leaf=LeafConfig(n_iters=2),
        input_transform="identity",
        missing_values="any",
    ).fit(X[:1200], y[:1200], X[1200:1350], y[1200:1350], generator=seeded())
    mean_filled = bad.clone()
    mean_filled[1, 3] = float(X[:1200, 3].mean())
    torch.testing.assert_close(anywhere(bad), anywhere(mean_filled))


def test_large_fit_iterates_on_subsamples_only_above_its_row_count():
    """Above ``large_fit_rows`` the leaves are those of ``LeafConfig(iter_rows=...)``, the
    split models those of ``AGOPSplit(sample_size=...)`` and the leaves get no overlap rows; at
    or below it, the fit is the plain one."""
    X, y = planted(900, d=4, seed=5, dtype=torch.float64)
    Xq = planted(50, d=4, seed=6, dtype=torch.float64)[0]
    cfg = LeafConfig(n_iters=3)

    def fit(leaf, **kw):
        model = xRFMTree(leaf=leaf, max_leaf_size=400, **kw).double()
        return model.fit(X, y, generator=torch.Generator().manual_seed(0))

    large = fit(cfg, large_fit_rows=500, large_fit_iter_rows=150)
    explicit = fit(
        cfg.replace(iter_rows=150),
        large_fit_rows=None,
        n_trees=1,
        split_rule=AGOPSplit(sample_size=150),
        overlap_fraction=0.0,
    )
    assert not torch.allclose(large(Xq), fit(cfg.replace(iter_rows=150), large_fit_rows=None)(Xq))
    plain = fit(cfg, large_fit_rows=None)
    torch.testing.assert_close(large(Xq), explicit(Xq), rtol=0, atol=0)
    assert len(large.trees) == len(plain.trees)  # one tree per map in regression
    assert not torch.allclose(large(Xq), plain(Xq))
    torch.testing.assert_close(fit(cfg, large_fit_rows=900)(Xq), plain(Xq), rtol=0, atol=0)
    # the final solves still see every row of a leaf
    assert sum(lf.support_.shape[0] for lf in large.leaves()) >= 900
    with pytest.raises(ValueError, match="large_fit_rows"):
        xRFMTree(large_fit_rows=0)


def test_default_tree_count_is_two_per_map_for_classification_only():
    X, y = planted(900, d=4, seed=7)
    labels = (y.reshape(len(y), -1)[:, 0] > y.reshape(len(y), -1)[:, 0].median()).long()
    kw = {"max_leaf_size": 400, "leaf": LeafConfig(n_iters=1), "input_transform": "identity"}
    g = torch.Generator
    reg = xRFMTree(**kw).fit(X, y, generator=g().manual_seed(0))
    clf = xRFMTree(task="classification", **kw).fit(X, labels, generator=g().manual_seed(0))
    big = xRFMTree(task="classification", large_fit_rows=500, **kw)
    big.fit(X, labels, generator=g().manual_seed(0))
    assert (len(reg.trees), len(clf.trees), len(big.trees)) == (1, 2, 1)
    assert clf.n_leaves > 2
    # the two trees differ (split-model subsamples)
    assert not torch.equal(clf.trees[0].thresholds_, clf.trees[1].thresholds_)
