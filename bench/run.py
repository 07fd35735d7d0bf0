"""Accuracy and speed: xrfm_torch vs the reference xrfm (defaults and XRFM_D), three GBDTs, RealMLP.

    python -m bench.run                      # every NAME.csv.gz in --data-dir, seed 0
    python -m bench.run --datasets cpu_act houses --seeds 0 1 2 --models ours xrfm_d

Every (dataset, seed, model) runs in its own process (peak RSS per model). Writes
``results.jsonl``, ``results.md`` and ``results.png`` into ``--out`` and prints ours/reference ratios.
Needs the ``bench`` extra (``pip install -e ".[bench]"``); ``realmlp`` (pytabkit's RealMLP-TD with
its defaults, validation rows for its early stopping) also needs ``pytabkit``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from bench.common import DEFAULT_DATA, ROOT, run_isolated

MODELS = ["ours", "xrfm_default", "xrfm_d", "xgboost", "lightgbm", "catboost", "realmlp"]
GBDTS = ["xgboost", "lightgbm", "catboost"]


def table(rows: list[dict], datasets: list[str], models: list[str]) -> str:
    """Markdown table: mean test RMSE (fit seconds) per dataset and model, plus ratios."""

    def cell(ds: str, m: str) -> tuple[float, float] | None:
        rs = [r for r in rows if r["dataset"] == ds and r["model"] == m and "rmse" in r]
        if not rs:
            return None
        return statistics.mean(r["rmse"] for r in rs), statistics.mean(r["fit_s"] for r in rs)

    head = (
        "| dataset | "
        + " | ".join(models)
        + " | ours/best ref RMSE | ours/best ref fit s | ours ≤ best GBDT |"
    )
    lines = [head, "|" + "---|" * (len(models) + 4)]
    for ds in datasets:
        vals = {m: cell(ds, m) for m in models}
        out = [ds]
        for m in models:
            v = vals[m]
            out.append("—" if v is None else f"{v[0]:.4g} ({v[1]:.1f}s)")
        refs = [vals[m] for m in ("xrfm_default", "xrfm_d") if vals.get(m)]
        ours = vals.get("ours")
        if ours and refs:
            best = min(refs, key=lambda v: v[0])
            out += [f"{ours[0] / best[0]:.3f}", f"{ours[1] / best[1]:.2f}"]
        else:
            out += ["—", "—"]
        gb = [vals[m][0] for m in GBDTS if vals.get(m)]
        out.append("—" if not (ours and gb) else ("yes" if ours[0] <= min(gb) else "no"))
        lines.append("| " + " | ".join(out) + " |")
    return "\n".join(lines)


def chart(rows: list[dict], datasets: list[str], models: list[str], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    fig, axes = plt.subplots(1, 2, figsize=(12, 0.45 * len(datasets) + 2), sharey=True)
    for k, m in enumerate(models):
        rel, fit = [], []
        for ds in datasets:
            base = [
                r["rmse"]
                for r in rows
                if r["dataset"] == ds and r["model"] == "xrfm_d" and "rmse" in r
            ]
            mine = [r for r in rows if r["dataset"] == ds and r["model"] == m and "rmse" in r]
            rel.append(
                statistics.mean(r["rmse"] for r in mine) / statistics.mean(base)
                if mine and base
                else float("nan")
            )
            fit.append(statistics.mean(r["fit_s"] for r in mine) if mine else float("nan"))
        ys = [i + 0.12 * (k - len(models) / 2) for i in range(len(datasets))]
        axes[0].scatter(rel, ys, label=m, s=25)
        axes[1].scatter(fit, ys, label=m, s=25)
    axes[0].axvline(1.0, color="gray", lw=0.8)
    axes[0].set_xlabel("test RMSE / xrfm XRFM_D RMSE")
    axes[1].set_xscale("log")
    axes[1].set_xlabel("fit seconds (log)")
    axes[0].set_yticks(range(len(datasets)), datasets)
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--datasets", nargs="*", help="names (default: every *.csv.gz in --data-dir)")
    ap.add_argument("--seeds", nargs="*", type=int, default=[0])
    ap.add_argument("--models", nargs="*", default=MODELS, choices=MODELS)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per measurement")
    ap.add_argument("--options", default="{}", help="JSON keyword arguments for our xRFMTree")
    ap.add_argument(
        "--with-results",
        nargs="*",
        type=Path,
        default=[],
        help="results.jsonl files of earlier runs: their rows for models not run now join the "
        "table and ratios (the first file wins per dataset/seed/model); with --models and no "
        "names, only report",
    )
    ap.add_argument(
        "--out", type=Path, default=ROOT / "bench" / "results" / time.strftime("%Y%m%d-%H%M%S")
    )
    a = ap.parse_args()
    files = {p.name.removesuffix(".csv.gz"): p for p in sorted(a.data_dir.glob("*.csv.gz"))}
    if not files:
        sys.exit(f"no *.csv.gz datasets in {a.data_dir}")
    names = a.datasets or sorted(files, key=lambda n: files[n].stat().st_size)
    a.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with (a.out / "results.jsonl").open("w") as fh:
        for ds in names:
            for seed in a.seeds:
                for m in a.models:
                    args = [
                        "--model",
                        m,
                        "--csv",
                        str(files[ds]),
                        "--seed",
                        str(seed),
                        "--threads",
                        str(a.threads),
                        "--options",
                        a.options,
                    ]
                    res = {"dataset": ds, "seed": seed, "model": m, **run_isolated(args, a.timeout)}
                    rows.append(res)
                    fh.write(json.dumps(res) + "\n")
                    fh.flush()
                    msg = res.get("error", "").splitlines()[-1:] if "error" in res else None
                    print(
                        f"{ds:20s} seed {seed} {m:13s} "
                        + (
                            f"ERROR {msg}"
                            if msg is not None
                            else f"rmse {res['rmse']:.5g}  r2 {res['r2']:.4f}  fit {res['fit_s']:.1f}s  "
                            f"predict {res['predict_s']:.2f}s  rss {res['peak_rss_mb']:.0f}MB"
                        ),
                        flush=True,
                    )
    for path in a.with_results:
        with path.open() as fh:
            old = [json.loads(line) for line in fh if line.strip()]
        have = {(r["dataset"], r["seed"], r["model"]) for r in rows}
        rows += [
            r
            for r in old
            if (r["dataset"], r["seed"], r["model"]) not in have
            and r["model"] not in a.models
            and r["dataset"] in names
        ]
    if a.with_results:  # the merged rows, so the output directory stands on its own
        with (a.out / "results.jsonl").open("w") as fh:
            fh.writelines(json.dumps(r) + "\n" for r in rows)
    shown = [m for m in MODELS if any(r["model"] == m for r in rows)]
    md = table(rows, names, shown)
    cmd = "python -m bench.run " + " ".join(sys.argv[1:])
    (a.out / "results.md").write_text(f"Command: `{cmd}`\n\n{md}\n")
    chart(rows, names, shown, a.out / "results.png")
    print("\n" + md)
    ratios = []
    for ds in names:
        ours = [r for r in rows if r["dataset"] == ds and r["model"] == "ours" and "fit_s" in r]
        refs = [
            [r for r in rows if r["dataset"] == ds and r["model"] == m and "rmse" in r]
            for m in ("xrfm_default", "xrfm_d")
        ]
        refs = [rs for rs in refs if rs]
        if ours and refs:
            best = min(refs, key=lambda rs: statistics.mean(r["rmse"] for r in rs))
            ratios.append(
                statistics.mean(r["fit_s"] for r in ours)
                / statistics.mean(r["fit_s"] for r in best)
            )
    if ratios:
        summary = (
            f"median fit-time ratio ours / better reference configuration: "
            f"{statistics.median(ratios):.3f}"
        )
        print("\n" + summary)
        with (a.out / "results.md").open("a") as fh:
            fh.write(f"\n{summary}\n")
    print(f"results in {a.out}")


if __name__ == "__main__":
    main()
