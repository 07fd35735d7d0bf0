"""The evaluation base's report: counts per half and task, budgets, and what a change moved.

    python -m bench.base --cache DIR --report [--tag NAME] [--base NAME]

Reads ``DIR/results.jsonl`` (``bench.base``) and writes ``DIR/results.md``. Losses are test
log-loss (classification) or RMSE (regression), averaged over the seeds a table has for *every*
model compared (a table lacking one is left out of that count, so counts are like for like).
A change (``--tag``) is set beside ``default`` (or ``--base``: the paired ``control``) per table and
time budget: the relative difference of its loss, how many tables each has at or below CatBoost,
and the tables where it moved beyond seed noise (``|mean| > max(MIN_MOVE, 2 x standard error)`` over
the seeds both have; with one seed, ``|difference| > MIN_MOVE``), then fit by fit: the geometric
mean of the change's loss over the base's, and each fit that moved (both as multiples of CatBoost's
loss on that seed, with the candidate each kept and the share of its time limit each used).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.budget import GBDTS
from bench.budget import score as loss

#: A relative change of the loss smaller than this is never called a move.
MIN_MOVE = 0.01


def index(rows: list[dict[str, Any]]) -> dict[tuple, dict[int, dict[str, Any]]]:
    """``(table, model, tag, budget) -> {seed: row}``, errors left out (a later row wins)."""
    out: dict[tuple, dict[int, dict[str, Any]]] = defaultdict(dict)
    for r in rows:
        if "error" in r:
            continue
        tag = r.get("tag") if r["model"] == "ours" else None
        out[r["table"], r["model"], tag, r.get("budget_x")][r["seed"]] = r
    return out


def paired(idx: dict, table: str, arms: list[tuple]) -> list[list[dict[str, Any]]] | None:
    """Each arm's rows on the seeds every arm has (arms: ``(model, tag, budget)``), or None."""
    seeds = None
    for arm in arms:
        got = set(idx.get((table, *arm), {}))
        seeds = got if seeds is None else seeds & got
    if not seeds:
        return None
    return [[idx[(table, *arm)][s] for s in sorted(seeds)] for arm in arms]


def mean_loss(rows: list[dict[str, Any]]) -> float:
    return statistics.mean(loss(r) for r in rows)


def moved(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> tuple[float, bool]:
    """Mean relative difference of ``b``'s loss against ``a``'s (paired by seed); beyond noise?"""
    rel = [loss(y) / loss(x) - 1 for x, y in zip(a, b)]
    m = statistics.mean(rel)
    se = statistics.stdev(rel) / math.sqrt(len(rel)) if len(rel) > 1 else 0.0
    return m, abs(m) > max(MIN_MOVE, 2 * se)


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def summary(rows: list[dict[str, Any]], tag: str = "default") -> list[str]:
    """Markdown lines: per half and task, ours (``tag``) against CatBoost and the GBDTs."""
    idx = index(rows)
    meta = {r["table"]: (r["half"], r["task"]) for r in rows}
    budgets = sorted({r["budget_x"] for r in rows if r.get("budget_x") is not None})
    lines = [
        f"Ours = our estimators with `{tag}` settings. Counts: tables where ours' mean test loss is",
        "at or below CatBoost's (and the best GBDT's); fit and prediction times are ratios of ours",
        "to CatBoost's fit seconds and LightGBM's prediction seconds per 1000 rows, per table.",
        "",
        "| half | task | tables | <= CatBoost | <= best GBDT | fit / CatBoost (median) "
        "| predict / LightGBM (median, worst) |"
        + "".join(f" {b:g}x CatBoost's time <= CatBoost |" for b in budgets),
        "|---|---|---|---|---|---|---|" + "---|" * len(budgets),
    ]
    for half in ("design", "confirm"):
        for task in ("classification", "regression"):
            tabs = sorted(t for t, m in meta.items() if m == (half, task))
            n = le_cat = le_best = 0
            fit_ratio, pred_ratio = [], []
            for t in tabs:
                arms = [("ours", tag, None), *((g, None, None) for g in GBDTS)]
                got = paired(idx, t, arms)
                if got is None:
                    continue
                ours, cat, *others = got
                n += 1
                le_cat += mean_loss(ours) <= mean_loss(cat)
                le_best += mean_loss(ours) <= min(mean_loss(g) for g in [cat, *others])
                fit_ratio.append(statistics.mean(r["fit_s"] for r in ours)
                                 / statistics.mean(r["fit_s"] for r in cat))  # fmt: skip
                pred_ratio.append(statistics.mean(r["predict_s_per_1000"] for r in ours)
                                  / statistics.mean(r["predict_s_per_1000"] for r in others[0]))  # fmt: skip
            cells = []
            for b in budgets:
                got_b = [paired(idx, t, [("ours", tag, b), ("catboost", None, None)]) for t in tabs]
                done = [g for g in got_b if g is not None]
                wins = sum(mean_loss(g[0]) <= mean_loss(g[1]) for g in done)
                cells.append(f" {wins}/{len(done)} |")
            worst = max(pred_ratio, default=math.nan)
            lines.append(
                f"| {half} | {task} | {n} | {le_cat}/{n} | {le_best}/{n} | "
                f"{median(fit_ratio):.2f}x | {median(pred_ratio):.1f}x, {worst:.0f}x |"
                + "".join(cells)
            )
    lines += ["", *budget_use(idx, meta, tag, budgets)]
    return lines


def budget_use(idx: dict, meta: dict, tag: str, budgets: list[float]) -> list[str]:
    """Per budget: where it covers the default's fit, at or below the default (+0.5 %); else the
    median share of the budget used."""
    out = []
    for b in budgets:
        covered = kept = 0
        shares = []
        for t in sorted(meta):
            got = paired(idx, t, [("ours", tag, b), ("ours", tag, None)])
            if got is None:
                continue
            for lim, full in zip(*got):
                if lim["time_limit"] >= full["fit_s"]:
                    covered += 1
                    kept += loss(lim) <= 1.005 * loss(full)
                else:
                    shares.append(lim["fit_s"] / lim["time_limit"])
        out.append(
            f"- {b:g}x: where the budget covers the default's fit time, at or below the default "
            f"(+0.5 %) on {kept}/{covered} (table, seed) pairs; elsewhere the median share of "
            f"the budget used {median(shares):.2f} ({len(shares)} pairs)"
        )
    return out


def beside(rows: list[dict[str, Any]], tag: str, base: str) -> dict[str, list[tuple]]:
    """``tag`` beside ``base``, per time budget (``None``: no limit) and half, where one has rows.

    Returns:
        ``{where: [(table, base's rows, tag's rows, CatBoost's rows), ...]}`` in table order, each
        arm's rows on the seeds all three share; ``where`` is ``"design"``, ``"confirm, 3x
        CatBoost's time"``, ...
    """
    idx = index(rows)
    meta = {r["table"]: r["half"] for r in rows}
    budgets = sorted({r["budget_x"] for r in rows if r.get("budget_x") is not None})
    out: dict[str, list[tuple]] = {}
    for budget in [None, *budgets]:
        arms = [("ours", base, budget), ("ours", tag, budget), ("catboost", None, None)]
        for half in ("design", "confirm"):
            got = [(t, *p) for t in sorted(t for t, h in meta.items() if h == half)
                   if (p := paired(idx, t, arms)) is not None]  # fmt: skip
            if got:
                out[half if budget is None else f"{half}, {budget:g}x CatBoost's time"] = got
    return out


def changes(rows: list[dict[str, Any]], tag: str, base: str = "default") -> list[str]:
    """Markdown lines: per half (and per time budget), the tables where ``tag`` moved the loss
    against ``base``, and how many of each are at or below CatBoost's."""
    lines = [f"`{tag}` against `{base}` (relative test loss; moves beyond seed noise):", ""]
    for where, tables in beside(rows, tag, base).items():
        rel, better, worse, wins = [], [], [], [0, 0]
        for t, old, new, cat in tables:
            m, beyond = moved(old, new)
            rel.append(m)
            wins[0] += mean_loss(old) <= mean_loss(cat)
            wins[1] += mean_loss(new) <= mean_loss(cat)
            if beyond:
                (better if m < 0 else worse).append(f"{t} {100 * m:+.1f} %")
        lines.append(
            f"- {where}: {len(rel)} tables, median {100 * median(rel):+.2f} %, at or below "
            f"CatBoost {wins[1]} ({base}: {wins[0]}); better: {', '.join(better) or 'none'}; "
            f"worse: {', '.join(worse) or 'none'}"
        )
    return lines


def fits(rows: list[dict[str, Any]], tag: str, base: str = "default") -> list[str]:
    """Markdown lines: per time budget and half, ``tag`` against ``base`` fit by fit (one table and
    seed): the geometric mean of their loss ratio and every fit whose loss moved."""
    lines = [f"`{tag}` against `{base}` fit by fit (losses as multiples of CatBoost's):", ""]
    for where, tables in beside(rows, tag, base).items():
        ratios = [
            (loss(n) / loss(o), t, o, n, loss(c)) for t, *arms in tables for o, n, c in zip(*arms)
        ]
        moves = sorted((m for m in ratios if abs(m[0] - 1) > 1e-9), key=lambda m: m[0])
        geo = math.exp(statistics.mean(math.log(m[0]) for m in ratios))
        lines.append(f"- {where}: {len(ratios)} fits, geometric mean {geo:.4f}, {len(moves)} moved, "
                     f"{sum(m[0] < 1 for m in moves)} lower")  # fmt: skip
        for _, t, old, new, cat in moves:
            lines.append(f"  - {t} seed {old['seed']}: {loss(old) / cat:.4f} -> {loss(new) / cat:.4f}"
                         f"{_kept(old, new)}")  # fmt: skip
    return lines


def _kept(old: dict[str, Any], new: dict[str, Any]) -> str:
    """`` (kept A -> B, used p -> q)`` for two limited fits, else nothing."""
    if "time_limit" not in old or "time_limit" not in new:
        return ""
    used = [r["fit_s"] / r["time_limit"] for r in (old, new)]
    return (
        f" (kept {old.get('chosen')} -> {new.get('chosen')}, used {used[0]:.2f} -> {used[1]:.2f})"
    )


def per_table(rows: list[dict[str, Any]], tag: str) -> list[str]:
    """Markdown lines: every table's mean losses and fit seconds (ours, CatBoost, best GBDT)."""
    idx = index(rows)
    meta = {r["table"]: (r["half"], r["task"], r["rows"]) for r in rows}
    lines = ["| table | half | task | rows | ours (fit s) | CatBoost (fit s) | best GBDT |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for t in sorted(meta, key=lambda t: (meta[t][0], meta[t][1], t)):
        got = paired(idx, t, [("ours", tag, None), *((g, None, None) for g in GBDTS)])
        if got is None:
            continue
        ours, cat, *others = got
        name, best = min(zip(GBDTS, [cat, *others]), key=lambda p: mean_loss(p[1]))
        fit = lambda rs: statistics.mean(r["fit_s"] for r in rs)  # noqa: E731
        mark = "**" if mean_loss(ours) <= mean_loss(cat) else ""
        half, task, n = meta[t]
        lines.append(
            f"| {t} | {half} | {task} | {n} | {mark}{mean_loss(ours):.5g}{mark} ({fit(ours):.1f}) "
            f"| {mean_loss(cat):.5g} ({fit(cat):.1f}) | {mean_loss(best):.5g} ({name}) |"
        )
    return lines


def write_report(
    rows: list[dict[str, Any]], out: Path, tag: str = "default", base: str = "default"
) -> None:
    """``out/results.md``: the summary, the change against ``base`` (if ``tag`` is another
    one), every table."""
    lines = ["# Evaluation base", "", *summary(rows, tag), ""]
    if tag != base:
        lines += [*changes(rows, tag, base), "", *fits(rows, tag, base), ""]
    lines += per_table(rows, tag)
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
