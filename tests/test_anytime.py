"""Time limits: the anytime fit built on the deadline (tests/test_deadline.py).

Timing itself is a benchmark's business (``bench.budget``); these tests pin the behaviour that
decides it: which candidates an anytime fit builds and keeps, and that the kept model is the one
its candidate alone would give.
"""

from __future__ import annotations

import json
import math
import time
from typing import cast

import numpy as np
import pytest
import torch
from torch import Tensor

from conftest import honest_loss, planted, record_probes
from xrfm_torch import (
    Anytime,
    BaggedTree,
    KernelBlend,
    LeafConfig,
    XRFMClassifier,
    XRFMRegressor,
    export_program,
    load_model,
    save_model,
    xRFMTree,
)
from xrfm_torch.models import anytime as anytime_module
from xrfm_torch.models.factory import build_model, model_from_config
from xrfm_torch.models.keep import common_rows
from xrfm_torch.models.ladder import (
    QUICK_PROBE_ROWS,
    QUICK_SPLIT_ROWS,
    RAW_TREE_COST,
    TREE_COST,
    estimate,
    kernel_name,
    ladder,
    quick_kernel,
    quick_tree,
    target_index,
)
from xrfm_torch.tree.honest import HonestOutputs, mean_loss, row_losses


# ---- the ladder --------------------------------------------------------------------------------
def test_the_ladder_of_each_target_kind():
    tree = xRFMTree(max_leaf_size=10_000)
    rungs = ladder(tree, None, 1, 2000)
    # a single kernel's target, then the spares: the other kernel and its mix with the target
    assert [r.name for r in rungs] == [
        "quick tree laplace",
        "tree laplace",
        "tree gaussian",
        "mix tree",
    ]
    assert [r.spare for r in rungs] == [False, False, True, True]
    assert [r.kernel for r in rungs] == [0, 0, 1, -1] and rungs[-1].mixes == (1, 2)
    gaussian = ladder(xRFMTree(kernel="gaussian", max_leaf_size=500), None, 1, 2000)
    assert [r.name for r in gaussian] == ["tree gaussian", "tree laplace", "mix tree"]
    assert all(r.detour is None for r in rungs)  # one kernel: no detours, spares instead
    rungs = ladder(tree, ["laplace", "gaussian"], 5, 2000)
    assert all(r.draw for r in rungs[9:])  # the fallback tree's draws (test_anytime_draws.py)
    rungs = rungs[:9]
    names = [r.name for r in rungs]
    assert names == [
        "quick tree laplace",  # a fallback: not the target's kind
        "quick bags laplace",
        "bags laplace",
        "bags gaussian",
        "mix bags",
        # detours: each quick rung's other kernel and their mix, of that rung's kind
        "quick tree gaussian",
        "mix quick tree",
        "quick bags gaussian",
        "mix quick bags",
    ]
    assert [r.fallback for r in rungs] == [True, False, False, False, False, True, True] + [
        False
    ] * 2
    assert [r.detour for r in rungs] == [None] * 5 + [0, 0, 1, 1]
    assert not any(r.spare for r in rungs)  # two kernels already: nothing spare
    assert rungs[4].mixes == (2, 3) and rungs[1].bags == 5 and rungs[0].bags == 1
    assert rungs[6].mixes == (0, 5) and rungs[8].mixes == (1, 7)
    assert [r.bags for r in rungs[5:]] == [1, 1, 5, 5] and all(r.quick for r in rungs[5:])
    # leaves already small and one tree per map: the quick candidate would be the tree itself
    small = ladder(xRFMTree(max_leaf_size=500), None, 1, 2000)
    assert [r.name for r in small] == ["tree laplace", "tree gaussian", "mix tree"]


def test_a_small_fits_quick_single_tree_takes_the_gaussian_kernel():
    """A small fit's (at most QUICK_PROBE_ROWS rows) quick single tree of a blend is Gaussian."""
    both = ["laplace", "gaussian"]
    tree = xRFMTree(max_leaf_size=10_000)
    assert quick_kernel(tree, both, 1, small=True) == 1
    assert quick_kernel(tree, both, 1, small=False) == 0  # the quick trees probe
    assert quick_kernel(tree, ["gaussian", "laplace"], 1, True) == 0  # (already first)
    assert quick_kernel(tree, None, 1, True) == 0  # one kernel: its own, then the spares
    clf = xRFMTree(task="classification", max_leaf_size=10_000)
    assert quick_kernel(clf, both, 1, True) == 1 and quick_kernel(clf, both, 5, True) == 1
    assert quick_kernel(clf, both, 5, False) == 0
    rungs = ladder(tree, both, 1, 2000, first=1)
    assert all(r.draw for r in rungs[6:])  # its draws (test_anytime_draws.py)
    rungs = rungs[:6]
    assert [r.name for r in rungs] == [
        "quick tree gaussian",
        "tree laplace",  # the full candidates keep the kernels' order
        "tree gaussian",
        "mix tree",
        "quick tree laplace",  # the detour: the other kernel, then the small blend
        "mix quick tree",
    ]
    assert [r.kernel for r in rungs] == [1, 0, 1, -1, 0, -1]
    assert [r.detour for r in rungs] == [None] * 4 + [0, 0] and rungs[5].mixes == (0, 4)
    # bags: the fallback single tree is Gaussian, the quick bags keep the first kernel
    bags = ladder(clf, both, 5, 2000, first=1)[:9]
    assert [r.name for r in bags] == [
        "quick tree gaussian",
        "quick bags laplace",
        "bags laplace",
        "bags gaussian",
        "mix bags",
        "quick tree laplace",
        "mix quick tree",
        "quick bags gaussian",
        "mix quick bags",
    ]
    assert [r.kernel for r in bags] == [1, 0, 0, 1, -1, 0, -1, 1, -1]
    assert [r.detour for r in bags] == [None] * 5 + [0, 0, 1, 1]
    assert bags[6].mixes == (0, 5) and bags[8].mixes == (1, 7)
    with pytest.raises(ValueError, match="first must index one of the kernels"):
        ladder(tree, both, 1, 2000, first=2)


def test_the_quick_kernel_is_fitted_saved_and_loaded_with_the_rows_it_was_chosen_on(tmp_path):
    tree = xRFMTree(max_leaf_size=200, leaf=LeafConfig(n_iters=2))
    blend = KernelBlend(tree, kernels=("laplace", "gaussian"))
    X, y = planted(300, d=4, seed=2, noise=0.1)
    assert QUICK_PROBE_ROWS >= 300
    model = Anytime(blend, time_limit=600.0, quick_leaf_size=80)
    model.fit(X, y, generator=torch.Generator().manual_seed(3))
    assert int(model.quick_kernel_) == 1
    trials = model.summary()["trials"]
    assert trials[0]["candidate"] == "quick tree gaussian" and trials[0]["seconds"] > 0
    # the quick candidate is the Gaussian tree with the quick settings, as fitted
    quick = cast(xRFMTree, model._candidate(0))
    assert kernel_name(quick) == "gaussian" and quick.config.max_leaf_size == 80
    save_model(model, tmp_path / "m.pt")
    loaded = load_model(tmp_path / "m.pt")
    assert int(loaded.quick_kernel_) == 1
    assert [t["candidate"] for t in loaded.summary()["trials"]] == [t["candidate"] for t in trials]
    torch.testing.assert_close(loaded(X[:20]), model(X[:20]))
    # a state saved before the rule (no quick_kernel_) was fitted with the first kernel's
    state = {k: v for k, v in model.state_dict().items() if k != "quick_kernel_"}
    old = Anytime(KernelBlend(tree, kernels=("laplace", "gaussian")), quick_leaf_size=80)
    old.load_state_dict(state)
    assert int(old.quick_kernel_) == 0 and old.rungs()[0].name == "quick tree laplace"


def test_the_candidates_keep_the_targets_own_bag_and_blend_settings():
    tree = xRFMTree(task="classification", max_leaf_size=10_000)
    bags = BaggedTree(tree, n_bags=3, shared_plan=False, size_fraction=0.25)
    target = KernelBlend(bags, kernels=("laplace", "gaussian"), weight_steps=10, race_margin=None)
    model = Anytime(target, time_limit=60.0, quick_leaf_size=2000)
    names = [r.name for r in model.rungs()]
    built = {name: model._candidate(i) for i, name in enumerate(names)}
    for name in ("bags laplace", "bags gaussian", "quick bags laplace"):
        member = built[name]
        assert isinstance(member, BaggedTree) and member.n_bags == 3
        assert member.shared_plan is False
        # the quick bags keep the quick tree's size; the others the target's share
        assert member.size_fraction == (1.0 if name.startswith("quick") else 0.25)
    mix = built["mix bags"]
    assert isinstance(mix, KernelBlend) and mix.kernels == ("laplace", "gaussian")
    assert (mix.weight_steps, mix.race_margin) == (10, None)
    assert isinstance(mix.prototype, BaggedTree) and mix.prototype.size_fraction == 0.25
    # the default target's candidates are built with the defaults
    plain = Anytime(KernelBlend(BaggedTree(tree, n_bags=3)), time_limit=60.0)
    mixed = plain._candidate(len(plain.rungs()) - 1)
    assert isinstance(mixed, KernelBlend) and (mixed.weight_steps, mixed.race_margin) == (4, 2.0)


def test_cost_estimates_come_from_the_candidates_before():
    rungs = ladder(xRFMTree(), ["laplace", "gaussian"], 1, 2000)
    nan = math.nan
    assert estimate(rungs[1], rungs, [2.0, nan, nan, nan]) == pytest.approx(6.0)  # 3x the quick
    assert estimate(rungs[2], rungs, [2.0, 5.0, nan, nan]) == 5.0  # as the first kernel's
    assert estimate(rungs[3], rungs, [2.0, 5.0, 4.0, nan]) == 0.0  # a mix fits nothing
    # a detour's quick second kernel: what the quick first kernel took, not the full tree
    assert estimate(rungs[4], rungs, [2.0, 5.0, nan, nan, nan, nan]) == 2.0
    bagged = ladder(xRFMTree(), ["laplace", "gaussian"], 5, 2000)
    assert estimate(bagged[1], bagged, [2.0] + [nan] * 8) == pytest.approx(10.0)  # 5 trees
    # the quick tree's probe (1.5 of its 2.0 s) runs once for the bags: 1.5 + 5 x 0.5
    assert estimate(bagged[1], bagged, [2.0] + [nan] * 8, [1.5] + [0.0] * 8) == pytest.approx(4.0)
    assert estimate(bagged[2], bagged, [2.0, 8.0] + [nan] * 7) == pytest.approx(24.0)
    assert estimate(bagged[7], bagged, [2.0, 8.0] + [nan] * 7) == 8.0  # quick bags, gaussian
    # the first full candidate after a quick one on the raw inputs: RAW_TREE_COST times it
    raw = estimate(rungs[1], rungs, [2.0, nan, nan, nan], raw=True)
    assert raw == pytest.approx(2.0 * RAW_TREE_COST) and RAW_TREE_COST > TREE_COST
    # only that one: a further kernel still costs what the first kernel's full tree took
    assert estimate(rungs[2], rungs, [2.0, 5.0, nan, nan], raw=True) == 5.0


def test_a_fit_whose_quick_trees_see_the_raw_inputs_estimates_full_ones_at_the_raw_cost(
    monkeypatch,
):
    """500 rows (at most QUICK_PROBE_ROWS): the quick tree skips the probe every full tree adds,
    so the first full tree is estimated at RAW_TREE_COST times it."""
    calls: list[tuple[str, bool, float]] = []
    real_estimate = anytime_module.estimate

    def spy_estimate(rung, rungs, seconds, probes=None, raw=False):
        out = real_estimate(rung, rungs, seconds, probes, raw)
        calls.append((rung.name, raw, out))
        return out

    monkeypatch.setattr(anytime_module, "estimate", spy_estimate)
    X, y = planted(500, d=5, seed=1, noise=0.1)
    model = _anytime().fit(X, y, generator=torch.Generator().manual_seed(7))
    assert not bool(model.quick_probe_)
    quick = float(model.trials_[0, 1])
    assert {raw for _, raw, _ in calls} == {True}
    first = next(out for name, _, out in calls if name == "tree laplace")
    assert first == pytest.approx(RAW_TREE_COST * quick, rel=1e-9)


def test_the_quick_tree_is_small_shallow_and_cheap_to_split():
    tree = xRFMTree(task="classification", max_leaf_size=10_000)
    quick = quick_tree(tree, 2000)
    assert quick.config.max_leaf_size == 2000 and quick.config.n_trees == 1
    assert quick.config.split_rule.sample_size == QUICK_SPLIT_ROWS < 4000
    assert quick_tree(xRFMTree(max_leaf_size=500), 2000).config.max_leaf_size == 500
    # without a probe (small fits) it sees the raw inputs where the tree would probe
    assert quick.config.input_transform == "auto"
    assert quick_tree(tree, 2000, probe=False).config.input_transform == "identity"
    fixed = xRFMTree(input_transform=("quantile", "identity"))
    assert quick_tree(fixed, 2000, probe=False).config.input_transform == ("quantile", "identity")
    # the other settings are the tree's
    changed = ("max_leaf_size", "n_trees", "split_rule")
    assert quick.config.replace(**{k: getattr(tree.config, k) for k in changed}) == tree.config
    assert {**quick.get_config(), "config": None} == {**tree.get_config(), "config": None}


def test_common_rows_align_outputs_by_row():
    targets = torch.arange(6.0)
    a = HonestOutputs(
        targets[[4, 1, 3], None] * 10, targets[[4, 1, 3]], None, torch.tensor([4, 1, 3])
    )
    b = HonestOutputs(targets[:, None] * 10, targets, torch.ones(6), torch.arange(6))
    ra, rb = common_rows([a, b])
    assert ra.rows.tolist() == rb.rows.tolist() == [1, 3, 4]
    torch.testing.assert_close(ra.outputs, rb.outputs)
    torch.testing.assert_close(ra.targets, targets[[1, 3, 4]])
    with pytest.raises(ValueError, match="known rows"):
        common_rows([a, HonestOutputs(b.outputs, b.targets, None)])


# ---- the anytime fit ---------------------------------------------------------------------------
def _anytime(limit: float = 600.0, **tree_args) -> Anytime:
    tree = xRFMTree(max_leaf_size=200, leaf=LeafConfig(n_iters=2), **tree_args)
    return Anytime(tree, time_limit=limit, quick_leaf_size=80)


def test_it_keeps_the_candidate_of_lowest_honest_loss_as_fitted_alone():
    X, y = planted(500, d=5, seed=1, noise=0.1)
    model = _anytime().fit(X, y, generator=torch.Generator().manual_seed(7))
    losses = model.trials_[:, 0]
    assert losses.isfinite().all() and model.trials_[:, 1].gt(0).all()  # both fitted, timed
    assert int(model.chosen_) == int(losses.argmin())
    alone = model._candidate(int(model.chosen_))
    alone.fit(X, y, generator=torch.Generator().manual_seed(7))
    torch.testing.assert_close(model(X[:50]), alone(X[:50]))
    summary = model.summary()
    names = ["quick tree laplace", "tree laplace", "tree gaussian", "mix tree"]
    assert [t["candidate"] for t in summary["trials"]] == names
    assert summary["chosen"] == summary["trials"][int(model.chosen_)]["candidate"]
    # the mix's weights include each kernel alone: its honest loss is at most either's
    assert losses[3] <= min(losses[1], losses[2]) + 1e-12
    assert summary["unused_share"] == pytest.approx(1 - summary["fit_seconds"] / 600.0)
    # its honest outputs are the chosen candidate's (as a blend would mix them)
    torch.testing.assert_close(model.honest_outputs().outputs, alone.honest_outputs().outputs)


def test_each_kernel_is_probed_once_and_every_candidate_is_as_fitted_alone(
    monkeypatch, quick_probes
):
    """The later rungs of a kernel grow on its first rung's probe: the same models, one probe."""
    probed = record_probes(monkeypatch)
    X, y = planted(500, d=5, seed=1, noise=0.1)
    model = _anytime().fit(X, y, generator=torch.Generator().manual_seed(7))
    # quick tree laplace, tree laplace, tree gaussian, mix tree: two kernels, two probes
    assert probed == ["LaplaceKernel", "GaussianKernel"]
    for i in range(3):  # each fitted alone, probing for itself: the same honest loss, exactly
        probed.clear()
        alone = model._candidate(i).fit(X, y, generator=torch.Generator().manual_seed(7))
        assert len(probed) == 1
        loss = honest_loss(alone)
        assert loss == pytest.approx(float(model.trials_[i, 0]), rel=1e-12)  # (row order)
        if i == int(model.chosen_):
            assert torch.equal(model(X), alone(X))


def test_estimates_take_each_rung_as_alone_less_the_probe_it_reuses(monkeypatch, quick_probes):
    seen: dict[str, list[float]] = {}
    costs: set[bool] = set()
    grown: list[tuple[object, float]] = []
    real_estimate, real_grown = anytime_module.estimate, anytime_module.grown_maps

    def spy_estimate(rung, rungs, seconds, probes=None, raw=False):
        seen[rung.name] = list(seconds)
        costs.add(raw)
        return real_estimate(rung, rungs, seconds, probes, raw)

    def spy_grown(model):
        out = real_grown(model)
        grown.append(out)
        return out

    monkeypatch.setattr(anytime_module, "estimate", spy_estimate)
    monkeypatch.setattr(anytime_module, "grown_maps", spy_grown)
    X, y = planted(500, d=5, seed=1, noise=0.1)
    model = _anytime().fit(X, y, generator=torch.Generator().manual_seed(7))
    took = model.trials_[:, 1].tolist()
    # read once per kernel, from its first rung: the quick Laplace tree, the Gaussian tree
    assert len(grown) == 2 and all(s > 0 for _, s in grown)
    probe = grown[0][1]  # the quick tree's own probe, which the full Laplace tree reused
    assert probe < took[0]
    assert seen["tree laplace"][0] == took[0]  # the quick tree probed for itself: as measured
    # the full Laplace tree is seen as alone: its seconds and the probe it skipped, exactly
    assert seen["tree gaussian"][1] == pytest.approx(took[1] + probe, rel=1e-6)
    assert costs == {False}  # the quick tree probed: its seconds hold what a full one adds


def test_the_first_bags_are_estimated_with_the_quick_trees_probe_once(monkeypatch, quick_probes):
    """Bags without validation rows probe once for all: the estimate counts the probe once."""
    calls: list[tuple[str, float]] = []
    grown: list[float] = []
    real_estimate, real_grown = anytime_module.estimate, anytime_module.grown_maps

    def spy_estimate(rung, rungs, seconds, probes=None, raw=False):
        out = real_estimate(rung, rungs, seconds, probes, raw)
        calls.append((rung.name, out))
        return out

    def spy_grown(model):
        out = real_grown(model)
        grown.append(out[1])
        return out

    monkeypatch.setattr(anytime_module, "estimate", spy_estimate)
    monkeypatch.setattr(anytime_module, "grown_maps", spy_grown)
    X, y = planted(300, d=4, seed=5)
    labels = (y > y.median()).long()
    tree = xRFMTree(task="classification", max_leaf_size=300, leaf=LeafConfig(n_iters=1))
    model = Anytime(BaggedTree(tree, n_bags=3), time_limit=600.0, quick_leaf_size=60)
    model.fit(X, labels, generator=torch.Generator().manual_seed(0))
    quick = float(model.trials_[0, 1])  # the fallback quick tree, which probed for itself
    probe = grown[0]
    assert 0 < probe < quick
    assert calls[1][0] == "quick bags laplace"
    assert calls[1][1] == pytest.approx(probe + 3 * (quick - probe), rel=1e-9)


def test_a_fit_too_small_to_split_takes_the_quick_fit_for_its_twin():
    """No tree of either candidate splits 70 rows: the full tree is the quick one, not refitted."""
    X, y = planted(70, d=4, seed=4, noise=0.1)
    model = _anytime().fit(X, y, generator=torch.Generator().manual_seed(1))
    quick, full = model.trials_[0], model.trials_[1]
    assert torch.equal(quick, full)  # one fit: the same honest loss and the same seconds
    alone = model._candidate(1)  # the full tree fitted on its own is that same model
    alone.fit(X, y, generator=torch.Generator().manual_seed(1))
    twin = model._candidate(0).fit(X, y, generator=torch.Generator().manual_seed(1))
    torch.testing.assert_close(alone(X), twin(X), rtol=0, atol=0)
    # above the quick leaf size (80 rows) the two differ and each is fitted
    X, y = planted(300, d=4, seed=4, noise=0.1)
    model = _anytime().fit(X, y, generator=torch.Generator().manual_seed(1))
    assert model.trials_[0, 1] != model.trials_[1, 1]
    assert model.trials_[0, 0] != model.trials_[1, 0]


def test_a_quick_fit_split_by_its_map_sets_smaller_leaves_is_no_twin(monkeypatch):
    """A set of input maps grows trees of half the leaf size: the quick ones split 70 rows."""
    record_probes(monkeypatch, ["quantile", "identity"])
    X, y = planted(70, d=4, seed=4, noise=0.1)
    model = _anytime().fit(X, y, generator=torch.Generator().manual_seed(1))
    quick = cast(xRFMTree, model._candidate(0)).fit(
        X, y, generator=torch.Generator().manual_seed(1)
    )
    assert quick.n_leaves > len(quick.trees) == 2  # split: not the full tree
    assert model.trials_[1, 1] != model.trials_[0, 1]  # so the full tree is fitted on its own
    full = cast(xRFMTree, model._candidate(1)).fit(X, y, generator=torch.Generator().manual_seed(1))
    assert full.n_leaves == len(full.trees) == 2
    assert honest_loss(full) == pytest.approx(float(model.trials_[1, 0]), rel=1e-12)


def test_a_small_fits_quick_candidates_see_the_raw_inputs_and_its_full_ones_probe(
    monkeypatch, tmp_path
):
    """At most QUICK_PROBE_ROWS rows: no probe for the quick tree, one per full tree."""
    probed = record_probes(monkeypatch, ["quantile"])  # (not what this table's probe would pick)
    X, y = planted(500, d=5, seed=1, noise=0.1)
    model = _anytime().fit(X, y, generator=torch.Generator().manual_seed(7))
    assert QUICK_PROBE_ROWS >= 500 and not bool(model.quick_probe_)
    assert probed == ["LaplaceKernel", "GaussianKernel"]  # tree laplace, tree gaussian
    for i in range(3):  # each fitted alone: the same honest loss, exactly
        probed.clear()
        alone = model._candidate(i).fit(X, y, generator=torch.Generator().manual_seed(7))
        assert len(probed) == (i > 0)
        assert list(cast(xRFMTree, alone).input_map.names) == ["quantile" if i else "identity"]
        assert honest_loss(alone) == pytest.approx(float(model.trials_[i, 0]), rel=1e-12)
    # where neither splits (70 rows) the quick tree is the full one's twin: it probes for it
    probed.clear()
    small = _anytime().fit(X[:70], y[:70], generator=torch.Generator().manual_seed(1))
    assert bool(small.quick_probe_) and torch.equal(small.trials_[0], small.trials_[1])
    assert probed == ["LaplaceKernel", "GaussianKernel"]  # quick (= full) laplace, tree gaussian
    # a saved model loads with its quick candidates built as fitted; an older state (no
    # quick_probe_) loads as one whose quick candidates probed
    save_model(model, tmp_path / "m.pt")
    loaded = load_model(tmp_path / "m.pt")
    assert not bool(loaded.quick_probe_)
    assert loaded._candidate(0).get_config() == model._candidate(0).get_config()
    state = {k: v for k, v in model.state_dict().items() if k != "quick_probe_"}
    old = _anytime()
    old.load_state_dict(state)
    assert bool(old.quick_probe_)
    torch.testing.assert_close(old(X[:30]), model(X[:30]))


def test_rows_of_weight_zero_are_left_out_as_if_never_given():
    X, y = planted(500, d=5, seed=3, noise=0.1)
    w = torch.ones(500)
    w[::7] = 0.0
    weighted = _anytime().fit(X, y, sample_weight=w, generator=torch.Generator().manual_seed(2))
    keep = w > 0
    plain = _anytime().fit(X[keep], y[keep], generator=torch.Generator().manual_seed(2))
    assert int(weighted.chosen_) == int(plain.chosen_)
    torch.testing.assert_close(weighted.trials_[:, 0], plain.trials_[:, 0])
    torch.testing.assert_close(weighted(X[:40]), plain(X[:40]))
    with pytest.raises(ValueError, match="sample_weight must be non-negative"):
        _anytime().fit(X, y, sample_weight=-w)


def test_a_limit_too_short_for_anything_keeps_the_quick_candidate_cut_short(caplog):
    X, y = planted(500, d=5, seed=1)
    with caplog.at_level("INFO", logger="xrfm_torch"):
        model = _anytime(limit=1e-6).fit(X, y, generator=torch.Generator().manual_seed(0))
    assert int(model.chosen_) == 0 and model.trials_[1].isnan().all()  # the rest never started
    chosen = model.models()[0]
    assert isinstance(chosen, xRFMTree) and chosen.config.max_leaf_size == 80
    assert all(int(leaf.best_iter_) == 0 for leaf in chosen.leaves())  # no leaf iterated
    # nor searched a temperature, probed more than one input map or fitted a split model
    assert float(chosen.temperature_) == 0.0 and chosen.input_map.names == ["identity"]
    assert chosen.n_leaves > 1 and "splits by principal component at the time limit" in caplog.text
    # past the limit, but within its tolerance (10 % plus a second): no warning
    assert model.fit_seconds_ > model.time_limit and "alone took" not in caplog.text


def _bagged_blend(n_rows: int, max_leaf_size: int) -> tuple[Tensor, Tensor, KernelBlend]:
    """A planted table's rows, their labels, and a blend of three bags of classification trees."""
    X, y = planted(n_rows, d=4, seed=2)
    tree = xRFMTree(task="classification", max_leaf_size=max_leaf_size, leaf=LeafConfig(n_iters=1))
    blend = KernelBlend(BaggedTree(tree, n_bags=3), kernels=("laplace", "gaussian"))
    return X, (y > y.median()).long(), blend


def test_a_blended_bagged_target_mixes_its_kernels_bags(quick_probes):
    X, labels, target = _bagged_blend(240, 300)
    model = Anytime(target, time_limit=600.0, quick_leaf_size=60)
    model.fit(X, labels, generator=torch.Generator().manual_seed(0))
    names = [t["candidate"] for t in model.summary()["trials"]]
    assert names[:5] == [
        "quick tree laplace",  # the fallback (as on a large fit: the first kernel)
        "quick bags laplace",
        "bags laplace",
        "bags gaussian",
        "mix bags",
    ]
    assert model.trials_[:5, 0].isfinite().all()
    assert model.trials_[5:].isnan().all()  # the main line finished: no detour
    # the fallback single tree is never kept once bags finished, whatever its loss; the target
    # (the mix, fitted) is kept unless a candidate beats it clearly: here none is below it
    losses = model.trials_[:5, 0]
    assert float(losses[1:].min()) == float(losses[4])
    assert int(model.chosen_) == 4
    # the mix is the target itself, fitted the way the blend fits it
    mix = model.trials_[4, 0]
    assert mix <= model.trials_[2:4, 0].min() + 1e-12  # weight 1 on one kernel is a candidate mix
    blend = _bagged_blend(240, 300)[2]  # the target, fitted alone
    blend.fit(X, labels, generator=torch.Generator().manual_seed(0))
    full = model._candidate(4)
    assert isinstance(full, KernelBlend) and full.get_config() == blend.get_config()
    if int(model.chosen_) == 4:
        torch.testing.assert_close(model.predict_proba(X[:20]), blend.predict_proba(X[:20]))
    torch.testing.assert_close(model.predict_proba(X).sum(1), torch.ones(240))


def test_a_bagged_target_too_small_to_split_fits_its_bags_first():
    """Every bag is one leaf: no fallback single tree, the quick bags are the full ones' twin."""
    X, labels, target = _bagged_blend(150, 600)
    model = Anytime(target, time_limit=600.0, quick_leaf_size=300)
    model.fit(X, labels, generator=torch.Generator().manual_seed(0))
    names = [t["candidate"] for t in model.summary()["trials"]]
    assert names[:5] == [
        "quick tree gaussian",  # a small blend's fallback kernel (never fitted here)
        "quick bags laplace",
        "bags laplace",
        "bags gaussian",
        "mix bags",
    ]
    fallbacks = [i for i, name in enumerate(names) if "quick tree" in name]
    assert model.trials_[fallbacks].isnan().all()  # never fitted, nor any of its detours
    assert torch.equal(model.trials_[1], model.trials_[2])  # one fit: the bags' twin
    assert model.trials_[1:5, 0].isfinite().all()
    # the kept model is the blend of bags, the same as fitted alone from the same generator
    assert int(model.chosen_) == 4
    blend = _bagged_blend(150, 600)[2]  # the target, fitted alone
    blend.fit(X, labels, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(model.predict_proba(X[:20]), blend.predict_proba(X[:20]))
    # out of time, the quick bags are kept, cut short: no leaf of any bag iterated
    starved = Anytime(target, time_limit=1e-6, quick_leaf_size=300)
    starved.fit(X, labels, generator=torch.Generator().manual_seed(0))
    assert int(starved.chosen_) == 1 and starved.trials_[3:].isnan().all()
    assert torch.equal(starved.trials_[1], starved.trials_[2])  # its twin takes its fit
    kept = starved.models()[0]
    assert isinstance(kept, BaggedTree)
    leaves = [leaf for t in kept.models() for leaf in t.leaves()]
    assert len(leaves) == 3 and all(int(leaf.best_iter_) == 0 for leaf in leaves)
    torch.testing.assert_close(starved.predict_proba(X).sum(1), torch.ones(150))


def test_one_leaf_bags_over_their_estimate_still_start_and_others_are_skipped(monkeypatch, caplog):
    """Bags of one leaf each stop iterating at the limit: they start even where their estimate
    exceeds the time left (cut short, still a model to mix); bags that split are skipped."""
    real = anytime_module.estimate

    def dear(rung, *args):  # the Gaussian bags look far too costly for the time left
        return 1e9 if rung.name == "bags gaussian" else real(rung, *args)

    monkeypatch.setattr(anytime_module, "estimate", dear)
    X, labels, target = _bagged_blend(150, 600)
    model = Anytime(target, time_limit=600.0, quick_leaf_size=300)
    with caplog.at_level("INFO", logger="xrfm_torch"):
        model.fit(X, labels, generator=torch.Generator().manual_seed(0))
    assert "bags gaussian started anyway" in caplog.text
    names = [t["candidate"] for t in model.summary()["trials"]]
    gaussian, mix = names.index("bags gaussian"), names.index("mix bags")
    assert model.trials_[[gaussian, mix], 0].isfinite().all() and int(model.chosen_) == mix
    # the same bags on more rows than a leaf holds: skipped, and the line stops
    X, labels, target = _bagged_blend(240, 300)
    split = Anytime(target, time_limit=600.0, quick_leaf_size=60)
    split.fit(X, labels, generator=torch.Generator().manual_seed(0))
    assert split.trials_[gaussian].isnan().all() and split.trials_[mix].isnan().all()


def test_bagged_candidates_are_compared_on_all_their_out_of_fold_rows():
    # the fallback tree scores only its validation rows; the bags must not be narrowed to them
    X, y = planted(300, d=4, seed=5)
    labels = (y > y.median()).long()
    tree = xRFMTree(task="classification", max_leaf_size=300, leaf=LeafConfig(n_iters=1))
    model = Anytime(BaggedTree(tree, n_bags=3), time_limit=600.0, quick_leaf_size=60)
    model.fit(X, labels, generator=torch.Generator().manual_seed(0))
    trials = model.summary()["trials"]
    assert trials[0]["candidate"].startswith("quick tree")
    kept = model.models()[0]
    assert isinstance(kept, BaggedTree) and int(model.chosen_) >= 1
    honest = kept.honest_outputs()
    assert honest.rows is not None and honest.rows.numel() == 300  # every row is out of fold
    own = mean_loss(row_losses(honest.outputs.double(), honest.targets, "classification"), None)
    assert float(model.trials_[int(model.chosen_), 0]) == pytest.approx(float(own), rel=1e-12)
    # the fallback's loss is its own, on its validation rows
    fallback = model._candidate(0).fit(X, labels, generator=torch.Generator().manual_seed(0))
    f = fallback.honest_outputs()
    assert f.rows is not None and f.rows.numel() < 100
    own_f = mean_loss(row_losses(f.outputs.double(), f.targets, "classification"), None)
    assert float(model.trials_[0, 0]) == pytest.approx(float(own_f), rel=1e-9)


def test_a_bagged_target_out_of_time_keeps_its_fallback_tree():
    X, labels, target = _bagged_blend(240, 300)
    model = Anytime(target, time_limit=1e-6, quick_leaf_size=60)
    model.fit(X, labels, generator=torch.Generator().manual_seed(0))
    assert int(model.chosen_) == 0 and model.trials_[1:].isnan().all()
    kept = model.models()[0]
    assert isinstance(kept, xRFMTree) and kept.config.max_leaf_size == 60
    # a small fit of a blend: the fallback is the Gaussian tree (quick_kernel)
    assert int(model.quick_kernel_) == 1 and kernel_name(kept) == "gaussian"
    torch.testing.assert_close(model.predict_proba(X).sum(1), torch.ones(240))


def test_a_saved_anytime_model_loads_with_its_choice(tmp_path):
    X, y = planted(400, d=5, seed=4)
    model = _anytime().fit(X, y, generator=torch.Generator().manual_seed(0))
    path = tmp_path / "model.pt"
    save_model(model, path)
    loaded = load_model(path)
    assert isinstance(loaded, Anytime) and int(loaded.chosen_) == int(model.chosen_)
    torch.testing.assert_close(loaded(X[:30]), model(X[:30]))
    torch.testing.assert_close(loaded.trials_, model.trials_)
    assert loaded.summary()["chosen"] == model.summary()["chosen"]
    again = model_from_config(model.get_config())
    assert isinstance(again, Anytime) and again.get_config() == model.get_config()
    # exports as the candidate it kept (in float64: a Gaussian member's float32 kernel values
    # round differently in the exported graph's whole-tensor form, by up to about 1e-3)
    model, x = model.double(), X[:30].double()
    program = export_program(model, x[:2])
    torch.testing.assert_close(program.module()(x), model(x), rtol=1e-9, atol=1e-10)


def test_bad_time_limits_are_refused_by_name():
    for bad in (0, -1.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="time_limit"):
            Anytime(xRFMTree(), time_limit=bad)
    with pytest.raises(ValueError, match="time_limit"):
        Anytime(xRFMTree(), time_limit="60")  # type: ignore[arg-type]
    X = np.random.default_rng(0).normal(size=(60, 3))
    for bad in (0, -5, "fast", float("inf")):
        with pytest.raises(ValueError, match="time_limit"):
            XRFMRegressor(time_limit=bad).fit(X, X[:, 0])


def test_build_model_and_the_estimators_wrap_the_default_in_an_anytime_fit():
    model = build_model(xRFMTree(), 5, ["laplace", "gaussian"], time_limit=30.0)
    assert isinstance(model, Anytime) and model.time_limit == 30.0
    assert isinstance(model.prototype, KernelBlend)
    assert not isinstance(build_model(xRFMTree(), 1, None), Anytime)
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 4))
    y = X[:, 0] + 0.1 * rng.normal(size=300)
    start = time.perf_counter()
    reg = XRFMRegressor(time_limit=60.0, max_leaf_size=150, n_iters=2, random_state=0).fit(X, y)
    assert time.perf_counter() - start < 60.0  # a loose bound: the fit itself takes about a second
    assert isinstance(reg.model_, Anytime)
    assert np.sqrt(np.mean((reg.predict(X) - y) ** 2)) < 0.5 * np.std(y)
    plain = XRFMClassifier(random_state=0).fit(X, y > 0)
    assert not isinstance(plain.model_, Anytime)


# ---- Lightning ---------------------------------------------------------------------------------
def test_lightning_takes_trainer_max_time_as_the_fit_limit(tmp_path):
    import lightning.pytorch as pl

    from xrfm_torch.lit import TabularDataModule, XRFMLitModule

    dm = TabularDataModule("synthetic", n_samples=600, n_features=6, seed=0)
    dm.setup()
    tree = xRFMTree(leaf=LeafConfig(n_iters=2), max_leaf_size=200, **dm.model_kwargs())
    system = XRFMLitModule(tree, **dm.system_kwargs())
    assert not isinstance(system.model, Anytime)
    trainer = pl.Trainer(
        max_time={"minutes": 10},
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        default_root_dir=tmp_path,
    )
    trainer.fit(system, datamodule=dm)
    assert isinstance(system.model, Anytime) and system.model.is_fitted
    assert 590.0 < system.hparams["time_limit"] <= 600.0
    rungs = system.model.rungs()  # the target (the blend's mix) ties its Laplace tree: kept
    assert system.model.summary()["chosen"] == rungs[target_index(rungs)].name == "mix tree"
    trainer.save_checkpoint(tmp_path / "limited.ckpt")
    loaded = XRFMLitModule.load_from_checkpoint(tmp_path / "limited.ckpt", weights_only=True)
    assert isinstance(loaded.model, Anytime)
    x = torch.from_numpy(dm.data.X_test)
    assert torch.equal(loaded.predict_step((x,), 0), system.predict_step((x,), 0))
    # system.time_limit sets the limit itself (the Hydra key), before any trainer
    own = XRFMLitModule(tree, time_limit=30.0, **dm.system_kwargs())
    assert isinstance(own.model, Anytime) and own.model.time_limit == 30.0
    with pytest.raises(ValueError, match="time_limit"):
        XRFMLitModule(tree, time_limit=-1, **dm.system_kwargs())


def test_train_py_takes_system_time_limit(tmp_path):
    from test_configs import compose_with
    from xrfm_torch.pipeline import run

    cfg = compose_with(
        [
            "dataset=synthetic",
            "dataset.n_samples=800",
            "dataset.n_features=6",
            "model.max_leaf_size=300",
            "model.leaf.n_iters=2",
            "system.time_limit=120",
            "trainer.enable_progress_bar=false",
        ],
        tmp_path,
    )
    result = run(cfg)
    model = result["objects"]["system"].model
    assert isinstance(model, Anytime) and model.time_limit == 120.0
    assert result["metrics"]["test/r2"] > 0.6  # the synthetic task is learnable
    summary = json.loads((tmp_path / "tree_summary.json").read_text())
    assert summary["chosen"] == model.summary()["chosen"]
    assert [t["candidate"] for t in summary["trials"]] == [r.name for r in model.rungs()]
