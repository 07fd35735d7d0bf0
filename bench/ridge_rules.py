"""Ridge rules on small data: the validation walk, GCV and ``"auto"`` where validation rows are few.

    python -m bench.ridge_rules --data-dir PATH/TO/reg_num --rows 250 1000 --seeds 0 1 2 --out DIR

For each table, seed and size ``n`` it fits ``xRFMTree`` on a seeded subsample of ``n`` protocol
training rows and ``n // 8`` protocol validation rows (so a leaf validates on 31 rows at
``n = 250``), once per ``LeafConfig(ridge_rule=...)``, and scores the full test split (RMSE) and
the fit time. Writes ``results.jsonl`` and ``results.md``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from bench.common import DEFAULT_DATA, run_module_child, write_table

RULES = ("validation", "gcv", "auto")


def measure(path: Path, seed: int, rows: int, rule: str, threads: int) -> dict:
    import numpy as np
    import torch

    from xrfm_torch import LeafConfig, xRFMTree
    from xrfm_torch.data import prepare, read_csv

    torch.set_num_threads(threads)
    X, y, names = read_csv(path, "target")
    d = prepare(X, y, seed, regression=True, feature_names=names)
    rng = np.random.default_rng(seed)
    tr = rng.permutation(len(d.X_train))[:rows]
    va = rng.permutation(len(d.X_val))[: max(rows // 8, 2)]
    t = torch.from_numpy
    model = xRFMTree(leaf=LeafConfig(ridge_rule=rule))  # type: ignore[arg-type]
    start = time.perf_counter()
    model.fit(
        t(d.X_train[tr]),
        t(d.y_train[tr]),
        t(d.X_val[va]),
        t(d.y_val[va]),
        generator=torch.Generator().manual_seed(seed),
    )
    fit_s = time.perf_counter() - start
    with torch.no_grad():
        pred = model(t(d.X_test)).numpy().reshape(-1)
    rmse = float(np.sqrt(np.mean((pred - d.y_test.reshape(-1)) ** 2)))
    return {"rmse": rmse, "fit_s": fit_s, "val_rows": len(va)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--datasets", nargs="*")
    ap.add_argument("--rows", nargs="+", type=int, default=[250, 1000])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("bench-ridge-rules"))
    ap.add_argument(
        "--one", nargs=4, metavar=("PATH", "SEED", "ROWS", "RULE"), help=argparse.SUPPRESS
    )
    a = ap.parse_args()
    if a.one:
        path, seed, rows, rule = a.one
        print(json.dumps(measure(Path(path), int(seed), int(rows), rule, a.threads)))
        return
    files = {p.name.removesuffix(".csv.gz"): p for p in sorted(a.data_dir.glob("*.csv.gz"))}
    a.out.mkdir(parents=True, exist_ok=True)
    lines = ["| dataset | rows | seed | " + " | ".join(f"{r} RMSE (fit s)" for r in RULES) + " |"]
    lines.append("|---|---|---|" + "---|" * len(RULES))
    with (a.out / "results.jsonl").open("a") as fh:
        for name in a.datasets or sorted(files):
            for rows in a.rows:
                for seed in a.seeds:
                    cells = []
                    for rule in RULES:
                        args = ["--one", str(files[name]), str(seed), str(rows), rule]
                        r = run_module_child(
                            "bench.ridge_rules", [*args, "--threads", str(a.threads)]
                        )
                        row = {"dataset": name, "rows": rows, "seed": seed, "rule": rule, **r}
                        fh.write(json.dumps(row) + "\n")
                        print(json.dumps(row), flush=True)
                        cells.append(f"{r['rmse']:.4g} ({r['fit_s']:.1f})")
                    lines.append(f"| {name} | {rows} | {seed} | " + " | ".join(cells) + " |")
    write_table(a.out, "bench.ridge_rules", lines)


if __name__ == "__main__":
    main()
