"""Accuracy per second: ours with a time limit of 1x, 3x and 10x CatBoost's own fit time.

    python -m bench.budget --data-dir DIR --tables reg_num/cpu_act clf_num/pol --seeds 0
    python -m bench.budget --report OUT/results.jsonl

Per (table, seed), in the ``bench.peers`` harness (same split, threads and process isolation):
CatBoost, then the other GBDTs (``--peers``), then ``XRFMClassifier`` / ``XRFMRegressor`` with
``time_limit = k * (CatBoost's fit seconds on that table and seed)`` for each ``k`` of
``--budgets``, and with ``--default`` the estimator without a limit. Rows go to
``OUT/results.jsonl`` (``budget_x``, ``time_limit``, ``fit_s`` = the time actually used,
``chosen`` = the candidate the anytime fit kept); the report (``OUT/results.md``) counts the
tables where ours is at or below CatBoost, and below the best GBDT, at each budget.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench.common import DATASETS, run_module_child
from bench.peers import is_regression

#: The dev suite's tables that need no network (the classification suite's sklearn tables are
#: written by ``python -m bench.suite --out DIR/clf_suite --tables breast_cancer wine digits``).
TABLES = [
    *(f"reg_num/{t}" for t in ("wine_quality", "Bike_Sharing_Demand", "pol", "Brazilian_houses",
                               "elevators", "cpu_act", "Ailerons", "houses", "house_sales",
                               "house_16H")),
    *(f"clf_suite/{t}" for t in ("breast_cancer", "wine", "digits")),
    *(f"clf_num/{t}" for t in ("pol", "house_16H", "california", "electricity")),
    "mixed/adult",
]  # fmt: skip
GBDTS = ("catboost", "lightgbm", "xgboost")


def score(row: dict[str, Any]) -> float:
    """The row's test loss: log-loss or RMSE (lower is better)."""
    return float(row["logloss"] if "logloss" in row else row["rmse"])


def run_one(path: Path, seed: int, model: str, threads: int, options: dict | None) -> dict:
    """One (table, seed, model) in its own process (``bench.peers --one``)."""
    args = ["--one", str(path), str(seed), model, "--threads", str(threads)]
    if options:
        args += ["--options", json.dumps(options)]
    try:
        return run_module_child("bench.peers", args)
    except SystemExit as err:  # one failing fit does not end the run
        return {"error": str(err)[-600:]}


def report(rows: list[dict[str, Any]], budgets: list[float]) -> list[str]:
    """Markdown: per table, CatBoost and the best GBDT beside ours at each budget; the counts."""
    ok = [r for r in rows if "error" not in r]
    tables = list(dict.fromkeys(r["table"] for r in ok))
    head = "| table | CatBoost (s) | best GBDT | " + " | ".join(
        f"ours {b:g}x (used s)" for b in budgets
    )
    lines = [head + " |", "|---|---|---|" + "---|" * len(budgets)]
    wins = {b: [0, 0, 0] for b in budgets}  # <= CatBoost, <= best GBDT, tables

    def mean(tab: str, model: str, budget: float | None = None, key: str = "score") -> float | None:
        rs = [r for r in ok if r["table"] == tab and r["model"] == model
              and r.get("budget_x") == budget]  # fmt: skip
        if not rs:
            return None
        return statistics.mean(score(r) if key == "score" else float(r[key]) for r in rs)

    for tab in tables:
        cat, cat_s = mean(tab, "catboost"), mean(tab, "catboost", key="fit_s")
        if cat is None or cat_s is None:
            continue
        peers = {g: mean(tab, g) for g in GBDTS}
        best_name, best = min(
            ((g, v) for g, v in peers.items() if v is not None), key=lambda p: p[1]
        )
        cells = []
        for b in budgets:
            ours, used = mean(tab, "ours", b), mean(tab, "ours", b, "fit_s")
            if ours is None or used is None:
                cells.append("—")
                continue
            wins[b][2] += 1
            wins[b][0] += ours <= cat
            wins[b][1] += ours <= best
            mark = "**" if ours <= cat else ""
            cells.append(f"{mark}{ours:.5g}{mark} ({used:.1f})")
        lines.append(f"| {tab} | {cat:.5g} ({cat_s:.1f}) | {best:.5g} ({best_name}) | "
                     + " | ".join(cells) + " |")  # fmt: skip
    lines.append("")
    for b in budgets:
        le_cat, le_best, n = wins[b]
        lines.append(f"- {b:g}x CatBoost's time: at or below CatBoost on {le_cat} of {n} tables, "
                     f"at or below the best GBDT on {le_best} of {n}")  # fmt: skip
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DATASETS)
    ap.add_argument("--tables", nargs="+", default=TABLES)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--budgets", nargs="+", type=float, default=[1.0, 3.0, 10.0])
    ap.add_argument("--peers", nargs="*", default=["lightgbm"], choices=GBDTS[1:])
    ap.add_argument("--default", action="store_true", help="also fit ours without a limit")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("bench-budget"))
    ap.add_argument("--report", type=Path, help="only write the report of this results.jsonl")
    a = ap.parse_args()
    if a.report:
        rows = [json.loads(line) for line in a.report.read_text().splitlines() if line.strip()]
        print("\n".join(report(rows, a.budgets)))
        return
    a.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    with (a.out / "results.jsonl").open("a") as fh:

        def keep(row: dict[str, Any]) -> dict[str, Any]:
            rows.append(row)
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            print(json.dumps(row), flush=True)
            return row

        for seed in a.seeds:
            for tab in a.tables:
                path = a.data_dir / f"{tab}.csv.gz"
                base = {"table": tab, "seed": seed, "task": "regression" if is_regression(tab) else "classification"}  # fmt: skip
                cat = keep({**base, "model": "catboost", **run_one(path, seed, "catboost", a.threads, None)})  # fmt: skip
                for peer in a.peers:
                    keep({**base, "model": peer, **run_one(path, seed, peer, a.threads, None)})
                if "error" in cat:
                    continue
                for b in a.budgets:
                    limit = b * float(cat["fit_s"])
                    opts = {"time_limit": limit}
                    keep({**base, "model": "ours", "budget_x": b, "time_limit": limit,
                          **run_one(path, seed, "ours", a.threads, opts)})  # fmt: skip
                if a.default:
                    keep({**base, "model": "ours_default", **run_one(path, seed, "ours", a.threads, None)})  # fmt: skip
    (a.out / "results.md").write_text("\n".join(report(rows, a.budgets)) + "\n")
    print("\n".join(report(rows, a.budgets)))


if __name__ == "__main__":
    main()
