"""Leaf memory estimates and the budget check before a fit (xrfm_torch.tree.memory)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import planted
from xrfm_torch import LeafConfig, LeafRFM, PCASplit, xRFMTree
from xrfm_torch.leaf.approx import approx_width
from xrfm_torch.tree.memory import (
    LEAF_MATRICES,
    LEAF_OVERHEAD,
    MemoryBudgetError,
    approximate_to_fit,
    available_bytes,
    leaf_peak_bytes,
)

ROOT = Path(__file__).resolve().parents[1]


def test_estimate_counts_dense_matrices_of_the_largest_solve():
    n, v = 3000, 500
    base = LEAF_OVERHEAD
    assert (
        leaf_peak_bytes(n, v, n, torch.float32)
        == int(4 * (LEAF_MATRICES * n * n + 2 * v * n)) + base
    )
    # the final solve may be larger than the iterations (overlap, borrowed rows) and float64 doubles
    assert (
        leaf_peak_bytes(1000, v, n, torch.float64)
        == int(8 * (LEAF_MATRICES * n * n + 2 * v * 1000)) + base
    )


def test_an_approximate_final_solve_is_charged_for_its_features_not_n_squared():
    n_fit, v, n = 3000, 500, 40_000
    cfg = LeafConfig(approx_above=3000, approx="fourier", fourier_features=4096)
    width = approx_width(cfg, n_fit, n, d=20)
    assert width == 4096 + 21
    final = (4 + 8) * n * width + 2 * 8 * width * width
    assert leaf_peak_bytes(n_fit, v, n, torch.float32, width) == final + LEAF_OVERHEAD
    assert final < leaf_peak_bytes(n, v, n, torch.float32) / 5  # the exact leaf: 4 n^2 floats
    # Nystrom and centroids: as wide as their centres (the iteration rows); exact below the rule
    assert approx_width(cfg.replace(approx="nystrom"), n_fit, n, d=20) == n_fit
    assert approx_width(cfg, n_fit, 3000, d=20) is None  # not above approx_above
    assert approx_width(cfg, 3000, 5000, d=20) is None  # iterations on more than half
    assert approx_width(LeafConfig(), n_fit, n, d=20) is None


def test_a_tree_of_approximate_leaves_fits_where_exact_leaves_would_not():
    X, y = planted(2000, d=4)
    kw = {
        "max_leaf_size": 2000,
        "input_transform": "identity",
        "n_trees": 1,
        # exact final solve on 2000 rows: 4 * 4 * 2000^2 + 32 MiB ~ 98 MB; Fourier: ~41 MB
        "memory_budget": 60_000_000,
    }
    cfg = LeafConfig(n_iters=1, iter_rows=300, approx_above=600, approx="fourier")
    model = xRFMTree(leaf=cfg.replace(fourier_features=256), **kw).fit(X, y)
    assert model.leaves()[0].approximation == "fourier"
    assert model.leaves()[0].config.iter_rows == 300  # the user's settings fitted: kept


def test_a_leaf_over_budget_is_approximated_to_fit(caplog):
    """Exact leaves over the budget become Nystrom leaves (k-means centres) that fit it; the
    model stays close to the exact one, and a budget no leaf fits still stops the fit."""
    X, y = planted(2400, d=4, seed=1)
    X_test, y_test = planted(1000, d=4, seed=2)
    kw = {"max_leaf_size": 2400, "input_transform": "identity", "n_trees": 1}
    leaf = LeafConfig(n_iters=2)
    g = torch.Generator
    exact = xRFMTree(leaf=leaf, memory_budget=None, **kw).fit(X, y, generator=g().manual_seed(0))
    limit = 60_000_000  # the exact leaf: 16 * 2400^2 + 32 MiB ~ 126 MB
    with caplog.at_level("WARNING", logger="xrfm_torch.tree.grow"):
        model = xRFMTree(leaf=leaf, memory_budget=limit, **kw).fit(
            X, y, generator=g().manual_seed(0)
        )
    (fitted,) = model.leaves()
    assert fitted.approximation == "nystrom" and fitted.config.approx_centres == "kmeans"
    b = fitted.config.iter_rows
    # no validation data: 480 rows held out, then all 2400 in the final solve; 1200 centres
    # would need ~91 MB, 600 need ~57 MB
    assert fitted.support_.shape[0] == b == 600
    assert leaf_peak_bytes(b, 480, 2400, torch.float32, b) <= limit
    assert any("exceed the memory budget" in r.message for r in caplog.records)
    assert exact.leaves()[0].approximation is None
    mse = [float(((m(X_test)[:, 0] - y_test) ** 2).mean()) for m in (exact, model)]
    assert mse[1] < 0.1 * float(y_test.var())  # still learns the planted function
    assert mse[1] < 1.5 * mse[0]
    with pytest.raises(MemoryBudgetError, match="not even a leaf approximated"):
        xRFMTree(leaf=leaf, memory_budget=LEAF_OVERHEAD, **kw).fit(X, y)


def test_approximate_to_fit_halves_the_centres_until_the_estimate_fits():
    cfg = LeafConfig()
    n_fit, v, n = 20_000, 2000, 20_000
    limit = leaf_peak_bytes(750, v, n, torch.float32, 750)
    new = approximate_to_fit(cfg, n_fit, v, n, 10, torch.float32, limit)
    assert new is not None and new.iter_rows == new.approx_above == 750  # 3000 -> 1500 -> 750
    assert (new.approx, new.approx_centres) == ("nystrom", "kmeans")
    assert approximate_to_fit(cfg, n_fit, v, n, 10, torch.float32, LEAF_OVERHEAD) is None
    # a leaf that chose its approximation keeps it; only the rows shrink
    own = LeafConfig(iter_rows=4000, approx_above=4000, approx="centroids")
    new = approximate_to_fit(own, n_fit, v, n, 10, torch.float32, limit)
    assert new is not None and (new.approx, new.approx_centres, new.iter_rows) == (
        "centroids",
        "rows",
        500,
    )


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="peak RSS read from /proc")
def test_estimate_bounds_a_measured_leaf_fit():
    # one process per measurement (peak RSS is per process); float32, default LeafConfig
    out = subprocess.run(
        [sys.executable, "-m", "tools.leaf_memory", "--one", "3000", "--threads", "1"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
    ).stdout
    r = json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])
    assert r["estimate_mb"] >= r["peak_mb"] > 0.5 * r["estimate_mb"]


def test_a_tree_over_budget_stops_before_fitting_any_leaf(monkeypatch):
    X, y = planted(2000, d=4)
    fits = []
    real_fit = LeafRFM.fit
    monkeypatch.setattr(
        LeafRFM, "fit", lambda self, X, *a, **k: fits.append(len(X)) or real_fit(self, X, *a, **k)
    )
    model = xRFMTree(
        max_leaf_size=1000,
        leaf=LeafConfig(n_iters=1),
        input_transform="identity",
        split_rule=PCASplit(),  # no split model: every RFM fit is a leaf's
        memory_budget=5_000_000,
    )
    with pytest.raises(
        MemoryBudgetError,
        match=r"needs about .* GiB, more than the memory budget of 0\.00 GiB.*max_leaf_size",
    ):
        model.fit(X, y, generator=torch.Generator().manual_seed(0))
    assert fits == []
    model = xRFMTree(
        max_leaf_size=1000,
        leaf=LeafConfig(n_iters=1),
        input_transform="identity",
        split_rule=PCASplit(),
        memory_budget=None,
    )
    model.fit(X, y, generator=torch.Generator().manual_seed(0))
    assert model.is_fitted and len(fits) == model.n_leaves


def test_budget_arguments_and_the_auto_budget():
    assert xRFMTree().memory_budget == "auto"
    assert xRFMTree(memory_budget=2**30).get_config()["config"]["memory_budget"] == 2**30
    for bad in (0, -5, "lots", 1.5):
        with pytest.raises(ValueError, match="memory_budget"):
            xRFMTree(memory_budget=bad)
    free = available_bytes(torch.device("cpu"))
    if sys.platform.startswith("linux"):
        assert free is not None and free > 2**20
