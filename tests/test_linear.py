"""The constant + linear part of the leaf kernel (``linear_mix``)."""

from __future__ import annotations

import pytest
import torch
from sklearn.kernel_ridge import KernelRidge

from conftest import plain_leaf, planted
from xrfm_torch import LaplaceKernel
from xrfm_torch.kernels.linear import linear_features, linear_grad, linear_weights, weights_grad
from xrfm_torch.numerics.agop import normalize_agop
from xrfm_torch.numerics.solvers import solve_krr


def laplace_gram(A: torch.Tensor, B: torch.Tensor, L: float) -> torch.Tensor:
    return torch.exp(-torch.cdist(A, B) / L)


def test_solve_with_features_is_the_low_rank_updated_system():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(90, 3, generator=g, dtype=torch.float64)
    K, U = laplace_gram(X, X, 2.0), torch.randn(90, 4, generator=g, dtype=torch.float64)
    y = torch.randn(90, 2, generator=g, dtype=torch.float64)
    exact = torch.linalg.solve(K + U @ U.T + 1e-2 * torch.eye(90, dtype=torch.float64), y)
    torch.testing.assert_close(solve_krr(K, y, 1e-2, features=U), exact)
    K0 = K.clone()
    solve_krr(K.float(), y.float(), 1e-2, features=U.float())
    assert torch.equal(K, K0)  # the low-rank part goes into the factored copy only
    with pytest.raises(ValueError, match="features must have shape"):
        solve_krr(K, y, 1e-2, features=U[:5])


def test_linear_mix_leaf_is_kernel_ridge_with_the_summed_kernel():
    X, y = planted(300, d=4, dtype=torch.float64)
    Xt, _ = planted(60, d=4, seed=3, dtype=torch.float64)
    L, reg, c = 3.0, 1e-2, 0.5
    leaf = plain_leaf(LaplaceKernel(bandwidth=L), n_iters=0, reg=reg, linear_mix=c)
    leaf.fit(X, y, Xt, torch.zeros(60, dtype=torch.float64))

    def gram(A: torch.Tensor, B: torch.Tensor) -> torch.Tensor:
        return laplace_gram(A, B, L) + c * (1.0 + A @ B.T / A.shape[1])

    ref = KernelRidge(alpha=reg, kernel="precomputed").fit(gram(X, X).numpy(), y.numpy())
    expected = torch.from_numpy(ref.predict(gram(Xt, X).numpy()))
    torch.testing.assert_close(leaf(Xt)[:, 0], expected, rtol=1e-6, atol=1e-7)
    U = linear_features(X, c)  # the rank-(d + 1) factor of the linear part
    torch.testing.assert_close(U @ U.T, c * (1.0 + X @ X.T / 4))


@pytest.mark.parametrize("diag", [True, False])
def test_gradients_include_the_linear_part(diag):
    X, y = planted(300, d=4, dtype=torch.float64)
    leaf = plain_leaf(LaplaceKernel(2.0), n_iters=1, diag=diag, linear_mix=0.3).fit(
        X[:250], y[:250], X[250:], y[250:]
    )
    Xq = X[250:256]  # not support points (the Laplace kernel has a kink there)
    jac = torch.func.vmap(torch.func.jacrev(lambda x: leaf(x[None])[0]))(Xq)  # (n, c, d)
    torch.testing.assert_close(leaf.input_grads(Xq), jac)
    plain = plain_leaf(LaplaceKernel(2.0), n_iters=1, diag=diag).fit(
        X[:250], y[:250], X[250:], y[250:]
    )
    assert not torch.allclose(plain.input_grads(Xq), leaf.input_grads(Xq), atol=1e-3)


def test_iterations_learn_m_from_the_agop_of_the_summed_kernel():
    X, y = planted(400, d=5, dtype=torch.float64)
    args = {"reg": 1e-3, "diag": False, "linear_mix": 1.0, "early_stop_multiplier": None}
    first = plain_leaf(LaplaceKernel(3.0), n_iters=0, **args).fit(
        X[:320], y[:320], X[320:], y[320:]
    )
    second = plain_leaf(LaplaceKernel(3.0), n_iters=1, **args).fit(
        X[:320], y[:320], X[320:], y[320:]
    )
    assert int(second.best_iter_) == 1  # the planted target gains from the learned M
    torch.testing.assert_close(second.M, normalize_agop(first.agop()), rtol=1e-6, atol=1e-9)


def test_linear_mix_extrapolates_a_linear_trend():
    g = torch.Generator().manual_seed(1)
    X = torch.rand(400, 3, generator=g, dtype=torch.float64) * 2 - 1  # inside [-1, 1]^3
    w = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    y = X @ w + 0.3 * torch.sin(3 * X[:, 0])
    Xfar = torch.rand(50, 3, generator=g, dtype=torch.float64) * 2 + 2  # outside, in [2, 4]^3
    yfar = Xfar @ w + 0.3 * torch.sin(3 * Xfar[:, 0])

    def far_rmse(c: float) -> float:
        leaf = plain_leaf(LaplaceKernel(1.0), n_iters=0, reg=1e-3, linear_mix=c)
        leaf.fit(X[:320], y[:320], X[320:], y[320:])
        return float(((leaf(Xfar)[:, 0] - yfar) ** 2).mean().sqrt())

    # the kernel alone decays towards 0 far away; the linear part carries the trend on
    assert far_rmse(1.0) < 0.4 * far_rmse(0.0)


def test_linear_mix_must_be_non_negative():
    with pytest.raises(ValueError, match="linear_mix"):
        plain_leaf(linear_mix=-0.1)


def test_linear_weights_give_the_linear_parts_prediction_and_its_gradient():
    g = torch.Generator().manual_seed(0)
    zs, alpha, xs = (
        torch.randn(30, 5, generator=g),
        torch.randn(30, 2, generator=g),
        torch.randn(4, 5, generator=g),
    )
    c = 0.7
    U = linear_features(zs, c)
    v = linear_weights(U, alpha)  # (d + 1, c_out)
    torch.testing.assert_close(linear_features(xs, c) @ v, linear_features(xs, c) @ U.mT @ alpha)
    jac = torch.func.vmap(torch.func.jacrev(lambda x: (linear_features(x[None], c) @ v)[0]))(xs)
    torch.testing.assert_close(weights_grad(v, c).expand(4, -1, -1), jac)  # (n, c_out, d)
    assert torch.equal(weights_grad(v, c), linear_grad(zs, alpha, c))
    assert linear_grad(zs, alpha, 0.0) is None
