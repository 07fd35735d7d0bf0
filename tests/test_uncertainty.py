"""Predictive uncertainty: the leaves' GP view, the variance model, the tree's mean and std."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import Matern

from conftest import plain_leaf, planted
from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.kernels import LaplaceKernel
from xrfm_torch.leaf.posterior import LOG_FLOOR
from xrfm_torch.tree.uncertainty import fit_log_variance, gaussian_nll

F64 = torch.float64


def fitted_leaf(n: int = 120, linear_mix: float = 0.0, n_iters: int = 0):
    X, y = planted(n, d=3, dtype=F64)
    Xv, yv = planted(40, d=3, seed=1, dtype=F64)
    leaf = plain_leaf(
        LaplaceKernel(bandwidth=2.0), n_iters=n_iters, reg=1e-2, linear_mix=linear_mix
    )
    return leaf.fit(X, y, Xv, yv).fit_posterior(), X, y


def test_leaf_latent_variance_is_sklearns_gaussian_process_std():
    leaf, X, y = fitted_leaf()
    Xt, _ = planted(30, d=3, seed=2, dtype=F64)
    gp = GaussianProcessRegressor(
        Matern(length_scale=2.0, length_scale_bounds="fixed", nu=0.5), alpha=1e-2, optimizer=None
    ).fit(X.numpy(), y.numpy())
    mean_ref, std_ref = gp.predict(Xt.numpy(), return_std=True)
    mean, v, _ = leaf.moments(Xt)
    torch.testing.assert_close(mean[:, 0], torch.from_numpy(mean_ref), rtol=0, atol=1e-8)
    torch.testing.assert_close(v, torch.from_numpy(std_ref) ** 2, rtol=0, atol=1e-8)


@pytest.mark.parametrize("linear_mix", [0.0, 0.1])
def test_leave_one_out_noise_model_matches_brute_force_refits(linear_mix):
    leaf, X, y = fitted_leaf(n=50, linear_mix=linear_mix, n_iters=1)
    loo = []
    for i in range(len(X)):
        keep = torch.arange(len(X)) != i
        other = plain_leaf(leaf.kernel, n_iters=0, reg=float(leaf.reg_), linear_mix=linear_mix)
        other.fit(X[keep], y[keep], X[:1], y[:1])  # same kernel; M set below
        other.sqrt_m_ = leaf.sqrt_m_.clone()
        other.refit(X[keep], y[keep])
        loo.append(float(y[i] - other(X[i : i + 1])[0, 0]))
    loo = torch.tensor(loo, dtype=F64)
    # g at a support point is the KRR prediction of z = log(loo^2 + floor): check via its solve
    z = torch.log(loo**2 + LOG_FLOOR * (loo**2).mean())
    ref = plain_leaf(leaf.kernel, n_iters=0, reg=float(leaf.reg_), linear_mix=linear_mix)
    ref.fit(X, z, X[:1], z[:1])
    ref.sqrt_m_ = leaf.sqrt_m_.clone()
    ref.refit(X, z - z.mean())
    Xt, _ = planted(20, d=3, seed=5, dtype=F64)
    _, _, g = leaf.moments(Xt)
    torch.testing.assert_close(g[:, 0], ref(Xt)[:, 0] + z.mean(), rtol=1e-6, atol=1e-6)


def test_signal_variance_is_the_marginal_likelihood_scale():
    leaf, X, y = fitted_leaf()
    K = LaplaceKernel(bandwidth=2.0)(X, X) + 1e-2 * torch.eye(len(X), dtype=F64)
    ref = y @ torch.linalg.solve(K, y) / len(X)
    torch.testing.assert_close(leaf.gp.signal_var_[0], ref, rtol=1e-8, atol=0)


def test_log_variance_fit_recovers_planted_coefficients_and_is_stationary():
    g = torch.Generator().manual_seed(0)
    n = 20000
    F = torch.stack([torch.ones(n, dtype=F64), torch.randn(n, generator=g, dtype=F64)], 1)
    theta = torch.tensor([-1.0, 0.7], dtype=F64)
    r2 = torch.exp(F @ theta) * torch.randn(n, generator=g, dtype=F64) ** 2
    est = fit_log_variance(F, r2, ridge=0.0)
    torch.testing.assert_close(est, theta, rtol=0, atol=0.05)
    th = est.clone().requires_grad_()
    eta = F @ th
    (grad,) = torch.autograd.grad((0.5 * (eta + r2 * torch.exp(-eta))).mean(), th)
    assert float(grad.abs().max()) < 1e-8


def heteroscedastic(n: int, seed: int):
    """Noise sd 0.1 where x1 <= 0 and 0.6 where x1 > 0, on a smooth mean (offset 10)."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 4, generator=g, dtype=F64)
    sd = torch.where(X[:, 1] > 0, 0.6, 0.1).to(F64)
    return X, 3 * X[:, 0].sin() + 10 + sd * torch.randn(n, generator=g, dtype=F64), sd


@pytest.fixture(scope="module")
def noisy_model() -> xRFMTree:
    X, y, _ = heteroscedastic(2500, 0)
    Xv, yv, _ = heteroscedastic(600, 1)
    model = xRFMTree(leaf=LeafConfig(n_iters=2), uncertainty="calibrated", max_leaf_size=1500)
    return model.fit(X, y, Xv, yv, generator=torch.Generator().manual_seed(0))


def test_calibrated_std_follows_planted_noise_and_covers(noisy_model):
    Xt, yt, sd = heteroscedastic(3000, 2)
    mean, std = noisy_model(Xt, return_std=True)
    quiet, loud = std[sd < 0.3, 0].median(), std[sd > 0.3, 0].median()
    assert 0.08 < float(quiet) < 0.2 and 0.5 < float(loud) < 0.8
    lo, hi = noisy_model.predict_interval(Xt, coverage=0.9)
    cover = float(((yt[:, None] >= lo) & (yt[:, None] <= hi)).double().mean())
    assert 0.86 <= cover <= 0.94
    # beats the best constant variance (the test rows' own mean squared error)
    homo = gaussian_nll(mean, ((yt[:, None] - mean) ** 2).mean(), yt[:, None]).mean()
    assert float(gaussian_nll(mean, std**2, yt[:, None]).mean()) < float(homo) - 0.3


def test_std_is_in_target_units():
    X, y, _ = heteroscedastic(800, 0)
    Xt = X[:50]
    kw = {"leaf": LeafConfig(n_iters=1), "uncertainty": "calibrated"}
    a = xRFMTree(**kw).fit(X, y, generator=torch.Generator().manual_seed(0))
    b = xRFMTree(**kw).fit(X, 1000 * y, generator=torch.Generator().manual_seed(0))
    (ma, sa), (mb, sb) = a(Xt, return_std=True), b(Xt, return_std=True)
    torch.testing.assert_close(mb, 1000 * ma, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(sb, 1000 * sa, rtol=1e-6, atol=1e-6)


def test_soft_routing_mixes_leaf_gaussians(noisy_model):
    model = noisy_model
    Xt, _, _ = heteroscedastic(40, 3)
    temp = 0.5
    mean, _ = model(Xt, temp, return_std=True)
    torch.testing.assert_close(mean, model(Xt, temp), rtol=1e-10, atol=1e-10)
    tree = model.partition_trees()[0]
    xt = model.input_map(Xt)[0]
    w = tree.weights(xt, temp, keep_mass=model.keep_mass, max_leaves=model.max_soft_leaves)
    per = [leaf.moments(xt) for leaf in tree.leaf_list()]
    mus = torch.stack([p[0][:, 0] for p in per], 1)  # (n, L)
    vs = torch.stack([p[1] for p in per], 1)
    mix = (w * mus).sum(1)
    latent = (w * vs).sum(1) + (w * (mus - mix[:, None]) ** 2).sum(1)
    from xrfm_torch.tree.uncertainty import model_moments

    m = model_moments(
        [tree], [xt], temp, keep_mass=model.keep_mass, max_leaves=model.max_soft_leaves
    )
    torch.testing.assert_close(m.latent[:, 0], latent, rtol=1e-10, atol=1e-12)


def test_std_is_differentiable_in_the_inputs(noisy_model):
    model = noisy_model
    x = heteroscedastic(3, 4)[0].requires_grad_()
    _, std = model(x, 0.5, return_std=True)
    (grad,) = torch.autograd.grad(std.sum(), x)
    h = 1e-6
    for j in range(x.shape[1]):
        e = torch.zeros_like(x)
        e[:, j] = h
        with torch.no_grad():
            up = model(x + e, 0.5, return_std=True)[1].sum()
            down = model(x - e, 0.5, return_std=True)[1].sum()
        assert abs(float((up - down) / (2 * h)) - float(grad[:, j].sum())) < 1e-4


def test_gp_variance_is_the_leaf_process():
    X, y = planted(400, d=3, dtype=F64)
    model = xRFMTree(leaf=LeafConfig(n_iters=1), uncertainty="gp", max_leaf_size=1000)
    model.fit(X, y, generator=torch.Generator().manual_seed(0))
    Xt, _ = planted(20, d=3, seed=9, dtype=F64)
    leaf = model.leaves()[0]
    _, v, _ = leaf.moments(model.input_map(Xt)[0])
    ref = leaf.gp.signal_var_ * (v + leaf.reg_) * model.targets.scaler.scale_**2
    _, std = model(Xt, return_std=True)
    torch.testing.assert_close(std[:, 0] ** 2, ref, rtol=1e-8, atol=0)


def test_state_dict_round_trip_keeps_mean_and_std(noisy_model):
    model = noisy_model
    Xt, _, _ = heteroscedastic(30, 5)
    fresh = xRFMTree.from_config(model.get_config())
    fresh.load_state_dict(model.state_dict())
    assert not any(k.endswith("factor_") for k in model.state_dict())  # not saved
    for a, b in zip(model(Xt, return_std=True), fresh(Xt, return_std=True)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


def test_bad_uses_are_refused(noisy_model):
    X, y = planted(200, d=3)
    plain = xRFMTree(leaf=LeafConfig(n_iters=0)).fit(
        X, y, generator=torch.Generator().manual_seed(0)
    )
    with pytest.raises(ValueError, match="uncertainty='calibrated'"):
        plain(X[:3], return_std=True)
    with pytest.raises(ValueError, match="needs task='regression'"):
        xRFMTree(task="classification", uncertainty="calibrated")
    with pytest.raises(ValueError, match="uncertainty must be one of"):
        xRFMTree(uncertainty="bayes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="coverage must be in"):
        noisy_model.predict_interval(heteroscedastic(3, 6)[0], coverage=1.0)


# ---- estimators and Lightning -------------------------------------------------------------------
def test_regressor_return_std_and_interval_match_the_tree():
    from sklearn.base import clone

    from xrfm_torch import XRFMClassifier, XRFMRegressor

    X, y, _ = heteroscedastic(700, 0)
    est = XRFMRegressor(n_iters=1, uncertainty="calibrated", random_state=0, dtype="float64")
    est.fit(X.numpy(), 50 * y.numpy())
    mean, std = est.predict(X[:20].numpy(), return_std=True)
    ref_mean, ref_std = est.model_(X[:20], return_std=True)
    assert mean.shape == std.shape == (20,)
    np.testing.assert_allclose(mean, est.predict(X[:20].numpy()), rtol=1e-10)
    torch.testing.assert_close(torch.from_numpy(std), ref_std[:, 0], rtol=0, atol=0)
    lo, hi = est.predict_interval(X[:20].numpy(), coverage=0.8)
    z = 1.2815515655446004  # Phi^{-1}(0.9)
    torch.testing.assert_close(torch.from_numpy(hi - lo), torch.from_numpy(2 * z * std))
    assert clone(est).get_params()["uncertainty"] == "calibrated"
    assert "uncertainty" not in XRFMClassifier().get_params()
    with pytest.raises(ValueError, match="return_std needs"):
        XRFMRegressor(n_iters=0, random_state=0).fit(X.numpy(), y.numpy()).predict(
            X[:2].numpy(), return_std=True
        )


def test_gaussian_nll_metric_is_torchs_gaussian_nll_loss():
    from xrfm_torch.lit.metrics import GaussianNLL

    g = torch.Generator().manual_seed(0)
    mean, y = torch.randn(2, 50, generator=g)
    std = torch.rand(50, generator=g) + 0.1
    metric = GaussianNLL()
    metric.update(mean[:20], std[:20], y[:20])
    metric.update(mean[20:], std[20:], y[20:])
    ref = torch.nn.functional.gaussian_nll_loss(mean, y, std**2, full=True, eps=0.0)
    torch.testing.assert_close(metric.compute(), ref, rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="one shape"):
        metric.update(mean, std[:3], y)


def test_lightning_logs_nll_and_writes_the_coverage_report(tmp_path):
    import json

    import lightning.pytorch as pl

    from xrfm_torch.lit import IntervalCalibration, TabularDataModule, XRFMLitModule
    from xrfm_torch.lit.calibration import interval_coverage

    dm = TabularDataModule("synthetic", n_samples=1500, n_features=6)
    dm.setup()
    tree = xRFMTree(leaf=LeafConfig(n_iters=1), uncertainty="calibrated")
    system = XRFMLitModule(tree, **dm.system_kwargs())
    callback = IntervalCalibration(dirpath=str(tmp_path))
    trainer = pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=[callback],
    )
    trainer.fit(system, datamodule=dm)
    result = trainer.test(system, datamodule=dm, verbose=False)[0]
    X, y = dm.datasets["test"].tensors[:2]
    mean, std = system.model(X, return_std=True)
    y_orig, mean_orig = system.original_targets(y), system.to_output(mean)
    std_orig = system.to_output_std(std)
    ref_nll = torch.nn.functional.gaussian_nll_loss(
        mean_orig, y_orig.reshape(mean_orig.shape), std_orig**2, full=True, eps=0.0
    )
    assert result["test/nll"] == pytest.approx(float(ref_nll), rel=1e-4)
    z = (y_orig.reshape(mean_orig.shape) - mean_orig) / std_orig
    report = json.loads((tmp_path / "calibration_test.json").read_text())
    assert report["rows"] == len(X)
    assert report["observed"] == pytest.approx(interval_coverage(z, report["nominal"]))
    assert result["test/coverage90"] == pytest.approx(interval_coverage(z, [0.9])[0])
    with pytest.raises(ValueError, match="levels must be in"):
        IntervalCalibration(levels=[0.5, 1.0])


@pytest.mark.parametrize("user_val", [True, False])
def test_posterior_reuses_the_final_solves_factor(monkeypatch, user_val):
    """Each leaf's cached factor is that of its own system; with user validation data (final
    solve = the chosen model's factor continued by the bordered solve) nothing is factored again."""
    import xrfm_torch.leaf.gp as leaf_module
    from xrfm_torch.kernels import transform
    from xrfm_torch.leaf.posterior import system_matrix

    calls = []
    real = leaf_module.cholesky_factor
    monkeypatch.setattr(leaf_module, "cholesky_factor", lambda A: calls.append(1) or real(A))
    X, y, _ = heteroscedastic(900, 0)
    Xv, yv, _ = heteroscedastic(300, 1)
    model = xRFMTree(
        leaf=LeafConfig(n_iters=1, linear_mix=0.5),
        uncertainty="gp",
        max_leaf_size=500,
        overlap_fraction=0.1,
    ).double()
    val = (Xv, yv) if user_val else ()
    model.fit(X, y, *val, generator=torch.Generator().manual_seed(0))
    leaves = model.partition_trees()[0].leaf_list()
    assert len(leaves) >= 2
    if user_val:
        assert calls == []
    for leaf in leaves:
        xs = transform(leaf.support_, leaf.sqrt_m_)
        A = system_matrix(leaf.kernel, xs, float(leaf.reg_), leaf.config.linear_mix)
        L = leaf.gp.factor_
        assert L.shape == A.shape
        torch.testing.assert_close(L @ L.mT, A, rtol=1e-9, atol=1e-9)
    plain = xRFMTree(leaf=LeafConfig(n_iters=1), max_leaf_size=500).double()
    plain.fit(X, y, *val, generator=torch.Generator().manual_seed(0))
    assert all(lf.gp.factor_.numel() == 0 for lf in plain.partition_trees()[0].leaf_list())
