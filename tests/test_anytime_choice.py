"""Which fitted candidate an anytime fit keeps (:func:`xrfm_torch.models.keep.choose`).

Planted honest outputs with known per-row losses: the target is kept unless a candidate's
per-row losses beat it by the margin in paired standard errors, computed here by formula.
"""

from __future__ import annotations

import math

import pytest
import torch

from conftest import planted
from xrfm_torch import Anytime, LeafConfig, xRFMTree
from xrfm_torch.models.keep import TARGET_MARGIN, choose
from xrfm_torch.models.ladder import ladder, target_index
from xrfm_torch.tree.honest import HonestOutputs


def _tree() -> xRFMTree:
    return xRFMTree(max_leaf_size=200, leaf=LeafConfig(n_iters=2))


def _honest(row_loss: torch.Tensor, weights: torch.Tensor | None = None) -> HonestOutputs:
    """Regression outputs whose squared errors against zero targets are ``row_loss``."""
    n = row_loss.shape[0]
    outputs = row_loss.double().sqrt()[:, None]
    return HonestOutputs(outputs, torch.zeros(n, dtype=torch.float64), weights, torch.arange(n))


def _paired_z(challenger: torch.Tensor, incumbent: torch.Tensor) -> float:
    d = (incumbent - challenger).double()
    return float(d.mean() / (d.std() / math.sqrt(d.shape[0])))


def test_the_target_is_the_blend_of_the_kernels_or_the_single_kernels_own_model():
    two = ladder(_tree(), ["laplace", "gaussian"], 1, 80)
    names = [r.name for r in two]
    assert names[target_index(two)] == "mix tree"
    # detours come after it, the quick trees' draws last
    assert names[4:6] == ["quick tree gaussian", "mix quick tree"] and two[6].draw == 1
    bags = ladder(_tree(), ["laplace", "gaussian"], 5, 80)
    assert [r.name for r in bags][target_index(bags)] == "mix bags"
    one = ladder(_tree(), None, 1, 80)  # one kernel: the spares come after the target
    assert [r.name for r in one][target_index(one)] == "tree laplace"
    assert all(r.spare for r in one[target_index(one) + 1 :])


@pytest.mark.parametrize("gain", [0.02, 0.3])
def test_a_cheaper_candidate_replaces_the_target_only_by_a_clear_win(gain):
    rungs = ladder(_tree(), ["laplace", "gaussian"], 1, 80)
    target = target_index(rungs)
    g = torch.Generator().manual_seed(0)
    base = 1.0 + torch.rand(400, generator=g, dtype=torch.float64)
    quick = base - gain + 0.5 * torch.randn(400, generator=g, dtype=torch.float64).abs()
    quick = quick - (quick.mean() - (base.mean() - gain))  # mean exactly `gain` below
    honest = {0: _honest(quick), target: _honest(base)}
    best, losses = choose(rungs, honest, "regression")
    assert losses[0] == pytest.approx(float(base.mean()) - gain)
    assert losses[target] == pytest.approx(float(base.mean()))
    clear = _paired_z(quick, base) > TARGET_MARGIN
    assert clear == (gain == 0.3)  # the planted gains fall on either side of the margin
    assert best == (0 if clear else target)
    # without a margin, the lower mean wins as before
    assert choose(rungs, honest, "regression", margin=0.0)[0] == 0


def test_without_the_target_the_lowest_loss_is_kept_and_ties_go_to_the_cheaper():
    rungs = ladder(_tree(), ["laplace", "gaussian"], 1, 80)
    g = torch.Generator().manual_seed(1)
    base = 1.0 + torch.rand(300, generator=g, dtype=torch.float64)
    honest = {0: _honest(base), 1: _honest(base - 0.001), 2: _honest(base - 0.001)}
    assert choose(rungs, honest, "regression")[0] == 1  # no margin among non-targets
    honest[target_index(rungs)] = _honest(base - 0.001)  # a tie with the target: the target
    assert choose(rungs, honest, "regression")[0] == target_index(rungs)


def test_weighted_rows_are_tested_on_their_weighted_losses():
    rungs = ladder(_tree(), ["laplace", "gaussian"], 1, 80)
    target = target_index(rungs)
    n = 400
    w = torch.ones(n, dtype=torch.float64)
    w[: n // 2] = 0.01  # the first half barely counts
    base = torch.full((n,), 1.0, dtype=torch.float64)
    quick = base.clone()
    quick[: n // 2] -= 0.9  # wins only where the weights are small
    quick[n // 2 :] += 0.05
    honest = {0: _honest(quick, w), target: _honest(base, w)}
    best, losses = choose(rungs, honest, "regression", margin=0.0)
    assert losses[0] == pytest.approx(float((quick * w).sum() / w.sum()))
    assert losses[0] > losses[target] and best == target  # unweighted, quick would win
    assert float(quick.mean()) < float(base.mean())


def test_an_anytime_fit_keeps_its_target_where_no_candidate_wins_clearly():
    """On a fit where every candidate is fitted, the kept one is the target or a clear winner."""
    X, y = planted(500, d=5, seed=1, noise=0.1)
    model = Anytime(_tree(), time_limit=600.0, quick_leaf_size=80)
    model.fit(X, y, generator=torch.Generator().manual_seed(7))
    rungs = model.rungs()
    target = target_index(rungs)
    losses = model.trials_[:, 0]
    assert losses[target].isfinite()
    chosen = int(model.chosen_)
    assert chosen == target or float(losses[chosen]) < float(losses[target])
    assert model.summary()["chosen"] == rungs[chosen].name
