from __future__ import annotations

import logging

import pytest
import torch
from sklearn.kernel_ridge import KernelRidge

from xrfm_torch.kernels import LaplaceKernel
from xrfm_torch.numerics.solvers import (
    KRRSolveError,
    _residual_too_large,
    first_krr_solve,
    krr_workspace,
    padded_size,
    solve_krr,
)
from xrfm_torch.numerics.warm_solves import pcg_krr, solve_bordered


def gram(n=80, d=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    return LaplaceKernel(bandwidth=2.0).double()(X, X), torch.randn(
        n, 3, generator=g, dtype=torch.float64
    )


@pytest.mark.parametrize("reg", [pytest.param(1e-3, id="reg1e-3"), pytest.param(0.5, id="reg0.5")])
@pytest.mark.parametrize("outputs", [pytest.param(1, id="single"), pytest.param(3, id="multi")])
@pytest.mark.parametrize("n", [80, 83])  # 83: the factorization runs on a padded 88 x 88 matrix
def test_matches_sklearn_kernel_ridge(reg, outputs, n):
    K, Y = gram(n)
    y = Y[:, 0] if outputs == 1 else Y
    ours = solve_krr(K, y, reg)
    ref = KernelRidge(alpha=reg, kernel="precomputed").fit(K.numpy(), y.numpy()).dual_coef_
    torch.testing.assert_close(ours, torch.from_numpy(ref), rtol=0, atol=1e-8)
    assert ours.shape == y.shape


def test_matrix_unchanged_and_workspace_reused():
    K, Y = gram(83)
    before = K.clone()
    W = krr_workspace(83, torch.float64)
    assert W.shape == (padded_size(83), padded_size(83)) == (88, 88) and W.stride(0) == 1
    W.fill_(float("nan"))  # stale contents must not leak into the solve
    a = solve_krr(K, Y, 1e-2, workspace=W)
    b = solve_krr(K[:40, :40], Y[:40], 1e-2, workspace=W)  # wrong size: a fresh buffer is used
    assert torch.equal(K, before)
    torch.testing.assert_close(a, solve_krr(K, Y, 1e-2), rtol=0, atol=1e-12)
    torch.testing.assert_close(b, torch.linalg.solve(K[:40, :40] + 1e-2 * torch.eye(40), Y[:40]))


def test_autograd_path_matches_gradcheck():
    K, Y = gram(12)
    K.requires_grad_(True)
    y = Y[:, 0].clone().requires_grad_(True)
    torch.autograd.gradcheck(lambda k, t: solve_krr(0.5 * (k + k.mT), t, 1e-2), (K, y))


def test_float64_solve_of_float32_system():
    K, Y = gram()
    alpha = solve_krr(K.float(), Y.float(), 1e-3, solve_dtype=torch.float64)
    assert alpha.dtype == torch.float32
    torch.testing.assert_close(alpha.double(), solve_krr(K, Y, 1e-3), rtol=1e-4, atol=1e-3)


def test_jitter_retry_on_singular_matrix(caplog):
    v = torch.randn(50, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    K = v @ v.T  # rank 2: Cholesky with reg=0 fails
    y = torch.randn(50, dtype=torch.float64)
    with caplog.at_level(logging.DEBUG):
        alpha = solve_krr(K, y, 0.0)
    assert "jitter" in caplog.text
    assert torch.isfinite(alpha).all()


def test_indefinite_matrix_raises_clear_error():
    K = -torch.eye(5, dtype=torch.float64)
    with pytest.raises(KRRSolveError, match="Cholesky of K \\+ reg\\*I failed for n=5"):
        solve_krr(K, torch.ones(5, dtype=torch.float64), 1e-3, max_tries=2)


@pytest.mark.parametrize(
    ("K", "y", "match"),
    [
        (torch.ones(3, 4), torch.ones(3), "K must be square"),
        (torch.eye(3), torch.ones(4), "y has 4 rows"),
    ],
)
def test_bad_shapes(K, y, match):
    with pytest.raises(ValueError, match=match):
        solve_krr(K, y, 1e-3)


def test_negative_reg_rejected():
    with pytest.raises(ValueError, match="reg"):
        solve_krr(torch.eye(3), torch.ones(3), -1.0)


def test_residual_bound_flags_a_wrong_solution_only():
    K, Y = gram(83)
    exact = torch.linalg.solve(K + 1e-3 * torch.eye(83, dtype=K.dtype), Y)
    assert not _residual_too_large(K, exact, Y)
    assert not _residual_too_large(K, torch.zeros_like(exact), Y)  # alpha = 0 meets the bound
    assert _residual_too_large(K, 3 * exact, Y)
    assert _residual_too_large(K, exact * float("nan"), Y)


def test_float32_solve_failing_the_residual_bound_is_repeated_in_float64(monkeypatch, caplog):
    K, Y = gram(83)
    calls = []

    def flag_first(K_, alpha, b, U=None, w=None):
        calls.append(alpha.dtype)
        return torch.tensor(len(calls) == 1)

    monkeypatch.setattr("xrfm_torch.numerics.solvers._residual_too_large", flag_first)
    with caplog.at_level(logging.DEBUG):
        alpha = solve_krr(K.float(), Y.float(), 1e-3)
    assert calls == [torch.float32]  # the float64 repeat is not checked again
    assert "repeating it in float64" in caplog.text and alpha.dtype == torch.float32
    torch.testing.assert_close(alpha.double(), solve_krr(K, Y, 1e-3), rtol=0, atol=1e-5)


def factor_of(K, reg, U=None):
    """The workspace a Cholesky solve of ``K + U U^T + reg I`` leaves behind (padded factor)."""
    W = krr_workspace(K.shape[0], K.dtype)
    solve_krr(K, torch.ones(K.shape[0], 1, dtype=K.dtype), reg, workspace=W, features=U)
    return W


@pytest.mark.parametrize("with_features", [False, True])
def test_pcg_from_a_nearby_factor_matches_the_direct_solve(with_features):
    _, Y = gram(83)
    g = torch.Generator().manual_seed(1)
    X = torch.randn(83, 4, generator=g, dtype=torch.float64)
    K0 = LaplaceKernel(bandwidth=2.0).double()(X, X)  # padded factor: 88 x 88
    K1 = LaplaceKernel(bandwidth=2.1).double()(X, X)  # the next iteration's, nearby
    U = 0.3 * X if with_features else None
    A = K1 + 1e-2 * torch.eye(83) + (U @ U.mT if U is not None else 0)
    alpha = pcg_krr(K1, Y, 1e-2, factor_of(K0, 1e-2, U), features=U, tol=1e-8, max_iters=40)
    assert alpha is not None
    res = (Y - A @ alpha).norm(dim=0) / Y.norm(dim=0)
    assert float(res.max()) <= 1e-8
    torch.testing.assert_close(alpha, torch.linalg.solve(A, Y), rtol=0, atol=1e-6)


def test_pcg_gives_up_with_a_poor_preconditioner_or_mismatched_dtype():
    g = torch.Generator().manual_seed(2)
    X = torch.randn(200, 4, generator=g, dtype=torch.float64)
    K = LaplaceKernel(bandwidth=2.0).double()(X, X)
    y = torch.randn(200, 1, generator=g, dtype=torch.float64)
    far = factor_of(torch.zeros_like(K), 1.0)  # the identity: plain CG on a system of cond ~1e3
    assert pcg_krr(K, y, 1e-3, far, tol=1e-6, max_iters=5) is None
    own = factor_of(K, 1e-3)
    assert pcg_krr(K.float(), y.float(), 1e-3, own) is None  # factor in another dtype
    # with its own factor the preconditioned start is the solution already
    torch.testing.assert_close(
        pcg_krr(K, y, 1e-3, own, tol=1e-8), torch.linalg.solve(K + 1e-3 * torch.eye(200), y)
    )


@pytest.mark.parametrize("with_features", [False, True])
def test_bordered_solve_continues_the_factor_exactly(with_features):
    g = torch.Generator().manual_seed(3)
    X = torch.randn(90, 4, generator=g, dtype=torch.float64)
    y = torch.randn(90, 2, generator=g, dtype=torch.float64)
    K = LaplaceKernel(bandwidth=2.0).double()(X, X)
    U = 0.3 * X if with_features else None
    n = 77  # S: the first 77 rows (factor padded to 80), B: the last 13
    F = factor_of(K[:n, :n], 1e-2, None if U is None else U[:n])
    alpha = solve_bordered(F, K[:n, :n], K[:n, n:], K[n:, n:], y, 1e-2, features=U)
    A = K + 1e-2 * torch.eye(90) + (U @ U.mT if U is not None else 0)
    torch.testing.assert_close(alpha, torch.linalg.solve(A, y), rtol=1e-6, atol=1e-7)


def test_a_jittered_or_repeated_solve_marks_its_factor_unusable(caplog):
    K, Y = gram(40)
    W = krr_workspace(40, torch.float64)
    solve_krr(K, Y, 1e-2, workspace=W)
    assert bool(W[0, 0].isfinite())  # a clean factor of K + reg I: reusable
    # the leading block of a Cholesky factor is the factor of the leading block
    torch.testing.assert_close(
        solve_bordered(W, K[:30, :30], K[:30, 30:], K[30:, 30:], Y, 1e-2),
        torch.linalg.solve(K + 1e-2 * torch.eye(40), Y),
    )
    singular = torch.ones(40, 40, dtype=torch.float64)  # rank one: reg 0 fails, jitter succeeds
    with caplog.at_level(logging.DEBUG, logger="xrfm_torch.numerics.solvers"):
        solve_krr(singular, Y, 0.0, workspace=W)
    assert "jitter" in caplog.text
    assert bool(W[0, 0].isnan())
    Kb = torch.ones(40, 3, dtype=torch.float64)
    Yb = torch.cat([Y, Y[:3]])
    assert solve_bordered(W, singular, Kb, torch.ones(3, 3, dtype=torch.float64), Yb, 0.0) is None
    assert pcg_krr(singular, Y, 0.0, W) is None


def test_the_first_attempt_leaves_its_check_on_the_device():
    K = gram(90)[0].float()
    y = torch.randn(90, 2, generator=torch.Generator().manual_seed(1))
    W1, W2 = krr_workspace(90), krr_workspace(90)
    alpha, unsure = first_krr_solve(K, y, 1e-3, workspace=W1)
    assert unsure.dtype == torch.bool and unsure.ndim == 0 and not bool(unsure)
    # where it holds, it is solve_krr's answer and leaves the same factor behind
    torch.testing.assert_close(alpha, solve_krr(K, y, 1e-3, workspace=W2), rtol=0, atol=0)
    torch.testing.assert_close(W1, W2, rtol=0, atol=0)
    # an indefinite system fails the factorization (solve_krr would add jitter)
    bad = K - 2 * torch.eye(90)
    assert bool(first_krr_solve(bad, y, 0.0)[1])
    with pytest.raises(KRRSolveError):
        solve_krr(bad, y, 0.0, max_tries=1)


def test_the_first_attempt_flags_a_float32_solve_above_the_residual_bound(monkeypatch):
    K, Y = gram(83)
    monkeypatch.setattr(
        "xrfm_torch.numerics.solvers._residual_too_large", lambda *a: torch.tensor(True)
    )
    assert bool(first_krr_solve(K.float(), Y.float(), 1e-3)[1])  # solve_krr: float64 repeat
    assert not bool(first_krr_solve(K, Y, 1e-3)[1])  # float64 solves are not checked


@pytest.mark.parametrize(("t", "too_large"), [(0.49, False), (0.51, True)])
def test_residual_bound_sums_every_row_chunk_and_the_low_rank_part(t, too_large):
    # b = (1 - t)(K + U U^T) alpha: the residual is t (K + U U^T) alpha, above ||b|| iff t > 1/2;
    # 4200 rows span two of the bound's row chunks and the second holds most of the mass, so a
    # bound that left it (or the low-rank part) out would pass t = 0.51
    g = torch.Generator().manual_seed(0)
    n = 4200
    K = torch.eye(n)
    U = torch.randn(n, 2, generator=g)
    alpha = torch.randn(n, 1, generator=g)
    alpha[4096:] *= 100
    Ka = (K.double() + U.double() @ U.double().mT) @ alpha.double()
    b = ((1 - t) * Ka).float()
    assert bool(_residual_too_large(K, alpha, b, U)) is too_large
    assert bool(_residual_too_large(K, alpha, (1 - t) * alpha)) is too_large  # without U
