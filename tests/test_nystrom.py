"""Nyström final solves (numerics.solvers.solve_nystrom, LeafConfig.nystrom_above)."""

from __future__ import annotations

import pytest
import torch

from xrfm_torch import LeafConfig, LeafRFM
from xrfm_torch.kernels import transform
from xrfm_torch.kernels.linear import linear_features
from xrfm_torch.numerics.solvers import solve_krr, solve_nystrom


def _laplace(A, B, bandwidth=2.0):
    return torch.exp(-torch.cdist(A, B) / bandwidth)


def test_nystrom_with_every_row_as_centre_is_exact_krr(generator):
    X = torch.randn(120, 3, generator=generator, dtype=torch.float64)
    y = torch.stack([X[:, 0].sin(), X[:, 1] ** 2], 1)
    K = _laplace(X, X)
    w = solve_nystrom(K, K, y, 0.05)
    torch.testing.assert_close(w, solve_krr(K, y, 0.05), rtol=1e-6, atol=1e-8)


def test_nystrom_weights_minimize_the_restricted_ridge_objective(generator):
    X = torch.randn(300, 4, generator=generator, dtype=torch.float64)
    y = (X[:, 0] * X[:, 1]).unsqueeze(1)
    C = X[:40]
    Phi, K_cc = _laplace(X, C), _laplace(C, C)
    w = solve_nystrom(Phi, K_cc, y, 0.1)
    # the gradient of ||Phi w - y||^2 + reg w^T K_cc w vanishes at w
    grad = Phi.T @ (Phi @ w - y) + 0.1 * K_cc @ w
    assert float(grad.abs().max()) < 1e-8 * float((Phi.T @ y).abs().max())
    with pytest.raises(ValueError, match="do not match"):
        solve_nystrom(Phi, K_cc[:10, :10], y, 0.1)


def _leaf(X, y, Xv, yv, generator, **cfg):
    config = LeafConfig(n_iters=1, iter_rows=100, kernel_exponents=None, **cfg)
    return LeafRFM("laplace", config).fit(X, y, Xv, yv, generator=generator)


def test_leaf_final_solve_above_nystrom_rows_keeps_its_iteration_rows_as_centres(generator):
    X = torch.randn(400, 3, generator=generator, dtype=torch.float64)
    y = torch.sin(2 * X[:, 0]) + X[:, 1]
    Xv = torch.randn(80, 3, generator=generator, dtype=torch.float64)
    yv = torch.sin(2 * Xv[:, 0]) + Xv[:, 1]
    g_state = generator.get_state()
    leaf = _leaf(X, y, Xv, yv, generator, nystrom_above=150)
    generator.set_state(g_state)
    exact = _leaf(X, y, Xv, yv, generator)
    C = leaf.support_
    assert C.shape[0] == 100 and exact.support_.shape[0] == 400
    assert float(torch.cdist(C, X).min(1).values.max()) < 1e-6  # the centres are training rows
    # the weights solve the Nyström system of the leaf's learned kernel (plus its linear part)
    xs, cs = transform(X, leaf.sqrt_m_), transform(C, leaf.sqrt_m_)
    c = leaf.config.linear_mix
    Phi = leaf.kernel.from_distance(leaf.kernel.distance(xs, cs))
    Phi = Phi + linear_features(xs, c) @ linear_features(cs, c).T
    K_cc = leaf.kernel.from_distance(leaf.kernel.distance(cs, cs))
    K_cc = K_cc + linear_features(cs, c) @ linear_features(cs, c).T
    w = solve_nystrom(Phi, K_cc, y, float(leaf.reg_))
    torch.testing.assert_close(leaf.alpha_, w, rtol=1e-10, atol=1e-12)
    Xq = torch.randn(50, 3, generator=generator, dtype=torch.float64)
    xq = transform(Xq, leaf.sqrt_m_)
    want = leaf.kernel.from_distance(leaf.kernel.distance(xq, cs)) @ w
    want = want + linear_features(xq, c) @ (linear_features(cs, c).T @ w)
    torch.testing.assert_close(leaf(Xq), want)
    # same M and ridge as the exact leaf: only the final solve differs
    torch.testing.assert_close(leaf.sqrt_m_, exact.sqrt_m_)


def test_leaf_with_a_kept_factor_solves_exactly(generator):
    X = torch.randn(400, 3, generator=generator, dtype=torch.float64)
    y = X[:, 0].sin()
    leaf = LeafRFM("laplace", LeafConfig(n_iters=1, iter_rows=100, nystrom_above=150))
    leaf.keep_factor = True  # a leaf with a posterior needs the exact GP solve
    leaf.fit(X, y, X[:50], y[:50], generator=generator)
    assert leaf.support_.shape[0] == 400
