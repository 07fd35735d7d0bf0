"""The figures the docs publish stay true: a few benchmark cases rerun against their stored rows.

Each case runs a benchmark command for a handful of (table, seed) rows, reads the rows it
writes and compares each with the stored row of the same table, seed and model, in the results
folder the docs cite. A figure may move by float rounding and thread counts, not by more than
its seed noise: the standard deviation of the stored figure over that table's seeds. A change
that moves one further, for better or worse, fails here until the stored rows (and the docs that
quote them) are rerun with it.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import SHARED_DATASETS

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"


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


def test_every_case_has_stored_rows_with_seed_noise():
    for case in CASES:
        stored = rows(RESULTS / case.stored)
        stored = [r for r in stored if case.metric in r and r["model"] in case.args]
        tables = {r[case.key] for r in stored}
        assert tables, case.name
        for table in tables:
            seeds = [
                r[case.metric] for r in stored if r[case.key] == table and r["model"] in case.args
            ]
            assert len(seeds) >= 3, (case.name, table)


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name.split(":")[0])
def test_published_figure_holds(case, tmp_path):
    if case.needs_data and not SHARED_DATASETS.is_dir():
        pytest.skip(f"benchmark tables not found at {SHARED_DATASETS} (set XRFM_TORCH_DATASETS)")

    def filled(args: tuple[str, ...]) -> list[str]:
        return [a.replace("DATA", str(SHARED_DATASETS)).replace("TMP", str(tmp_path)) for a in args]

    if case.prepare:
        subprocess.run([sys.executable, "-m", *filled(case.prepare)], cwd=ROOT, check=True)
    args = filled(case.args)
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", *args, "--threads", "2", "--out", str(out)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    stored = rows(RESULTS / case.stored)
    new = rows(out / "results.jsonl")
    assert new, done.stdout[-2000:]
    for row in new:
        same = [
            r
            for r in stored
            if (r[case.key], r["seed"], r["model"]) == (row[case.key], row["seed"], row["model"])
        ]
        assert len(same) == 1, f"no stored row for {row[case.key]} seed {row['seed']}"
        spread = [
            r[case.metric]
            for r in stored
            if (r[case.key], r["model"]) == (row[case.key], row["model"])
        ]
        noise = statistics.stdev(spread)
        moved = row[case.metric] - same[0][case.metric]
        assert abs(moved) <= noise, (
            f"{case.name}: {row[case.key]} seed {row['seed']} {case.metric} "
            f"{row[case.metric]:.5g}, stored {same[0][case.metric]:.5g} (seed noise {noise:.3g})"
        )
