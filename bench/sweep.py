"""Compare xRFMTree option sets on the protocol datasets, in one process (a device may be given).

For exploring defaults quickly (e.g. on a GPU); the reported benchmark is ``bench/run.py``, which
measures each model in its own process on this machine. Example::

    python -m bench.sweep --device cuda --configs '{"base": {}, "ov": {"overlap_fraction": 0.1}}'
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from bench.common import DEFAULT_DATA, fit_predict, leaf_summary
from xrfm_torch import xRFMTree
from xrfm_torch.data import prepare, read_csv


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--datasets", nargs="*", help="file stems (default: every *.csv.gz)")
    ap.add_argument(
        "--configs",
        required=True,
        help='JSON {"name": {xRFMTree options, objects as {"_target_": ...} dicts}, ...}',
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, help="append one JSON line per fit here")
    ap.add_argument(
        "--references",
        nargs="*",
        default=[],
        choices=["xrfm_default", "xrfm_d"],
        help="also fit these configurations of the reference xrfm on --device",
    )
    a = ap.parse_args()
    configs: dict[str, dict] = json.loads(a.configs)
    files = sorted(a.data.glob("*.csv.gz"))
    if a.datasets:
        files = [f for f in files if f.name.removesuffix(".csv.gz") in a.datasets]
    table: dict[str, dict[str, float]] = {}

    def record(row: dict) -> None:
        """Print a fit's JSON line, append it to --out, keep its RMSE for the table."""
        print(json.dumps(row), flush=True)
        if a.out:
            with a.out.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
        table.setdefault(row["dataset"], {})[row["model"]] = row["rmse"]

    for f in files:
        name = f.name.removesuffix(".csv.gz")
        X, y, names = read_csv(f, "target")
        d = prepare(X, y, a.seed, feature_names=names)

        def t(v: np.ndarray) -> torch.Tensor:
            return torch.from_numpy(v).to(a.device)

        y_test = d.y_scaler.inverse(d.y_test)
        for ref in a.references:
            pred, fit_s, _, _ = fit_predict(ref, d, a.seed, torch.get_num_threads(), {}, a.device)
            rmse = float(np.sqrt(np.mean((pred - y_test) ** 2)))
            record({"dataset": name, "seed": a.seed, "model": ref, "rmse": rmse, "fit_s": fit_s})
        for cname, opts in configs.items():
            s = time.perf_counter()
            m = xRFMTree.from_config(opts).fit(
                t(d.X_train),
                t(d.y_train),
                t(d.X_val),
                t(d.y_val),
                generator=torch.Generator().manual_seed(a.seed),
            )
            if a.device != "cpu":
                torch.cuda.synchronize()
            fit_s = time.perf_counter() - s
            with torch.no_grad():
                pred = d.y_scaler.inverse(m(t(d.X_test)).cpu().numpy()[:, 0])
            rmse = float(np.sqrt(np.mean((pred - y_test) ** 2)))
            row = {
                "dataset": name,
                "seed": a.seed,
                "model": cname,
                "rmse": rmse,
                "fit_s": fit_s,
                **leaf_summary(m),
            }
            record(row)
    names_c = list(configs) + list(a.references)
    print("| dataset | " + " | ".join(names_c) + " |")
    print("|---" * (len(names_c) + 1) + "|")
    for name, row in table.items():
        base = row[names_c[0]]
        cells = [f"{row[c]:.5g} ({row[c] / base:.4f})" for c in names_c]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
