"""Where a default fit's time goes: cProfile of one estimator fit, summed by phase.

Fits ``XRFMClassifier()`` or ``XRFMRegressor()`` (their defaults, or ``--options``) on the
protocol split of one table (seed 0, the validation rows as ``eval_set``) under cProfile, after
a small warm-up fit, and prints the fit's seconds by phase (cumulative time of the function that
runs it; ``iterate``, the RFM loop, and ``select_kernel``, the post-hoc search after it, are
separate calls) and the functions of most own time::

    python -m tools.fit_profile --table clf_num/pol --data-dir DIR
    python -m tools.fit_profile --table reg_num/cpu_act --data-dir DIR --options '{"n_bags": 5}'

A table is ``DIR/<path>.csv.gz`` with a ``target`` column; a ``clf_*`` folder means
classification. A table with text columns is split as the benchmark harness splits it
(``bench.peers``) and fitted as a DataFrame. cProfile adds some overhead to Python-heavy
phases; shares, not seconds, are the point.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from bench.common import DATASETS
from bench.peers import class_codes, split_table
from xrfm_torch import XRFMClassifier, XRFMRegressor
from xrfm_torch.data import prepare, read_csv

#: Phase -> the function (file suffix, name) whose cumulative time is the phase's.
PHASES = {
    "input-map probe": ("inputs/choice.py", "choose_maps"),
    "tree tops (split models, cuts)": ("tree/grow.py", "grow_tree"),
    "leaf fits": ("leaf/model.py", "fit"),
    "  RFM iterations": ("leaf/iteration.py", "iterate"),
    "  post-hoc exponent/bandwidth/ridge search": ("leaf/selection.py", "select_kernel"),
    "final solves (held-out rows joined)": ("leaf/model.py", "refit"),
    "temperature search": ("tree/temperature.py", "search_temperature"),
    "probability calibration": ("tree/targets.py", "calibrate"),
    "out-of-fold predictions (bags)": ("models/bagging.py", "_out_of_fold"),
}


def cumulative(stats: pstats.Stats, suffix: str, name: str) -> float:
    """Cumulative seconds of the function ``name`` defined in a file ending with ``suffix``."""
    raw = stats.stats  # type: ignore[attr-defined]
    return sum(v[3] for (path, _, fn), v in raw.items() if fn == name and path.endswith(suffix))


def load(path: Path, classification: bool) -> Any:
    """The protocol split of ``path`` (seed 0): numeric tables through ``prepare``, tables with
    text columns as DataFrames through the benchmark harness's split (``bench.peers``)."""
    try:
        X, y, names = read_csv(path, "target")
    except ValueError:  # text columns
        parts, ys, _ = split_table(path, 0)
        if classification:
            ys = class_codes(ys)
        return SimpleNamespace(
            X_train=parts[0], y_train=ys[0], X_val=parts[1], y_val=ys[1],
            X_test=parts[2], y_test=ys[2],
        )  # fmt: skip
    return prepare(X, y, 0, regression=not classification, feature_names=names)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", required=True, help="path under DIR without .csv.gz")
    ap.add_argument("--data-dir", type=Path, default=DATASETS)
    ap.add_argument("--options", default="{}", help="estimator arguments as JSON")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--top", type=int, default=15, help="functions listed by own time")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    classification = Path(a.table).parts[0].startswith("clf")
    d = load(a.data_dir / f"{a.table}.csv.gz", classification)
    cls = XRFMClassifier if classification else XRFMRegressor
    options = json.loads(a.options)
    cls(n_iters=1, random_state=0).fit(d.X_train[:300], d.y_train[:300])  # warm-up
    est = cls(random_state=0, **options)
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    est.fit(d.X_train, d.y_train, eval_set=(d.X_val, d.y_val))
    profiler.disable()
    total = time.perf_counter() - start
    stats = pstats.Stats(profiler)
    kind = type(est.model_).__name__
    print(f"{a.table}: {cls.__name__}({a.options}) -> {kind}, {len(d.y_train)} training rows, "
          f"{est.model_.n_leaves} leaves, fit {total:.1f} s under cProfile\n")  # fmt: skip
    print("| phase | s | share |\n|---|---|---|")
    for phase, (suffix, name) in PHASES.items():
        s = cumulative(stats, suffix, name)
        print(f"| {phase} | {s:.1f} | {s / total:.0%} |")
    print(f"\nown time, top {a.top}:\n")
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[: a.top]  # type: ignore[attr-defined]
    print("| function | own s | calls |\n|---|---|---|")
    for (path, line, fn), v in rows:
        where = "/".join(Path(path).parts[-2:]) if path != "~" else "builtin"
        print(f"| {fn} ({where}:{line}) | {v[2]:.1f} | {v[1]} |")
    if classification:
        proba = est.predict_proba(d.X_test)
        idx = np.searchsorted(est.classes_, d.y_test)
        print(
            f"\ntest log-loss {-np.mean(np.log(np.clip(proba[np.arange(len(idx)), idx], 1e-15, 1))):.4f}"
        )
    else:
        print(
            f"\ntest RMSE (standardized) {np.sqrt(np.mean((est.predict(d.X_test) - d.y_test) ** 2)):.4f}"
        )


if __name__ == "__main__":
    main()
