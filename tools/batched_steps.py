"""A tree's leaves' RFM steps one by one against one batched step: operations, time, agreement.

The probe behind the lockstep lead (docs/design.md, "Solving"): on
a GPU a fit costs the host some 20 us per operation, and a step's ~110 operations are the same
for a leaf of 500 rows as of 5000. A tree's median splits give its leaves (nearly) equal row
counts, so ``B`` leaves' steps can run as one step on (B, n, n) batches: the same operations
for all of them, and one read back. This probe cuts a table's training rows into ``B`` equal
leaves (and its validation rows into ``B`` equal parts), takes each leaf's ``t = 0`` step with
:func:`~xrfm_torch.leaf.step.rfm_step` for a learned ``sqrt(M)`` per leaf, then the
``t = 1`` step both ways, and prints the operations dispatched (those that are not views), the
seconds (median of ``--repeats``, after a warm-up) and how far the batched results are from
the one-by-one ones::

    python -m tools.batched_steps --table reg_num/house_16H --data-dir DIR --leaves 8
    python -m tools.batched_steps --table reg_num/house_16H --data-dir DIR --device cuda

The batched step is the library's (:mod:`xrfm_torch.leaf.batched_step`, what a lockstep fit
runs on a GPU): the default leaf's exact step, padded rows, one read back for all leaves.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import torch
from torch import Tensor

from bench.common import DATASETS
from tools.host_reads import counting
from xrfm_torch.kernels import LaplaceKernel
from xrfm_torch.leaf.batch_ops import batch_rows
from xrfm_torch.leaf.batched_step import StepRequest, batched_rfm_step
from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.numerics.agop import RootedAgop, normalize_agop, sqrt_psd
from xrfm_torch.numerics.solvers import krr_workspace


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


def agops(results: Sequence[tuple[object, Tensor | RootedAgop | None, object]]) -> Tensor:
    """The steps' AGOPs, (B, d, d) (a batched step's come with their next roots)."""
    return torch.stack(
        [g.G if isinstance(g, RootedAgop) else g for _, g, _ in results if g is not None]
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default="reg_num/house_16H")
    ap.add_argument("--data-dir", type=Path, default=DATASETS)
    ap.add_argument("--leaves", type=int, default=8)
    ap.add_argument("--rows", type=int, default=0, help="rows per leaf (0: all training rows)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args(argv)
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

    def request(b: int, sqrt_m: Tensor | None) -> StepRequest:
        buffers = (X.new_empty(n, n), X.new_empty(n, n), krr_workspace(n, X.dtype, device))
        kernel = LaplaceKernel().to(device)
        return StepRequest(
            kernel,
            X[b],
            y[b],
            Xv[b],
            yv[b],
            sqrt_m,
            buffers,
            cfg,
            True,
            False,
            None,
            None,
            (None, None),
        )

    # t = 0 for each leaf: its AGOP gives the sqrt(M) that both ways use at t = 1
    S = [
        sqrt_psd(normalize_agop(agops([request(b, None).run()])[0], cfg.eps, cfg.agop_ridge))
        for b in range(B)
    ]
    reqs = [request(b, S[b]) for b in range(B)]
    rows = batch_rows(reqs)
    one = [r.run() for r in reqs]
    both = batched_rfm_step(reqs, rows)
    seq_err = torch.tensor([c.err for c, _, _ in one], dtype=torch.float64)
    err = torch.tensor([c.err for c, _, _ in both], dtype=torch.float64)
    seq_alpha = torch.stack([c.alpha for c, _, _ in one])
    alpha = torch.stack([c.alpha for c, _, _ in both])
    seq_G, G = agops(one), agops(both)

    def rel(a_: Tensor, b_: Tensor) -> float:
        return float((a_.cpu().double() - b_.cpu().double()).norm() / b_.cpu().double().norm())

    counted = {}
    for name, fn in (
        ("one by one", lambda: [r.run() for r in reqs]),
        ("batched", lambda: batched_rfm_step(reqs, rows)),
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
        f"AGOP {rel(G, seq_G):.2e}"
    )


if __name__ == "__main__":
    main()
