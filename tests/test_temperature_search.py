"""The temperature search: the grid tried from hard routing up, stopping past the best."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import planted
from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.numerics import host
from xrfm_torch.tree import temperature
from xrfm_torch.tree.partition import PartitionTree
from xrfm_torch.tree.temperature import (
    DEFAULT_TEMPERATURE_GRID,
    prediction_errors,
    search_temperature,
    temperature_predictions,
)

GRID = list(DEFAULT_TEMPERATURE_GRID)


@pytest.fixture(scope="module")
def fitted():
    X, y = planted(3000, d=6, noise=0.1)
    Xv, yv = planted(800, d=6, seed=1, noise=0.1)
    model = xRFMTree(max_leaf_size=300, leaf=LeafConfig(n_iters=2), temperature_patience=None)
    model.fit(X, y, Xv, yv, generator=torch.Generator().manual_seed(0))
    assert model.n_leaves >= 8
    trees = model.partition_trees()
    return trees, model.input_map(Xv), model.targets.encode(yv[:, None], "y_val"), model


def search(fitted, grid=GRID, patience=None):
    trees, xs, yv, model = fitted
    cfg = model.config
    return search_temperature(
        trees, xs, yv, grid, keep_mass=cfg.keep_mass, max_leaves=cfg.max_soft_leaves,
        patience=patience,
    )  # fmt: skip


def test_the_whole_grid_is_each_temperature_routed_on_its_own(fitted):
    trees, xs, yv, model = fitted
    cfg = model.config
    best, errs, out = search(fitted)
    # the reference: each temperature's soft-routed forward alone (its own rows for each leaf)
    preds = [
        trees[0](xs[0], t, keep_mass=cfg.keep_mass, max_leaves=cfg.max_soft_leaves) for t in GRID
    ]
    full = prediction_errors(preds, yv)
    assert errs == pytest.approx(full, rel=1e-5)
    assert best == min(range(len(full)), key=full.__getitem__)
    assert 0 < best < len(GRID) - 4  # soft routing pays here, and the grid's top does not
    # the same leaves on other batches of rows: float32 distances round differently (1e-4)
    torch.testing.assert_close(out, preds[best], rtol=1e-3, atol=2e-4)
    assert float(model.temperature_) == pytest.approx(GRID[best])  # what fit chose
    # the outputs at each temperature are the search's, each leaf evaluated on other batches
    at = temperature_predictions(
        trees, xs, GRID, keep_mass=cfg.keep_mass, max_leaves=cfg.max_soft_leaves
    )
    for p, q in zip(at, preds, strict=True):
        torch.testing.assert_close(p, q, rtol=1e-3, atol=2e-4)


@pytest.mark.parametrize("patience", [1, 2, 3])
def test_the_search_stops_patience_temperatures_past_the_best(fitted, patience):
    full_best, full, _ = search(fitted)
    best, errs, _ = search(fitted, patience=patience)
    tried = [i for i, e in enumerate(errs) if not math.isnan(e)]
    assert errs[0] == pytest.approx(full[0], rel=1e-5)  # hard routing is always tried
    positive = tried[1:]
    assert positive == list(range(1, positive[-1] + 1))  # from the lowest up, none skipped
    assert [errs[i] for i in tried] == pytest.approx([full[i] for i in tried], rel=1e-5)
    # it ended right after `patience` temperatures that did not beat the best positive one
    best_positive = min(positive, key=errs.__getitem__)
    assert positive[-1] == best_positive + patience
    assert all(errs[i] >= errs[best_positive] for i in positive[-patience:])
    assert best == min(tried, key=errs.__getitem__) == full_best  # a unimodal curve: same choice


def test_each_row_and_leaf_is_evaluated_once(fitted, monkeypatch):
    calls: list[torch.Tensor] = []
    original = PartitionTree.leaf_predictions

    def spy(self, x, mask=None, out=None):
        calls.append(mask.clone())
        return original(self, x, mask, out)

    monkeypatch.setattr(PartitionTree, "leaf_predictions", spy)
    trees, xs, _, model = fitted
    search(fitted)
    stacked = torch.stack(calls).long()
    assert int(stacked.sum(0).max()) == 1  # no pair twice
    cfg = model.config
    reached = torch.zeros_like(calls[0])
    for t in GRID:  # every pair some temperature gives weight, and no other
        reached |= trees[0].weights(xs[0], t, keep_mass=cfg.keep_mass, max_leaves=12) > 0
    assert torch.equal(stacked.sum(0).bool(), reached)


def test_an_unsorted_grid_keeps_its_order_and_ties_go_to_the_earlier_entry(fitted):
    _, full, _ = search(fitted)
    grid = [GRID[5], 0.0, GRID[2], GRID[5]]
    best, errs, _ = search(fitted, grid=grid)
    assert errs == pytest.approx([full[5], full[0], full[2], full[5]], rel=1e-5)
    expected = min(range(3), key=lambda i: [full[5], full[0], full[2]][i])
    assert best == expected  # entry 3 repeats entry 0: the earlier one wins


@pytest.mark.parametrize("bad", [0, -1, 1.5])
def test_bad_temperature_patience_is_named(bad):
    with pytest.raises(ValueError, match="temperature_patience"):
        xRFMTree(temperature_patience=bad)


@pytest.mark.parametrize("dense", [True, False])
def test_where_launches_bound_each_leaf_runs_once_on_every_row(fitted, monkeypatch, dense):
    trees, xs, yv, model = fitted
    cfg = model.config
    lazy = temperature_predictions(
        trees, xs, GRID, keep_mass=cfg.keep_mass, max_leaves=cfg.max_soft_leaves
    )
    monkeypatch.setattr(host, "launch_bound", lambda device: True)  # as on a GPU
    if not dense:  # more pairs than the cap: the lazy evaluation, as on a CPU
        monkeypatch.setattr(temperature, "DENSE_PAIRS", 10)
    calls = []
    for leaf in trees[0].leaf_list():
        real = leaf.forward
        monkeypatch.setattr(
            leaf, "forward", lambda x, real=real: calls.append(x.shape[0]) or real(x)
        )
    at = temperature_predictions(
        trees, xs, GRID, keep_mass=cfg.keep_mass, max_leaves=cfg.max_soft_leaves
    )
    n_leaves, n_val = trees[0].n_leaves, xs[0].shape[0]
    if dense:
        assert calls == [n_val] * n_leaves  # one call per leaf, on every row
    else:
        assert len(calls) > n_leaves and max(calls) < n_val
    for p, q in zip(at, lazy, strict=True):  # the same outputs (other row batches: float32)
        torch.testing.assert_close(p, q, rtol=1e-3, atol=2e-4)


@pytest.mark.parametrize("patience", [None, 2])
def test_where_launches_bound_all_temperatures_are_scored_at_once(fitted, monkeypatch, patience):
    # the same search from one pass over all temperatures (and one read) as from one each
    lazy_best, lazy, lazy_out = search(fitted, patience=patience)
    monkeypatch.setattr(host, "launch_bound", lambda device: True)  # as on a GPU
    reads = []
    real = temperature.prediction_errors
    monkeypatch.setattr(
        temperature,
        "prediction_errors",
        lambda p, *a, **k: reads.append(len(p)) or real(p, *a, **k),
    )
    best, errs, out = search(fitted, patience=patience)
    assert reads == [len(GRID)]  # every entry scored in one call
    assert best == lazy_best
    tried = [i for i, e in enumerate(lazy) if not math.isnan(e)]
    assert [i for i, e in enumerate(errs) if not math.isnan(e)] == tried  # same walk, same stop
    assert [errs[i] for i in tried] == pytest.approx([lazy[i] for i in tried], rel=1e-5)
    torch.testing.assert_close(out, lazy_out, rtol=1e-3, atol=2e-4)


def test_weights_at_several_temperatures_are_each_temperatures_weights(fitted):
    trees, xs, _, model = fitted
    tree, x, cfg = trees[0], xs[0], model.config
    temps = [t for t in GRID if t > 0]
    many = tree.weights_at(
        x, torch.tensor(temps), keep_mass=cfg.keep_mass, max_leaves=cfg.max_soft_leaves
    )
    for t, w in zip(temps, many, strict=True):
        alone = tree.weights(x, t, keep_mass=cfg.keep_mass, max_leaves=cfg.max_soft_leaves)
        assert torch.equal(w > 0, alone > 0)  # the same leaves kept per row
        torch.testing.assert_close(w, alone, rtol=1e-5, atol=1e-6)
    # a chunked pass (a few weights at a time) gives the same outputs
    at = temperature.RoutedOutputs(
        trees, xs, keep_mass=cfg.keep_mass, max_leaves=cfg.max_soft_leaves
    )
    at.dense = True
    whole = at.at_once(temps)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(temperature, "DENSE_WEIGHTS", 1)  # one temperature per chunk
        torch.testing.assert_close(at.at_once(temps), whole)
    for t, o in zip(temps, whole, strict=True):
        torch.testing.assert_close(o, at(t), rtol=1e-5, atol=1e-6)
