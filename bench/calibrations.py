"""Probability calibrations compared on the same fitted classifiers (test log-loss).

    python -m bench.calibrations --data-dir PATH/TO/clf_num --seeds 0 1 2 --out DIR

Each (table, seed) fits ``xRFMTree(task="classification")`` once on the protocol split and
captures the validation scores its calibration step sees (the averaged trees' outputs on
validation rows the leaves did not fit); every calibration is then fitted on those scores and
scored on the test rows: ``clip`` (scores clipped to [1e-3, 1 - 1e-3]), ``softmax`` (one scale),
``auto`` (that softmax where it wins by 2 paired standard errors), ``platt`` (the default:
``softmax(a log max(s, 0.01) + b)``). Writes ``results.jsonl`` and ``results.md``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common import DATASETS, fit_on_split, run_module_child, write_table

CALIBRATIONS = ("clip", "softmax", "auto", "platt")


def measure(path: Path, seed: int, threads: int) -> dict:
    import torch

    from xrfm_torch import xRFMTree
    from xrfm_torch.data import prepare, read_csv
    from xrfm_torch.leaf.criteria import (
        choose_softmax_scale,
        class_probabilities,
        fit_platt,
        fit_softmax_scale,
        row_logloss,
    )
    from xrfm_torch.tree import targets

    torch.set_num_threads(threads)
    captured: dict = {}
    calibrate = targets.TargetCoding.calibrate

    def capture(self, scores, y_val):  # type: ignore[no-untyped-def]
        captured["scores"] = scores.double().clone()
        captured["labels"] = (y_val + self.prior_.to(y_val.dtype)).argmax(1)
        return calibrate(self, scores, y_val)

    targets.TargetCoding.calibrate = capture  # type: ignore[method-assign]
    X, y, names = read_csv(path, "target")
    d = prepare(X, y, seed, regression=False, feature_names=names)
    t = torch.from_numpy
    model = xRFMTree(task="classification")
    fit_on_split(model, d, seed)
    with torch.no_grad():
        test = model(t(d.X_test)).double()
    labels = t(d.y_test).long()
    v, yv = captured["scores"], captured["labels"]
    probs = {
        "clip": class_probabilities(test),
        "softmax": class_probabilities(test, fit_softmax_scale(v, yv)),
        "auto": class_probabilities(test, choose_softmax_scale(v, yv)),
        "platt": class_probabilities(test, platt=fit_platt(v, yv)),
    }
    row = {name: float(row_logloss(p, labels).mean()) for name, p in probs.items()}
    row["accuracy"] = {
        name: float((p.argmax(1) == labels).double().mean()) for name, p in probs.items()
    }
    row["val_rows"] = len(yv)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DATASETS / "clf_num")
    ap.add_argument("--datasets", nargs="*")
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("bench-calibrations"))
    ap.add_argument("--one", nargs=2, metavar=("PATH", "SEED"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        print(json.dumps(measure(Path(a.one[0]), int(a.one[1]), a.threads)))
        return
    files = {p.name.removesuffix(".csv.gz"): p for p in sorted(a.data_dir.glob("*.csv.gz"))}
    a.out.mkdir(parents=True, exist_ok=True)
    lines = ["| dataset | seed | " + " | ".join(CALIBRATIONS) + " | validation rows |"]
    lines.append("|---|---|" + "---|" * (len(CALIBRATIONS) + 1))
    with (a.out / "results.jsonl").open("a") as fh:
        for name in a.datasets or sorted(files):
            for seed in a.seeds:
                args = ["--one", str(files[name]), str(seed), "--threads", str(a.threads)]
                row = {
                    "dataset": name,
                    "seed": seed,
                    **run_module_child("bench.calibrations", args),
                }
                fh.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
                cells = " | ".join(f"{row[c]:.4f}" for c in CALIBRATIONS)
                lines.append(f"| {name} | {seed} | {cells} | {row['val_rows']} |")
    write_table(a.out, "bench.calibrations", lines)


if __name__ == "__main__":
    main()
