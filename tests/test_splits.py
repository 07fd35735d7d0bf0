from __future__ import annotations

import math

import pytest
import torch

from conftest import planted
from xrfm_torch import AGOPSplit, CARTSplit, LaplaceKernel, PCASplit, RandomSplit
from xrfm_torch.numerics.events import counting
from xrfm_torch.tree.splits import balanced_split


@pytest.mark.parametrize("n", [2, 7, 10, 101])
def test_balanced_split_sizes_and_threshold(n):
    proj = torch.randn(n, generator=torch.Generator().manual_seed(n))
    left, right, thr = balanced_split(proj)
    assert len(left) == math.ceil(n / 2) and len(right) == n // 2
    assert set(left.tolist()) | set(right.tolist()) == set(range(n))
    assert proj[left].max() <= thr < proj[right].min()
    # the midpoint of the two middle projections in float64, as when they were read back
    middle = sorted(proj.tolist())[math.ceil(n / 2) - 1 : math.ceil(n / 2) + 1]
    assert thr.dtype == torch.float64 and thr.item() == 0.5 * (middle[0] + middle[1])


def test_balanced_split_of_duplicates_is_deterministic():
    proj = torch.zeros(9)
    left, right, thr = balanced_split(proj)
    assert left.tolist() == [0, 1, 2, 3, 4] and right.tolist() == [5, 6, 7, 8]
    assert thr == 0.0


def test_agop_split_recovers_planted_direction():
    g = torch.Generator().manual_seed(0)
    d = 8
    v = torch.randn(d, generator=g)
    v /= v.norm()
    X = torch.randn(2000, d, generator=g)
    y = torch.sin(1.5 * X @ v)[:, None]
    Xv = torch.randn(300, d, generator=g)
    yv = torch.sin(1.5 * Xv @ v)[:, None]
    split = AGOPSplit(n_iters=1, sample_size=1500)(
        X, y, Xv, yv, kernel=LaplaceKernel(), generator=g
    )
    assert split.threshold is None
    assert abs(float(split.direction @ v)) >= 0.9


def test_pca_split_is_top_principal_component():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(500, 3, generator=g) * torch.tensor([0.5, 3.0, 1.0])
    split = PCASplit()(X, torch.zeros(500, 1), None, None, kernel=LaplaceKernel(), generator=g)
    assert abs(float(split.direction[1])) > 0.99


def test_a_split_model_that_predicts_its_mean_cuts_along_the_principal_direction():
    # targets with no signal: the split model loses to its mean, whose AGOP is 0; the cut then
    # follows the inputs' widest direction (column 1), not eigh's arbitrary last axis
    g = torch.Generator().manual_seed(3)
    scale = torch.tensor([1.0, 3.0, 0.5, 1.0, 1.0])
    X, Xv = torch.randn(3000, 5, generator=g) * scale, torch.randn(800, 5, generator=g) * scale
    y, yv = torch.randn(3000, 1, generator=g), torch.randn(800, 1, generator=g)
    with counting() as events:
        split = AGOPSplit()(X, y, Xv, yv, kernel=LaplaceKernel(), generator=g)
    assert events["splits by principal component (the split model predicts its mean)"] == 1
    pca = PCASplit()(X, y, None, None, kernel=LaplaceKernel(), generator=None)
    torch.testing.assert_close(split.direction, pca.direction)
    assert abs(float(split.direction[1])) > 0.99


def test_random_split_is_seeded_unit_vector():
    X = torch.zeros(10, 5)
    a = RandomSplit()(
        X, X[:, :1], None, None, kernel=LaplaceKernel(), generator=torch.Generator().manual_seed(2)
    )
    b = RandomSplit()(
        X, X[:, :1], None, None, kernel=LaplaceKernel(), generator=torch.Generator().manual_seed(2)
    )
    assert torch.equal(a.direction, b.direction)
    assert abs(float(a.direction.norm()) - 1) < 1e-6


def test_cart_split_finds_feature_and_threshold():
    g = torch.Generator().manual_seed(3)
    X = torch.rand(400, 4, generator=g)
    y = (X[:, 2] > 0.6).float()[:, None] * 5 + 0.01 * torch.randn(400, 1, generator=g)
    split = CARTSplit(min_child_fraction=0.1)(X, y, None, None, kernel=LaplaceKernel(), generator=g)
    assert torch.equal(split.direction, torch.tensor([0.0, 0.0, 1.0, 0.0]))
    assert abs(split.threshold - 0.6) < 0.02


def test_cart_cost_matches_brute_force():
    g = torch.Generator().manual_seed(4)
    X = torch.randn(40, 3, generator=g, dtype=torch.float64)
    y = torch.randn(40, 2, generator=g, dtype=torch.float64)
    split = CARTSplit(min_child_fraction=0.1)(X, y, None, None, kernel=LaplaceKernel(), generator=g)

    def sse(m):
        return float(((y[m] - y[m].mean(0)) ** 2).sum()) if m.any() else 0.0

    best = min(
        (sse(X[:, j] <= t) + sse(X[:, j] > t), j, float(t))
        for j in range(3)
        for t in torch.sort(X[:, j]).values[3:-4]
    )
    j = int(split.direction.argmax())
    got = sse(X[:, j] <= split.threshold) + sse(X[:, j] > split.threshold)
    assert got == pytest.approx(best[0], rel=1e-9)


def test_cart_min_child_fraction_validated():
    with pytest.raises(ValueError, match="min_child_fraction"):
        CARTSplit(min_child_fraction=0.7)


def test_agop_split_without_validation_rows():
    X, y = planted(600, d=5)
    split = AGOPSplit(sample_size=500)(
        X,
        y[:, None],
        None,
        None,
        kernel=LaplaceKernel(),
        generator=torch.Generator().manual_seed(0),
    )
    assert float(split.direction[:2].norm()) > 0.9


def test_agop_split_sse_threshold_finds_an_off_median_step():
    # a step at x0 = 0.5 (the 69th percentile): the AGOP direction is +-e0 and the SSE cut of the
    # projections lands on the step, where the median cut would be near 0
    g = torch.Generator().manual_seed(5)
    X = torch.randn(1500, 3, generator=g, dtype=torch.float64)
    y = (3.0 * (X[:, 0] > 0.5) + 0.05 * torch.randn(1500, generator=g, dtype=torch.float64))[
        :, None
    ]
    rule = AGOPSplit(sample_size=1000, threshold="sse")
    split = rule(
        X, y, None, None, kernel=LaplaceKernel(), generator=torch.Generator().manual_seed(0)
    )
    v = split.direction
    assert abs(float(v[0])) > 0.95
    side = math.copysign(1.0, float(v[0]))
    assert abs(split.threshold - 0.5 * float(v[0])) < 0.1  # x0 = 0.5 is X @ v = 0.5 v0
    left = X @ v <= split.threshold
    assert bool(((X[:, 0] > 0.5) == (left if side < 0 else ~left)).float().mean() > 0.98)
    median = AGOPSplit(sample_size=1000)(
        X, y, None, None, kernel=LaplaceKernel(), generator=torch.Generator().manual_seed(0)
    )
    assert median.threshold is None and torch.equal(median.direction, v)


def test_agop_split_threshold_validated():
    with pytest.raises(ValueError, match="threshold"):
        AGOPSplit(threshold="mean")
    with pytest.raises(ValueError, match="min_child_fraction"):
        AGOPSplit(threshold="sse", min_child_fraction=0.0)
