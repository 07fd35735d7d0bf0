"""Property-based tests (hypothesis): routing, kernels, solvers, special functions, estimators.

Random shapes, dtypes and scales; every property is an identity or a bound that holds for all of
them. ``derandomize=True`` makes each run draw the same examples (CI is reproducible).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from xrfm_torch.kernels import LaplaceKernel
from xrfm_torch.kernels.distance import pairwise_distance
from xrfm_torch.numerics.solvers import solve_krr
from xrfm_torch.numerics.special import count_sorted, erfinv_poly
from xrfm_torch.tree.routing import (
    hard_route,
    hard_weights,
    path_signs,
    soft_weights,
)

FAST = settings(max_examples=25, deadline=None, derandomize=True)
SLOW = settings(max_examples=3, deadline=None, derandomize=True)
DTYPES = st.sampled_from([torch.float32, torch.float64])


def random_tree(seed: int, n_leaves: int, d: int, dtype: torch.dtype):
    """A random full binary tree: (vectors (J, d), thresholds (J,), children (J, 2), L)."""
    g = torch.Generator().manual_seed(seed)
    children: list[list[int]] = []
    frontier: list[tuple[int, int] | None] = [None]  # (parent, side) of each leaf; None: root
    for _ in range(n_leaves - 1):  # split a random leaf into a node with two leaves
        spot = frontier.pop(int(torch.randint(len(frontier), (1,), generator=g)))
        node = len(children)
        children.append([0, 0])
        if spot is not None:
            children[spot[0]][spot[1]] = node
        frontier += [(node, 0), (node, 1)]
    for leaf_id, spot in enumerate(frontier):
        if spot is not None:
            children[spot[0]][spot[1]] = -(leaf_id + 1)
    J = len(children)
    vectors = torch.randn(J, d, generator=g, dtype=dtype)
    thresholds = 0.3 * torch.randn(J, generator=g, dtype=dtype)
    return (
        vectors,
        thresholds,
        torch.tensor(children, dtype=torch.long).reshape(J, 2),
        len(frontier),
    )


@FAST
@given(
    seed=st.integers(0, 10_000),
    n_leaves=st.integers(2, 12),
    n=st.integers(1, 60),
    d=st.integers(1, 6),
    scale=st.sampled_from([1e-3, 1.0, 1e3]),
    dtype=DTYPES,
)
def test_hard_weights_are_one_hot_and_route_like_hard_route(seed, n_leaves, n, d, scale, dtype):
    vectors, thresholds, children, L = random_tree(seed, n_leaves, d, dtype)
    x = scale * torch.randn(n, d, generator=torch.Generator().manual_seed(seed + 1), dtype=dtype)
    sign = path_signs(children, L)
    w = hard_weights(x, vectors, thresholds * scale, sign)
    ids = hard_route(x, vectors, thresholds * scale, children)
    assert torch.equal(w, torch.nn.functional.one_hot(ids, L).to(dtype))


@FAST
@given(
    seed=st.integers(0, 10_000),
    n_leaves=st.integers(2, 12),
    n=st.integers(1, 60),
    temperature=st.floats(0.01, 10.0),
    keep_mass=st.floats(0.5, 1.0),
    max_leaves=st.one_of(st.none(), st.integers(1, 12)),
    dtype=DTYPES,
)
def test_soft_weights_are_a_distribution_and_keep_the_heaviest_leaf(
    seed, n_leaves, n, temperature, keep_mass, max_leaves, dtype
):
    vectors, thresholds, children, L = random_tree(seed, n_leaves, 3, dtype)
    x = torch.randn(n, 3, generator=torch.Generator().manual_seed(seed + 2), dtype=dtype)
    sign = path_signs(children, L)
    scales = torch.ones(len(thresholds), dtype=dtype)
    full = soft_weights(x, vectors, thresholds, scales, sign, children, temperature)
    w = soft_weights(
        x,
        vectors,
        thresholds,
        scales,
        sign,
        children,
        temperature,
        keep_mass=keep_mass,
        max_leaves=max_leaves,
    )
    tol = 1e-5 if dtype == torch.float32 else 1e-12
    assert bool((w >= 0).all())
    torch.testing.assert_close(w.sum(1), torch.ones(n, dtype=dtype), rtol=0, atol=tol)
    torch.testing.assert_close(full.sum(1), torch.ones(n, dtype=dtype), rtol=0, atol=tol)
    # the truncated mixture keeps each row's heaviest leaf and at most max_leaves leaves
    assert torch.equal(w.argmax(1), full.argmax(1)) or bool(
        (full.max(1).values - full.gather(1, w.argmax(1)[:, None])[:, 0] < tol).all()
    )
    if max_leaves is not None:
        assert int((w > 0).sum(1).max()) <= max_leaves


@FAST
@given(
    n=st.integers(1, 40),
    m=st.integers(1, 40),
    d=st.integers(1, 8),
    scale=st.sampled_from([1e-2, 1.0, 1e2]),
    shift=st.sampled_from([0.0, 1e3]),
    seed=st.integers(0, 10_000),
)
def test_euclidean_distances_are_exact_and_laplace_kernel_is_bounded(n, m, d, scale, shift, seed):
    g = torch.Generator().manual_seed(seed)
    x = shift + scale * torch.randn(n, d, generator=g, dtype=torch.float64)
    z = shift + scale * torch.randn(m, d, generator=g, dtype=torch.float64)
    r = pairwise_distance(x, z, 2.0)
    # the reference from differences (cdist's matrix-product mode loses digits at shift 1e3)
    direct = (x[:, None, :] - z[None]).norm(dim=-1)
    torch.testing.assert_close(r, direct, rtol=1e-7, atol=1e-9 * scale)
    k = LaplaceKernel(bandwidth=scale).to(torch.float64)
    K = k(x, z)
    assert bool(((K > 0) & (K <= 1)).all())
    torch.testing.assert_close(k(x, x).diagonal(), torch.ones(n, dtype=torch.float64))
    torch.testing.assert_close(k(x, x), k(x, x).T)


@FAST
@given(
    n=st.integers(2, 80),
    c=st.integers(1, 3),
    reg=st.sampled_from([1e-4, 1e-2, 1.0]),
    y_scale=st.sampled_from([1e-3, 1.0, 1e3]),
    seed=st.integers(0, 10_000),
)
def test_krr_solve_satisfies_its_normal_equations(n, c, reg, y_scale, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, generator=g, dtype=torch.float64)
    y = y_scale * torch.randn(n, c, generator=g, dtype=torch.float64)
    K = LaplaceKernel(bandwidth=2.0).to(torch.float64)(x, x)
    alpha = solve_krr(K, y, reg)
    residual = (K + reg * torch.eye(n, dtype=torch.float64)) @ alpha - y
    assert float(residual.abs().max()) <= 1e-8 * y_scale * max(1.0, 1 / reg)


@FAST
@given(
    m=st.integers(1, 4),
    k=st.integers(1, 70),
    n=st.integers(1, 30),
    ties=st.booleans(),
    seed=st.integers(0, 10_000),
)
def test_branch_free_search_counts_like_searchsorted(m, k, n, ties, seed):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(m, k, generator=g)
    x = torch.randn(m, n, generator=g)
    if ties:
        q, x = q.round(), x.round()
    q = q.sort(1).values
    for right in (True, False):
        assert torch.equal(count_sorted(q, x, right=right), torch.searchsorted(q, x, right=right))


@FAST
@given(y=st.floats(-1 + 1e-7, 1 - 1e-7))
def test_erfinv_from_basic_operators(y):
    t = torch.tensor([y], dtype=torch.float64)
    torch.testing.assert_close(erfinv_poly(t), torch.erfinv(t), rtol=1e-10, atol=1e-12)


@SLOW
@given(
    log_scales=st.lists(st.floats(-6, 6), min_size=3, max_size=3),
    seed=st.integers(0, 100),
)
def test_regressor_predictions_do_not_depend_on_column_units(log_scales, seed):
    from xrfm_torch import XRFMRegressor

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(240, 3))
    y = np.sin(X[:, 0]) + X[:, 1] * X[:, 2] + 0.05 * rng.normal(size=240)
    scales = 10.0 ** np.asarray(log_scales)
    kwargs = {
        "n_iters": 1,
        "max_leaf_size": 300,
        "random_state": 0,
        "dtype": "float64",
        "input_transform": "identity",
    }
    base = XRFMRegressor(**kwargs).fit(X[:200], y[:200]).predict(X[200:])
    scaled = XRFMRegressor(**kwargs).fit(X[:200] * scales, y[:200]).predict(X[200:] * scales)
    np.testing.assert_allclose(scaled, base, rtol=1e-4, atol=1e-4 * np.abs(base).max())


@SLOW
@given(seed=st.integers(0, 100), k=st.integers(2, 4))
def test_classifier_probabilities_are_distributions_over_its_classes(seed, k):
    from xrfm_torch import XRFMClassifier

    rng = np.random.default_rng(seed)
    X = rng.normal(size=(240, 3))
    labels = np.array([f"c{i}" for i in range(k)])[np.digitize(X[:, 0], np.linspace(-1, 1, k - 1))]
    clf = XRFMClassifier(
        n_iters=1, max_leaf_size=300, random_state=0, input_transform="identity"
    ).fit(X, labels)
    p = clf.predict_proba(X[:50])
    assert p.shape == (50, len(clf.classes_)) and set(clf.classes_) <= set(labels)
    np.testing.assert_allclose(p.sum(1), 1.0, atol=1e-6)
    assert (p >= 1e-3 - 1e-6).all() and (p <= 1 - 1e-3 + 1e-6).all()  # float32 clip bounds
    assert (clf.predict(X[:50]) == clf.classes_[p.argmax(1)]).all()


pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")
