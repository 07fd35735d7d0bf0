"""Tables with text categories and missing cells, through the scikit-learn estimators.

    python -m bench.mixed --data-dir PATH/TO/mixed --datasets adult ames --seeds 0

Reads ``NAME.csv.gz`` with pandas (empty cells and ``NA`` are missing; the last column is
``target``), splits rows by the protocol (70/10/20, seeded), and fits ``XRFMClassifier`` (binary
or multiclass integer targets) or ``XRFMRegressor`` with the validation rows as ``eval_set``.
Classification is scored by log-loss, accuracy and AUROC, regression by RMSE. Each fit runs in its
own process; results go to ``--out`` (``results.jsonl``, ``results.md``).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.common import DATASETS, run_module_child, write_table

CLASSIFICATION = {"adult"}


def measure(path: Path, seed: int, threads: int, options: dict | None = None) -> dict:
    """Fit and score one table and seed in this process."""
    import pandas as pd
    import torch

    from xrfm_torch import XRFMClassifier, XRFMRegressor
    from xrfm_torch.data import protocol_split

    torch.set_num_threads(threads)
    df = pd.read_csv(path)
    X, y = df.drop(columns="target"), df["target"].to_numpy()
    tr, va, te = protocol_split(len(df), seed)
    name = path.name.removesuffix(".csv.gz")
    classify = name in CLASSIFICATION
    est = (XRFMClassifier if classify else XRFMRegressor)(random_state=seed, **(options or {}))
    start = time.perf_counter()
    est.fit(X.iloc[tr], y[tr], eval_set=(X.iloc[va], y[va]))
    row: dict = {"fit_s": time.perf_counter() - start, "leaves": est.model_.n_leaves}
    trees = [t for _, t in est.model_.single_trees()]  # every bag of every kernel, or one tree
    row["n_bags"] = len(trees)
    row["input_maps"] = sorted({name for t in trees for name in t.input_map.names})
    row["categorical"] = len(est.encoder_.categorical)
    row["columns_seen"] = int(trees[0].leaves()[0].support_.shape[1])
    if classify:
        p = est.predict_proba(X.iloc[te])
        yt = np.searchsorted(est.classes_, y[te])
        row["logloss"] = float(-np.log(p[np.arange(len(yt)), yt]).mean())
        row["accuracy"] = float((p.argmax(1) == yt).mean())
        if p.shape[1] == 2:
            from sklearn.metrics import roc_auc_score

            row["auroc"] = float(roc_auc_score(yt, p[:, 1]))
    else:
        row["rmse"] = float(np.sqrt(np.mean((est.predict(X.iloc[te]) - y[te]) ** 2)))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DATASETS / "mixed")
    ap.add_argument("--datasets", nargs="+", default=["adult", "ames"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--options", default="{}", help="JSON keyword arguments for the estimator")
    ap.add_argument("--out", type=Path, default=Path("bench-mixed"))
    ap.add_argument("--one", nargs=2, metavar=("PATH", "SEED"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        options = json.loads(a.options)
        print(json.dumps(measure(Path(a.one[0]), int(a.one[1]), a.threads, options)))
        return
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with (a.out / "results.jsonl").open("a") as fh:
        for name in a.datasets:
            for seed in a.seeds:
                path = a.data_dir / f"{name}.csv.gz"
                args = ["--one", str(path), str(seed), "--threads", str(a.threads)]
                args += ["--options", a.options]
                row = {"dataset": name, "seed": seed, **run_module_child("bench.mixed", args)}
                rows.append(row)
                fh.write(json.dumps(row) + "\n")
                fh.flush()
                print(json.dumps(row), flush=True)
    table = [
        "| dataset | seed | log-loss | accuracy | AUROC | RMSE | fit s | leaves | columns seen |"
    ]
    table.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        cells = [
            f"{r['logloss']:.4f}" if "logloss" in r else "",
            f"{100 * r['accuracy']:.2f} %" if "accuracy" in r else "",
            f"{r['auroc']:.4f}" if "auroc" in r else "",
            f"{r['rmse']:.4f}" if "rmse" in r else "",
        ]
        table.append(
            f"| {r['dataset']} | {r['seed']} | {' | '.join(cells)} | {r['fit_s']:.1f} | "
            f"{r['leaves']} | {r['columns_seen']} |"
        )
    write_table(a.out, "bench.mixed", table)


if __name__ == "__main__":
    main()
