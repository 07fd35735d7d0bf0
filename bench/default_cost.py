"""The default's cost before -> after a change: fit seconds and test loss per table, the median ratio.

Run ``bench.peers --models ours`` (the default, no limit) on two checkouts with the same tables
and seeds, then compare::

    git worktree add /tmp/before COMMIT
    (cd /tmp/before && PYTHONPATH=src python -m bench.peers --models ours --tables ... --out B)
    python -m bench.peers --models ours --tables ... --out A
    python -m bench.default_cost B/results.jsonl A/results.jsonl --noise NOISE.jsonl ...

Rows may also carry ``name`` = ``"before"`` / ``"after"`` in one file (``--split-by-name``).
``--noise`` files hold earlier runs of the default over several seeds (rows with ``model`` in
``--noise-models``): a table's seed noise is the standard deviation of its test loss over those
seeds, and a change in loss larger than that is flagged as beyond seed noise.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

from bench.budget import score


def read(path: Path) -> list[dict[str, Any]]:
    """The rows of a results file that hold a fit (failed fits are left out)."""
    return [r for r in map(json.loads, path.read_text().splitlines()) if "error" not in r]


def seed_noise(rows: list[dict[str, Any]], models: set[str]) -> dict[str, float]:
    """Per table, the standard deviation of the test loss over the seeds of ``models``' rows."""
    by_table: dict[str, dict[int, float]] = {}
    for r in rows:
        if r.get("model") in models:  # bench.run's regression rows name a reg_num "dataset"
            table = r.get("table") or f"reg_num/{r['dataset']}"
            by_table.setdefault(table, {})[int(r["seed"])] = score(r)
    return {t: statistics.stdev(v.values()) for t, v in by_table.items() if len(v) >= 2}


def compare(
    before: list[dict[str, Any]], after: list[dict[str, Any]], noise: dict[str, float]
) -> list[str]:
    """Markdown: per (table, seed) fit seconds and loss before -> after, then the medians."""
    key = lambda r: (r["table"], int(r["seed"]))  # noqa: E731
    old = {key(r): r for r in before}
    lines = [
        "| table | seed | fit s before -> after | ratio | test loss before -> after | change "
        "| seed noise (sd) |",
        "|---|---|---|---|---|---|---|",
    ]
    ratios: dict[str, list[float]] = {"classification": [], "regression": []}
    moved: dict[str, list[str]] = {"worse": [], "better": []}
    for r in after:
        b = old.get(key(r))
        if b is None:
            continue
        ratio = r["fit_s"] / b["fit_s"]
        task = "classification" if "logloss" in r else "regression"
        ratios[task].append(ratio)
        lo, la = score(b), score(r)
        sd = noise.get(r["table"])
        if sd is not None and abs(la - lo) > sd:
            way = "worse" if la > lo else "better"
            moved[way].append(f"{r['table']} ({lo:.4g} -> {la:.4g}, sd {sd:.2g})")
        lines.append(
            f"| {r['table']} | {r['seed']} | {b['fit_s']:.1f} -> {r['fit_s']:.1f} | "
            f"{ratio:.2f} | {lo:.4f} -> {la:.4f} | {100 * (la - lo) / lo:+.1f} % | "
            f"{'—' if sd is None else f'{sd:.4f}'} |"
        )
    every = ratios["classification"] + ratios["regression"]
    if every:
        lines.append("")
        for name, rs in (*ratios.items(), ("all", every)):
            if rs:
                third = sum(x <= 1 / 3 for x in rs)
                lines.append(
                    f"- {name}: median ratio {statistics.median(rs):.2f} over {len(rs)} fits "
                    f"({third} at or below 1/3)"
                )
        for way, tables in moved.items():
            lines.append(f"- {way} beyond seed noise: {', '.join(tables) if tables else 'none'}")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", type=Path, help="results.jsonl of the earlier code (or both)")
    ap.add_argument("after", type=Path, nargs="?", help="results.jsonl of the current code")
    ap.add_argument("--split-by-name", action="store_true", help="one file, rows named")
    ap.add_argument("--noise", type=Path, nargs="*", default=[], help="multi-seed runs")
    ap.add_argument("--noise-models", nargs="+", default=["ours", "ours_blend"])
    a = ap.parse_args()
    rows = read(a.before)
    if a.split_by_name:
        before = [r for r in rows if r.get("name") == "before"]
        after = [r for r in rows if r.get("name") == "after"]
    elif a.after is None:
        ap.error("give two files, or one with --split-by-name")
    else:
        before, after = rows, read(a.after)
    noise = seed_noise([r for p in a.noise for r in read(p)], set(a.noise_models))
    print("\n".join(compare(before, after, noise)))


if __name__ == "__main__":
    main()
