"""Imbalanced classification: ``XRFMClassifier(class_weight="balanced")`` against unweighted.

    python -m bench.class_weight --data-dir PATH/TO/clf_num --seeds 0 1 2 --minority 0.1

Each ``clf_num`` table (balanced by the benchmark) is made imbalanced: for each seed, class 1 is
subsampled to ``--minority`` times the rows of class 0 (seeded), then split by the protocol
(train / validation / test). Both models get the validation rows as ``eval_set`` (the balanced
one with its class weights applied to them). Reported on the test rows: balanced accuracy (the
mean per-class recall), accuracy, log-loss and the minority class's recall. Writes
``results.jsonl`` and ``results.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.common import DATASETS, write_table


def imbalanced(X: np.ndarray, y: np.ndarray, minority: float, seed: int):
    """Keep all class-0 rows and a seeded ``minority`` share (of their count) of class 1."""
    rng = np.random.default_rng(seed)
    ones = np.flatnonzero(y == 1)
    keep_ones = rng.choice(ones, size=round(minority * int((y == 0).sum())), replace=False)
    rows = np.sort(np.concatenate([np.flatnonzero(y == 0), keep_ones]))
    return X[rows], y[rows]


def measure(name: str, path: Path, seed: int, minority: float, threads: int) -> list[dict]:
    import torch

    from xrfm_torch import XRFMClassifier
    from xrfm_torch.data import prepare, read_csv

    torch.set_num_threads(threads)
    X, y, names = read_csv(path, "target")
    X, y = imbalanced(X, y.astype(np.int64), minority, seed)
    d = prepare(X, y.astype(np.float64), seed, regression=False, feature_names=names)
    yt = d.y_test.astype(np.int64)
    rows = []
    for class_weight in (None, "balanced"):
        model = XRFMClassifier(class_weight=class_weight, random_state=seed)
        start = time.perf_counter()
        model.fit(
            d.X_train, d.y_train.astype(np.int64), eval_set=(d.X_val, d.y_val.astype(np.int64))
        )
        fit_s = time.perf_counter() - start
        p = model.predict_proba(d.X_test)
        pred = model.classes_[p.argmax(1)]
        recalls = [float((pred[yt == k] == k).mean()) for k in (0, 1)]
        rows.append(
            {
                "dataset": name,
                "seed": seed,
                "minority": minority,
                "class_weight": class_weight,
                "n_train": len(d.y_train),
                "test_minority_rows": int((yt == 1).sum()),
                "balanced_accuracy": float(np.mean(recalls)),
                "minority_recall": recalls[1],
                "accuracy": float((pred == yt).mean()),
                "logloss": float(-np.log(p[np.arange(len(yt)), yt]).mean()),
                "fit_s": fit_s,
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DATASETS / "clf_num")
    ap.add_argument("--datasets", nargs="*", default=["pol", "house_16H", "california"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--minority", type=float, default=0.1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("bench-class-weight"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with (a.out / "results.jsonl").open("a") as fh:
        for name in a.datasets:
            for seed in a.seeds:
                for row in measure(
                    name, a.data_dir / f"{name}.csv.gz", seed, a.minority, a.threads
                ):
                    rows.append(row)
                    fh.write(json.dumps(row) + "\n")
                    fh.flush()
                    print(
                        f"{name:12s} seed {seed} {row['class_weight']!s:9s} bal.acc "
                        f"{row['balanced_accuracy']:.4f} recall1 {row['minority_recall']:.4f} "
                        f"acc {row['accuracy']:.4f} logloss {row['logloss']:.4f} fit {row['fit_s']:.1f}s",
                        flush=True,
                    )
    lines = [
        "| dataset | class_weight | balanced accuracy | minority recall | accuracy | log-loss | fit s |",
        "|---|---|---|---|---|---|---|",
    ]
    for name in a.datasets:
        for cw in (None, "balanced"):
            sel = [r for r in rows if r["dataset"] == name and r["class_weight"] == cw]
            if not sel:
                continue
            mean = {
                k: float(np.mean([r[k] for r in sel]))
                for k in sel[0]
                if k not in ("dataset", "class_weight")
            }
            lines.append(
                f"| {name} | {cw} | {mean['balanced_accuracy']:.4f} | {mean['minority_recall']:.4f} | "
                f"{mean['accuracy']:.4f} | {mean['logloss']:.4f} | {mean['fit_s']:.1f} |"
            )
    lines.append(f"\nMeans over seeds {a.seeds}; class 1 subsampled to {a.minority} x class 0.")
    write_table(a.out, "bench.class_weight", lines)


if __name__ == "__main__":
    main()
