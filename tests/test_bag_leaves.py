"""A bag's leaf size: a classifier's bags split down to half of ``max_leaf_size``, regression's not."""

from __future__ import annotations

import pytest
import torch

from xrfm_torch import Anytime, BaggedTree, KernelBlend, LeafConfig, xRFMTree
from xrfm_torch.models.bagging import CLASSIFICATION_BAG_LEAF_FRACTION
from xrfm_torch.models.factory import model_from_config


def _data(n: int = 600):
    g = torch.Generator().manual_seed(5)
    X = torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = torch.sin(2 * X[:, 0]) + X[:, 1] + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return X, y


def _bags(task: str, leaf_fraction: float | None) -> BaggedTree:
    X, y = _data()
    if task == "classification":
        y = (y > y.median()).long()
    tree = xRFMTree(
        task=task, max_leaf_size=400, input_transform="identity", leaf=LeafConfig(n_iters=1)
    )
    model = BaggedTree(tree, n_bags=3, leaf_fraction=leaf_fraction)
    # 600 pooled rows, 3 folds: every bag trains on 400 rows, exactly max_leaf_size
    return model.fit(X, y, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize(
    ("task", "leaf_fraction", "largest"),
    [
        ("classification", None, 400 * CLASSIFICATION_BAG_LEAF_FRACTION),
        ("classification", 1.0, 400),
        ("regression", None, 400),
        ("regression", 0.25, 100),
    ],
)
def test_a_bags_leaves_hold_its_share_of_max_leaf_size(task, leaf_fraction, largest):
    model = _bags(task, leaf_fraction)
    assert CLASSIFICATION_BAG_LEAF_FRACTION == 0.5
    for bag in model.bags:
        rows = [leaf.support_.shape[0] for leaf in bag.leaves()]
        assert bag.config.max_leaf_size == largest
        assert max(rows) <= largest
        # 400 training rows: one leaf when it may hold them all, else split to the smaller size
        assert (len(rows) == 1) == (largest == 400)
        assert sum(rows) >= 400  # every training row lies in a leaf (overlap adds some)
    # the settings stay those given: the prototype keeps its size, the config round-trips
    assert model.prototype.config.max_leaf_size == 400
    back = model_from_config(model.get_config())
    assert isinstance(back, BaggedTree) and back.leaf_fraction == leaf_fraction
    assert back.get_config() == model.get_config()


@pytest.mark.parametrize("bad", [0.0, 1.5, float("nan"), -0.5])
def test_a_bad_leaf_fraction_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="leaf_fraction"):
        BaggedTree(xRFMTree(), n_bags=2, leaf_fraction=bad)


def test_the_anytime_quick_bags_keep_the_quick_leaf_size():
    # the quick rung's leaves are already small (measured as they are); the full bags halve theirs
    tree = xRFMTree(task="classification", max_leaf_size=10_000)
    target = KernelBlend(BaggedTree(tree, n_bags=5), kernels=("laplace", "gaussian"))
    model = Anytime(target, time_limit=60.0, quick_leaf_size=2000)
    names = [r.name for r in model.rungs()]
    quick = model._candidate(names.index("quick bags laplace"))
    full = model._candidate(names.index("bags laplace"))
    assert isinstance(quick, BaggedTree) and isinstance(full, BaggedTree)
    assert quick.bag_leaf_fraction == 1.0 and quick.prototype.config.max_leaf_size == 2000
    assert full.bag_leaf_fraction == 0.5 and full.prototype.config.max_leaf_size == 10_000
