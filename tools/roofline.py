"""How close the leaf fit gets to this machine's dense limit.

    python -m tools.roofline --n 2000 4000 8000

For each n: GFLOP/s of a bare float32 ``torch.linalg.cholesky`` (n^3/3 flops) and of a GEMM
(2 n^3), and the Cholesky-equivalent rate of a whole LeafRFM fit (``fits * n^3 / 3`` over its wall
time: everything that is not the factorization counts as overhead).
"""

from __future__ import annotations

import argparse
import time

import torch

from xrfm_torch import LeafRFM
from xrfm_torch.data.sources import make_synthetic


def best_of(fn, reps: int = 3) -> float:
    times = []
    for _ in range(reps):
        s = time.perf_counter()
        fn()
        times.append(time.perf_counter() - s)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", nargs="*", type=int, default=[2000, 4000, 8000])
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(
        "| n | GEMM GFLOP/s | Cholesky GFLOP/s | leaf fit (Cholesky-equivalent) GFLOP/s | leaf / Cholesky | fits | leaf s |"
    )
    print("|---|---|---|---|---|---|---|")
    for n in a.n:
        X, y, _ = make_synthetic(int(n * 1.2), 20, 0.1, 0)
        Xt = torch.tensor(X, dtype=torch.float32)
        yt = torch.tensor(y, dtype=torch.float32)
        A = torch.randn(n, n)
        K = torch.exp(-torch.cdist(Xt[:n], Xt[:n]) / 10) + 1e-3 * torch.eye(n)
        gemm = 2 * n**3 / best_of(lambda A=A: A @ A) / 1e9
        chol = n**3 / 3 / best_of(lambda K=K: torch.linalg.cholesky_ex(K)) / 1e9
        leaf = LeafRFM(n_iters=5, early_stop_multiplier=None, diag=True)
        s = time.perf_counter()
        leaf.fit(Xt[:n], yt[:n], Xt[n:], yt[n:])
        leaf_s = time.perf_counter() - s
        fits = int(torch.isfinite(leaf.val_errors_).sum())
        rate = fits * n**3 / 3 / leaf_s / 1e9
        print(
            f"| {n} | {gemm:.0f} | {chol:.0f} | {rate:.0f} | {rate / chol:.2f} | {fits} | {leaf_s:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
