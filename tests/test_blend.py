"""KernelBlend: one fit per kernel, mixed by weights chosen on honest outputs."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import jacrev

from conftest import planted
from xrfm_torch import (
    BaggedTree,
    GaussianKernel,
    KernelBlend,
    LaplaceKernel,
    LeafConfig,
    XRFMClassifier,
    XRFMRegressor,
    load_model,
    save_model,
    xRFMTree,
)
from xrfm_torch.models.blend import weight_grid
from xrfm_torch.models.export import export_program
from xrfm_torch.tree.honest import row_losses

KERNELS = ("laplace", "gaussian")


def small_tree(**kw) -> xRFMTree:
    return xRFMTree(max_leaf_size=150, input_transform="identity", leaf=LeafConfig(n_iters=2), **kw)


def class_data(n: int, seed: int):
    X, f = planted(n, d=4, seed=seed, noise=0.3)
    return X, (f > f.median()).float() + (f > f.quantile(0.8)).float()  # 3 classes


@pytest.fixture(scope="module")
def classifier_blend():
    X, y = class_data(500, 0)
    Xv, yv = class_data(200, 1)
    blend = KernelBlend(small_tree(task="classification"), kernels=KERNELS, weight_steps=10)
    blend.fit(X, y, Xv, yv, generator=torch.Generator().manual_seed(7))
    return blend, (X, y, Xv, yv)


def test_weight_grid_is_every_composition_from_the_first_kernel_down():
    two = weight_grid(2, 4)
    assert two.tolist() == [[1, 0], [0.75, 0.25], [0.5, 0.5], [0.25, 0.75], [0, 1]]
    three = weight_grid(3, 2)
    assert three.shape == (6, 3) and torch.allclose(three.sum(1), torch.ones(6, dtype=three.dtype))
    assert three[0].tolist() == [1, 0, 0] and three[-1].tolist() == [0, 0, 1]


def test_members_are_the_single_kernel_models_and_the_weights_minimize_the_honest_loss(
    classifier_blend,
):
    blend, (X, y, Xv, yv) = classifier_blend
    singles = {}
    for name, kernel in zip(KERNELS, (LaplaceKernel(), GaussianKernel())):
        tree = small_tree(task="classification", kernel=kernel)
        singles[name] = tree.fit(X, y, Xv, yv, generator=torch.Generator().manual_seed(7))
    # every member is what its kernel alone gives with the same seed
    for k, member in zip(blend.member_kernels_.tolist(), blend.members):
        assert torch.equal(member.predict_proba(Xv), singles[KERNELS[k]].predict_proba(Xv))
    # the honest outputs of a tree with validation rows are its validation probabilities
    probs = {k: t.predict_proba(Xv).double() for k, t in singles.items()}
    torch.testing.assert_close(
        singles["gaussian"].honest_outputs().outputs.double(), probs["gaussian"]
    )
    losses = [
        float(row_losses(w[0] * probs["laplace"] + w[1] * probs["gaussian"], yv, "classification").mean())
        for w in weight_grid(2, 10)
    ]  # fmt: skip
    best = weight_grid(2, 10)[int(np.argmin(losses))]
    assert blend.weights_.sum().item() == pytest.approx(1.0)
    full = torch.zeros(2, dtype=torch.float64)
    full[blend.member_kernels_] = blend.weights_.double()
    torch.testing.assert_close(full, best)
    assert min(blend.honest_losses_.values()) == pytest.approx(min(losses), rel=1e-5)
    expected = sum(best[i] * probs[k] for i, k in enumerate(KERNELS) if best[i] > 0)
    torch.testing.assert_close(blend.predict_proba(Xv).double(), expected, rtol=1e-5, atol=1e-6)
    # zero-weight members are dropped
    assert len(blend.members) == int((best > 0).sum())


def test_weight_steps_1_keeps_the_kernel_of_lower_honest_loss_alone():
    X, y = planted(600, d=3, seed=3, noise=0.1)
    blend = KernelBlend(small_tree(), kernels=KERNELS, weight_steps=1)
    blend.fit(X[:450], y[:450], X[450:], y[450:], generator=torch.Generator().manual_seed(0))
    losses = blend.honest_losses_
    assert set(losses) == {(1.0, 0.0), (0.0, 1.0)}
    winner = 0 if losses[(1.0, 0.0)] <= losses[(0.0, 1.0)] else 1
    assert blend.weights_.tolist() == [1.0] and blend.member_kernels_.tolist() == [winner]
    assert isinstance(blend.members[0].kernel, (LaplaceKernel, GaussianKernel)[winner])
    mse = float((blend(X[450:])[:, 0] - y[450:]).double().square().mean())
    assert mse == pytest.approx(min(losses.values()), rel=1e-4)


def test_bagged_members_mix_on_their_out_of_fold_outputs():
    X, y = planted(400, d=3, seed=2, noise=0.2)
    blend = KernelBlend(BaggedTree(small_tree(), n_bags=2), kernels=KERNELS, weight_steps=4)
    blend.fit(X, y, generator=torch.Generator().manual_seed(1))
    oof = {}
    for name in KERNELS:
        proto = BaggedTree(small_tree(kernel=name), n_bags=2)
        oof[name] = proto.fit(X, y, generator=torch.Generator().manual_seed(1)).oof_.double()
    losses = [
        float(((w[0] * oof["laplace"] + w[1] * oof["gaussian"])[:, 0] - y).square().mean())
        for w in weight_grid(2, 4)
    ]
    best = weight_grid(2, 4)[int(np.argmin(losses))]
    full = torch.zeros(2, dtype=torch.float64)
    full[blend.member_kernels_] = blend.weights_.double()
    torch.testing.assert_close(full, best)
    torch.testing.assert_close(
        blend.oof_.double(),
        sum(full[i] * oof[k] for i, k in enumerate(KERNELS)),
        rtol=1e-5,
        atol=1e-6,
    )
    pairs = blend.single_trees()
    assert sum(w for w, _ in pairs) == pytest.approx(1.0)
    torch.testing.assert_close(blend(X[:5]), sum(w * t(X[:5]) for w, t in pairs))


def test_state_dict_file_and_export_round_trips(classifier_blend, tmp_path):
    blend, (_, _, Xv, _) = classifier_blend
    save_model(blend, tmp_path / "blend.pt")
    loaded = load_model(tmp_path / "blend.pt")
    assert isinstance(loaded, KernelBlend) and loaded.get_config() == blend.get_config()
    assert loaded.member_kernels_.tolist() == blend.member_kernels_.tolist()
    for a, b in zip(loaded.members, blend.members):
        assert type(a.kernel) is type(b.kernel)
    assert torch.equal(loaded.predict_proba(Xv), blend.predict_proba(Xv))
    fresh = KernelBlend(small_tree(task="classification"), kernels=KERNELS, weight_steps=10)
    fresh.load_state_dict(blend.state_dict())
    assert torch.equal(fresh(Xv), blend(Xv))
    program = export_program(blend, Xv[:4], output="proba").module()
    torch.testing.assert_close(program(Xv), blend.predict_proba(Xv), rtol=1e-5, atol=1e-6)
    bad = dict(blend.state_dict())
    bad["member_kernels_"] = torch.tensor([5])
    with pytest.raises(ValueError, match="member kernels"):
        KernelBlend(small_tree(task="classification"), kernels=KERNELS).load_state_dict(bad)


def test_gradients_are_the_weighted_members_gradients(classifier_blend):
    blend, (_, _, Xv, _) = classifier_blend
    x = Xv[:3]
    jac = jacrev(lambda z: blend(z).sum(0))(x)  # (c, n, d)
    grads = blend.input_grads(x)  # (n, c, d)
    torch.testing.assert_close(grads, jac.permute(1, 0, 2), rtol=1e-3, atol=1e-4)
    expected = sum(w * m.input_grads(x) for w, m in blend.weighted_members())
    torch.testing.assert_close(grads, expected, rtol=1e-3, atol=1e-4)
    imp = blend.feature_importance()
    assert imp.sum().item() == pytest.approx(1.0, abs=1e-5)


def test_bad_settings_and_unfitted_use_are_refused():
    with pytest.raises(ValueError, match="unknown kernel 'cosine'"):
        KernelBlend(kernels=("laplace", "cosine"))
    with pytest.raises(ValueError, match="at least 2 distinct"):
        KernelBlend(kernels=("laplace", "laplace"))
    with pytest.raises(ValueError, match="at least 2 distinct"):
        KernelBlend(kernels="laplace")
    with pytest.raises(TypeError, match="xRFMTree or BaggedTree"):
        KernelBlend(torch.nn.Linear(2, 2))  # type: ignore[arg-type]
    blend = KernelBlend()
    with pytest.raises(RuntimeError, match="not fitted"):
        blend(torch.zeros(2, 3))
    with pytest.raises(RuntimeError, match="fitted in this session"):
        blend.honest_outputs()
    with pytest.raises(RuntimeError, match="blend of BaggedTrees"):
        _ = blend.oof_


def test_the_estimators_blend_by_default_and_take_one_kernel_or_a_tuple():
    X, y = class_data(300, 4)
    labels = np.array(["lo", "mid", "hi"])[y.long().numpy()]
    common = {"n_iters": 1, "input_transform": "identity", "n_bags": 1, "random_state": 0}
    clf = XRFMClassifier(**common).fit(X.numpy(), labels)
    assert isinstance(clf.model_, KernelBlend) and clf.model_.kernels == KERNELS
    x = torch.tensor(clf.encoder_.transform(X[:20].numpy()), dtype=torch.float32)
    torch.testing.assert_close(
        torch.from_numpy(clf.predict_proba(X[:20].numpy())).float(), clf.model_.predict_proba(x)
    )
    single = XRFMClassifier(kernel=("gaussian",), **common).fit(X.numpy(), labels)
    assert isinstance(single.model_, xRFMTree) and isinstance(single.model_.kernel, GaussianKernel)
    reg = XRFMRegressor(n_iters=1, input_transform="identity").fit(X.numpy(), y.numpy())
    assert isinstance(reg.model_, KernelBlend) and reg.model_.kernels == KERNELS
    one = XRFMRegressor("laplace", n_iters=1).fit(X.numpy(), y.numpy())
    assert isinstance(one.model_, xRFMTree)
    for bad in (("laplace", 3), (), 5):
        with pytest.raises(ValueError, match="kernel"):
            XRFMClassifier(kernel=bad, **common).fit(X.numpy(), labels)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown kernel 'nope'"):
        XRFMClassifier(kernel=("laplace", "nope"), **common).fit(X.numpy(), labels)


def test_lightning_experiment_kernel_blend_fits_reports_and_reloads(tmp_path):
    from test_configs import compose_with
    from xrfm_torch.lit import XRFMLitModule
    from xrfm_torch.pipeline import run

    cfg = compose_with(
        ["experiment=kernel_blend", "debug=fast", "logger=none", "trainer.enable_progress_bar=false"],
        tmp_path,
    )  # fmt: skip
    result = run(cfg)
    system, dm = result["objects"]["system"], result["objects"]["datamodule"]
    assert isinstance(system.model, KernelBlend) and system.model.is_fitted
    assert '"kernels"' in (tmp_path / "tree_summary.json").read_text()
    csv = (tmp_path / "leaf_metrics_test.csv").read_text().splitlines()
    assert csv[0].startswith("bag,tree,leaf")  # one row per single tree's leaf, told apart
    n_trees = len(system.model.single_trees())
    assert {row.split(",")[0] for row in csv[1:]} == {str(b) for b in range(n_trees)}
    x = torch.from_numpy(dm.data.X_test)
    loaded = XRFMLitModule.load_from_checkpoint(result["checkpoint"], weights_only=True)
    assert torch.equal(loaded.predict_step((x,), 0), system.predict_step((x,), 0))


def test_lightning_blend_of_bags_logs_its_mixed_out_of_fold_scores(tmp_path):
    from test_configs import compose_with
    from xrfm_torch.pipeline import run

    cfg = compose_with(
        ["experiment=kernel_blend", "system.n_bags=2", "debug=fast", "logger=none",
         "trainer.enable_progress_bar=false"],
        tmp_path,
    )  # fmt: skip
    result = run(cfg)
    system, dm = result["objects"]["system"], result["objects"]["datamodule"]
    blend = system.model
    assert isinstance(blend, KernelBlend) and isinstance(blend.members[0], BaggedTree)
    y = torch.cat([torch.from_numpy(dm.data.y_train), torch.from_numpy(dm.data.y_val)])
    pred = system.to_output(blend.honest_outputs().outputs)
    rmse = float((pred - system.original_targets(y.float())).double().square().mean().sqrt())
    assert result["metrics"]["val/oof_rmse"] == pytest.approx(rmse, rel=1e-6)


def test_sample_weights_weigh_the_honest_losses():
    X, y = planted(500, d=3, seed=5, noise=0.2)
    Xv, yv = planted(200, d=3, seed=6, noise=0.2)
    wv = torch.linspace(0.1, 3.0, 200)  # heavier rows late: a different weighted mean
    blend = KernelBlend(small_tree(), kernels=KERNELS, weight_steps=4)
    blend.fit(X, y, Xv, yv, val_sample_weight=wv, generator=torch.Generator().manual_seed(2))
    preds = {}
    for name in KERNELS:
        tree = small_tree(kernel=name).fit(
            X, y, Xv, yv, val_sample_weight=wv, generator=torch.Generator().manual_seed(2)
        )
        preds[name] = tree(Xv)[:, 0].double()
    grid = weight_grid(2, 4)
    weighted = [
        float(((w[0] * preds["laplace"] + w[1] * preds["gaussian"] - yv).square() * wv).sum() / wv.sum())
        for w in grid
    ]  # fmt: skip
    assert list(blend.honest_losses_.values()) == pytest.approx(weighted, rel=1e-4)


def test_return_std_is_the_weighted_mixture_of_the_members():
    X, y = planted(500, d=3, seed=7, noise=0.3)
    blend = KernelBlend(small_tree(uncertainty="calibrated"), kernels=KERNELS)
    members = [
        small_tree(uncertainty="calibrated", kernel=k).fit(
            X[:400], y[:400], X[400:], y[400:], generator=torch.Generator().manual_seed(3)
        )
        for k in KERNELS
    ]
    blend.members = torch.nn.ModuleList(members)  # a mixture of both, whatever a fit would pick
    blend.weights_ = torch.tensor([0.25, 0.75])
    blend.member_kernels_ = torch.tensor([0, 1])
    mean, std = blend(X[:7], return_std=True)
    parts = [(w, m(X[:7], return_std=True)) for w, m in blend.weighted_members()]
    m_ref = sum(w * ms[0] for w, ms in parts)
    second = sum(w * (ms[1].square() + ms[0].square()) for w, ms in parts)
    torch.testing.assert_close(mean, m_ref)
    torch.testing.assert_close(std, (second - m_ref.square()).clamp_min(0).sqrt())
    lo, hi = blend.predict_interval(X[:7], coverage=0.9)
    torch.testing.assert_close((hi - lo) / 2, 1.6448536 * std, rtol=1e-5, atol=1e-6)
