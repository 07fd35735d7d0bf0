"""Peak resident memory of one leaf fit against n^2: what tree/memory.py's estimate rests on.

    python -m tools.leaf_memory --n 2000 4000 8000 12000 --d 20 --out bench/results/leaf-memory

Each size runs in its own process: ``LeafRFM()`` with the default ``LeafConfig`` fitted on ``n``
planted rows (float32) with 1500 validation rows; the peak RSS growth during the fit (Linux ``VmHWM``, reset first)
is divided by ``4 n^2`` bytes (one float32 n x n matrix) and set beside the estimate of
``xrfm_torch.tree.memory.leaf_peak_bytes``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.common import run_module_child, write_table


def _status_kb(key: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    raise KeyError(key)


def current_rss() -> int:
    """Resident bytes now (Linux)."""
    return _status_kb("VmRSS") * 1024


def reset_peak() -> None:
    """Reset the peak-RSS mark (Linux >= 4.0); ``ru_maxrss`` would carry the parent's peak."""
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")


def peak_rss() -> int:
    """Peak resident bytes since :func:`reset_peak` (Linux ``VmHWM``)."""
    return _status_kb("VmHWM") * 1024


def measure(n: int, d: int, threads: int) -> dict:
    import torch

    from xrfm_torch import LeafConfig, LeafRFM
    from xrfm_torch.tree.memory import leaf_peak_bytes

    torch.set_num_threads(threads)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(n, d, generator=g)
    y = X[:, :1].sin() + 0.1 * torch.randn(n, 1, generator=g)
    Xv = torch.randn(1500, d, generator=g)
    yv = Xv[:, :1].sin()
    base = current_rss()
    reset_peak()
    start = time.perf_counter()
    LeafRFM("laplace", LeafConfig()).fit(X, y, Xv, yv, generator=g)
    seconds = time.perf_counter() - start
    peak = peak_rss() - base
    estimate = leaf_peak_bytes(n, 1500, n, torch.float32)
    return {
        "n": n,
        "d": d,
        "peak_mb": peak / 2**20,
        "matrices": peak / (4 * n * n),
        "estimate_mb": estimate / 2**20,
        "fit_s": seconds,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", nargs="+", type=int, default=[2000, 4000, 8000, 12000])
    ap.add_argument("--d", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("bench-leaf-memory"))
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(measure(a.one, a.d, a.threads)))
        return
    a.out.mkdir(parents=True, exist_ok=True)
    lines = [
        "| n | peak growth MB | n x n float32 matrices | estimate MB | fit s |",
        "|---|---|---|---|---|",
    ]
    with (a.out / "results.jsonl").open("a") as fh:
        for n in a.n:
            r = run_module_child(
                "tools.leaf_memory", ["--one", str(n), "--d", str(a.d), "--threads", str(a.threads)]
            )
            fh.write(json.dumps(r) + "\n")
            print(json.dumps(r), flush=True)
            lines.append(
                f"| {n} | {r['peak_mb']:.0f} | {r['matrices']:.2f} | "
                f"{r['estimate_mb']:.0f} | {r['fit_s']:.1f} |"
            )
    write_table(a.out, "tools.leaf_memory", lines)


if __name__ == "__main__":
    main()
