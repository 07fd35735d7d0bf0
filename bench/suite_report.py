"""The classification suite's verdicts from ``bench.peers`` results (means over seeds).

    python -m bench.suite_report RESULTS.jsonl [MORE.jsonl ...] [--model ours] [--out FILE.md]
        [--rename FILE=MODEL ...] [--prefix FILE=FOLDER ...]

Reads ``bench.peers`` rows; ``--rename`` gives every row of a file one model name (a preset
measured under another name that is now the default), ``--prefix`` names the tables of rows
written by ``bench.classify`` / ``bench.mixed`` (``dataset`` instead of ``table``; model
``ours`` unless renamed). Rows of later files replace those of earlier ones for the same
(table, seed, model). Per table:
mean test log-loss (accuracy, fit seconds) of ``--model``, of ``ours_single`` where present, of
the best GBDT (lowest mean log-loss of XGBoost, LightGBM, CatBoost) and of the reference
``xrfm_default``; the ratio to the best GBDT; whether the model is above the reference by more
than seed noise (mean paired difference over seeds > 2 standard errors of that mean); the
accuracy gap to the best GBDT in points (± the standard error of the mean paired difference
over seeds to the GBDT of the highest mean accuracy). Then the counts the issue asks for.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path

GBDTS = ("xgboost", "lightgbm", "catboost")


def load(
    paths: list[Path],
    rename: dict[Path, str] | None = None,
    prefix: dict[Path, str] | None = None,
) -> dict[tuple[str, int, str], dict]:
    rows: dict[tuple[str, int, str], dict] = {}
    for path in paths:
        for line in path.read_text().splitlines():
            r = json.loads(line)
            if "error" in r or "logloss" not in r:
                continue
            if "table" not in r and path in (prefix or {}):
                r["table"] = f"{(prefix or {})[path]}/{r['dataset']}"
            r["model"] = (rename or {}).get(path, r.get("model", "ours"))
            rows[(r["table"], r["seed"], r["model"])] = r
    return rows


def _pairs(items: list[str], flag: str) -> dict[Path, str]:
    out = {}
    for item in items:
        path, sep, value = item.partition("=")
        if not sep or not value:
            raise SystemExit(f"{flag} takes FILE=VALUE, got {item!r}")
        out[Path(path)] = value
    return out


def _paired(
    rows: dict[tuple[str, int, str], dict], tab: str, seeds: list[int], a: str, b: str, key: str
) -> tuple[float, float]:
    """Mean over seeds of ``a``'s ``key`` minus ``b``'s, and its standard error (NaN: < 2 seeds).

    Only the seeds where ``b`` ran count.
    """
    d = [rows[(tab, s, a)][key] - rows[(tab, s, b)][key] for s in seeds if (tab, s, b) in rows]
    if len(d) < 2:
        return math.nan, math.nan
    return statistics.mean(d), statistics.stdev(d) / math.sqrt(len(d))


def report(
    rows: dict[tuple[str, int, str], dict], model: str, only: list[int] | None = None
) -> list[str]:
    tables = list(dict.fromkeys(t for t, _, _ in rows))
    lines = [
        f"| table | {model} | ours_single | best GBDT | xrfm 0.4.5 | {model} / GBDT | "
        "acc. gap (pts ± SE) | above ref.? |",
        "|---|---|---|---|---|---|---|---|",
    ]
    wins = within10 = noisy_ref = acc_ok = n = 0
    for tab in tables:
        seeds = sorted(
            {s for t, s, m in rows if t == tab and m == model and (only is None or s in only)}
        )
        if not seeds:
            continue

        def cell(m: str, tab: str = tab, seeds: list[int] = seeds) -> tuple[float, float, float]:
            rs = [rows[(tab, s, m)] for s in seeds if (tab, s, m) in rows]
            if len(rs) < len(seeds):
                return math.nan, math.nan, math.nan
            return (
                statistics.mean(r["logloss"] for r in rs),
                100 * statistics.mean(r["accuracy"] for r in rs),
                statistics.mean(r["fit_s"] for r in rs),
            )

        ours, single, ref = cell(model), cell("ours_single"), cell("xrfm_default")
        gb = {g: cell(g) for g in GBDTS}
        best = min(gb, key=lambda g: gb[g][0])
        ratio = ours[0] / gb[best][0]
        gap = ours[1] - max(v[1] for v in gb.values())
        _, gap_se = _paired(rows, tab, seeds, model, max(gb, key=lambda g: gb[g][1]), "accuracy")
        ref_diff, ref_se = _paired(rows, tab, seeds, model, "xrfm_default", "logloss")
        above_ref = ref_diff > 2 * ref_se  # False where NaN (fewer than 2 seeds)
        n += 1
        wins += ratio <= 1.0
        within10 += ratio <= 1.10
        noisy_ref += above_ref
        acc_ok += gap >= -0.5

        def fmt(v: tuple[float, float, float]) -> str:
            return "—" if math.isnan(v[0]) else f"{v[0]:.4f} ({v[1]:.1f} %, {v[2]:.1f} s)"

        lines.append(
            f"| {tab.split('/')[-1]} (n={len(seeds)}) | {fmt(ours)} | {fmt(single)} | "
            f"{best} {fmt(gb[best])} | {fmt(ref)} | {ratio:.3f} | {gap:+.1f} ± {100 * gap_se:.1f} | "
            f"{'yes' if above_ref else 'no'} |"
        )
    lines += [
        "",
        f"{model} at or below the best GBDT's log-loss on {wins} of {n} tables; within 10 % on "
        f"{within10} of {n}; above the reference by more than seed noise on {noisy_ref}; "
        f"accuracy within 0.5 points of the best GBDT's (or above) on {acc_ok} of {n}.",
    ]
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--model", default="ours")
    ap.add_argument("--seeds", nargs="*", type=int, help="only these seeds")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--rename", nargs="*", default=[], help="FILE=MODEL: that file's model")
    ap.add_argument("--prefix", nargs="*", default=[], help="FILE=FOLDER: tables of dataset rows")
    a = ap.parse_args()
    rows = load(a.results, _pairs(a.rename, "--rename"), _pairs(a.prefix, "--prefix"))
    text = "\n".join(report(rows, a.model, a.seeds)) + "\n"
    print(text)
    if a.out:
        a.out.write_text(text)


if __name__ == "__main__":
    main()
