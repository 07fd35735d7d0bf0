"""Predictive uncertainty on the regression sets: Gaussian NLL and interval coverage.

    python -m bench.uncertainty --seeds 0 1 2
    python -m bench.uncertainty --datasets pol --models ours_gp catboost_unc --seeds 0
    python -m bench.uncertainty --models ours --agop-ridge 0.1     # GP-RFM's M = G + lambda_M I

Protocol split (seeded 70/10/20, inputs standardized with training statistics). Every model gets
the training rows, the validation rows for its choices, and predicts a mean and a standard
deviation for the test rows, in the target's original units:

- ``ours``: ``xRFMTree(uncertainty="calibrated")``; ``ours_gp``: ``uncertainty="gp"`` (each leaf's
  Gaussian process with its marginal-likelihood scale; no validation data in the variance);
- ``catboost_unc``: ``CatBoostRegressor(loss_function="RMSEWithUncertainty")``, 3000 iterations,
  learning rate 0.05, early stopping 100 on the validation rows, raw targets (the issue's anchor).

Scores: NLL = mean of ``log(2 pi s^2) / 2 + (y - m)^2 / (2 s^2)`` per test row, coverage of the
central 50/80/90/95 % intervals, RMSE; for ours also the fit time, the fit time without
uncertainty and the prediction time with and without standard deviations. Each (dataset, seed,
model) runs in its own process. Writes ``results.jsonl`` and ``results.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from bench.common import DEFAULT_DATA, fit_on_split, run_module_child, write_table

MODELS = ["ours", "ours_gp", "catboost_unc"]
COVERAGES = (0.5, 0.8, 0.9, 0.95)
#: The issue's anchors: the GP-RFM paper's NLL (its own protocol) and CatBoost
#: RMSEWithUncertainty measured on this protocol at seed 0 (NLL, 90 % coverage).
ANCHORS = {
    "cpu_act": (2.21, 2.172),
    "pol": (2.73, 2.245),
    "elevators": (-4.86, -4.667),
    "wine_quality": (0.95, 1.025),
    "Ailerons": (-7.37, -7.446),
    "houses": (-0.07, -0.081),
    "house_16H": (0.69, 0.622),
    "Brazilian_houses": (-2.11, 1.076),
    "Bike_Sharing_Demand": (6.04, 5.554),
    "house_sales": (-0.32, -0.327),
}


def scores(y: np.ndarray, mean: np.ndarray, std: np.ndarray) -> dict[str, float]:
    """NLL, RMSE and central-interval coverages of Gaussian predictions (1-d arrays)."""
    from statistics import NormalDist

    var = std.astype(np.float64) ** 2
    r = y.astype(np.float64) - mean
    out = {
        "nll": float(np.mean(0.5 * np.log(2 * np.pi * var) + r * r / (2 * var))),
        "rmse": float(np.sqrt(np.mean(r * r))),
    }
    for c in COVERAGES:
        z = NormalDist().inv_cdf(0.5 + c / 2)
        out[f"cov{round(100 * c)}"] = float(np.mean(np.abs(r) <= z * std))
    return out


def measure(path: Path, seed: int, model: str, threads: int, agop_ridge: float = 0.0) -> dict:
    """Fit and score one (dataset, seed, model) in this process."""
    import torch

    from xrfm_torch.data import prepare, read_csv

    torch.set_num_threads(threads)
    X, y, names = read_csv(path, "target")
    d = prepare(X, y, seed, feature_names=names)
    inv = d.y_scaler.inverse
    y_test = inv(d.y_test)
    row: dict = {}
    if model in ("ours", "ours_gp"):
        from xrfm_torch import LeafConfig, xRFMTree

        t = torch.from_numpy
        kind = "calibrated" if model == "ours" else "gp"
        fitted = {}
        for unc in ("none", kind):  # the same seed: the same means, with and without variances
            m = xRFMTree(uncertainty=unc, leaf=LeafConfig(agop_ridge=agop_ridge))
            fitted[unc] = (m, fit_on_split(m, d, seed))
        m, row["fit_s"] = fitted[kind]
        row["fit_s_mean_only"] = fitted["none"][1]
        with torch.no_grad():
            s = time.perf_counter()
            m(t(d.X_test))
            row["predict_s_mean_only"] = time.perf_counter() - s
            s = time.perf_counter()
            mean, std = m(t(d.X_test), return_std=True)
            row["predict_s"] = time.perf_counter() - s
        scale = float(np.ravel(d.y_scaler.std)[0])
        mean, std = inv(mean.numpy()[:, 0]), std.numpy()[:, 0] * scale
    elif model == "catboost_unc":
        import catboost as cb

        s = time.perf_counter()
        m = cb.CatBoostRegressor(
            loss_function="RMSEWithUncertainty",
            iterations=3000,
            learning_rate=0.05,
            thread_count=threads,
            random_seed=seed,
            verbose=False,
            early_stopping_rounds=100,
            allow_writing_files=False,
        )
        m.fit(d.X_train, inv(d.y_train), eval_set=(d.X_val, inv(d.y_val)))
        row["fit_s"] = time.perf_counter() - s
        out = np.asarray(m.predict(d.X_test, prediction_type="RMSEWithUncertainty"))
        mean, std = out[:, 0], np.sqrt(out[:, 1])  # CatBoost returns (mean, variance)
    else:
        raise ValueError(f"unknown model {model!r}")
    row.update(scores(y_test, mean, std))
    return row


def summary(rows: list[dict], datasets: list[str], models: list[str]) -> list[str]:
    """Markdown: mean NLL (90 % coverage) per dataset and model, anchors, wins."""
    head = ["dataset", *models, "GP-RFM paper", "CatBoost anchor (seed 0)", "ours ≤ both"]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---|" * (len(head) - 1)]
    wins = 0
    covered = 0
    for ds in datasets:
        cells, ours = [], None
        for m in models:
            rs = [r for r in rows if r["dataset"] == ds and r["model"] == m and "error" not in r]
            if not rs:
                cells.append("—")
                continue
            nll = statistics.mean(r["nll"] for r in rs)
            cov = statistics.mean(r["cov90"] for r in rs)
            cells.append(f"{nll:.3f} ({cov:.2f}, n={len(rs)})")
            if m == "ours":
                ours = (nll, cov)
        gp, cat = ANCHORS.get(ds, (float("nan"), float("nan")))
        win = ours is not None and ours[0] <= min(gp, cat)
        wins += win
        covered += ours is not None and 0.85 <= ours[1] <= 0.95
        mark = "—" if ours is None else ("yes" if win else "no")
        lines.append(f"| {ds} | " + " | ".join(cells) + f" | {gp} | {cat} | {mark} |")
    lines.append("")
    lines.append(
        f"ours ≤ both anchors on {wins}/{len(datasets)}; 90 % coverage in [0.85, 0.95] "
        f"on {covered}/{len(datasets)}"
    )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--datasets", nargs="*", help="names (default: every *.csv.gz, smallest first)")
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("bench-uncertainty"))
    ap.add_argument(
        "--agop-ridge", type=float, default=0.0, help="LeafConfig.agop_ridge (lambda_M) for ours"
    )
    ap.add_argument("--one", nargs=3, metavar=("PATH", "SEED", "MODEL"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.one:
        path, seed, model = Path(a.one[0]), int(a.one[1]), a.one[2]
        print(json.dumps(measure(path, seed, model, a.threads, a.agop_ridge)))
        return
    files = {p.name.removesuffix(".csv.gz"): p for p in sorted(a.data_dir.glob("*.csv.gz"))}
    names = a.datasets or sorted(files, key=lambda n: files[n].stat().st_size)
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with (a.out / "results.jsonl").open("a") as fh:
        for seed in a.seeds:
            for ds in names:
                for model in a.models:
                    args = ["--one", str(files[ds]), str(seed), model, "--threads", str(a.threads)]
                    args += ["--agop-ridge", str(a.agop_ridge)]
                    row = {"dataset": ds, "seed": seed, "model": model}
                    if a.agop_ridge and model != "catboost_unc":
                        row["agop_ridge"] = a.agop_ridge
                    try:
                        row.update(run_module_child("bench.uncertainty", args))
                    except SystemExit as err:  # one failing run does not end the run
                        row["error"] = str(err)[-600:]
                    rows.append(row)
                    fh.write(json.dumps(row) + "\n")
                    fh.flush()
                    print(json.dumps(row), flush=True)
    write_table(a.out, "bench.uncertainty", summary(rows, names, a.models))


if __name__ == "__main__":
    main()
