"""Host reads: the scalars a fit's decisions need come back together, not one by one.

On a GPU every read of a value waits for the device; these tests count reads on the CPU (where
a read is free) so that a change that adds one per solve shows up without a GPU.
"""

from __future__ import annotations

import logging
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from xrfm_torch import LeafConfig, LpqLaplaceKernel
from xrfm_torch.leaf.step import rfm_step
from xrfm_torch.numerics import host
from xrfm_torch.numerics.host import read_scalars


def test_read_scalars_keeps_values_and_order():
    values = [
        torch.tensor(0.1, dtype=torch.float32),
        torch.tensor(True),
        torch.tensor([7], dtype=torch.int32),
        torch.tensor(float("nan"), dtype=torch.float64),
        torch.tensor([[2.5]], dtype=torch.float64, requires_grad=True),
    ]
    got = read_scalars(*values)
    assert got[:3] == [float(torch.tensor(0.1, dtype=torch.float32)), 1.0, 7.0]
    assert math.isnan(got[3]) and got[4] == 2.5
    # stacked by dtype and read together: each value back in its own place, exactly
    mixed = [torch.tensor(0.3), torch.tensor(False), torch.tensor(2**40 + 1), torch.tensor(-1.5)]
    mixed += [torch.tensor(True), torch.tensor(1e-40, dtype=torch.float64)]
    assert read_scalars(*mixed) == [float(v) for v in mixed]
    assert read_scalars() == []
    with pytest.raises(ValueError, match="value 1 has shape \\(2,\\)"):
        read_scalars(torch.tensor(1.0), torch.ones(2))


class Reads(TorchDispatchMode):
    """Counts reads of tensor values to the host: ``float(t)``, ``bool(t)``, ``t.item()``."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func.overloadpacket.__name__ == "_local_scalar_dense":
            self.n += 1
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("agop", [True, False])
def test_one_rfm_step_reads_back_once(monkeypatch, agop):
    # the step reads its validation error, bandwidth, M's finiteness, the AGOP's largest entry
    # and whether its solve's first attempt failed or was useless, all together
    batches = []
    real = host.read_scalars

    def counted(*values):
        batches.append(len(values))
        return real(*values)

    for module in ("xrfm_torch.leaf.step", "xrfm_torch.numerics.solvers"):
        monkeypatch.setattr(f"{module}.read_scalars", counted)
    g = torch.Generator().manual_seed(0)
    X, Xv = torch.randn(150, 4, generator=g), torch.randn(50, 4, generator=g)
    y, yv = X[:, :1].sin(), Xv[:, :1].sin()
    n = X.shape[0]
    buffers = (torch.empty(n, n), torch.empty(n, n), torch.empty(n + 64, n + 64).mT)
    sqrt_m = torch.tensor([1.0, 0.5, 2.0, 0.3])
    reads = Reads()
    with reads:
        cand, G, _ = rfm_step(
            LpqLaplaceKernel(3.0, p=1.0, q=1.0), X, y, Xv, yv, sqrt_m, buffers,
            LeafConfig(reg=1e-3), agop=agop, diag=True, generator=None,
        )  # fmt: skip
    assert reads.n == 0  # no value read one at a time
    assert batches == [5]  # the step reads its five scalars whether or not it computed G
    assert math.isfinite(cand.err) and (G is not None) == agop


def _step_inputs():
    g = torch.Generator().manual_seed(0)
    X, Xv = torch.randn(150, 4, generator=g), torch.randn(50, 4, generator=g)
    n = X.shape[0]
    buffers = (torch.empty(n, n), torch.empty(n, n), torch.empty(n + 64, n + 64).mT)
    return X, X[:, :1].sin(), Xv, Xv[:, :1].sin(), torch.tensor([1.0, 0.5, 2.0, 0.3]), buffers


def test_a_step_whose_first_solve_fails_repeats_it_with_the_retries(monkeypatch):
    # the first attempt's flag comes back with the step's scalars; where it says "failed",
    # the step solves again (solve_krr: jitter, float64) and scores that solve instead
    def step():
        X, y, Xv, yv, sqrt_m, buffers = _step_inputs()
        return rfm_step(
            LpqLaplaceKernel(3.0, p=1.0, q=1.0), X, y, Xv, yv, sqrt_m, buffers,
            LeafConfig(reg=1e-3), agop=True, diag=True, generator=None,
        )  # fmt: skip

    plain, G_plain, _ = step()
    batches = []
    real = host.read_scalars

    def counted(*values):
        batches.append(len(values))
        return real(*values)

    def failed_first(K, y, reg, **kw):
        return torch.full_like(y, float("nan")), torch.tensor(True)

    monkeypatch.setattr("xrfm_torch.leaf.step.read_scalars", counted)
    monkeypatch.setattr("xrfm_torch.leaf.step.first_krr_solve", failed_first)
    again, G_again, _ = step()
    assert batches == [5, 5]  # the failed step's scalars, then the repeated solve's
    assert again.err == plain.err and math.isfinite(again.err)
    torch.testing.assert_close(again.alpha, plain.alpha, rtol=0, atol=0)
    torch.testing.assert_close(G_again, G_plain, rtol=0, atol=0)


def test_a_non_finite_m_fails_the_step_after_the_joint_read():
    # the finiteness of sqrt(M) is read with the step's other scalars; the step still fails
    g = torch.Generator().manual_seed(0)
    X, Xv = torch.randn(60, 3, generator=g), torch.randn(20, 3, generator=g)
    n = X.shape[0]
    buffers = (torch.empty(n, n), torch.empty(n, n), torch.empty(n + 64, n + 64).mT)
    sqrt_m = torch.tensor([1.0, float("nan"), 1.0])
    cand, G, factored = rfm_step(
        LpqLaplaceKernel(3.0, p=1.0, q=1.0), X, X[:, :1], Xv, Xv[:, :1], sqrt_m, buffers,
        LeafConfig(reg=1e-3), agop=True, diag=True, generator=None,
    )  # fmt: skip
    assert G is None and not factored and not math.isfinite(cand.err)


def test_the_host_reads_tool_counts_device_reads_only():
    # tools.host_reads: reads of values and data-shaped ops count; a number made on the host
    # and read there does not (it would never leave the host on a GPU either)
    from tools.host_reads import counting

    real = torch.Tensor.tolist
    with counting() as mode:
        x = torch.arange(6.0)
        float(x.sum())  # a read
        x[x > 2]  # a boolean index
        torch.tensor(0.5, dtype=torch.float32).item()  # host-made: not counted
        x.max().tolist()  # a read
        x.nonzero()  # data-shaped
    assert torch.Tensor.tolist is real  # restored
    assert dict(mode.kinds) == {"read": 2, "boolean index": 1, "nonzero": 1}
    assert all("test_host_reads" not in site for site in mode.sites)  # sites are the package's


def test_a_leaf_whose_first_solves_all_fail_is_the_leaf_fitted_with_the_checks_read_at_once(
    monkeypatch,
):
    # every deferred first attempt (RFM steps, the post-hoc search) reported as failed: each
    # is solved again by solve_krr, and the fitted leaf is the same, bit for bit
    from xrfm_torch import LeafRFM

    g = torch.Generator().manual_seed(5)
    X, Xv = torch.randn(200, 4, generator=g), torch.randn(60, 4, generator=g)
    y, yv = (X[:, :1] * X[:, 1:2]).sin(), (Xv[:, :1] * Xv[:, 1:2]).sin()

    def fit():
        leaf = LeafRFM(config=LeafConfig(n_iters=4, reg_factors=(0.1, 10.0)))
        return leaf.fit(X, y, Xv, yv, generator=torch.Generator().manual_seed(0))

    plain = fit()
    calls = []

    def failed_first(K, y, reg, **kw):
        calls.append(reg)
        return torch.full_like(y, float("nan")), torch.tensor(True)

    monkeypatch.setattr("xrfm_torch.leaf.step.first_krr_solve", failed_first)
    monkeypatch.setattr("xrfm_torch.leaf.solve_request.first_krr_solve", failed_first)
    again = fit()
    assert len(calls) > 5  # the steps and the search candidates all went the long way
    a, b = plain.state_dict(), again.state_dict()
    for key in a:
        torch.testing.assert_close(a[key], b[key], rtol=0, atol=0, equal_nan=True, msg=key)


def test_a_leaf_checks_its_rows_values_once_and_its_final_solve_not_again(monkeypatch):
    # the fit's four arguments are checked with one read, the extra rows with one more, and the
    # final solve on all of them (no factor to continue here) checks nothing again
    from conftest import plain_leaf, planted
    from xrfm_torch.numerics import checks

    joint, single = [], []
    real_joint, real_single = checks.check_all_finite, checks.check_finite
    monkeypatch.setattr(
        checks, "check_finite", lambda *a, **k: single.append(a[1]) or real_single(*a, **k)
    )
    for module in ("xrfm_torch.leaf.data", "xrfm_torch.leaf.model"):
        monkeypatch.setattr(
            f"{module}.check_all_finite",
            lambda items: joint.append([name for _, name, _ in items]) or real_joint(items),
        )
    X, y = planted(300, d=4, seed=1)
    Xv, yv = planted(100, d=4, seed=2)
    leaf = plain_leaf(n_iters=1).fit(X[:250], y[:250], Xv, yv, extra=(X[250:], y[250:]))
    assert joint == [["X", "y", "X_val", "y_val"], ["extra X", "extra y"]]
    assert single == []
    assert leaf.support_.shape[0] == 300  # the extra rows joined the final solve
    # a bad extra row is still named
    bad = y[250:].clone()
    bad[3] = float("nan")
    with pytest.raises(
        ValueError, match=r"extra y contains 1 non-finite value\(s\), first at index \(3, 0\)"
    ):
        plain_leaf(n_iters=1).fit(X[:250], y[:250], Xv, yv, extra=(X[250:], bad))
    # the public refit checks its rows itself
    with pytest.raises(ValueError, match="y contains 1 non-finite"):
        leaf.refit(X[250:], bad)


def test_quiet_logging_reads_nothing_for_its_messages(caplog):
    # a debug or info message's figures are reads (waits on a GPU): with those levels off, a
    # tree fit (input-map probe, several leaves) makes none of them
    from conftest import planted
    from tools.host_reads import counting
    from xrfm_torch import xRFMTree

    X, y = planted(800, d=4, seed=5)
    Xv, yv = planted(200, d=4, seed=6)

    def reads(level: int) -> tuple[int, int]:
        with caplog.at_level(level, logger="xrfm_torch"), counting() as mode:
            tree = xRFMTree(max_leaf_size=200, leaf=LeafConfig(n_iters=1))
            tree.fit(X, y, Xv, yv, generator=torch.Generator().manual_seed(0))
        return mode.kinds["read"], tree.n_leaves

    loud, n_leaves = reads(logging.DEBUG)
    quiet, _ = reads(logging.WARNING)
    assert n_leaves >= 4
    # each leaf's line read its iteration and bandwidth; the probe's line each map set's error
    assert quiet + 2 * n_leaves <= loud


def test_split_by_masks_is_boolean_indexing_with_one_read():
    from tools.host_reads import counting

    g = torch.Generator().manual_seed(3)
    index = [torch.randperm(n, generator=g) + 7 for n in (0, 1, 40, 40, 300)]
    masks = [torch.rand(i.shape[0], generator=g) < p for i, p in zip(index, (0.5, 1, 0, 1, 0.3))]
    with counting() as mode:
        split = host.split_by_masks(index, masks)
    assert dict(mode.kinds) == {"read": 1}  # the sizes of all of them at once
    for i, m, (kept, rest) in zip(index, masks, split):
        assert torch.equal(kept, i[m]) and torch.equal(rest, i[~m])
    # given sizes, nothing is read
    sizes = [int(m.sum()) for m in masks]
    with counting() as mode:
        again = host.split_by_masks(index, masks, sizes)
    assert not mode.kinds
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(split, again))


def test_overlap_rows_are_set_apart_with_one_routing_and_one_read(monkeypatch):
    # a tree with overlap: each leaf's own rows (those routed to it) are told from its overlap
    # rows by one routing of all rows and one read of the sizes, not a routing and a read per
    # leaf (the same rows either way: a row's routing does not depend on the rows beside it)
    from conftest import planted
    from tools.host_reads import counting
    from xrfm_torch import xRFMTree
    from xrfm_torch.tree import leaf_fits, routing

    X, y = planted(900, d=4, seed=5)
    Xv, yv = planted(200, d=4, seed=6)
    routes: list[int] = []
    real_route = routing.hard_route

    def route(x, *a):
        routes.append(x.shape[0])
        return real_route(x, *a)

    monkeypatch.setattr(leaf_fits, "hard_route", route)

    def fit() -> xRFMTree:
        tree = xRFMTree(max_leaf_size=200, overlap_fraction=0.2, leaf=LeafConfig(n_iters=1))
        return tree.fit(X, y, Xv, yv, generator=torch.Generator().manual_seed(0))

    with counting() as mode:
        tree = fit()
    assert tree.n_leaves >= 4 and routes == [900]  # all training rows, once
    assert not [s for s in mode.sites if "leaf_fits" in s and "boolean" in s]
    # each leaf's final solve has its own rows and the overlap rows; its iterations only its own
    (partition,), (xt,) = tree.partition_trees(), tree.input_map(X)
    own = partition.route(xt)
    for k, leaf in enumerate(partition.leaf_list()):
        assert leaf.support_.shape[0] > int((own == k).sum())


def test_a_tree_checks_its_mapped_rows_once_and_its_leaves_check_none(monkeypatch):
    # the leaves' rows are the tree's mapped rows: checked once for all leaves (and the probe's
    # leaves), and a non-finite value a map made is named by its map
    from conftest import planted
    from xrfm_torch import LeafRFM, xRFMTree
    from xrfm_torch.inputs.input_map import InputMap

    X, y = planted(800, d=4, seed=5)
    Xv, yv = planted(200, d=4, seed=6)
    checked: list[bool] = []
    real_fit = LeafRFM.fit

    def fit(self, *a, check_input=True, **k):
        checked.append(check_input)
        return real_fit(self, *a, check_input=check_input, **k)

    monkeypatch.setattr(LeafRFM, "fit", fit)
    tree = xRFMTree(max_leaf_size=200, input_transform="auto", leaf=LeafConfig(n_iters=1))
    tree.fit(X, y, Xv, yv, generator=torch.Generator().manual_seed(0))
    n_leaves, n_splits = tree.n_leaves, tree.n_leaves - 1
    assert n_leaves >= 4
    # the split models check their own rows (a split rule is public); probes and leaves do not
    assert checked.count(True) == n_splits * len(tree.partition_trees())
    assert checked.count(False) >= n_leaves + 3  # three probe leaves

    real_encode = InputMap.encode_many

    def encode(self, x, names):
        out = real_encode(self, x, names)
        if x.shape[0] == X.shape[0]:
            out["identity"][7, 2] = float("inf")
        return out

    monkeypatch.setattr(InputMap, "encode_many", encode)
    with pytest.raises(
        ValueError,
        match=r"X mapped by 'identity' contains 1 non-finite value\(s\), first at index \(7, 2\)",
    ):
        xRFMTree(max_leaf_size=200, leaf=LeafConfig(n_iters=1)).fit(
            X, y, Xv, yv, generator=torch.Generator().manual_seed(0)
        )


def test_growing_a_tree_reads_no_thresholds_scales_or_validation_counts(monkeypatch):
    # a node's threshold and temperature scale stay on the device until the tree is grown, and
    # its validation rows are split with one read (was: a read each, two per node)
    from tools.host_reads import counting
    from xrfm_torch import LaplaceKernel
    from xrfm_torch.tree.grow import grow_tree
    from xrfm_torch.tree.splits import PCASplit

    g = torch.Generator().manual_seed(0)
    X = torch.randn(800, 3, generator=g, dtype=torch.float64)
    Xv = torch.randn(200, 3, generator=g, dtype=torch.float64)
    with counting() as mode:
        layout = grow_tree(
            X,
            X[:, :1],
            Xv,
            Xv[:, :1],
            max_leaf_size=100,
            split_rule=PCASplit(),
            kernel=LaplaceKernel(),
            generator=g,
        )
    reads = sum(n for site, n in mode.sites.items() if "grow.py" in site or "splits.py" in site)
    assert layout.n_splits == 7 and reads == 7  # the validation split of each node
    # each threshold splits its node's rows at the median: routing reproduces the leaves
    from xrfm_torch.tree.routing import hard_route

    ids = hard_route(X, layout.vectors, layout.thresholds, layout.children)
    for k, rows in enumerate(layout.leaf_train):
        assert torch.equal(rows.sort().values, (ids == k).nonzero().squeeze(1))


def test_the_post_hoc_search_estimates_its_cost_only_under_a_time_limit(monkeypatch):
    from conftest import planted
    from xrfm_torch import LeafRFM
    from xrfm_torch.leaf import iteration
    from xrfm_torch.numerics import deadline

    X, y = planted(300, d=4, seed=1)
    estimates: list[float] = []
    real = iteration.search_cost
    monkeypatch.setattr(
        iteration, "search_cost", lambda *a: estimates.append(real(*a)) or estimates[-1]
    )
    config = LeafConfig(n_iters=2, bandwidth_factors=(0.5, 1.0))
    LeafRFM(LpqLaplaceKernel(), config).fit(X, y, generator=torch.Generator().manual_seed(0))
    assert estimates == []  # (it reads the iterations' errors: a wait on a GPU)
    with deadline.within(1000.0):
        LeafRFM(LpqLaplaceKernel(), config).fit(X, y, generator=torch.Generator().manual_seed(0))
    assert len(estimates) == 1 and 0 < estimates[0] < 1000
