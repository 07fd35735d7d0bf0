"""Fit time of one tree per kernel exponent ``p`` (the cost of leaving ``p = 2`` in a search).

    python -m bench.lpq_speed --n 5000 --threads 1

A synthetic table (``n`` training rows, 12 features, target ``sin(2 x0) + x1^2 + x2 x3 / 2``
plus noise; 1000 validation and 2000 test rows) fitted by ``xRFMTree`` with
``LpqLaplaceKernel(10, p, q=1)`` on the raw inputs, for each ``p``: fit seconds, test RMSE, and
the fit time over that of ``p = 2`` (the Laplace kernel, one GEMM per distance matrix).
"""

from __future__ import annotations

import argparse
import time

import torch

from xrfm_torch import LpqLaplaceKernel, xRFMTree


def table(n: int, d: int, g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    X = torch.randn(n, d, generator=g)
    y = torch.sin(2 * X[:, 0]) + X[:, 1] ** 2 + 0.5 * X[:, 2] * X[:, 3]
    return X, y + 0.1 * torch.randn(n, generator=g)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=5000)
    ap.add_argument("--p", nargs="+", type=float, default=[2.0, 1.6, 1.0])
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    g = torch.Generator().manual_seed(0)
    X, y = table(a.n + 1000, 12, g)
    Xt, yt = table(2000, 12, g)
    base = None
    print("| p | fit s | test RMSE | fit s / (p = 2) |")
    print("|---|---|---|---|")
    for p in a.p:
        model = xRFMTree(LpqLaplaceKernel(10.0, p=p, q=1.0), input_transform="identity")
        start = time.perf_counter()
        model.fit(X[: a.n], y[: a.n], X[a.n :], y[a.n :])
        secs = time.perf_counter() - start
        rmse = float(((model(Xt).squeeze(-1) - yt) ** 2).mean().sqrt())
        base = secs if p == 2.0 else base
        ratio = f"{secs / base:.2f}" if base else "-"
        print(f"| {p:g} | {secs:.1f} | {rmse:.5f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
