"""Fit time and peak memory vs n on the protocol's synthetic scaling task (d = 20).

    python bench/scaling.py --n 10000 20000 40000 80000 --models ours xrfm_d

Each point runs in its own process. A model is dropped once one of its runs exceeds ``--max-seconds``
or fails. Writes ``scaling.jsonl``, ``scaling.md`` and a log-log ``scaling.png`` into ``--out`` and
prints the growth ratio of fit time per doubling of n.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import ROOT, run_isolated


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--n", nargs="*", type=int, default=[10_000, 20_000, 40_000, 80_000, 160_000])
    ap.add_argument("--models", nargs="*", default=["ours", "xrfm_d"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-seconds", type=float, default=1200.0)
    ap.add_argument("--options", default="{}", help="JSON keyword arguments for our xRFMTree")
    ap.add_argument(
        "--out",
        type=Path,
        default=ROOT / "bench" / "results" / f"scaling-{time.strftime('%Y%m%d-%H%M%S')}",
    )
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    alive = set(a.models)
    with (a.out / "scaling.jsonl").open("w") as fh:
        for n in sorted(a.n):
            for m in a.models:
                if m not in alive:
                    continue
                args = [
                    "--model",
                    m,
                    "--synthetic-n",
                    str(n),
                    "--seed",
                    str(a.seed),
                    "--threads",
                    str(a.threads),
                    "--options",
                    a.options,
                ]
                res = {"n": n, "model": m, **run_isolated(args, a.max_seconds * 1.5)}
                rows.append(res)
                fh.write(json.dumps(res) + "\n")
                fh.flush()
                if "error" in res or res["fit_s"] > a.max_seconds:
                    alive.discard(m)
                msg = (
                    res.get("error", "")[-200:]
                    if "error" in res
                    else (
                        f"fit {res['fit_s']:.1f}s  rmse {res['rmse']:.4f}  rss {res['peak_rss_mb']:.0f}MB"
                        + (f"  leaf iterations {res['iters']}" if "iters" in res else "")
                    )
                )
                print(f"n={n:8d} {m:12s} {msg}", flush=True)
    lines = [
        "| model | n | fit s | growth vs n/2 | test RMSE | peak RSS MB | iterations per leaf |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in a.models:
        pts = [(r["n"], r) for r in rows if r["model"] == m and "fit_s" in r]
        prev = None
        for n, r in pts:
            growth = f"{r['fit_s'] / prev[1]['fit_s']:.2f}x" if prev and prev[0] * 2 == n else "—"
            # RFM iterations run per leaf (each one or two kernel solves): the data-dependent time
            fits = "+".join(map(str, r["iters"])) if "iters" in r else "—"
            lines.append(
                f"| {m} | {n} | {r['fit_s']:.1f} | {growth} | {r['rmse']:.4f} "
                f"| {r['peak_rss_mb']:.0f} | {fits} |"
            )
            prev = (n, r)
    md = "\n".join(lines)
    (a.out / "scaling.md").write_text(
        f"Command: `python bench/scaling.py {' '.join(sys.argv[1:])}`\n\n{md}\n"
    )
    print("\n" + md)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, ax = plt.subplots(figsize=(5, 4))
    for m in a.models:
        pts = [(r["n"], r["fit_s"]) for r in rows if r["model"] == m and "fit_s" in r]
        if pts:
            ax.loglog(*zip(*pts), "o-", label=m)
    if rows:
        n0 = min(r["n"] for r in rows)
        t0 = min((r["fit_s"] for r in rows if r["n"] == n0 and "fit_s" in r), default=1.0)
        ns = sorted({r["n"] for r in rows})
        ax.loglog(ns, [t0 * n / n0 for n in ns], "k:", lw=0.8, label="linear in n")
    ax.set_xlabel("training rows n")
    ax.set_ylabel("fit seconds")
    ax.legend()
    fig.tight_layout()
    fig.savefig(a.out / "scaling.png", dpi=100)


if __name__ == "__main__":
    main()
