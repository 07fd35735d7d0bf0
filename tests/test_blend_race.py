"""KernelBlend races bagged members: after each kernel's first bag, only kernels that may get a weight go on."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch

from conftest import planted
from xrfm_torch import BaggedTree, KernelBlend, LeafConfig, xRFMTree
from xrfm_torch.models.bagging import PLAN_MIN_ROWS
from xrfm_torch.tree.honest import HonestOutputs, row_losses

KERNELS = ("laplace", "gaussian")


def small_tree(**kw) -> xRFMTree:
    return xRFMTree(max_leaf_size=300, input_transform="identity", leaf=LeafConfig(n_iters=2), **kw)


def class_data(n: int, seed: int):
    X, f = planted(n, d=4, seed=seed, noise=0.3)
    return X, (f > f.median()).float()


def test_begin_and_finish_fit_is_fit_and_the_first_fold_outputs_are_its_out_of_fold_rows():
    X, y = class_data(PLAN_MIN_ROWS + 100, 0)
    proto = small_tree(task="classification")
    whole = BaggedTree(proto, n_bags=3).fit(X, y, generator=torch.Generator().manual_seed(4))
    staged = BaggedTree(proto, n_bags=3)
    staged.begin_fit(X, y, generator=torch.Generator().manual_seed(4))
    first = staged.first_fold_outputs()
    assert first is not None and not staged.is_fitted
    staged.finish_fit()
    a, b = whole.state_dict(), staged.state_dict()
    assert list(a) == list(b)
    for k in a:
        if isinstance(a[k], torch.Tensor):  # val_errors_ pads unused iterations with NaN
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, equal_nan=True, msg=k)
        else:
            assert a[k] == b[k], k
    rows = (whole.folds_ == 0).nonzero().squeeze(1)
    assert torch.equal(first.rows, rows)
    assert torch.equal(first.outputs, whole.oof_[rows])
    assert torch.equal(first.targets, y[rows])
    with pytest.raises(RuntimeError, match="begin_fit"):
        staged.finish_fit()


def test_below_plan_min_rows_there_is_no_first_bag_ahead_and_no_race():
    X, y = class_data(400, 1)
    bags = BaggedTree(small_tree(task="classification"), n_bags=2)
    bags.begin_fit(X, y, generator=torch.Generator().manual_seed(0))
    assert bags.first_fold_outputs() is None
    blend = KernelBlend(BaggedTree(small_tree(task="classification"), n_bags=2), kernels=KERNELS)
    blend.fit(X, y, generator=torch.Generator().manual_seed(0))
    assert blend.raced_ == {} and len(blend.honest_losses_) == 5


def stand_in(p1: torch.Tensor, labels: torch.Tensor) -> SimpleNamespace:
    """A member whose first fold's outputs are the class-1 probabilities ``p1``."""
    out = torch.stack([1 - p1, p1], 1).double()
    rows = torch.arange(len(labels))
    return SimpleNamespace(first_fold_outputs=lambda: HonestOutputs(out, labels, None, rows))


def one_step_t(good: torch.Tensor, bad: torch.Tensor, labels: torch.Tensor) -> tuple[float, float]:
    """Mean and paired t of the per-row loss increase from (1, 0) to (3/4, 1/4)."""
    pg, pb = (torch.stack([1 - p, p], 1).double() for p in (good, bad))
    d = row_losses(0.75 * pg + 0.25 * pb, labels, "classification") - row_losses(
        pg, labels, "classification"
    )
    return float(d.mean()), float(d.mean() / (d.std() / math.sqrt(len(d))))


@pytest.mark.parametrize("margin", [2.0, 50.0])
def test_race_drops_a_kernel_when_one_weight_step_to_it_loses_by_the_margin(margin):
    g = torch.Generator().manual_seed(0)
    labels = (torch.rand(400, generator=g) < 0.5).double()
    good = (0.9 * labels + 0.05 + 0.04 * torch.rand(400, generator=g)).clamp(0.01, 0.99)
    bad = torch.rand(400, generator=g)
    gap, t = one_step_t(good, bad, labels)
    assert 2.0 < t < 50.0  # the planted gap lies between the two margins
    blend = KernelBlend(xRFMTree(task="classification"), kernels=KERNELS, race_margin=margin)
    keep = blend._race([stand_in(good, labels), stand_in(bad, labels)])
    if margin == 2.0:
        assert keep == [0]
        assert blend.raced_["gaussian"] == pytest.approx(gap, rel=1e-9)
    else:
        assert keep == [0, 1] and blend.raced_ == {}
    # the order of the kernels does not matter: the bad one goes either way
    blend = KernelBlend(xRFMTree(task="classification"), kernels=KERNELS, race_margin=2.0)
    assert blend._race([stand_in(bad, labels), stand_in(good, labels)]) == [1]
    assert list(blend.raced_) == ["laplace"]


def test_race_keeps_both_kernels_when_a_mixture_is_best():
    g = torch.Generator().manual_seed(1)
    labels = (torch.rand(600, generator=g) < 0.5).double()
    noise = 0.3 * torch.randn(2, 600, generator=g)
    a, b = (((labels - 0.5) * 2 + n).sigmoid() for n in noise)  # equally good, own errors
    blend = KernelBlend(xRFMTree(task="classification"), kernels=KERNELS, race_margin=2.0)
    assert blend._race([stand_in(a, labels), stand_in(b, labels)]) == [0, 1]
    parts = [stand_in(p, labels).first_fold_outputs() for p in (a, b)]
    losses = blend._grid_losses(parts)[2].mean(1)  # the grid of weight_steps=4
    assert 0 < int(losses.argmin()) < 4  # a mixture is best: both kernels have weight


def test_a_raced_blend_keeps_the_survivor_exactly_and_mixes_it_alone():
    X, y = class_data(PLAN_MIN_ROWS + 200, 3)  # a draw whose first fold favours one kernel
    Xv, yv = class_data(300, 4)  # (with the bags' leaves of 300 rows: size_fraction=1)
    proto = BaggedTree(small_tree(task="classification"), n_bags=2, size_fraction=1.0)
    seed = torch.Generator().manual_seed(5)
    raced = KernelBlend(proto, kernels=KERNELS, race_margin=1e-9)  # any loss in one step drops
    raced.fit(X, y, generator=torch.Generator().manual_seed(5))
    whole = KernelBlend(proto, kernels=KERNELS, race_margin=None)
    whole.fit(X, y, generator=seed)
    singles = [
        BaggedTree(small_tree(task="classification", kernel=k), n_bags=2, size_fraction=1.0)
        for k in KERNELS
    ]
    for s in singles:
        s.begin_fit(X, y, generator=torch.Generator().manual_seed(5))
    firsts = [s.first_fold_outputs() for s in singles]
    gaps = {}
    per_row = raced._grid_losses(firsts)[2].mean(1)  # the grid of weight_steps=4
    best = int(per_row.argmin())
    if best == 0:
        gaps["gaussian"] = float(per_row[1] - per_row[0])
    elif best == 4:
        gaps["laplace"] = float(per_row[3] - per_row[4])
    assert raced.raced_ == pytest.approx({k: v for k, v in gaps.items() if v > 0}, rel=1e-6)
    for s in singles:
        s.finish_fit()
    assert whole.raced_ == {}
    for k, member in zip(raced.member_kernels_.tolist(), raced.members):
        assert torch.equal(member.predict_proba(Xv), singles[k].predict_proba(Xv))
    assert len(raced.raced_) == 1 and len(whole.honest_losses_) == 5
    # one kernel left: it predicts alone, and the dropped one fitted no more than its first bag
    assert raced.weights_.tolist() == [1.0] and len(raced.honest_losses_) == 1
    torch.testing.assert_close(raced.oof_, singles[int(raced.member_kernels_)].oof_)
    assert raced.summary()["raced"] == raced.raced_


def test_race_margin_is_checked_and_saved():
    with pytest.raises(ValueError, match="race_margin"):
        KernelBlend(race_margin=-1.0)
    blend = KernelBlend(race_margin=None)
    assert blend.get_config()["race_margin"] is None
    assert KernelBlend().get_config()["race_margin"] == 2.0


def test_race_weighs_the_first_fold_rows_by_their_sample_weights():
    g = torch.Generator().manual_seed(2)
    labels = (torch.rand(600, generator=g) < 0.5).double()
    good = (0.9 * labels + 0.05).clamp(0.01, 0.99)
    bad = (0.98 * labels + 0.01 + 0.05 * torch.rand(600, generator=g)).clamp(0.01, 0.99)
    bad[:300] = torch.rand(300, generator=g)  # wrong on the first half, better on the second
    rows = torch.arange(600)

    def member(p1: torch.Tensor, w: torch.Tensor) -> SimpleNamespace:
        out = torch.stack([1 - p1, p1], 1).double()
        return SimpleNamespace(first_fold_outputs=lambda: HonestOutputs(out, labels, w, rows))

    tree = xRFMTree(task="classification")
    on_bad_half = torch.cat([torch.ones(300), torch.full((300,), 1e-6)]).double()
    blend = KernelBlend(tree, kernels=KERNELS, race_margin=2.0)
    assert blend._race([member(good, on_bad_half), member(bad, on_bad_half)]) == [0]
    on_good_half = on_bad_half.flip(0)  # the weight where the second kernel is better
    blend = KernelBlend(tree, kernels=KERNELS, race_margin=2.0)
    assert blend._race([member(good, on_good_half), member(bad, on_good_half)]) == [1]
    assert list(blend.raced_) == ["laplace"]
