"""Ridge from a predicted risk (xrfm_torch.numerics.risk): GCV against its definition."""

from __future__ import annotations

import pytest
import torch

from xrfm_torch import LeafConfig, LeafRFM
from xrfm_torch.kernels import transform
from xrfm_torch.kernels.linear import features_or_none
from xrfm_torch.numerics.risk import gcv_ridge, gcv_scores, kernel_spectrum


def _laplace(X, bandwidth=2.0):
    return torch.exp(-torch.cdist(X, X) / bandwidth)


def _gcv_by_definition(K, y, lam):
    n = K.shape[0]
    H = K @ torch.linalg.inv(K + lam * torch.eye(n, dtype=K.dtype))
    R = (torch.eye(n, dtype=K.dtype) - H) @ y.reshape(n, -1)
    return float((R * R).sum() / n / (torch.trace(torch.eye(n, dtype=K.dtype) - H) / n) ** 2)


@pytest.mark.parametrize("linear", [False, True], ids=["kernel", "kernel+linear"])
def test_gcv_scores_match_the_hat_matrix_formula(generator, linear):
    X = torch.randn(80, 3, generator=generator, dtype=torch.float64)
    y = torch.stack([X[:, 0].sin(), X[:, 1] * X[:, 2]], 1)
    y = y + 0.1 * torch.randn(80, 2, generator=generator, dtype=torch.float64)
    K = _laplace(X)
    U = torch.cat([torch.ones(80, 1, dtype=X.dtype), X], 1) * 0.3 if linear else None
    lams = [1e-4, 1e-2, 0.3, 5.0]
    s, e = kernel_spectrum(K, y, U)
    got = gcv_scores(s, e, lams)
    full = K if U is None else K + U @ U.T
    want = torch.tensor([_gcv_by_definition(full, y, lam) for lam in lams], dtype=torch.float64)
    torch.testing.assert_close(got, want, rtol=1e-7, atol=0)


def test_gcv_prefers_large_ridges_for_noise_and_small_ones_for_a_smooth_signal(generator):
    X = torch.randn(150, 2, generator=generator, dtype=torch.float64)
    K = _laplace(X)
    noise = torch.randn(150, generator=generator, dtype=torch.float64)
    lam, grid, scores = gcv_ridge(K, noise, 1e-4, 10.0, n_grid=21)
    assert lam == pytest.approx(float(grid[-1]))  # nothing to fit: shrink all the way
    assert float(scores[-1]) < float(scores[0])
    smooth = X[:, 0] + 0.5 * X[:, 1]  # in the kernel's span up to a tiny residual, no noise
    lam, grid, _ = gcv_ridge(K, smooth, 1e-4, 10.0, n_grid=21)
    assert lam <= float(grid[4])
    with pytest.raises(ValueError, match="low"):
        gcv_ridge(K, smooth, 0.0, 1.0)


def test_leaf_with_gcv_rule_keeps_the_gcv_ridge_of_its_kernel(generator):
    X = torch.randn(300, 4, generator=generator, dtype=torch.float64)
    y = torch.sin(2 * X[:, 0]) + 0.3 * torch.randn(300, generator=generator, dtype=torch.float64)
    Xv = torch.randn(100, 4, generator=generator, dtype=torch.float64)
    yv = torch.sin(2 * Xv[:, 0])
    cfg = LeafConfig(n_iters=2, kernel_exponents=None, ridge_rule="gcv")
    leaf = LeafRFM("laplace", cfg).fit(X, y, Xv, yv, generator=generator)
    xs = transform(leaf.support_, leaf.sqrt_m_)
    K = leaf.kernel.from_distance(leaf.kernel.distance(xs, xs))
    want, _, _ = gcv_ridge(K, y, 1e-4, 1e-1, features=features_or_none(xs, cfg.linear_mix))
    assert float(leaf.reg_) == pytest.approx(want, rel=1e-9)
    walk = LeafRFM("laplace", cfg.replace(ridge_rule="validation")).fit(
        X, y, Xv, yv, generator=generator
    )
    assert float(walk.reg_) in {1e-4, 1e-3, 1e-2, 1e-1}  # the walk stays on its ladder
    with pytest.raises(ValueError, match="ridge_rule"):
        LeafConfig(ridge_rule="loo")


def test_auto_ridge_rule_takes_gcv_only_for_few_validation_rows(generator):
    X = torch.randn(300, 4, generator=generator, dtype=torch.float64)
    y = torch.sin(2 * X[:, 0]) + 0.05 * torch.randn(300, generator=generator, dtype=torch.float64)
    Xv = torch.randn(100, 4, generator=generator, dtype=torch.float64)
    yv = torch.sin(2 * Xv[:, 0])
    cfg = LeafConfig(n_iters=2, kernel_exponents=None)

    def reg(rule, rows, below=50):
        g = torch.Generator().manual_seed(5)
        leaf = LeafRFM("laplace", cfg.replace(ridge_rule=rule, gcv_below=below))
        return float(leaf.fit(X, y, Xv[:rows], yv[:rows], generator=g).reg_)

    assert reg("auto", 20) == reg("gcv", 20)  # 20 validation rows < 50: GCV
    assert reg("auto", 100) == reg("validation", 100)
    assert reg("gcv", 20) != reg("validation", 20)  # (so the two rules differ here)
    with pytest.raises(ValueError, match="gcv_below"):
        LeafConfig(gcv_below=-1)
