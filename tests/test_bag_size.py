"""A bag's size: a classifier's bags are trees of half the leaf size and split sample."""

from __future__ import annotations

import pytest
import torch

from xrfm_torch import Anytime, BaggedTree, KernelBlend, LeafConfig, xRFMTree
from xrfm_torch.models.bagging import CLASSIFICATION_BAG_SIZE_FRACTION
from xrfm_torch.models.factory import model_from_config
from xrfm_torch.tree import splits
from xrfm_torch.tree.splits import AGOPSplit


def _data(n: int = 600):
    g = torch.Generator().manual_seed(5)
    X = torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = torch.sin(2 * X[:, 0]) + X[:, 1] + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return X, y


def _bags(task: str, size_fraction: float | None) -> BaggedTree:
    X, y = _data()
    if task == "classification":
        y = (y > y.median()).long()
    tree = xRFMTree(
        task=task,
        max_leaf_size=300,
        split_rule=AGOPSplit(sample_size=240),
        input_transform="identity",
        leaf=LeafConfig(n_iters=1),
    )
    model = BaggedTree(tree, n_bags=3, size_fraction=size_fraction)
    # 600 pooled rows, 3 folds: every bag trains on 400 rows, more than max_leaf_size
    return model.fit(X, y, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    ("task", "size_fraction", "largest"),
    [
        ("classification", None, 300 * CLASSIFICATION_BAG_SIZE_FRACTION),
        ("classification", 1.0, 300),
        ("regression", None, 300),
        ("regression", 0.25, 75),
    ],
)
def test_a_bags_leaves_and_split_models_take_its_share(task, size_fraction, largest, monkeypatch):
    drawn = []  # the rows each split model asks for (its training sample, then its validation)
    real = splits._subsample

    def spy(n, size, *args):
        drawn.append(size)
        return real(n, size, *args)

    monkeypatch.setattr(splits, "_subsample", spy)
    model = _bags(task, size_fraction)
    assert CLASSIFICATION_BAG_SIZE_FRACTION == 0.5
    share = largest / 300
    # every split model fits on the bag's share of the rule's 240 rows (validates on a quarter)
    sample = round(240 * share)
    assert sample in drawn and set(drawn) <= {sample, max(2, sample // 4)}
    for bag in model.members:
        assert bag.config.split_rule.sample_size == sample
        rows = [leaf.support_.shape[0] for leaf in bag.leaves()]
        assert bag.config.max_leaf_size == largest
        assert max(rows) <= largest
        # median cuts of 400 rows down to the size: no leaf above it, none needlessly small
        assert largest / 2 < max(rows)
        assert sum(rows) >= 400  # every training row lies in a leaf (overlap adds some)
    # the settings stay those given: the prototype keeps its size, the config round-trips
    assert model.prototype.config.max_leaf_size == 300
    assert model.prototype.config.split_rule.sample_size == 240
    back = model_from_config(model.get_config())
    assert isinstance(back, BaggedTree) and back.size_fraction == size_fraction
    assert back.get_config() == model.get_config()


@pytest.mark.parametrize("bad", [0.0, 1.5, float("nan"), -0.5])
def test_a_bad_size_fraction_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="size_fraction"):
        BaggedTree(xRFMTree(), n_bags=2, size_fraction=bad)


def test_the_anytime_quick_bags_keep_the_quick_leaf_size():
    # the quick rung's leaves are already small (measured as they are); the full bags halve theirs
    tree = xRFMTree(task="classification", max_leaf_size=10_000)
    target = KernelBlend(BaggedTree(tree, n_bags=5), kernels=("laplace", "gaussian"))
    model = Anytime(target, time_limit=60.0, quick_leaf_size=2000)
    names = [r.name for r in model.rungs()]
    quick = model._candidate(names.index("quick bags laplace"))
    full = model._candidate(names.index("bags laplace"))
    assert isinstance(quick, BaggedTree) and isinstance(full, BaggedTree)
    assert quick.bag_size_fraction == 1.0 and quick.prototype.config.max_leaf_size == 2000
    assert full.bag_size_fraction == 0.5 and full.prototype.config.max_leaf_size == 10_000
