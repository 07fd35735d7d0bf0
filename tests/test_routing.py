from __future__ import annotations

import torch

from conftest import plain_leaf
from xrfm_torch import LaplaceKernel
from xrfm_torch.tree.partition import PartitionTree
from xrfm_torch.tree.routing import hard_route, path_signs, soft_weights, truncate_weights

# node 0: x0 <= 0 -> leaf 0, else node 1; node 1: x1 <= 0.5 -> leaf 1, else leaf 2
V = torch.tensor([[1.0, 0.0], [0.0, 1.0]], dtype=torch.float64)
B = torch.tensor([0.0, 0.5], dtype=torch.float64)
S = torch.tensor([2.0, 0.5], dtype=torch.float64)
C = torch.tensor([[-1, 1], [-2, -3]])
P = torch.tensor([[-1, 0], [1, -1], [1, 1]], dtype=torch.int8)
X = torch.tensor([[-1.0, 3.0], [0.0, 0.0], [0.5, 0.2], [0.5, 0.5], [2.0, 0.9]], dtype=torch.float64)


def test_path_signs():
    assert torch.equal(path_signs(C, 3), P)


def test_hard_ids():
    assert hard_route(X, V, B, C).tolist() == [0, 0, 1, 1, 2]


def test_the_launch_bound_route_walks_every_row_to_the_same_leaf(monkeypatch):
    # on a GPU every level takes every row (no count of the rows left): same leaves, also in an
    # unbalanced tree whose leaves sit at depths 1 to 3, and one read (the child table) in all
    from tools.host_reads import counting
    from xrfm_torch.numerics import host
    from xrfm_torch.tree import routing

    g = torch.Generator().manual_seed(0)
    vectors = torch.randn(3, 4, generator=g, dtype=torch.float64)
    thresholds = torch.randn(3, generator=g, dtype=torch.float64) * 0.3
    children = torch.tensor([[-1, 1], [2, -4], [-2, -3]])  # node 1 and 2 below the root's right
    x = torch.randn(500, 4, generator=g, dtype=torch.float64)
    sparse = hard_route(x, vectors, thresholds, children)
    assert set(sparse.tolist()) == {0, 1, 2, 3}
    assert routing.tree_depth(children) == 3 and routing.tree_depth(C) == 2
    assert routing.tree_depth(children[:0]) == 0
    monkeypatch.setattr(host, "launch_bound", lambda device: True)  # as on a GPU
    with counting() as mode:
        dense = hard_route(x, vectors, thresholds, children)
    assert torch.equal(dense, sparse)
    assert dict(mode.kinds) == {"read": 1}
    assert hard_route(X, V, B, C).tolist() == [0, 0, 1, 1, 2]


def test_soft_weights_match_formula():
    T = 0.7
    w = soft_weights(X, V, B, S, P, C, T)
    z0 = X[:, 0] / (T * 2.0)
    z1 = (X[:, 1] - 0.5) / (T * 0.5)
    sig = torch.sigmoid
    expected = torch.stack([sig(-z0), sig(z0) * sig(-z1), sig(z0) * sig(z1)], 1)
    torch.testing.assert_close(w, expected)
    torch.testing.assert_close(w.sum(1), torch.ones(5, dtype=torch.float64))


def test_small_temperature_gives_hard_routing():
    Xo = X + torch.tensor([0.0, 1e-3], dtype=torch.float64)  # keep off the boundaries
    Xo[1, 0] = -1e-3
    w = soft_weights(Xo, V, B, S, P, C, 1e-6)
    hard = torch.nn.functional.one_hot(hard_route(Xo, V, B, C), 3).double()
    torch.testing.assert_close(w, hard, rtol=0, atol=1e-12)
    assert torch.equal(soft_weights(Xo, V, B, S, P, C, 0.0), hard)


def test_truncation_keeps_top_mass():
    w = torch.tensor([[0.6, 0.3, 0.1], [0.2, 0.5, 0.3]])
    torch.testing.assert_close(
        truncate_weights(w, keep_mass=0.75),
        torch.tensor([[2 / 3, 1 / 3, 0.0], [0.0, 0.625, 0.375]]),
    )
    torch.testing.assert_close(
        truncate_weights(w, max_leaves=1), torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    )


def hand_built_tree():
    g = torch.Generator().manual_seed(0)
    leaves = []
    for shift in (-1.0, 0.0, 1.0):
        Xl = torch.randn(30, 2, generator=g, dtype=torch.float64)
        yl = torch.sin(Xl[:, 0]) + shift
        leaves.append(
            plain_leaf(LaplaceKernel(2.0), n_iters=1).fit(Xl[:24], yl[:24], Xl[24:], yl[24:])
        )
    tree = PartitionTree(leaves).double()
    tree.set_structure(V, B, S, C)
    return tree


def test_tree_hard_and_soft_predictions():
    tree = hand_built_tree()
    assert tree.depth == 2 == int((tree.path_sign_ != 0).sum(1).max())  # the longest path
    hard = tree(X)
    per_leaf = torch.stack([leaf(X) for leaf in tree.leaves], 1)  # (n, L, 1)
    ids = torch.tensor([0, 0, 1, 1, 2])
    torch.testing.assert_close(hard, per_leaf[torch.arange(5), ids])
    w = soft_weights(X, V, B, S, P, C, 0.7)
    torch.testing.assert_close(tree(X, 0.7), (w[:, :, None] * per_leaf).sum(1))


def test_gradcheck_soft_routed_output():
    tree = hand_built_tree()
    x = (X + 0.05).clone().requires_grad_(True)
    assert torch.autograd.gradcheck(lambda inp: tree(inp, 0.7), (x,), eps=1e-6, atol=1e-5)
