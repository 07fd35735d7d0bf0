"""Per-dataset summary over seeds: each model's RMSE against the better reference configuration.

Reads JSON lines of ``bench/run.py`` or ``bench/sweep.py`` (keys dataset, seed, model, rmse); for
each dataset and model prints the mean over seeds of ``rmse / min(xrfm_default, xrfm_d)`` and in
how many seeds the model was <= the better reference and <= the best GBDT (where those ran)::

    python -m bench.seed_report bench/results/gpu-h100-seeds0-4/results.jsonl
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

REFS = ("xrfm_default", "xrfm_d")
GBDTS = ("xgboost", "lightgbm", "catboost")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--models", nargs="*", help="models to report (default: all but references)")
    a = ap.parse_args()
    rmse: dict[tuple[str, int], dict[str, float]] = defaultdict(dict)
    for f in a.files:
        for line in f.read_text().splitlines():
            r = json.loads(line)
            if "rmse" in r:  # first file wins, as in bench/run.py --with-results
                rmse[(r["dataset"], int(r["seed"]))].setdefault(r["model"], float(r["rmse"]))
    models = a.models or sorted({m for row in rmse.values() for m in row} - set(REFS) - set(GBDTS))
    datasets = sorted({d for d, _ in rmse})
    print(
        "| dataset | seeds | "
        + " | ".join(f"{m}: RMSE / better ref (<= ref, <= GBDT)" for m in models)
        + " |"
    )
    print("|---" * (len(models) + 2) + "|")
    totals = {m: [0, 0, 0] for m in models}  # seeds <= ref, seeds <= GBDT, seeds with GBDT
    for ds in datasets:
        seeds = sorted(s for d, s in rmse if d == ds and all(r in rmse[(d, s)] for r in REFS))
        cells = []
        for m in models:
            ratios, le_ref, le_gbdt, n_gbdt = [], 0, 0, 0
            for s in seeds:
                row = rmse[(ds, s)]
                if m not in row:
                    continue
                ref = min(row[r] for r in REFS)
                ratios.append(row[m] / ref)
                le_ref += row[m] <= ref
                gb = [row[g] for g in GBDTS if g in row]
                if gb:
                    n_gbdt += 1
                    le_gbdt += row[m] <= min(gb)
            t = totals[m]
            t[0], t[1], t[2] = t[0] + le_ref, t[1] + le_gbdt, t[2] + n_gbdt
            mean = sum(ratios) / len(ratios) if ratios else float("nan")
            gbdt = f", {le_gbdt}/{n_gbdt}" if n_gbdt else ""
            cells.append(f"{mean:.4f} ({le_ref}/{len(ratios)}{gbdt})")
        print(f"| {ds} | {len(seeds)} | " + " | ".join(cells) + " |")
    for m, (r, g, n) in totals.items():
        print(f"{m}: <= better reference in {r} dataset-seeds; <= best GBDT in {g} of {n}")


if __name__ == "__main__":
    main()
