"""The evaluation base: ours beside CatBoost, LightGBM and XGBoost on every table, cached and resumable.

    pip install -e ".[bench]"
    python -m bench.base --cache DIR --list                     # tables, halves, sizes
    python -m bench.base --cache DIR --half design --seeds 0 1 2
    python -m bench.base --cache DIR --half design --seeds 0 --tag leaf2000 \\
        --options '{"max_leaf_size": 2000}'                     # a candidate change, beside "default"
    python -m bench.base --cache DIR --half confirm --seeds 0 1 2 --budgets 3 10
    python -m bench.base --cache DIR --half design --seeds 0 --budgets 3 10 --no-default \\
        --tag mine --control CHECKOUT                           # a code change, paired fit by fit
    python -m bench.base --cache DIR --half design --rows 2501 7500 ...   # tables of that size only
    python -m bench.base --cache DIR --report [--tag leaf2000] [--base control]

The tables and their design/confirm split are :mod:`bench.base_tables`. Every (table, seed, model)
runs in its own process through ``bench.peers --one`` (one protocol: seeded 70/10/20 split, the
validation rows as ``eval_set`` / early stopping, 2 threads), and its result is appended to
``DIR/results.jsonl`` the moment it ends. A run skips what that file already holds (the key:
table, seed, model, tag, budget), so it resumes where it stopped and the GBDTs are fitted once per
table and seed, whatever is compared against them. ``--tag``/``--options`` name and give our
estimators' keyword arguments (tag ``default``: none); ``--budgets K ...`` adds ours with
``time_limit = K x CatBoost's fit seconds`` on the same table and seed. ``--control CHECKOUT``
compares this code with another version (a commit checked out beside it): each of ours' fits is
run with that version's package (tag ``control``) and with this one's, one after the other (in
an order that alternates between pairs), so that a change's effect on time-limited fits is not
mixed with the machine's speed on another day (which moves budgeted results: the same code,
rerun days later, cut different candidates short). Tables are visited smallest first, so a
partial run covers as many tables as it can. The report: :mod:`bench.base_report`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

from bench.base_tables import HALVES, Table, describe, materialize, tables
from bench.budget import GBDTS
from bench.common import DATASETS, ROOT

#: A fit still running after this many seconds is recorded as an error.
TIMEOUT_S = 1800.0
#: The tag of ``--control``'s fits.
CONTROL = "control"


def key(row: dict[str, Any]) -> tuple:
    """What makes two results the same measurement (the cache's key)."""
    tag = row.get("tag") if row["model"] == "ours" else None
    return row["table"], row["seed"], row["model"], tag, row.get("budget_x")


def read_results(path: Path) -> list[dict[str, Any]]:
    """The rows of a ``results.jsonl``; a line cut short by a killed run is skipped."""
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def run_child(
    path: Path,
    seed: int,
    model: str,
    options: dict | None,
    timeout: float,
    threads: int = 2,
    source: Path | None = None,
) -> dict:
    """``bench.peers --one`` in a fresh process: its scores, or ``{"error": ...}``.

    ``source``: a checkout whose ``src/xrfm_torch`` the process imports instead of this one's.
    """
    args = [sys.executable, "-m", "bench.peers", "--one", str(path), str(seed), model]
    args += ["--threads", str(threads)]
    if options:
        args += ["--options", json.dumps(options)]
    env = None
    if source is not None:  # ahead of the installed package (an editable install included)
        paths = [str(source / "src"), str(ROOT), os.environ.get("PYTHONPATH", "")]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in paths if p)}
    try:
        proc = subprocess.run(
            args, capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=env
        )
    except subprocess.TimeoutExpired:
        return {"error": f"timeout after {timeout:.0f}s"}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        return {"error": proc.stderr[-600:]}
    return dict(json.loads(lines[-1]))


def select(half: str, names: list[str] | None, task: str | None) -> list[Table]:
    """The base's tables of ``half`` (``all``: both), or those ``names``, of ``task`` if given."""
    out = [t for t in tables() if half == "all" or t.half == half]
    if names:
        known = {t.name: t for t in tables()}
        unknown = [n for n in names if n not in known]
        if unknown:
            raise SystemExit(f"unknown tables {unknown}; see --list")
        out = [known[n] for n in names]
    return [t for t in out if task is None or t.task == task]


def of_size(chosen: list[Table], rows_of: dict[str, int], low: int, high: int) -> list[Table]:
    """The tables of ``chosen`` with ``low`` to ``high`` rows (both included).

    A change that acts on fits of some size only (e.g. more than 2000 and at most 6000 training
    and validation rows: tables of 2501-7500 rows under the 70/10/20 split) is run on those; the
    others' fits run the same code in both versions.
    """
    if low > high:
        raise SystemExit(f"--rows {low} {high}: MIN is above MAX")
    return [t for t in chosen if low <= rows_of[t.name] <= high]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cache", type=Path, required=True, help="tables and results.jsonl go here")
    ap.add_argument("--data-dir", type=Path, default=DATASETS, help="the shared datasets folder")
    ap.add_argument("--half", choices=[*HALVES, "all"], default="design")
    ap.add_argument("--task", choices=["regression", "classification"])
    ap.add_argument("--tables", nargs="*", help="these tables only (names as --list prints)")
    ap.add_argument("--rows", nargs=2, type=int, metavar=("MIN", "MAX"),
                    help="these tables only: MIN to MAX rows (as --list counts them, after the cap)")  # fmt: skip
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--models", nargs="+", default=[*GBDTS, "ours"], choices=[*GBDTS, "ours"])
    ap.add_argument("--tag", default="default", help="name of ours' --options in the results")
    ap.add_argument("--options", default="{}", help="JSON keyword arguments for our estimators")
    ap.add_argument("--budgets", nargs="*", type=float, default=[])
    ap.add_argument("--no-default", action="store_true", help="with --budgets: no limit-free fit")
    ap.add_argument("--timeout", type=float, default=TIMEOUT_S)
    ap.add_argument("--threads", type=int, default=2, help="torch threads of ours (GBDTs: 2)")
    ap.add_argument(
        "--control",
        type=Path,
        help="a checkout of another version (e.g. `git worktree add DIR COMMIT`): each of ours' "
        "fits is also run with its src/, tagged 'control', just before or after this one's",
    )
    ap.add_argument("--list", action="store_true", help="describe the tables and stop")
    ap.add_argument("--report", action="store_true", help="write the report and stop")
    ap.add_argument("--base", default="default", help="with --report: the tag --tag is set beside")
    a = ap.parse_args()
    options = json.loads(a.options)
    if options and a.tag == "default":
        raise SystemExit("--options needs a --tag other than 'default'")
    if a.control is not None and not (a.control / "src" / "xrfm_torch").is_dir():
        raise SystemExit(f"--control {a.control} has no src/xrfm_torch")
    if a.control is not None and a.tag in ("default", CONTROL):
        raise SystemExit(
            f"--control needs a --tag for this version other than 'default' and {CONTROL!r}"
        )
    a.cache.mkdir(parents=True, exist_ok=True)
    results = a.cache / "results.jsonl"
    chosen = select(a.half, a.tables, a.task)
    if a.report:
        from bench.base_report import write_report

        write_report(read_results(results), a.cache, a.tag, a.base)
        return
    sizes = {}
    for t in chosen:  # write every table first: a missing package fails now, not hours later
        sizes[t.name] = materialize(t, a.data_dir, a.cache)
    import pandas as pd

    rows_of = {t.name: len(pd.read_csv(sizes[t.name], usecols=["target"])) for t in chosen}
    if a.rows:
        chosen = of_size(chosen, rows_of, *a.rows)
    if a.list:
        for t in chosen:
            d = describe(pd.read_csv(sizes[t.name]))
            print(json.dumps({"table": t.name, "task": t.task, "half": t.half, **d,
                              "source": t.source}))  # fmt: skip
        return
    chosen.sort(key=lambda t: (rows_of[t.name], t.name))
    done = {key(r): r for r in read_results(results) if "error" not in r}
    with results.open("a") as fh:

        def run(t: Table, seed: int, model: str, extra: dict[str, Any]) -> dict[str, Any]:
            if model != "ours" or a.control is None:
                return measure(t, seed, model, extra)
            # the paired fits one after the other, in an order that alternates between pairs
            control = {**extra, "tag": CONTROL}
            if zlib.crc32(json.dumps([t.name, seed, extra.get("budget_x")]).encode()) % 2:
                measure(t, seed, model, control, a.control)
                return measure(t, seed, model, extra)
            row = measure(t, seed, model, extra)
            measure(t, seed, model, control, a.control)
            return row

        def measure(
            t: Table, seed: int, model: str, extra: dict[str, Any], source: Path | None = None
        ) -> dict[str, Any]:
            """One fit of ``model`` (ours: with ``source``'s package, there without --options)."""
            row = {"table": t.name, "seed": seed, "model": model, "task": t.task,
                   "half": t.half, "rows": rows_of[t.name], **extra}  # fmt: skip
            if model != "ours":
                row.pop("tag", None)
            if key(row) in done:
                return done[key(row)]
            # runnable tasks when the fit starts: a fit timed beside other work is flagged
            row["load_1m"] = round(os.getloadavg()[0], 2)
            own = options if source is None else {}  # (the other version may not take them)
            opts = {**own, **({"time_limit": extra["time_limit"]} if "time_limit" in extra else {})}  # fmt: skip
            threads = a.threads if model == "ours" else 2
            if threads != 2:
                row["threads"] = threads
            row.update(
                run_child(sizes[t.name], seed, model, opts or None, a.timeout, threads, source)
            )
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            if "error" not in row:
                done[key(row)] = row
            print(json.dumps(row), flush=True)
            return row

        for seed in a.seeds:
            for t in chosen:
                cat = None
                for model in a.models:
                    if model != "ours":
                        row = run(t, seed, model, {})
                        cat = row if model == "catboost" else cat
                        continue
                    if not (a.budgets and a.no_default):
                        run(t, seed, "ours", {"tag": a.tag})
                    if a.budgets:
                        cat = cat or run(t, seed, "catboost", {})
                        if "error" in cat:
                            continue
                        for b in a.budgets:
                            limit = b * float(cat["fit_s"])
                            run(t, seed, "ours", {"tag": a.tag, "budget_x": b, "time_limit": limit})


if __name__ == "__main__":
    main()
