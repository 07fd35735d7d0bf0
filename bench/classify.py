"""Classification: xrfm_torch with each validation criterion, on the protocol split.

    python -m bench.classify --data-dir PATH/TO/clf_num --criteria mse logloss error --seeds 0
    python -m bench.classify --criteria mse --options '{"class_coding": "prevalence"}'

For every table (``NAME.csv.gz``, integer labels in ``target``), seed and criterion, fits
``xRFMTree(task="classification", leaf=LeafConfig(criterion=...))`` with the validation rows given
and reports test log-loss, Brier score, accuracy and AUROC (binary) and the fit seconds. Each fit
runs in its own process. Writes ``results.jsonl`` and ``results.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from bench.common import DATASETS, fit_on_split, run_module_child, write_table


def measure(path: Path, seed: int, criterion: str, threads: int, options: dict) -> dict:
    """Fit and score one (table, seed, criterion) in this process."""
    import torch

    from xrfm_torch import LeafConfig, xRFMTree
    from xrfm_torch.data import prepare, read_csv

    torch.set_num_threads(threads)
    X, y, names = read_csv(path, "target")
    d = prepare(X, y, seed, regression=False, feature_names=names)
    t = torch.from_numpy
    leaf = LeafConfig(criterion=criterion)  # type: ignore[arg-type]
    model = xRFMTree(task="classification", leaf=leaf, **options)
    fit_s = fit_on_split(model, d, seed)
    with torch.no_grad():
        p = model.predict_proba(t(d.X_test)).double().numpy()
    yt = d.y_test
    k = p.shape[1]
    onehot = np.eye(k)[yt]
    row = {
        "logloss": float(-np.log(p[np.arange(len(yt)), yt]).mean()),
        "brier": float(((p - onehot) ** 2).sum(1).mean()),
        "accuracy": float((p.argmax(1) == yt).mean()),
        "fit_s": fit_s,
        "input_maps": model.input_map.names,
        "leaves": model.n_leaves,
        "temperature": float(model.temperature_),
    }
    if k == 2:
        from sklearn.metrics import roc_auc_score

        row["auroc"] = float(roc_auc_score(yt, p[:, 1]))
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DATASETS / "clf_num")
    ap.add_argument("--datasets", nargs="*", help="names (default: every *.csv.gz in --data-dir)")
    ap.add_argument("--criteria", nargs="+", default=["mse", "logloss", "error"])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--options", default="{}", help="JSON keyword arguments for xRFMTree")
    ap.add_argument("--out", type=Path, default=Path("bench-classify"))
    ap.add_argument("--one", nargs=3, metavar=("PATH", "SEED", "CRITERION"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:  # the child process
        row = measure(Path(a.one[0]), int(a.one[1]), a.one[2], a.threads, json.loads(a.options))
        print(json.dumps(row))
        return
    files = {p.name.removesuffix(".csv.gz"): p for p in sorted(a.data_dir.glob("*.csv.gz"))}
    names = a.datasets or sorted(files)
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with (a.out / "results.jsonl").open("a") as fh:
        for name in names:
            for seed in a.seeds:
                for criterion in a.criteria:
                    args = ["--one", str(files[name]), str(seed), criterion]
                    args += ["--threads", str(a.threads), "--options", a.options]
                    child = run_module_child("bench.classify", args)
                    row = {"dataset": name, "seed": seed, "criterion": criterion, **child}
                    row["options"] = json.loads(a.options)
                    rows.append(row)
                    fh.write(json.dumps(row) + "\n")
                    fh.flush()
                    print(
                        f"{name:12s} seed {seed} {criterion:8s} logloss {row['logloss']:.4f} "
                        f"acc {100 * row['accuracy']:.2f} % brier {row['brier']:.4f} fit {row['fit_s']:.1f}s",
                        flush=True,
                    )
    lines = [
        "| dataset | seed | criterion | log-loss | accuracy | Brier | AUROC | fit s | maps, leaves |"
    ]
    lines.append("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        auroc = f"{r['auroc']:.4f}" if "auroc" in r else ""
        lines.append(
            f"| {r['dataset']} | {r['seed']} | {r['criterion']} | {r['logloss']:.4f} | "
            f"{100 * r['accuracy']:.2f} % | {r['brier']:.4f} | {auroc} | {r['fit_s']:.1f} | "
            f"{' & '.join(r['input_maps'])}, {r['leaves']} |"
        )
    write_table(a.out, "bench.classify", lines)


if __name__ == "__main__":
    main()
