"""QuantileNormal: empirical-CDF levels, normal scores, tails, gradients, state and bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from xrfm_torch.inputs.transforms import QuantileNormal


def _normal_icdf(p: torch.Tensor) -> torch.Tensor:
    return torch.distributions.Normal(0.0, 1.0).icdf(p)


def _data(n: int = 3000, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.stack(
        [
            torch.empty(n, dtype=torch.float64).exponential_(generator=g),  # heavy right tail
            torch.randn(n, generator=g, dtype=torch.float64) * 3 + 1,
        ],
        dim=1,
    )


def test_levels_match_sklearn_quantile_transformer_on_continuous_features() -> None:
    sk = pytest.importorskip("sklearn.preprocessing")
    X = _data()
    g = torch.Generator().manual_seed(1)
    Xt = torch.cat([X[:200], torch.randn(100, 2, generator=g, dtype=torch.float64) * 4])
    for k in (1000, 37):
        ref = sk.QuantileTransformer(n_quantiles=k, subsample=10**9).fit(X.numpy())
        ours = QuantileNormal(k).fit(X).levels(Xt)
        np.testing.assert_allclose(ours.numpy(), ref.transform(Xt.numpy()), atol=1e-12)


def test_training_rows_get_hazen_plotting_positions() -> None:
    # With one knot per row, the i-th smallest of n rows has level i / (n - 1) and score
    # Phi^-1((i + 1/2) / n).
    X = _data(n=500)
    z = QuantileNormal(n_quantiles=500).fit(X)(X)
    ranks = X.argsort(0).argsort(0).double()
    np.testing.assert_allclose(z.numpy(), _normal_icdf((ranks + 0.5) / 500).numpy(), atol=1e-9)


def test_tied_values_take_the_middle_of_their_run() -> None:
    # 600 zeros, 300 ones, 100 twos; one knot per row: the run of a value spans sorted indices
    # a..b, so its level is (a + b) / 2 / (n - 1).
    x = torch.cat([torch.zeros(600), torch.ones(300), torch.full((100,), 2.0)]).double()[:, None]
    qn = QuantileNormal(n_quantiles=1000).fit(x)
    levels = qn.levels(torch.tensor([[0.0], [1.0], [2.0]], dtype=torch.float64))[:, 0]
    expected = torch.tensor([(0 + 599) / 2, (600 + 899) / 2, (900 + 999) / 2]) / 999
    np.testing.assert_allclose(levels.numpy(), expected.numpy(), atol=1e-12)
    # A rare binary value is not pushed to an extreme score: mid-rank keeps it at Phi^-1(0.95).
    z = qn(torch.tensor([[2.0]], dtype=torch.float64))
    assert float(z) == pytest.approx(float(_normal_icdf(torch.tensor((949.5 + 0.5) / 1000))))


def test_tails_continue_linearly_in_units_of_the_feature_std_or_clip() -> None:
    X = _data()
    lo, hi = X.min(0).values, X.max(0).values
    std = X.std(0)
    edges = torch.stack([lo, hi])
    beyond = torch.stack([lo - 2 * std, hi + 0.5 * std])
    lin = QuantileNormal(tails="linear").fit(X)
    z_end = -math.sqrt(2) * float(torch.erfinv(torch.tensor(1 - 1 / 3000, dtype=torch.float64)))
    np.testing.assert_allclose(lin(edges).numpy(), [[z_end, z_end], [-z_end, -z_end]], atol=1e-9)
    np.testing.assert_allclose(
        lin(beyond).numpy(), [[z_end - 2, z_end - 2], [-z_end + 0.5, -z_end + 0.5]], atol=1e-9
    )
    clip = QuantileNormal().fit(X)  # the default
    np.testing.assert_allclose(clip(beyond).numpy(), clip(edges).numpy(), atol=1e-12)


def test_map_is_monotone_and_its_gradient_matches_finite_differences() -> None:
    X = _data()
    qn = QuantileNormal(n_quantiles=200).fit(X)
    grid = torch.linspace(-12, 20, 4001, dtype=torch.float64)[:, None].expand(-1, 2)
    z = qn(grid)
    assert bool((z.diff(dim=0) >= 0).all())
    g = torch.Generator().manual_seed(3)
    x = (X[:20] + 1e-3 * torch.randn(20, 2, generator=g, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(qn, (x,), eps=1e-7, atol=1e-5)


def test_state_dict_loads_into_a_fresh_module() -> None:
    X = _data().float()
    qn = QuantileNormal(n_quantiles=64).fit(X)
    fresh = QuantileNormal(n_quantiles=64)
    fresh.load_state_dict(qn.state_dict())
    assert fresh.is_fitted
    torch.testing.assert_close(fresh(X[:50]), qn(X[:50]), rtol=0, atol=0)


def test_follows_the_input_dtype() -> None:
    X = _data()
    assert QuantileNormal().fit(X.float())(X[:3].float()).dtype == torch.float32
    assert QuantileNormal().fit(X)(X[:3]).dtype == torch.float64


def test_bad_arguments_and_input_are_named() -> None:
    with pytest.raises(ValueError, match="n_quantiles"):
        QuantileNormal(n_quantiles=1)
    with pytest.raises(ValueError, match="tails"):
        QuantileNormal(tails="wrap")
    with pytest.raises(RuntimeError, match="not fitted"):
        QuantileNormal()(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="at least 2 rows"):
        QuantileNormal().fit(torch.zeros(1, 3))
    X = _data()
    X[5, 1] = float("nan")
    with pytest.raises(ValueError, match="non-finite"):
        QuantileNormal().fit(X)
    with pytest.raises(ValueError, match=r"shape \(n, 2\)"):
        QuantileNormal().fit(_data())(torch.zeros(3, 5, dtype=torch.float64))


def test_knots_are_sorted_and_ties_exact_in_float32() -> None:
    # float32 interpolation a (1 - w) + a w inside a tie run is not always a, and unsorted knots
    # broke searchsorted (and the tie rule); a standardized discrete feature is the usual case
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 7, (5000, 3), generator=g).float()
    X = (codes - codes.mean(0)) / codes.std(0)
    qn = QuantileNormal(n_quantiles=1000).fit(X)
    k = qn.knots_
    assert bool((k[1:] >= k[:-1]).all())
    for j in range(3):  # a knot inside a run is the value itself, not a rounding neighbour
        for v in X[:, j].unique():
            near = (k[:, j] - v).abs() < 1e-5
            assert near.sum() > 1 and bool((k[near, j] == v).all())
    # each distinct value maps to one score, the middle of its run: a value's rows and its
    # left/right counts agree with a direct count in float64
    z = qn(X)
    for v in X[:, 0].unique():
        rows = X[:, 0] == v
        assert z[rows, 0].unique().numel() == 1
        below, upto = (k[:, 0] < v).sum().item(), (k[:, 0] <= v).sum().item()
        level = (below + upto - 1) / (2 * (k.shape[0] - 1))
        n = X.shape[0]
        want = math.sqrt(2) * torch.erfinv(torch.tensor(2 * (level * (n - 1) + 0.5) / n - 1))
        assert z[rows, 0][0].item() == pytest.approx(want.item(), abs=1e-5)
