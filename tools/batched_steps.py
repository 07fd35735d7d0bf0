"""A tree's leaves' RFM steps one by one against one batched step: operations, time, agreement.

The probe behind the lockstep lead (docs/design.md, "A step makes each of its parts once"): on
a GPU a fit costs the host some 20 us per operation, and a step's ~110 operations are the same
for a leaf of 500 rows as of 5000. A tree's median splits give its leaves (nearly) equal row
counts, so ``B`` leaves' steps can run as one step on (B, n, n) batches: the same operations
for all of them, and one read back. This probe cuts a table's training rows into ``B`` equal
leaves (and its validation rows into ``B`` equal parts), takes each leaf's ``t = 0`` step with
:func:`~xrfm_torch.leaf.iteration.rfm_step` for a learned ``sqrt(M)`` per leaf, then the
``t = 1`` step both ways, and prints the operations dispatched (those that are not views), the
seconds (median of ``--repeats``, after a warm-up) and how far the batched results are from
the one-by-one ones::

    python -m tools.batched_steps --table reg_num/house_16H --data-dir DIR --leaves 8
    python -m tools.batched_steps --table reg_num/house_16H --data-dir DIR --device cuda

The batched step is the default leaf's exact step (full ``M``, Laplace-type kernel with
``p = 2``, constant + linear part, one float32 Cholesky, the residual bound, MSE, the AGOP
without self-terms). It is a measurement, not a fit path: no warm solves, weights, retries.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from bench.common import DATASETS
from tools.host_reads import counting
from xrfm_torch.kernels import LaplaceKernel
from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.leaf.iteration import rfm_step
from xrfm_torch.numerics.agop import normalize_agop, sqrt_psd
from xrfm_torch.numerics.solvers import krr_workspace


def batched_distance(x: Tensor, z: Tensor) -> Tensor:
    """``||x_i - z_j||`` per batch, (B, n, m), as ``pairwise_distance`` makes it (snap to 0)."""
    mu = z.mean(1, keepdim=True)
    x, z = x - mu, z - mu
    c = 16 * torch.finfo(x.dtype).eps
    s = (x * x).sum(-1, keepdim=True) + (z * z).sum(-1)[:, None, :]  # |x|^2 + |z|^2
    o = torch.baddbmm(s, x, z.mT, alpha=-2.0)
    return o.masked_fill_(o <= c * s, 0.0).sqrt_()


def batched_step(
    X: Tensor,
    y: Tensor,
    Xv: Tensor,
    yv: Tensor,
    S: Tensor,
    bandwidth: Tensor,
    cfg: LeafConfig,
    q: float,
    eps: float,
) -> tuple[list[float], Tensor, Tensor, Tensor]:
    """One exact RFM step for ``B`` leaves at once.

    Args: ``X`` (B, n, d), ``y`` (B, n, c), ``Xv`` (B, m, d), ``yv`` (B, m, c), ``S = sqrt(M)``
    (B, d, d), ``bandwidth`` (B,); the kernel ``exp(-(r / bandwidth)^q)``.

    Returns: the scalars read back together (B validation errors, B AGOP maxima, B flags of a
    failed or useless solve), ``alpha`` (B, n, c), the errors (B,) and the AGOPs (B, d, d).
    """
    B, n, d = X.shape
    c = y.shape[2]
    bw = bandwidth[:, None, None]
    xs, xv = X @ S, Xv @ S  # S symmetric
    R = batched_distance(xs, xs)
    K = torch.exp(-((R / bw) ** q))
    lm = cfg.linear_mix
    U = F.pad(xs / math.sqrt(d), (1, 0), value=1.0) * math.sqrt(lm)  # (B, n, d + 1)
    A = torch.baddbmm(K, U, U.mT)
    A.diagonal(dim1=1, dim2=2).add_(cfg.reg)
    L, info = torch.linalg.cholesky_ex(A)
    alpha = torch.cholesky_solve(y, L)
    v = U.mT @ alpha  # (B, d + 1, c)
    res = (torch.baddbmm(K @ alpha, U, v).double() - y.double()).square().sum((1, 2))
    unsure = (info != 0) | ~(res <= y.double().square().sum((1, 2)))
    Rv = batched_distance(xv, xs)
    pred = torch.baddbmm(
        torch.exp(-((Rv / bw) ** q)) @ alpha,
        F.pad(xv / math.sqrt(d), (1, 0), value=1.0) * math.sqrt(lm),
        v,
    )
    err = (pred - yv).square().sum(2).mean(1).double() / c  # (B,)
    # the AGOP: gradient weights -(q / bw^q) K r^(q - 2), no self-terms, chain rule through S
    w = K * R.pow(q - 2.0) * (-q / bw**q)
    w = w.masked_fill_(eps > R, 0.0)
    w.diagonal(dim1=1, dim2=2).zero_()
    wa = w @ alpha  # (B, n, c)
    waz = (w @ (alpha[..., None] * xs[:, :, None, :]).reshape(B, n, c * d)).reshape(B, n, c, d)
    g = xs[:, :, None, :] * wa[..., None] - waz  # (B, n, c, d) w.r.t. S x
    g = g + (math.sqrt(lm / d) * v[:, 1:].mT)[:, None]  # the linear part
    g = (g @ S.mT[:, None]).reshape(B, n * c, d)
    G = g.mT @ g / n
    scalars = torch.cat([err, G.amax((1, 2)).double(), unsure.double()]).tolist()
    return scalars, alpha, err, G


def timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """The median seconds of ``fn()`` over ``repeats`` runs after one warm-up."""
    fn()
    runs = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        runs.append(time.perf_counter() - t0)
    return statistics.median(runs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default="reg_num/house_16H")
    ap.add_argument("--data-dir", type=Path, default=DATASETS)
    ap.add_argument("--leaves", type=int, default=8)
    ap.add_argument("--rows", type=int, default=0, help="rows per leaf (0: all training rows)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    from xrfm_torch.data import prepare, read_csv

    device = torch.device(a.device)
    Xa, ya, cols = read_csv(a.data_dir / f"{a.table}.csv.gz", "target")
    data = prepare(Xa, ya, 0, feature_names=cols)
    B = a.leaves
    n = a.rows or data.X_train.shape[0] // B
    m = data.X_val.shape[0] // B

    def part(v: object, rows: int) -> Tensor:
        t = torch.as_tensor(v, dtype=torch.float32, device=device)
        t = t if t.ndim == 2 else t[:, None]
        return t[: B * rows].reshape(B, rows, -1)

    X, y = part(data.X_train, n), part(data.y_train, n)
    Xv, yv = part(data.X_val, m), part(data.y_val, m)
    cfg = LeafConfig()
    kernels = [LaplaceKernel().to(device) for _ in range(B)]
    buffers = [
        (X.new_empty(n, n), X.new_empty(n, n), krr_workspace(n, X.dtype, device)) for _ in range(B)
    ]

    def step(b: int, sqrt_m: Tensor | None) -> tuple[object, Tensor | None, bool]:
        return rfm_step(
            kernels[b],
            X[b],
            y[b],
            Xv[b],
            yv[b],
            sqrt_m,
            buffers[b],
            cfg,
            agop=True,
            diag=False,
            generator=None,
        )

    # t = 0 for each leaf: its AGOP gives the sqrt(M) that both ways use at t = 1
    S = torch.stack(
        [sqrt_psd(normalize_agop(step(b, None)[1], cfg.eps, cfg.agop_ridge)) for b in range(B)]
    )
    bandwidth = torch.stack([k.bandwidth.to(device, torch.float32) for k in kernels])
    q, eps = kernels[0].q, kernels[0].eps
    one = [step(b, S[b]) for b in range(B)]
    scalars, alpha, err, G = batched_step(X, y, Xv, yv, S, bandwidth, cfg, q, eps)
    seq_err = torch.tensor([c.err for c, _, _ in one], dtype=torch.float64)
    seq_alpha = torch.stack([c.alpha for c, _, _ in one])
    seq_G = torch.stack([g for _, g, _ in one if g is not None])

    def rel(a_: Tensor, b_: Tensor) -> float:
        return float((a_.cpu().double() - b_.cpu().double()).norm() / b_.cpu().double().norm())

    counted = {}
    for name, fn in (
        ("one by one", lambda: [step(b, S[b]) for b in range(B)]),
        ("batched", lambda: batched_step(X, y, Xv, yv, S, bandwidth, cfg, q, eps)),
    ):
        with counting() as mode:
            fn()
        counted[name] = (mode.computed, sum(mode.kinds.values()), timed(fn, device, a.repeats))
    print(
        f"{a.table}: {B} leaves of {n} rows, {m} validation rows each, d = {X.shape[2]}, {device}"
    )
    print("| steps | operations (not views) | host waits | seconds |")
    print("|---|---|---|---|")
    for name, (ops, waits, secs) in counted.items():
        print(f"| {name} | {ops} | {waits} | {secs:.4f} |")
    print(
        f"batched vs one by one: validation errors max rel diff "
        f"{float(((err.cpu() - seq_err) / seq_err).abs().max()):.2e}, alpha {rel(alpha, seq_alpha):.2e}, "
        f"AGOP {rel(G, seq_G):.2e}; flags {scalars[2 * B :]}"
    )


if __name__ == "__main__":
    main()
