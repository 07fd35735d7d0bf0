"""The regression verdict from ``bench.run`` results: our models against the peers, means over seeds.

    python -m bench.regression_report RESULTS.jsonl [MORE.jsonl ...] [--ours ours ours_bag5]
        [--peers xgboost lightgbm catboost realmlp] [--seeds 0 1 2] [--out FILE.md]

Rows of earlier files win for the same (dataset, seed, model), as in ``bench.run
--with-results``; a row's model can be renamed on the way in with ``--rename FILE=NAME`` (runs of
``bench.run --options '{"n_bags": 5}'`` record their model as ``ours``). Per dataset: mean test
RMSE (mean fit seconds) of each of ``--ours``, of each peer and of the better reference
configuration; the best of ours against the best peer (ratio), and the count the issue asks for.
A dataset counts only where every listed model has every seed.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

REFS = ("xrfm_default", "xrfm_d")


def load(paths: list[Path], renames: dict[str, str]) -> dict[tuple[str, int, str], dict]:
    """``(dataset, seed, model) -> row`` over the files, the first file winning."""
    rows: dict[tuple[str, int, str], dict] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if "rmse" not in r:
                continue
            model = renames.get(str(path), r["model"]) if r["model"] == "ours" else r["model"]
            rows.setdefault((r["dataset"], int(r["seed"]), model), {**r, "model": model})
    return rows


def report(
    rows: dict[tuple[str, int, str], dict], ours: list[str], peers: list[str], seeds: list[int]
) -> list[str]:
    """Markdown table and verdict lines."""
    datasets = list(dict.fromkeys(d for d, _, _ in rows))

    def mean(ds: str, m: str, key: str) -> float | None:
        rs = [rows.get((ds, s, m)) for s in seeds]
        if any(r is None for r in rs):
            return None
        return statistics.mean(float(r[key]) for r in rs if r is not None)

    shown = [*ours, *peers]
    lines = [
        "| dataset | " + " | ".join(shown) + " | better ref. | best ours / best peer |",
        "|---" * (len(shown) + 3) + "|",
    ]
    wins = n = 0
    for ds in datasets:
        rmse = {m: mean(ds, m, "rmse") for m in shown}
        if any(v is None for v in rmse.values()):
            continue
        fit = {m: mean(ds, m, "fit_s") for m in shown}
        refs = [v for v in (mean(ds, r, "rmse") for r in REFS) if v is not None]
        best_ours = min(ours, key=lambda m: rmse[m] or 0.0)
        best_peer = min(peers, key=lambda m: rmse[m] or 0.0)
        ratio = (rmse[best_ours] or 0.0) / (rmse[best_peer] or 1.0)
        n += 1
        wins += ratio <= 1.0
        cells = [
            f"{'**' if m in (best_ours, best_peer) else ''}{rmse[m]:.5g}"
            f"{'**' if m in (best_ours, best_peer) else ''} ({fit[m]:.1f} s)"
            for m in shown
        ]
        ref = f"{min(refs):.5g}" if refs else "—"
        lines.append(f"| {ds} | " + " | ".join(cells) + f" | {ref} | {ratio:.3f} ({best_ours}) |")
    lines.append("")
    lines.append(
        f"Best of {', '.join(ours)} at or below the best of {', '.join(peers)} on {wins} of {n} "
        f"datasets (mean test RMSE over seeds {', '.join(map(str, seeds))})."
    )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--ours", nargs="+", default=["ours", "ours_bag5"])
    ap.add_argument("--peers", nargs="+", default=["xgboost", "lightgbm", "catboost", "realmlp"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--rename", nargs="*", default=[], help="FILE=NAME: that file's ours rows")
    ap.add_argument("--out", type=Path)
    a = ap.parse_args()
    renames = dict(item.split("=", 1) for item in a.rename)
    lines = report(load(a.files, renames), a.ours, a.peers, a.seeds)
    text = "\n".join(lines)
    print(text)
    if a.out:
        a.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
