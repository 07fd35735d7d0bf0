"""Draws of the quick trees: where the main line stops with time left, more quick trees, averaged.

A tree's ``draw`` (``TreeConfig.draw``) holds out the rows draw 0 holds out and draws the rest
(split samples) anew; a blend's mix averages a kernel's draws under that kernel's weight
(:meth:`KernelBlend.mix`); an anytime fit of a blend ends its quick trees' detours with their
draws (:func:`xrfm_torch.models.ladder.ladder`), each estimated at its kernel's first quick tree.
"""

from __future__ import annotations

import math
from typing import cast

import pytest
import torch

from conftest import honest_loss, planted
from xrfm_torch import Anytime, KernelBlend, LeafConfig, load_model, save_model, xRFMTree
from xrfm_torch.models import anytime as anytime_module
from xrfm_torch.models.keep import choose
from xrfm_torch.models.ladder import QUICK_DRAWS, detours, estimate, ladder
from xrfm_torch.numerics.rng import redraw
from xrfm_torch.tree.honest import HonestOutputs, mean_loss, row_losses


def _tree(**settings) -> xRFMTree:
    return xRFMTree(**{"max_leaf_size": 200, "leaf": LeafConfig(n_iters=2), **settings})


def _fit(model, X, y, seed=3):
    return model.fit(X, y, generator=torch.Generator().manual_seed(seed))


def test_redraw_moves_a_generator_to_another_stream_deterministically():
    def after(draw: int) -> torch.Tensor:
        g = torch.Generator().manual_seed(5)
        redraw(g, draw)
        return torch.rand(4, generator=g)

    plain = torch.rand(4, generator=torch.Generator().manual_seed(5))
    assert torch.equal(after(0), plain)  # draw 0 leaves the generator as it is
    assert torch.equal(after(2), after(2)) and not torch.equal(after(1), after(2))
    assert not torch.equal(after(1), plain)
    with pytest.raises(ValueError, match="draw"):
        xRFMTree(draw=-1)


def test_draws_of_a_tree_hold_out_the_same_rows_and_split_differently():
    X, y = planted(400, d=5, seed=6, noise=0.1)
    first, again, other = (_fit(_tree(draw=d), X, y) for d in (0, 0, 1))
    assert first.n_leaves > 1 and other.n_leaves > 1
    a, b = first.honest_outputs(), other.honest_outputs()
    assert a.rows is not None and torch.equal(a.rows, cast(torch.Tensor, b.rows))
    assert torch.equal(a.targets, b.targets)
    torch.testing.assert_close(again(X[:50]), first(X[:50]), rtol=0, atol=0)
    assert not torch.allclose(other(X[:50]), first(X[:50]))
    # the root split's direction differs: its split model saw another sample of the rows
    roots = [m.partition_trees()[0].split_vectors_[0] for m in (first, other)]
    assert not torch.allclose(roots[0], roots[1])


def test_a_blend_weighs_kernels_and_averages_each_kernels_draws(tmp_path):
    X, y = planted(400, d=5, seed=6, noise=0.1)
    members = [_fit(_tree(kernel=k, draw=d), X, y) for k, d in
               [("laplace", 0), ("gaussian", 0), ("laplace", 1)]]  # fmt: skip
    blend = KernelBlend(_tree(), kernels=("laplace", "gaussian"), weight_steps=4)
    blend.mix(members, [0, 1, 0])
    parts = [m.honest_outputs() for m in members]
    pooled = [(parts[0].outputs + parts[2].outputs) / 2, parts[1].outputs]
    # the chosen kernel weight is the grid's best on the pooled outputs (by formula here)
    grid = [(w / 4, 1 - w / 4) for w in range(4, -1, -1)]
    targets = parts[0].targets
    mixed = [(a * pooled[0] + b * pooled[1]).double() for a, b in grid]
    losses = [float(mean_loss(row_losses(m, targets, "regression"), None)) for m in mixed]
    best = min(range(len(grid)), key=lambda i: losses[i])
    assert honest_loss(blend) == pytest.approx(losses[best], rel=1e-6)  # (float32 means)
    a, b = grid[best]
    expected = {0: a / 2, 2: a / 2, 1: b}  # members kept grouped by kernel, in kernel order
    kept = [j for j, w in expected.items() if w > 0]
    assert blend.member_kernels_.tolist() == [[0, 1, 0][j] for j in kept]
    torch.testing.assert_close(blend.weights_, torch.tensor([expected[j] for j in kept]))
    want = sum(expected[j] * members[j](X[:30]) for j in kept)
    torch.testing.assert_close(blend(X[:30]), cast(torch.Tensor, want))
    save_model(blend, tmp_path / "b.pt")
    torch.testing.assert_close(load_model(tmp_path / "b.pt")(X[:30]), blend(X[:30]))


def test_the_ladder_ends_with_each_quick_trees_draws_and_their_mixes():
    both = ["laplace", "gaussian"]
    rungs = ladder(_tree(max_leaf_size=10_000), both, 1, 2000)
    first = [r.name for r in rungs[:6]]
    assert first[0] == "quick tree laplace" and first[4:] == [
        "quick tree gaussian",
        "mix quick tree",
    ]
    draws = rungs[6:]
    assert len(draws) == 4 * (QUICK_DRAWS - 1)
    assert [r.name for r in draws[:4]] == [
        "quick tree laplace draw 2",
        "mix 3 quick trees",
        "quick tree gaussian draw 2",
        "mix 4 quick trees",
    ]
    assert [r.draw for r in draws] == [d for d in range(1, QUICK_DRAWS) for _ in range(4)]
    assert all(r.detour == 0 and r.quick and r.bags == 1 for r in draws)
    assert [r.kernel for r in draws[:4]] == [0, -1, 1, -1]
    assert draws[1].mixes == (0, 4, 6) and draws[3].mixes == (0, 4, 6, 8)
    assert rungs[-1].mixes == (0, 4, *range(6, len(rungs), 2))
    # the detours of the quick tree are its other kernel and their mix; the draws apart
    assert detours(rungs, 0) == [4, 5]
    assert detours(rungs, 0, draws=True) == list(range(6, len(rungs)))
    # a bagged target: its fallback tree's draws are fallbacks too; quick bags have none
    bags = ladder(_tree(task="classification", max_leaf_size=10_000), both, 5, 2000)
    tail = bags[9:]
    assert len(tail) == 4 * (QUICK_DRAWS - 1) and all(r.fallback and r.detour == 0 for r in tail)
    # one kernel: spares, no detours, no draws
    assert not any(r.draw for r in ladder(_tree(max_leaf_size=10_000), None, 1, 2000))


def test_a_draw_is_estimated_at_its_kernels_first_quick_tree_without_its_probe():
    rungs = ladder(_tree(max_leaf_size=10_000), ["laplace", "gaussian"], 1, 2000)
    seconds = [math.nan] * len(rungs)
    probes = [0.0] * len(rungs)
    seconds[0], probes[0] = 3.0, 1.0  # quick Laplace tree: 2 s of tree, 1 s of probe
    seconds[4], probes[4] = 2.5, 1.0  # the Gaussian detour: reused the probe (1 s)
    assert estimate(rungs[6], rungs, seconds, probes) == pytest.approx(2.0)
    assert estimate(rungs[8], rungs, seconds, probes) == pytest.approx(1.5)
    assert estimate(rungs[7], rungs, seconds, probes) == 0.0  # a mix
    seconds[4] = math.nan
    assert estimate(rungs[8], rungs, seconds, probes) == math.inf  # no Gaussian tree fitted


def test_where_the_line_stops_the_fit_goes_on_with_the_quick_trees_draws(
    monkeypatch, tmp_path, huge_tree_cost
):
    X, y = planted(400, d=5, seed=6, noise=0.1)
    model = Anytime(KernelBlend(_tree(), kernels=("laplace", "gaussian")), time_limit=600.0,
                    quick_leaf_size=80)  # fmt: skip
    _fit(model, X, y)
    rungs = model.rungs()
    losses = model.trials_[:, 0]
    assert losses[1:4].isnan().all() and losses[4:].isfinite().all()  # every draw and mix
    # kept: the candidate of lowest honest loss, where a draw alone is no candidate
    whole = [
        i for i, r in enumerate(rungs) if losses[i].isfinite() and not (r.draw and not r.mixes)
    ]
    assert int(model.chosen_) == min(whole, key=lambda i: (float(losses[i]), i))
    # the last mix is a KernelBlend of every quick tree, draws by their kernels' weights, as
    # fitted one by one from the same generator
    last = len(rungs) - 1
    trees = []
    for j in rungs[last].mixes:
        tree = cast(xRFMTree, model._candidate(j))  # (a small fit: raw inputs, no probe)
        assert tree.config.draw == rungs[j].draw and tree.config.input_transform == "identity"
        trees.append(_fit(tree, X, y))
    blend = cast(KernelBlend, model._candidate(last))
    blend.mix(trees, [rungs[j].kernel for j in rungs[last].mixes])
    assert honest_loss(blend) == pytest.approx(float(losses[last]), rel=1e-9)
    # kept as that mix, it is saved and loaded as it was fitted
    monkeypatch.setattr(anytime_module, "choose", lambda r, honest, task: (last, {}))
    _fit(model, X, y)
    assert int(model.chosen_) == last
    torch.testing.assert_close(model(X[:40]), blend(X[:40]))
    save_model(model, tmp_path / "m.pt")
    torch.testing.assert_close(load_model(tmp_path / "m.pt")(X[:40]), model(X[:40]))


def test_a_quick_tree_of_one_leaf_has_no_draws(monkeypatch, huge_tree_cost):
    """Every draw of a one-leaf tree is the same model: none is fitted."""
    X, y = planted(300, d=4, seed=2, noise=0.1)
    tree = xRFMTree(max_leaf_size=5000, leaf=LeafConfig(n_iters=2))
    model = Anytime(KernelBlend(tree, kernels=("laplace", "gaussian")), time_limit=600.0,
                    quick_leaf_size=2000)  # fmt: skip
    _fit(model, X, y)
    fitted = [r for r, ok in zip(model.rungs(), model.trials_[:, 0].isfinite().tolist()) if ok]
    assert fitted and not any(r.draw for r in fitted)


def test_a_draw_alone_is_never_kept_even_where_its_honest_loss_is_lowest():
    rungs = ladder(_tree(max_leaf_size=10_000), ["laplace", "gaussian"], 1, 2000)
    n = 300
    g = torch.Generator().manual_seed(0)
    base = 1.0 + torch.rand(n, generator=g, dtype=torch.float64)

    def honest(loss: torch.Tensor) -> HonestOutputs:
        return HonestOutputs(loss.sqrt()[:, None], torch.zeros(n, dtype=torch.float64), None,
                             torch.arange(n))  # fmt: skip

    # quick Laplace, quick Gaussian, their mix, the Laplace draw 2 (lowest), its mix
    given = {0: base + 0.3, 4: base + 0.2, 5: base + 0.1, 6: base - 0.5, 7: base}
    best, losses = choose(rungs, {i: honest(v) for i, v in given.items()}, "regression")
    assert best == 7  # the mix with the draw, not the draw alone
    assert losses[6] == pytest.approx(float((base - 0.5).mean()))  # (its loss is reported)
