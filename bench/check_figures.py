"""The figures the docs publish stay true: a few benchmark cases rerun against their stored rows.

    python -m bench.check_figures [--data-dir DIR] [--only NAME ...]

Each case runs a benchmark command for a handful of (table, seed) rows, reads the rows it writes
and compares each with the stored row of the same table, seed and model, in the results folder
the docs cite. A figure may move by float rounding and thread counts, not by more than its seed
noise: the standard deviation of the stored figure over that table's seeds. A change that moves
one further, for better or worse, fails here until the stored rows (and the docs that quote them)
are rerun with it. First, every result folder that the README, the docs, the result READMEs and
the benchmark scripts cite must exist. Prints one line per check and exits 1 if any fails.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench.common import DATASETS, ROOT

RESULTS = ROOT / "bench" / "results"
CITE = re.compile(r"bench/results/([A-Za-z0-9_.-]+)")


@dataclass(frozen=True)
class Case:
    """A benchmark command, the stored rows it reproduces and the figure compared."""

    name: str
    args: tuple[str, ...]  # after ``python -m``; DATA stands for the benchmark tables' folder
    stored: str  # a results file under bench/results
    metric: str
    key: str  # the row field naming the table
    needs_data: bool = True  # the benchmark tables (DATA), else tables the case builds itself
    prepare: tuple[
        str, ...
    ] = ()  # run first (after ``python -m``); TMP stands for a scratch folder


CASES = [
    Case(
        "regression: the default on cpu_act",
        ("bench.run", "--data-dir", "DATA/reg_num", "--datasets", "cpu_act", "--models", "ours",
         "--seeds", "0"),
        "regression-seeds0-2/results.jsonl",
        "rmse",
        "dataset",
    ),
    Case(
        "classification: the default estimator (blend of bags) on iris and wine",
        ("bench.peers", "--data-dir", "TMP", "--tables", "clf_suite/iris", "clf_suite/wine",
         "--models", "ours", "--seeds", "0"),
        "kernel-blend-h100-seeds0-4/cpu-small-seeds0-4.jsonl",
        "logloss",
        "table",
        needs_data=False,
        prepare=("bench.suite", "--out", "TMP/clf_suite", "--tables", "iris", "wine"),
    ),
    Case(
        "head: encoder + xRFM head on digits",
        ("bench.head", "--tasks", "digits", "--models", "head_linear", "--seeds", "0", "1", "2"),
        "head-seeds0-2/results.jsonl",
        "logloss",
        "task",
        needs_data=False,
    ),
    Case(
        "uncertainty: calibrated NLL on wine_quality",
        ("bench.uncertainty", "--data-dir", "DATA/reg_num", "--datasets", "wine_quality",
         "--models", "ours", "--seeds", "0"),
        "uncertainty-seeds0-2/results.jsonl",
        "nll",
        "dataset",
    ),
]  # fmt: skip


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def missing_citations() -> set[str]:
    """Result folders cited in the README, docs, result READMEs, bench and tools but absent."""
    pages = [
        ROOT / "README.md",
        *sorted((ROOT / "docs").glob("*.md")),
        *sorted(RESULTS.glob("*/README.md")),
        *sorted((ROOT / "bench").glob("*.py")),
        *sorted((ROOT / "tools").glob("*.py")),
    ]
    names = {m.group(1) for p in pages for m in CITE.finditer(p.read_text())}
    return {n for n in names if not (RESULTS / n).exists()}


def check(case: Case, data: Path, tmp: Path) -> list[str]:
    """Rerun ``case``; the rows that moved beyond their seed noise (empty: it holds)."""
    stored = rows(RESULTS / case.stored)

    def filled(args: tuple[str, ...]) -> list[str]:
        return [a.replace("DATA", str(data)).replace("TMP", str(tmp)) for a in args]

    if case.prepare:
        subprocess.run([sys.executable, "-m", *filled(case.prepare)], cwd=ROOT, check=True)
    out = tmp / "out"
    done = subprocess.run(
        [sys.executable, "-m", *filled(case.args), "--threads", "2", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode != 0:
        return [f"the command failed: {done.stderr[-2000:]}"]
    new = rows(out / "results.jsonl")
    if not new:
        return ["the command wrote no rows"]
    failures = []
    for row in new:
        key = (row[case.key], row["seed"], row["model"])
        same = [r for r in stored if (r[case.key], r["seed"], r["model"]) == key]
        spread = [r[case.metric] for r in stored if (r[case.key], r["model"]) == key[::2]]
        if len(same) != 1 or len(spread) < 3:
            failures.append(f"no stored row (or fewer than 3 seeds) for {key}")
            continue
        noise = statistics.stdev(spread)
        if abs(row[case.metric] - same[0][case.metric]) > noise:
            failures.append(
                f"{key}: {case.metric} {row[case.metric]:.5g}, stored "
                f"{same[0][case.metric]:.5g} (seed noise {noise:.3g})"
            )
    return failures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DATASETS)
    ap.add_argument("--only", nargs="*", help="case names' first words (e.g. regression head)")
    a = ap.parse_args()
    bad = 0
    gone = missing_citations()
    print(f"cited result folders: {'all present' if not gone else f'missing {sorted(gone)}'}")
    bad += bool(gone)
    for case in CASES:
        if a.only and case.name.split(":")[0] not in a.only:
            continue
        if case.needs_data and not a.data_dir.is_dir():
            print(f"{case.name}: skipped, no tables at {a.data_dir}")
            continue
        with tempfile.TemporaryDirectory() as tmp:
            failures = check(case, a.data_dir, Path(tmp))
        print(f"{case.name}: {'holds' if not failures else 'MOVED'}")
        for f in failures:
            print(f"    {f}")
        bad += bool(failures)
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
