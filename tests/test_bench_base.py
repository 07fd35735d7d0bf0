"""The evaluation base's bookkeeping: its tables, the fixed design/confirm split, the cache and
the report's counts (the fits themselves are the benchmark's business: ``python -m bench.base``)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bench import base, base_report, base_tables


def test_the_base_has_80_new_tables_of_both_tasks_and_unique_names():
    tabs = base_tables.tables()
    names = [t.name for t in tabs]
    assert len(names) == len(set(names))
    new = [t for t in tabs if not t.dev]
    assert len(new) >= 80
    reg = sum(t.task == "regression" for t in new)
    assert 0.35 <= reg / len(new) <= 0.65  # about half regression, half classification
    assert {t.task for t in tabs} == {"regression", "classification"}
    for t in new:  # a new table is made from a package, named by its folder's task
        assert t.load is not None
        assert t.name.split("/")[0] == ("base_reg" if t.task == "regression" else "base_clf")


def test_the_split_is_the_parity_of_the_names_hash_and_dev_tables_only_design():
    tabs = base_tables.tables()
    for t in tabs:
        if t.dev:
            assert t.half == "design"
        else:
            parity = hashlib.sha256(t.name.encode()).digest()[0] % 2
            assert t.half == ("design", "confirm")[parity]
    # the rule depends on the name alone: a table added later moves no other
    assert base_tables.half("base_reg/quakes") == base_tables.half("base_reg/quakes")
    halves = {(t.half, t.task) for t in tabs if not t.dev}
    assert halves == {(h, k) for h in base_tables.HALVES for k in ("regression", "classification")}


def test_rows_beyond_the_cap_are_drawn_with_seed_0_in_their_order():
    pd = pytest.importorskip("pandas")
    df = pd.DataFrame({"a": np.arange(50), "target": np.arange(50) % 3})
    capped = base_tables.cap_rows(df, cap=20)
    assert len(capped) == 20 and capped["a"].is_monotonic_increasing
    expected = np.sort(np.random.default_rng(0).choice(50, 20, replace=False))
    assert capped["a"].tolist() == expected.tolist()
    assert base_tables.cap_rows(df, cap=50) is df


def test_a_made_table_is_written_once_and_small_new_tables_are_refused(tmp_path):
    pd = pytest.importorskip("pandas")
    calls = []

    def load():
        calls.append(1)
        return pd.DataFrame({"x": np.arange(600.0), "target": np.arange(600.0)})

    t = base_tables.Table("base_reg/made", "regression", "test", load)
    path = base_tables.materialize(t, tmp_path, tmp_path)
    assert path == tmp_path / "tables" / "base_reg" / "made.csv.gz"
    assert base_tables.materialize(t, tmp_path, tmp_path) == path and calls == [1]
    assert pd.read_csv(path)["target"].sum() == np.arange(600.0).sum()
    small = base_tables.Table("base_reg/small", "regression", "test", lambda: load()[:100])
    with pytest.raises(ValueError, match="base_reg/small has 100 rows"):
        base_tables.materialize(small, tmp_path, tmp_path)


def test_the_cache_key_and_a_cut_line(tmp_path):
    path = tmp_path / "results.jsonl"
    rows = [
        {"table": "t", "seed": 0, "model": "catboost", "rmse": 1.0},
        {"table": "t", "seed": 0, "model": "ours", "tag": "default", "rmse": 1.0},
        {"table": "t", "seed": 0, "model": "ours", "tag": "a", "budget_x": 3.0, "rmse": 1.0},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"table": "t", "se')
    read = base.read_results(path)
    assert read == rows  # the line a killed run cut short is skipped
    keys = {base.key(r) for r in read}
    assert len(keys) == 3
    assert base.key({**rows[0], "tag": "x"}) == base.key(rows[0])  # GBDTs: one per table, seed


def _row(table, seed, model, value, half="confirm", task="regression", **kw):
    return {"table": table, "seed": seed, "model": model, "rmse": value, "fit_s": 2.0,
            "predict_s_per_1000": 1.0, "half": half, "task": task, "rows": 600, **kw}  # fmt: skip


def test_the_report_counts_like_for_like_and_names_moves_beyond_noise():
    rows = []
    for seed in (0, 1, 2):
        for t, ours, cat in (("a", 1.0, 1.1), ("b", 1.2, 1.1), ("c", 1.0, 1.0)):
            rows += [_row(t, seed, "catboost", cat), _row(t, seed, "lightgbm", 1.05),
                     _row(t, seed, "xgboost", 1.3), _row(t, seed, "ours", ours, tag="default")]  # fmt: skip
        # the change: table a 10 % worse on every seed, table b within 0.5 %, c missing a seed
        rows += [_row("a", seed, "ours", 1.1, tag="new"), _row("b", seed, "ours", 1.2 * (1 + 0.005 * (seed - 1)), tag="new")]  # fmt: skip
    rows.append(_row("c", 0, "ours", 0.5, tag="new"))
    lines = base_report.summary(rows)
    line = next(ln for ln in lines if ln.startswith("| confirm | regression"))
    # a and c at or below CatBoost; against the best GBDT (LightGBM 1.05) a and c
    assert "| 3 | 2/3 | 2/3 | 1.00x |" in line
    change = base_report.changes(rows, "new")
    confirm = next(ln for ln in change if ln.startswith("- confirm"))
    assert "worse: base" not in confirm and "worse: a +10.0 %" in confirm
    assert "better: c -50.0 %" in confirm  # one seed: beyond MIN_MOVE
    assert "b " not in confirm.split("worse:")[1]
    flipped = base_report.changes(rows, "default", base="new")  # the same pairs, the other way
    assert "better: a -9.1 %" in next(ln for ln in flipped if ln.startswith("- confirm"))


def test_budget_use_compares_with_the_default_where_the_budget_covers_it():
    rows = [_row("a", 0, "catboost", 1.0), _row("a", 0, "ours", 1.0, tag="default")]
    rows += [_row("a", 0, "ours", 1.004, tag="default", budget_x=3.0, time_limit=6.0),
             {**_row("a", 0, "ours", 1.2, tag="default", budget_x=1.0, time_limit=1.0), "fit_s": 0.5}]  # fmt: skip
    idx = base_report.index(rows)
    meta = {"a": ("confirm", "regression")}
    out = base_report.budget_use(idx, meta, "default", [1.0, 3.0])
    assert "at or below the default (+0.5 %) on 0/0" in out[0] and "used 0.50 (1 pairs)" in out[0]
    assert "on 1/1 (table, seed) pairs" in out[1]


def test_a_change_is_set_beside_its_paired_control_at_every_budget():
    rows = []
    for seed in (0, 1):
        rows += [_row("a", seed, "catboost", 1.0), _row("b", seed, "catboost", 1.0)]
        for tag, a3, b3 in (("control", 1.05, 0.99), ("mine", 0.98, 0.99)):
            rows += [_row("a", seed, "ours", a3, tag=tag, budget_x=3.0),
                     _row("b", seed, "ours", b3 * (1 + 0.001 * seed), tag=tag, budget_x=3.0)]  # fmt: skip
    lines = base_report.changes(rows, "mine", base="control")
    three = next(ln for ln in lines if ln.startswith("- confirm, 3x"))
    # a: 1.05 -> 0.98 on both seeds, now at or below CatBoost; b unchanged
    assert "2 tables" in three and "at or below CatBoost 2 (control: 1)" in three
    assert "better: a -6.7 %" in three and "worse: none" in three
    assert not any(ln.startswith("- confirm:") for ln in lines)  # no limit-free pairs: no line


def test_a_control_checkout_is_imported_ahead_of_the_installed_package(monkeypatch, tmp_path):
    fake = tmp_path / "control" / "src" / "xrfm_torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("")
    seen: dict = {}

    def run(args, **kwargs):
        seen.update(kwargs)
        return subprocess.CompletedProcess(args, 0, stdout='{"rmse": 2.0}\n', stderr="")

    monkeypatch.setattr(base.subprocess, "run", run)
    assert base.run_child(tmp_path / "t.csv", 0, "ours", None, 5.0) == {"rmse": 2.0}
    assert seen["env"] is None  # this checkout's package
    base.run_child(tmp_path / "t.csv", 0, "ours", None, 5.0, source=tmp_path / "control")
    path = seen["env"]["PYTHONPATH"].split(os.pathsep)
    assert path[:2] == [str(fake.parent), str(base.ROOT)]
    monkeypatch.undo()
    # and a process given that path imports the control's package, not the installed one
    code = "import xrfm_torch; print(xrfm_torch.__file__)"
    out = subprocess.run([sys.executable, "-c", code], env=seen["env"], capture_output=True,
                         text=True, check=True)  # fmt: skip
    assert out.stdout.strip() == str(fake / "__init__.py")


def test_a_peers_first_import_is_not_counted_as_its_fit_time(monkeypatch):
    """A fit is timed in a fresh process: its library's import (here a stand-in for catboost
    that takes 1 s to import and no time to fit) must happen before the timer starts."""
    import importlib.abc
    import importlib.util
    import time

    import pandas as pd

    from bench import peers

    class Regressor:
        def __init__(self, **kwargs):
            pass

        def fit(self, X, y, eval_set=None):
            return self

        def predict(self, X):
            return np.zeros(len(X))

    class SlowLoader(importlib.abc.Loader):
        def create_module(self, spec):
            return None

        def exec_module(self, module):
            time.sleep(1.0)
            module.CatBoostRegressor = Regressor

    class Finder(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name != "catboost":
                return None
            return importlib.util.spec_from_loader(name, SlowLoader())

    monkeypatch.delitem(sys.modules, "catboost", raising=False)
    monkeypatch.setattr(sys, "meta_path", [Finder(), *sys.meta_path])
    parts = [pd.DataFrame({"x": np.arange(n, dtype=float)}) for n in (8, 4, 4)]
    ys = (np.zeros(8), np.zeros(4), np.ones(4))
    start = time.perf_counter()
    out, fit_s, _ = peers.fit_peer("catboost", parts, ys, [], False, 0)
    assert time.perf_counter() - start >= 1.0  # the stand-in was imported in this call ...
    assert isinstance(sys.modules["catboost"].CatBoostRegressor(), Regressor)
    assert fit_s < 0.5  # ... before the fit's timer started
    np.testing.assert_array_equal(out, np.zeros(4))


def test_a_change_is_listed_fit_by_fit_with_its_geometric_mean_and_kept_candidates():
    rows = []
    for seed in (0, 1):
        rows.append(_row("a", seed, "catboost", 2.0))
        for tag, value, chosen in (
            ("control", 2.2, "quick tree"),
            ("mine", 2.2 - 0.4 * seed, "bags"),
        ):
            rows.append({**_row("a", seed, "ours", value, tag=tag, budget_x=3.0, time_limit=4.0),
                         "chosen": chosen})  # fmt: skip
    lines = base_report.fits(rows, "mine", base="control")
    head = next(ln for ln in lines if ln.startswith("- confirm, 3x"))
    # seed 0 unchanged, seed 1 2.2 -> 1.8: geometric mean sqrt(1.8 / 2.2)
    assert f"2 fits, geometric mean {(1.8 / 2.2) ** 0.5:.4f}, 1 moved, 1 lower" in head
    moved = [ln for ln in lines if ln.startswith("  - ")]
    # as multiples of CatBoost's 2.0; fit_s 2.0 of a 4.0 s limit: half used
    assert moved == ["  - a seed 1: 1.1000 -> 0.9000 (kept quick tree -> bags, used 0.50 -> 0.50)"]
    assert not any(ln.startswith("- confirm:") for ln in lines)  # no limit-free pairs: no line


def test_tables_are_chosen_by_their_rows_both_ends_included():
    chosen = [t for t in base_tables.tables() if t.half == "design"][:4]
    rows_of = {t.name: n for t, n in zip(chosen, (2500, 2501, 7500, 7501))}
    kept = base.of_size(chosen, rows_of, 2501, 7500)
    assert [rows_of[t.name] for t in kept] == [2501, 7500]
    with pytest.raises(SystemExit, match="MIN is above MAX"):
        base.of_size(chosen, rows_of, 10, 9)


def test_the_readme_and_the_benchmarks_page_quote_the_stored_confirm_run():
    """The confirm half's counts in README.md and docs/benchmarks.md are the stored rows' own
    (recomputed here by the report), so a rerun that moves them fails until the docs follow."""
    stored = base.ROOT / "bench" / "results" / "base-budget-confirm-seeds012" / "results.jsonl"
    rows = base.read_results(stored)
    lines = [ln for ln in base_report.summary(rows) if ln.startswith("| confirm |")]
    assert len(lines) == 2  # classification, regression
    page = (base.ROOT / "docs" / "benchmarks.md").read_text()
    for line in lines:  # the page's table drops the half column
        assert line.removeprefix("| confirm ") in page.splitlines()
    cells = [ln.strip("|").split("|") for ln in lines]
    # default, 3x and 10x: at or below CatBoost, summed over the tasks
    default, three, ten = (sum(int(c[i].split("/")[0]) for c in cells) for i in (3, 7, 8))
    tables = sum(int(c[2]) for c in cells)
    readme = " ".join((base.ROOT / "README.md").read_text().split())
    for c in cells:  # README's results section: the default per task
        task, (won, n) = c[1].strip(), c[3].strip().split("/")
        assert f"{task} {won} of {n}" in readme
    assert f"on {tables} real tables" in readme and f"test loss on {default} ([Results]" in readme
    assert f"on {ten} of the {tables} held-out tables" in readme
    assert f"given 3× on {three} (seeds 0-2)" in readme
    text = " ".join(page.split())
    assert f"at or below CatBoost on {default} of the {tables} tables" in text
    assert f"at or below CatBoost on {three} of {tables}; with 10x on {ten}." in text
