"""Probe: bagged probabilities averaged vs one calibration map refitted on out-of-fold scores.

    python -m bench.oof_calibration --data-dir DIR --tables iris wine penguins --seeds 0 1 2

For each suite table (``DIR/clf_suite/NAME.csv.gz``, ``bench.suite``) and seed: test log-loss of
the single default model (``n_bags=1``), of 5 cross-fitted bags with their probabilities
averaged (``BaggedTree.predict_proba``), and of the bags' mean class scores mapped by one
``TargetCoding`` calibration (platt, clip, softmax, auto) fitted on the out-of-fold scores of all
pooled rows. One JSON line per (table, seed) on stdout. One thread.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench.peers import logloss


def probe(path: Path, seed: int) -> dict:
    import torch

    from bench.peers import split_table
    from xrfm_torch import XRFMClassifier
    from xrfm_torch.tree.targets import TargetCoding

    torch.set_num_threads(1)
    parts, ys, _ = split_table(path, seed)
    classes = np.unique(ys[0])
    ys = tuple(np.searchsorted(classes, y) for y in ys)
    out: dict = {"table": path.name.removesuffix(".csv.gz"), "seed": seed}
    single = XRFMClassifier(random_state=seed, n_bags=1)
    single.fit(parts[0], ys[0], eval_set=(parts[1], ys[1]))
    out["single"] = logloss(single.predict_proba(parts[2]), ys[2])
    m = XRFMClassifier(random_state=seed, n_bags=5)
    m.fit(parts[0], ys[0], eval_set=(parts[1], ys[1]))
    out["bag5_mean"] = logloss(m.predict_proba(parts[2]), ys[2])
    tree = m.tree_
    Xp = torch.tensor(np.vstack([m._read(parts[0]), m._read(parts[1])]), dtype=torch.float32)
    yp = torch.tensor(np.concatenate([ys[0], ys[1]])).float()
    scores = torch.zeros(len(yp), len(classes))
    with torch.no_grad():
        for k, bag in enumerate(tree.bags):
            rows = tree.folds_ == k
            scores[rows] = bag(Xp[rows])
        xt = torch.tensor(m._read(parts[2]), dtype=torch.float32)
        mean_scores = torch.stack([b(xt) for b in tree.bags]).mean(0)
        for cal in ("platt", "clip", "softmax", "auto"):
            coding = TargetCoding("classification", "one_hot", cal).fit(yp)
            coding.calibrate(scores, coding.encode(yp), None)
            p = coding.probabilities(mean_scores).double().numpy()
            out[f"oof_{cal}"] = logloss(p, ys[2])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, required=True, help="folder holding clf_suite/")
    ap.add_argument("--tables", nargs="+", required=True)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    a = ap.parse_args()
    for seed in a.seeds:
        for name in a.tables:
            print(json.dumps(probe(a.data_dir / "clf_suite" / f"{name}.csv.gz", seed)), flush=True)


if __name__ == "__main__":
    main()
