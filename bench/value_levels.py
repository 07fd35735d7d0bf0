"""Numeric columns whose values act as codes: a text copy of each beside the number.

    python -m bench.value_levels --data-dir DIR --tables mixed/adult --seeds 0 1 2 3 4 \
        --levels capital-gain capital-loss --out OUT
    python -m bench.value_levels --data-dir DIR --tables clf_num/pol --levels rule --out OUT

Adult's capital-gain and capital-loss are 92 % / 95 % zeros; the other values are a few hundred
amounts whose outcome rates differ value by value (a tree splits on them exactly). A copy of the
column as text becomes a one-hot block of its most frequent values in the estimators (up to 15
and "other", :class:`xrfm_torch.inputs.categories.CategoryColumns`), beside the standardized
number. ``--levels rule`` copies every column with at least half its values at one value and at
least 20 other values held by 10 or more rows each (the candidates of
:func:`xrfm_torch.inputs.levels.level_columns`, without its test) (adult's two; also pol's and cpu_act's count
columns, where the copies hurt: docs/benchmarks.md). ``--levels none`` fits the plain table in
the same harness. The split and scaling are those of :mod:`bench.peers` (protocol split, numeric
columns standardized with training statistics); ``XRFMClassifier`` / ``XRFMRegressor`` with the
validation rows as ``eval_set`` and ``--options`` as keyword arguments. One JSON row per table
and seed (``results.jsonl``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.common import DATASETS
from xrfm_torch.inputs.levels import LEVEL_ROWS, MIN_LEVELS, SPIKE_SHARE


def rule_columns(df) -> list[str]:
    """The numeric columns ``--levels rule`` copies (counted over all rows of the table)."""
    import pandas as pd

    out = []
    for c in df.columns:
        if c == "target" or not pd.api.types.is_numeric_dtype(df[c]):
            continue
        _, counts = np.unique(df[c].dropna().to_numpy(float), return_counts=True)
        counts = np.sort(counts)[::-1]
        if counts[0] >= SPIKE_SHARE * counts.sum() and (counts[1:] >= LEVEL_ROWS).sum() >= (
            MIN_LEVELS
        ):
            out.append(str(c))
    return out


def with_levels(part, raw, columns: list[str]):
    """``part`` with a text column ``NAME_level`` first for each named column.

    The text is ``"v"`` and the raw value of the row in ``raw`` (the table before scaling; rows
    matched by index).
    """
    out = part.copy()
    for c in columns:
        out.insert(0, f"{c}_level", "v" + raw.loc[part.index, c].astype(str))
    return out


def measure(path: Path, table: str, seed: int, levels: list[str], options: dict) -> dict:
    """Fit and score one table and seed (the protocol split of :func:`bench.peers.split_table`)."""
    import pandas as pd

    from bench.peers import logloss, split_table
    from xrfm_torch import XRFMClassifier, XRFMRegressor

    df = pd.read_csv(path)
    columns = rule_columns(df) if levels == ["rule"] else [c for c in levels if c != "none"]
    parts, ys, _ = split_table(path, seed)
    if columns:
        parts = [with_levels(p, df, columns) for p in parts]
    classify = not np.issubdtype(df["target"].dtype, np.floating)
    start = time.perf_counter()
    cls = XRFMClassifier if classify else XRFMRegressor
    m = cls(random_state=seed, **options).fit(parts[0], ys[0], eval_set=(parts[1], ys[1]))
    fit_s = time.perf_counter() - start
    row = {"table": table, "seed": seed, "levels": columns}
    row |= {"options": options, "fit_s": fit_s}
    if classify:
        p = m.predict_proba(parts[2])
        y = np.searchsorted(m.classes_, ys[2])
        row |= {"logloss": logloss(p, y), "accuracy": float((p.argmax(1) == y).mean())}
    else:
        row["rmse"] = float(np.sqrt(np.mean((m.predict(parts[2]) - ys[2]) ** 2)))
    return row


def main() -> None:
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", type=Path, default=DATASETS)
    ap.add_argument("--tables", nargs="+", default=["mixed/adult"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--levels", nargs="+", default=["rule"], help="columns, 'rule' or 'none'")
    ap.add_argument("--options", default="{}", help="JSON keyword arguments for the estimator")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path("bench-value-levels"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    args.out.mkdir(parents=True, exist_ok=True)
    for table in args.tables:
        for seed in args.seeds:
            path = args.data_dir / f"{table}.csv.gz"
            row = measure(path, table, seed, args.levels, json.loads(args.options))
            print(json.dumps(row), flush=True)
            with open(args.out / "results.jsonl", "a") as f:
                f.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
