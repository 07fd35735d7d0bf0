"""The deadline a fit's loops consult: what a passed one does to a leaf, a tree and a candidate.

Timing itself is a benchmark's business (``bench.budget``); these tests pass deadlines that are
already over or far off, so what the loops do is decided, not raced.
"""

from __future__ import annotations

import math
from typing import cast

import pytest
import torch

from conftest import planted
from xrfm_torch import Anytime, LeafConfig, xRFMTree
from xrfm_torch.leaf import LeafRFM
from xrfm_torch.models import anytime as anytime_module
from xrfm_torch.numerics import deadline
from xrfm_torch.numerics.events import counting


def test_no_deadline_means_no_stop():
    assert deadline.time_left() == math.inf
    assert deadline.should_stop(1e9) is False
    deadline.check()


def test_a_nested_deadline_never_extends_the_outer_one():
    with deadline.within(0.0, abort=True):
        with deadline.within(1000.0):  # later: the outer, aborting one stays
            assert deadline.time_left() <= 0.0
            with pytest.raises(deadline.TimeLimitError):
                deadline.check()
        with deadline.within(None):
            assert deadline.time_left() <= 0.0
    with deadline.within(1000.0):
        assert 990.0 < deadline.time_left() <= 1000.0
        with deadline.within(0.0):  # earlier: this one, degrading
            assert deadline.should_stop() is True
            deadline.check()  # a degrading deadline never raises
        assert deadline.should_stop(10.0) is False
        assert deadline.should_stop(2000.0) is True  # work that would end past it
    assert deadline.time_left() == math.inf


def _leaf_data(n: int = 300):
    X, y = planted(n, d=5, seed=3)
    return X[:240], y[:240], X[240:], y[240:]


def test_a_passed_degrading_deadline_stops_a_leaf_after_its_first_solve():
    X, y, Xv, yv = _leaf_data()
    free = LeafRFM(config=LeafConfig(n_iters=6, min_iters=6))
    free.fit(X, y, Xv, yv, generator=torch.Generator().manual_seed(0))
    assert int(free.val_errors_.isfinite().sum()) > 2  # it iterates when there is time
    cut = LeafRFM(config=LeafConfig(n_iters=6, min_iters=6))
    with counting() as notes, deadline.within(0.0):
        cut.fit(X, y, Xv, yv, generator=torch.Generator().manual_seed(0))
    assert int(cut.best_iter_) == 0
    assert cut.val_errors_[0].isfinite() and not cut.val_errors_[1:].isfinite().any()
    assert float(cut.reg_) == LeafConfig().reg  # the ridge search was skipped too
    assert notes["leaves stopped iterating at the time limit"] == 1
    # the cut leaf is the plain kernel machine: the same as a fit with no iterations or search
    plain = LeafRFM(
        config=LeafConfig(
            n_iters=0, kernel_exponents=None, reg_factors=None, bandwidth_factors=None
        )
    )
    plain.fit(X, y, Xv, yv, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(cut(Xv), plain(Xv))


def test_a_passed_aborting_deadline_raises_in_a_leaf_and_a_tree():
    X, y, Xv, yv = _leaf_data()
    with deadline.within(0.0, abort=True), pytest.raises(deadline.TimeLimitError):
        LeafRFM(config=LeafConfig(n_iters=3)).fit(X, y, Xv, yv)
    with deadline.within(0.0, abort=True), pytest.raises(deadline.TimeLimitError):
        xRFMTree(max_leaf_size=100).fit(X, y, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("leaf_size", [600, 200])
def test_an_anytime_fits_one_leaf_candidate_stops_iterating_at_the_limit_a_split_one_is_dropped(
    monkeypatch, leaf_size
):
    X, y = planted(500, d=5, seed=1, noise=0.1)  # about 400 training rows: one leaf of 600
    real, aborts = deadline.within, []

    def within(seconds, *, abort=False):  # the limit passes once the quick tree is fitted
        aborts.append(abort)
        return real(seconds if len(aborts) == 1 else 0.0, abort=abort)

    built: dict[int, object] = {}
    candidate = Anytime._candidate

    def spy(self, index, maps=None):
        built[index] = candidate(self, index, maps)
        return built[index]

    monkeypatch.setattr(anytime_module.deadline, "within", within)
    monkeypatch.setattr(Anytime, "_candidate", spy)
    tree = xRFMTree(max_leaf_size=leaf_size, leaf=LeafConfig(n_iters=3, min_iters=3))
    model = Anytime(tree, time_limit=600.0, quick_leaf_size=80)
    model.fit(X, y, generator=torch.Generator().manual_seed(0))
    assert model.rungs()[1].name == "tree laplace" and model.trials_[1, 1] > 0  # it ran
    if leaf_size == 600:  # degrading: kept with its first solve, honestly scored
        assert aborts[:2] == [False, False] and math.isfinite(float(model.trials_[1, 0]))
        (leaf,) = cast(xRFMTree, built[1]).leaves()
        assert int(leaf.best_iter_) == 0 and not leaf.val_errors_[1:].isfinite().any()
    else:  # its tree splits: an aborting deadline drops it before its next leaf
        assert aborts[:2] == [False, True] and math.isnan(float(model.trials_[1, 0]))
