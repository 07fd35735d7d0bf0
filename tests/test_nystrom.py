"""Approximate final solves: Nyström, centroids, random Fourier features (LeafConfig.approx_above)."""

from __future__ import annotations

import math

import pytest
import torch

from xrfm_torch import LeafConfig, LeafRFM
from xrfm_torch.kernels import Kernel, transform
from xrfm_torch.kernels.fourier import fourier_features, fourier_frequencies, positive_stable
from xrfm_torch.kernels.linear import linear_features
from xrfm_torch.leaf.approx import kmeans_centres
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


def _centre_system(leaf, X, C):
    """``(k_tot(X, C), k_tot(C, C))`` of a leaf's learned kernel plus its linear part, by hand."""
    xs, cs = transform(X, leaf.sqrt_m_), transform(C, leaf.sqrt_m_)
    c = leaf.config.linear_mix

    def k_tot(a, b):
        K = leaf.kernel.from_distance(leaf.kernel.distance(a, b))
        return K + linear_features(a, c) @ linear_features(b, c).T

    return k_tot(xs, cs), k_tot(cs, cs)


def _leaf(X, y, Xv, yv, generator, **cfg):
    config = LeafConfig(n_iters=1, iter_rows=100, kernel_exponents=None, **cfg)
    return LeafRFM("laplace", config).fit(X, y, Xv, yv, generator=generator)


def test_leaf_final_solve_above_approx_rows_keeps_its_iteration_rows_as_centres(generator):
    X = torch.randn(400, 3, generator=generator, dtype=torch.float64)
    y = torch.sin(2 * X[:, 0]) + X[:, 1]
    Xv = torch.randn(80, 3, generator=generator, dtype=torch.float64)
    yv = torch.sin(2 * Xv[:, 0]) + Xv[:, 1]
    g_state = generator.get_state()
    leaf = _leaf(X, y, Xv, yv, generator, approx_above=150)
    generator.set_state(g_state)
    exact = _leaf(X, y, Xv, yv, generator)
    C = leaf.support_
    assert C.shape[0] == 100 and exact.support_.shape[0] == 400
    assert float(torch.cdist(C, X).min(1).values.max()) < 1e-6  # the centres are training rows
    # the weights solve the Nyström system of the leaf's learned kernel (plus its linear part)
    Phi, K_cc = _centre_system(leaf, X, C)
    w = solve_nystrom(Phi, K_cc, y, float(leaf.reg_))
    torch.testing.assert_close(leaf.alpha_, w, rtol=1e-10, atol=1e-12)
    Xq = torch.randn(50, 3, generator=generator, dtype=torch.float64)
    torch.testing.assert_close(leaf(Xq), _centre_system(leaf, Xq, C)[0] @ w)
    # same M and ridge as the exact leaf: only the final solve differs
    torch.testing.assert_close(leaf.sqrt_m_, exact.sqrt_m_)


def test_leaf_with_a_kept_factor_solves_exactly(generator):
    X = torch.randn(400, 3, generator=generator, dtype=torch.float64)
    y = X[:, 0].sin()
    leaf = LeafRFM("laplace", LeafConfig(n_iters=1, iter_rows=100, approx_above=150))
    leaf.keep_factor = True  # a leaf with a posterior needs the exact GP solve
    leaf.fit(X, y, X[:50], y[:50], generator=generator)
    assert leaf.support_.shape[0] == 400


def _data(generator, n=400, d=3):
    X = torch.randn(n, d, generator=generator, dtype=torch.float64)
    Xv = torch.randn(80, d, generator=generator, dtype=torch.float64)
    f = lambda A: torch.sin(2 * A[:, 0]) + A[:, 1]  # noqa: E731
    return X, f(X), Xv, f(Xv)


def test_positive_stable_draws_have_the_stable_laplace_transform():
    g = torch.Generator().manual_seed(0)
    for alpha in (0.35, 0.5, 0.75):
        s = positive_stable(alpha, 200_000, generator=g)
        for t in (0.3, 1.0, 3.0):
            # E[exp(-t S)] = exp(-t^alpha); Monte Carlo error ~ 1e-3
            assert abs(float(torch.exp(-t * s).mean()) - math.exp(-(t**alpha))) < 5e-3
    assert torch.equal(positive_stable(1.0, 5, generator=g), torch.ones(5, dtype=torch.float64))
    with pytest.raises(ValueError, match="alpha"):
        positive_stable(1.5, 5)


@pytest.mark.parametrize("q", [0.7, 1.0, 1.5, 2.0])
def test_fourier_features_approximate_the_lpq_kernel(q):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(6, 4, generator=g, dtype=torch.float64)
    z = torch.randn(6, 4, generator=g, dtype=torch.float64)
    w, b = fourier_frequencies(4, 200_000, q, 2.0, generator=g, dtype=torch.float64)
    approx = (fourier_features(x, w, b) * fourier_features(z, w, b)).sum(1)
    exact = Kernel(2.0, p=2.0, q=q)(x, z).diagonal()
    assert float((approx - exact).abs().max()) < 0.015  # ~ 3 / sqrt(D)
    with pytest.raises(ValueError, match="q"):
        fourier_frequencies(4, 10, 2.5, 1.0)


def test_fourier_leaf_solves_ridge_on_its_features_and_predicts_with_them(generator):
    X, y, Xv, yv = _data(generator)
    leaf = _leaf(X, y, Xv, yv, generator, approx_above=150, approx="fourier", fourier_features=512)
    assert leaf.approximation == "fourier" and leaf.fourier_w_.shape == (3, 512)
    c = leaf.config.linear_mix
    xs = transform(X, leaf.sqrt_m_)
    F = torch.cat(
        [fourier_features(xs, leaf.fourier_w_, leaf.fourier_b_), linear_features(xs, c)], 1
    )
    # the normal equations of ||F w - y||^2 + reg ||w||^2
    grad = F.T @ (F @ leaf.alpha_ - y[:, None]) + float(leaf.reg_) * leaf.alpha_
    assert float(grad.abs().max()) < 1e-8 * float((F.T @ y).abs().max())
    Xq = torch.randn(30, 3, generator=generator, dtype=torch.float64)
    xq = transform(Xq, leaf.sqrt_m_)
    Fq = torch.cat(
        [fourier_features(xq, leaf.fourier_w_, leaf.fourier_b_), linear_features(xq, c)], 1
    )
    torch.testing.assert_close(leaf(Xq), Fq @ leaf.alpha_)
    # analytic input gradients against autograd
    jac = torch.func.vmap(torch.func.jacrev(lambda r: leaf(r[None])[0]))(Xq)
    torch.testing.assert_close(leaf.input_grads(Xq), jac)
    # a state dict restores it in a fresh leaf (frequencies are buffers)
    fresh = LeafRFM("laplace", leaf.config)
    fresh.load_state_dict(leaf.state_dict())
    torch.testing.assert_close(fresh(Xq), leaf(Xq), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="approximate"):
        leaf.fit_posterior()


def test_fourier_leaf_approaches_the_exact_leaf_as_features_grow(generator):
    X, y, Xv, yv = _data(generator, n=600)
    state = generator.get_state()
    exact = _leaf(X, y, Xv, yv, generator)
    Xq = torch.randn(200, 3, generator=generator, dtype=torch.float64)
    gaps = []
    for D in (64, 4096):
        generator.set_state(state)
        leaf = _leaf(
            X, y, Xv, yv, generator, approx_above=150, approx="fourier", fourier_features=D
        )
        gaps.append(float((leaf(Xq) - exact(Xq)).pow(2).mean().sqrt()))
    assert gaps[1] < 0.5 * gaps[0]
    assert gaps[1] < 0.1 * float(y.std())


def test_fourier_leaf_refuses_a_non_euclidean_kernel(generator):
    X, y, Xv, yv = _data(generator)
    cfg = LeafConfig(n_iters=1, iter_rows=100, kernel_exponents=None)
    leaf = LeafRFM("product_laplace", cfg.replace(approx_above=150, approx="fourier"))
    with pytest.raises(ValueError, match="p=2"):
        leaf.fit(X, y, Xv, yv, generator=generator)


def test_centroid_leaf_is_the_least_squares_fit_on_its_centres(generator):
    X, y, Xv, yv = _data(generator)
    leaf = _leaf(X, y, Xv, yv, generator, approx_above=150, approx="centroids")
    assert leaf.approximation == "centroids" and leaf.support_.shape[0] == 100
    Phi = _centre_system(leaf, X, leaf.support_)[0]
    # the pseudoinverse's fit (the fitted values are what is well conditioned)
    want = Phi @ (torch.linalg.pinv(Phi, rtol=1e-6) @ y[:, None])
    torch.testing.assert_close(Phi @ leaf.alpha_, want, rtol=1e-6, atol=1e-8)
    # least squares: its residual is orthogonal to the features' leading singular directions
    U, S, _ = torch.linalg.svd(Phi, full_matrices=False)
    keep = 1e-6 * S[0] < S
    r = y[:, None] - Phi @ leaf.alpha_
    assert float((U[:, keep].T @ r).abs().max()) < 1e-6 * float(y.abs().max())


def test_kmeans_centres_find_planted_clusters():
    g = torch.Generator().manual_seed(3)
    means = torch.tensor([[0.0, 0.0], [10.0, 0.0], [0.0, 10.0]], dtype=torch.float64)
    X = torch.cat([m + 0.3 * torch.randn(50, 2, generator=g, dtype=torch.float64) for m in means])
    start = X[[0, 50, 100]] + 1.0
    centres = kmeans_centres(X, start, None)
    want = torch.stack([X[i * 50 : (i + 1) * 50].mean(0) for i in range(3)])
    torch.testing.assert_close(centres, want)
    # in a learned space that ignores the second column, the split is along the first one
    centres = kmeans_centres(X, X[[0, 50]], torch.tensor([1.0, 0.0], dtype=torch.float64))
    far = X[:, 0] > 5
    torch.testing.assert_close(centres, torch.stack([X[~far].mean(0), X[far].mean(0)]))


def test_kmeans_centres_serve_a_nystrom_leaf(generator):
    X, y, Xv, yv = _data(generator)
    leaf = _leaf(X, y, Xv, yv, generator, approx_above=150, approx_centres="kmeans")
    assert leaf.approximation == "nystrom"
    C = leaf.support_
    # means of the rows nearest them: only a centre left with a single row is a training row
    assert float((torch.cdist(C, X).min(1).values > 1e-9).double().mean()) > 0.5
    Phi, K_cc = _centre_system(leaf, X, C)
    torch.testing.assert_close(leaf.alpha_, solve_nystrom(Phi, K_cc, y, float(leaf.reg_)))
