"""Fit seconds of the presets against one tree: the README's cost column.

    python -m bench.preset_costs

``XRFMClassifier`` on three tables that need no download (scikit-learn's breast_cancer and
digits, a 6000 x 20 ``make_classification`` table), seed 0, 2 threads, after one warm-up fit:
one Laplace tree, 5 cross-fitted bags of it, the two-kernel blend of one tree each, and the
default (the blend of 5 bags). Prints a markdown table of seconds and ratios to one tree.
"""

from __future__ import annotations

import argparse
import time

import torch
from sklearn.datasets import load_breast_cancer, load_digits, make_classification

from xrfm_torch import XRFMClassifier

PRESETS = {
    "one tree": {"kernel": "laplace", "n_bags": 1},
    "5 bags": {"kernel": "laplace", "n_bags": 5},
    "2-kernel blend": {"n_bags": 1},
    "default (blend of 5 bags)": {},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    XRFMClassifier(n_iters=1, random_state=0).fit(*load_breast_cancer(return_X_y=True))
    tables = {
        "breast_cancer": load_breast_cancer(return_X_y=True),
        "digits": load_digits(return_X_y=True),
        "make_classification 6000 x 20": make_classification(
            6000, 20, n_informative=8, random_state=0
        ),
    }
    print("| table | " + " | ".join(PRESETS) + " |")
    print("|---" * (len(PRESETS) + 1) + "|")
    for name, (X, y) in tables.items():
        seconds = {}
        for preset, kwargs in PRESETS.items():
            start = time.perf_counter()
            XRFMClassifier(random_state=0, **kwargs).fit(X, y)
            seconds[preset] = time.perf_counter() - start
        one = seconds["one tree"]
        cells = [f"{s:.2f} s ({s / one:.1f}x)" for s in seconds.values()]
        print(f"| {name} ({len(y)} rows) | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
