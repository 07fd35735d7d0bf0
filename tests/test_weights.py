"""Sample weights in the leaf numerics: weighted solves, AGOP and validation errors.

The reference everywhere is the unweighted computation on rows repeated as often as their
integer weight (and scikit-learn's ``KernelRidge(sample_weight=)`` for the solve).
"""

from __future__ import annotations

import pytest
import torch
from sklearn.kernel_ridge import KernelRidge

from conftest import planted
from xrfm_torch import LeafConfig, LeafRFM
from xrfm_torch.kernels import LaplaceKernel
from xrfm_torch.leaf.criteria import validation_errors
from xrfm_torch.numerics.agop import agop_from_grads
from xrfm_torch.numerics.solvers import krr_workspace, solve_krr
from xrfm_torch.numerics.warm_solves import pcg_krr, solve_bordered


def integer_weights(n: int, seed: int = 0, high: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights 0 .. high-1 (some rows dropped, some repeated) and the repeated row indices."""
    w = torch.randint(0, high, (n,), generator=torch.Generator().manual_seed(seed))
    return w.double(), torch.repeat_interleave(torch.arange(n), w)


def gram(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    X, y = planted(n, d=3, seed=seed, dtype=torch.float64)
    return LaplaceKernel(bandwidth=2.0)(X, X), torch.stack([y, y**2], 1)


def test_weighted_solve_matches_kernel_ridge_with_sample_weight():
    K, Y = gram(120)
    w = torch.rand(120, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 0.1
    alpha = solve_krr(K, Y, 0.3, weights=w)
    ref = KernelRidge(alpha=0.3, kernel="precomputed").fit(K.numpy(), Y.numpy(), sample_weight=w)
    torch.testing.assert_close(K @ alpha, torch.from_numpy(ref.predict(K.numpy())))


def test_integer_weights_solve_as_repeated_rows_and_cg_and_bordered_agree():
    K, Y = gram(150)
    w, rep = integer_weights(150)
    keep = w > 0
    Kk, Yk, wk = K[keep][:, keep], Y[keep], w[keep]
    alpha = solve_krr(Kk, Yk, 0.05, weights=wk)
    alpha_rep = solve_krr(K[rep][:, rep], Y[rep], 0.05)
    # the repeated system's coefficients summed over each row's copies
    summed = torch.zeros_like(Y).index_add_(0, torch.arange(150)[rep], alpha_rep)
    torch.testing.assert_close(alpha, summed[keep], rtol=1e-8, atol=1e-10)
    # CG from the factor of a nearby weighted system reaches the same solution
    F = krr_workspace(Kk.shape[0], torch.float64)
    solve_krr(Kk, Yk, 0.06, weights=wk, workspace=F)
    cg = pcg_krr(Kk, Yk, 0.05, F, weights=wk, tol=1e-10, max_iters=200, accept=1e-8)
    assert cg is not None
    torch.testing.assert_close(cg, alpha, rtol=1e-6, atol=1e-8)
    # a bordered solve continuing the factor of the first rows gives the whole system's solution
    n = 60
    F = krr_workspace(n, torch.float64)
    solve_krr(Kk[:n, :n], Yk[:n], 0.05, weights=wk[:n], workspace=F)
    kk = Kk
    bordered = solve_bordered(F, kk[:n, :n], kk[:n, n:], kk[n:, n:], Yk, 0.05, weights=wk)
    assert bordered is not None
    torch.testing.assert_close(bordered, alpha, rtol=1e-8, atol=1e-10)


def test_weighted_agop_and_validation_errors_are_those_of_repeated_rows():
    g = torch.randn(40, 2, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    w, rep = integer_weights(40, seed=2)
    for diag in (False, True):
        torch.testing.assert_close(
            agop_from_grads(g, diag=diag, weights=w), agop_from_grads(g[rep], diag=diag)
        )
    pred, target = torch.randn(40, 3, dtype=torch.float64), torch.randn(40, 3, dtype=torch.float64)
    onehot = torch.eye(3, dtype=torch.float64)[torch.arange(40) % 3]
    for criterion, t in (("mse", target), ("logloss", onehot), ("error", onehot)):
        err, rows = validation_errors(pred, t, criterion, w)
        ref, _ = validation_errors(pred[rep], t[rep], criterion)
        assert err == pytest.approx(ref, rel=1e-12)
        per_output = 3 if criterion == "mse" else 1  # mse rows sum the outputs' errors
        assert float(rows.mean()) / per_output == pytest.approx(ref, rel=1e-12)


@pytest.mark.parametrize("linear_mix", [0.0, 0.1])
def test_leaf_with_integer_weights_equals_the_leaf_on_repeated_rows(linear_mix):
    # fixed M (no AGOP update), bandwidth and ridge: the leaf is one weighted solve
    X, y = planted(300, d=4, dtype=torch.float64)
    Xv, yv = planted(80, d=4, seed=1, dtype=torch.float64)
    Xb, yb = planted(40, d=4, seed=5, dtype=torch.float64)
    Xq, _ = planted(50, d=4, seed=9, dtype=torch.float64)
    w, rep = integer_weights(300)
    wb, rep_b = integer_weights(40, seed=3)
    cfg = LeafConfig.plain(n_iters=0, linear_mix=linear_mix, reg=1e-2)
    weighted = LeafRFM("laplace", cfg).fit(X, y, Xv, yv, sample_weight=w)
    repeated = LeafRFM("laplace", cfg).fit(X[rep], y[rep], Xv, yv)
    torch.testing.assert_close(weighted(Xq), repeated(Xq), rtol=1e-8, atol=1e-10)
    assert weighted.support_.shape[0] == int((w > 0).sum())  # rows of weight 0 are dropped
    # the same through the final solve that adds extra rows (bordered) and through refit
    weighted = LeafRFM("laplace", cfg).fit(
        X, y, Xv, yv, sample_weight=w, extra=(Xb, yb), extra_weight=wb
    )
    repeated = LeafRFM("laplace", cfg).fit(X[rep], y[rep], Xv, yv, extra=(Xb[rep_b], yb[rep_b]))
    torch.testing.assert_close(weighted(Xq), repeated(Xq), rtol=1e-8, atol=1e-10)
    weighted.refit(torch.cat([X, Xb]), torch.cat([y, yb]), torch.cat([w, wb]))
    torch.testing.assert_close(weighted(Xq), repeated(Xq), rtol=1e-8, atol=1e-10)


def test_validation_weights_decide_the_mean_fallback_like_repeated_rows():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(200, 3, generator=g, dtype=torch.float64)
    y, yv = torch.randn(200, generator=g, dtype=torch.float64), None
    Xv = torch.randn(200, 3, generator=g, dtype=torch.float64)
    yv = torch.randn(200, generator=g, dtype=torch.float64) + 0.3
    w, rep = integer_weights(200, seed=4)
    wv, rep_v = integer_weights(200, seed=5)
    cfg = LeafConfig.plain(n_iters=0, reg=1e-6)  # near-interpolation of pure noise
    weighted = LeafRFM("laplace", cfg).fit(X, y, Xv, yv, sample_weight=w, val_sample_weight=wv)
    repeated = LeafRFM("laplace", cfg).fit(X[rep], y[rep], Xv[rep_v], yv[rep_v])
    assert weighted.is_constant and repeated.is_constant
    torch.testing.assert_close(weighted.offset_, repeated.offset_)  # the weighted mean


def test_weights_steer_what_the_leaf_learns():
    # two regimes: y = sin(2 x0) where x2 > 0, y = sin(2 x1) elsewhere; weighting the first
    # 100:1 makes the learned M single out x0, the opposite weighting x1
    X, _ = planted(1200, d=4, seed=7, dtype=torch.float64)
    y = torch.where(X[:, 2] > 0, torch.sin(2 * X[:, 0]), torch.sin(2 * X[:, 1]))
    first = torch.where(X[:, 2] > 0, 1.0, 0.01).double()
    cfg = LeafConfig.plain(n_iters=3)
    diag = {}
    for name, w in (("first", first), ("second", 1.0101 - first)):
        leaf = LeafRFM("laplace", cfg).fit(X[:1000], y[:1000], sample_weight=w[:1000])
        diag[name] = leaf.M
    assert diag["first"][0] > 3 * diag["first"][1]
    assert diag["second"][1] > 3 * diag["second"][0]


def test_bad_weights_are_refused_by_name():
    X, y = planted(50, d=3)
    leaf = LeafRFM("laplace", LeafConfig.plain(n_iters=1))
    for w, match in (
        (-torch.ones(50), "non-negative; index 0"),
        (torch.zeros(50), "zero for every row"),
        (torch.full((50,), float("nan")), "non-finite"),
        (torch.ones(49), r"shape \(50,\)"),
        (torch.ones(50, 1), r"shape \(50,\)"),
    ):
        with pytest.raises(ValueError, match=match):
            leaf.fit(X, y, sample_weight=w)
    with pytest.raises(TypeError, match="real numbers"):
        leaf.fit(X, y, sample_weight=torch.ones(50, dtype=torch.bool))
