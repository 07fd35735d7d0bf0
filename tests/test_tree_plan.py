"""A map's later trees start from the first tree's learned M and follow its plan (shared_plan)."""

from __future__ import annotations

import pytest
import torch

from conftest import check_starts, record_leaf_starts
from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.tree.plan import leaf_plan


@pytest.fixture(scope="module")
def labelled():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(1400, 4, generator=g, dtype=torch.float64)
    score = torch.sin(2 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.3 * torch.randn(1400, generator=g)
    return X, (score > 0).long()


def _tree(**kw) -> xRFMTree:
    leaf = LeafConfig(n_iters=5, diag=True, patience=3, min_iters=2)
    return xRFMTree(
        task="classification",
        n_trees=2,
        max_leaf_size=300,
        leaf=leaf,
        input_transform="identity",
        temperature=0.0,
        **kw,
    )


def test_the_second_tree_starts_from_the_first_trees_matrices(labelled, monkeypatch):
    X, y = labelled
    calls = record_leaf_starts(monkeypatch)
    model = _tree().fit(X[:1000], y[:1000], generator=torch.Generator().manual_seed(2))
    first, second = model.partition_trees()
    assert len(calls) == first.n_leaves + second.n_leaves
    base = model.config.leaf
    plan = leaf_plan(first.leaf_list(), base, float(model.kernel.q))
    assert plan is not None and plan.min_iters == 0 and plan.patience == 2
    assert plan.n_iters == max(int(leaf.best_iter_) for leaf in first.leaf_list())
    assert all(start is None and cfg == base for _, start, cfg in calls[: first.n_leaves])
    assert all(cfg == plan for _, _, cfg in calls[first.n_leaves :])
    assert check_starts(first, calls[first.n_leaves :]) > 0
    for leaf in second.leaf_list():
        assert int(leaf.best_iter_) <= plan.n_iters


def test_without_a_shared_plan_every_tree_walks_alone_on_the_same_partition(labelled, monkeypatch):
    X, y = labelled
    g = lambda: torch.Generator().manual_seed(2)  # noqa: E731
    shared = _tree().fit(X[:1000], y[:1000], generator=g())
    calls = record_leaf_starts(monkeypatch)
    alone = _tree(shared_plan=False).fit(X[:1000], y[:1000], generator=g())
    assert all(start is None and cfg == alone.config.leaf for _, start, cfg in calls)
    for a, b in zip(shared.partition_trees(), alone.partition_trees()):
        # the draws are the same: the trees' cuts do not depend on how the leaves iterate
        assert torch.equal(a.split_vectors_, b.split_vectors_)
        assert torch.equal(a.thresholds_, b.thresholds_)
    for a, b in zip(shared.trees[0].leaf_list(), alone.trees[0].leaf_list()):
        assert torch.equal(a.alpha_, b.alpha_)  # the first tree is the same fit
    later = [int(leaf.val_errors_.isfinite().sum()) for leaf in shared.trees[1].leaf_list()]
    walked = [int(leaf.val_errors_.isfinite().sum()) for leaf in alone.trees[1].leaf_list()]
    assert sum(later) < sum(walked)  # fewer solves: what the shared plan is for
    # and no worse held out on this planted function
    err = {name: float((m.predict_proba(X[1000:]).argmax(1) != y[1000:]).double().mean())
           for name, m in (("shared", shared), ("alone", alone))}  # fmt: skip
    assert err["shared"] <= err["alone"] + 0.02
    assert xRFMTree.from_config(alone.get_config()).config.shared_plan is False
    with pytest.raises(TypeError, match="shared_plan"):
        xRFMTree(shared_plan="yes")  # type: ignore[arg-type]


def test_one_tree_per_map_is_the_same_fit_either_way(labelled):
    X, y = labelled
    g = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    fits = [
        xRFMTree(max_leaf_size=300, leaf=LeafConfig(n_iters=3), shared_plan=s).fit(
            X[:1000], y[:1000].double(), generator=g()
        )
        for s in (True, False)
    ]
    a, b = (f.state_dict() for f in fits)
    assert a.keys() == b.keys()
    for key in a:
        same = torch.equal(a[key], b[key]) if isinstance(a[key], torch.Tensor) else a[key] == b[key]
        assert same, key
