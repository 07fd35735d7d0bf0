from __future__ import annotations

import pytest
import torch
from torch.func import jacrev

from conftest import plain_leaf, planted
from xrfm_torch import LeafConfig
from xrfm_torch.kernels import LaplaceKernel
from xrfm_torch.numerics.agop import agop_from_grads, normalize_agop, sqrt_psd, top_eigenvector


def grads(seed=0):
    return torch.randn(40, 3, 6, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def test_agop_formula():
    g = grads()
    expected = sum(g[i, c][:, None] @ g[i, c][None, :] for i in range(40) for c in range(3)) / 40
    torch.testing.assert_close(agop_from_grads(g), expected)


def test_diag_equals_diagonal_of_full():
    g = grads(1)
    torch.testing.assert_close(agop_from_grads(g, diag=True), agop_from_grads(g).diagonal())


def test_normalized_max_entry():
    G = agop_from_grads(grads(2))
    eps = 0.25
    top = float(G.max())
    M = normalize_agop(G, eps)
    assert abs(float(M.max()) - top / (eps + top)) < 1e-12
    torch.testing.assert_close(M, G / (eps + top))
    assert float(normalize_agop(G, 0.0).max()) == 1.0


def test_kernel_agop_matches_autograd():
    g = torch.Generator().manual_seed(3)
    Z = torch.randn(25, 4, generator=g, dtype=torch.float64)
    X = torch.randn(30, 4, generator=g, dtype=torch.float64)
    alpha = torch.randn(25, 1, generator=g, dtype=torch.float64)
    k = LaplaceKernel(bandwidth=2.0).double()
    J = torch.stack([jacrev(lambda x: k(x[None], Z)[0] @ alpha)(x) for x in X])  # (n, 1, d)
    expected = sum(J[i, 0][:, None] @ J[i, 0][None, :] for i in range(30)) / 30
    torch.testing.assert_close(agop_from_grads(k.input_grads(X, Z, alpha)), expected)


def test_sqrt_psd():
    A = torch.randn(5, 5, generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    M = A @ A.T
    S = sqrt_psd(M)
    torch.testing.assert_close(S @ S, M)
    torch.testing.assert_close(S, S.T)
    torch.testing.assert_close(
        sqrt_psd(torch.tensor([4.0, 9.0, -1e-9])), torch.tensor([2.0, 3.0, 0.0])
    )


def test_top_eigenvector_of_planted_matrix():
    v = torch.tensor([1.0, -3.0, 2.0], dtype=torch.float64) / 14**0.5
    G = 5 * v[:, None] * v[None, :] + 0.1 * torch.eye(3, dtype=torch.float64)
    top = top_eigenvector(G)
    torch.testing.assert_close(top, -v)  # sign: largest-magnitude entry positive
    assert abs(float(top.norm()) - 1) < 1e-12


def test_agop_ridge_is_the_gp_rfm_m_plus_lambda_identity():
    """``M = G / max G + lambda_M I`` (Gedon et al., GP-RFM uncertainty), in the leaf's iteration as in the function."""
    G = torch.tensor([[4.0, 2.0], [2.0, 1.0]], dtype=torch.float64)
    expected = torch.tensor([[1.3, 0.5], [0.5, 0.55]], dtype=torch.float64)
    torch.testing.assert_close(normalize_agop(G, 0.0, 0.3), expected)
    torch.testing.assert_close(normalize_agop(G.diagonal(), 0.0, 0.3), expected.diagonal())
    X, y = planted(400, d=5, dtype=torch.float64)
    args = {"reg": 1e-3, "diag": False, "early_stop_multiplier": None}
    first = plain_leaf(LaplaceKernel(3.0), n_iters=0, **args).fit(
        X[:320], y[:320], X[320:], y[320:]
    )
    second = plain_leaf(LaplaceKernel(3.0), n_iters=1, agop_ridge=0.25, **args).fit(
        X[:320], y[:320], X[320:], y[320:]
    )
    assert int(second.best_iter_) == 1
    G0 = first.agop()
    torch.testing.assert_close(
        second.M, G0 / G0.max() + 0.25 * torch.eye(5, dtype=torch.float64), rtol=1e-6, atol=1e-9
    )
    assert float(torch.linalg.eigvalsh(second.M).min()) >= 0.25 - 1e-9
    with pytest.raises(ValueError, match="agop_ridge"):
        LeafConfig(agop_ridge=-1.0)


def test_sqrt_psd_retries_a_failed_float32_eigh_in_float64(monkeypatch):
    # LAPACK can fail to converge in float32 on a run of repeated eigenvalues (duplicated input
    # columns); the square root is then taken in float64 and cast back
    g = torch.Generator().manual_seed(0)
    A = torch.randn(6, 3, generator=g)
    M = torch.cat([A, A], 1).T @ torch.cat([A, A], 1)  # (6, 6), rank 3: three zero eigenvalues
    eigh = torch.linalg.eigh
    seen = []

    def flaky(S):
        seen.append(S.dtype)
        if S.dtype == torch.float32:
            raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")
        return eigh(S)

    monkeypatch.setattr(torch.linalg, "eigh", flaky)
    S = sqrt_psd(M)
    assert seen == [torch.float32, torch.float64] and S.dtype == torch.float32
    torch.testing.assert_close(S @ S, M, atol=1e-4, rtol=1e-4)
    with pytest.raises(torch.linalg.LinAlgError):
        sqrt_psd(M.double() * float("nan"))  # float64 failures are not hidden
