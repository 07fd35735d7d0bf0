"""The batched-steps probe (tools/batched_steps.py) computes the leaves' own RFM steps."""

from __future__ import annotations

import pytest
import torch

from tools.batched_steps import batched_step
from tools.host_reads import HostReads
from xrfm_torch import LaplaceKernel, LeafConfig
from xrfm_torch.leaf.iteration import rfm_step
from xrfm_torch.numerics.solvers import krr_workspace


def leaves(B: int, n: int = 70, m: int = 25, d: int = 5, c: int = 2, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(B, n, d, generator=g, dtype=torch.float64)
    Xv = torch.randn(B, m, d, generator=g, dtype=torch.float64)
    coef = torch.randn(d, c, generator=g, dtype=torch.float64)
    y, yv = torch.sin(X @ coef), torch.sin(Xv @ coef)
    A = torch.randn(B, d, d, generator=g, dtype=torch.float64) / 2
    S = A @ A.mT + 0.3 * torch.eye(d, dtype=torch.float64)  # a sqrt(M) per leaf (symmetric PSD)
    return X, y, Xv, yv, S


@pytest.mark.parametrize("linear_mix", [0.1, 0.0])
def test_batched_step_is_each_leafs_rfm_step(linear_mix):
    X, y, Xv, yv, S = leaves(3)
    cfg = LeafConfig(linear_mix=linear_mix)
    bandwidth = torch.tensor([2.0, 3.5, 5.0], dtype=torch.float64)
    scalars, alpha, err, G = batched_step(X, y, Xv, yv, S, bandwidth, cfg, 1.0, LaplaceKernel().eps)
    n = X.shape[1]
    for b in range(3):
        kernel = LaplaceKernel(bandwidth=float(bandwidth[b])).double()
        buffers = (X.new_empty(n, n), X.new_empty(n, n), krr_workspace(n, X.dtype, X.device))
        cand, G_b, _ = rfm_step(
            kernel,
            X[b],
            y[b],
            Xv[b],
            yv[b],
            S[b],
            buffers,
            cfg,
            agop=True,
            diag=False,
            generator=None,
        )
        assert float(err[b]) == pytest.approx(cand.err, rel=1e-9)
        torch.testing.assert_close(alpha[b], cand.alpha, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(G[b], G_b, rtol=1e-8, atol=1e-12)
        assert scalars[b] == float(err[b]) and scalars[3 + b] == float(G[b].max())
    assert scalars[6:] == [0.0, 0.0, 0.0]  # no failed or useless solve


def test_batched_step_costs_the_same_operations_for_any_number_of_leaves():
    counts = []
    for B in (2, 5):
        X, y, Xv, yv, S = leaves(B)
        bw = torch.full((B,), 3.0, dtype=torch.float64)
        mode = HostReads()
        with mode:
            batched_step(X, y, Xv, yv, S, bw, LeafConfig(), 1.0, LaplaceKernel().eps)
        counts.append(mode.computed)
    assert counts[0] == counts[1]
