"""The "log" input map: which columns it takes, the unit-free signed log, and its plumbing."""

from __future__ import annotations

import math

import pytest
import torch

from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.inputs.input_map import (
    INPUT_MAPS,
    LOG_SPAN,
    PROBED_MAPS,
    InputMap,
    log_columns,
    signed_log,
)


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def zero_inflated(n: int, seed: int) -> torch.Tensor:
    """Column 0 qualifies (90 % zeros, nonzero lognormal over ~4 decades); the others each miss
    one condition: 1 has one value below its zeros (the spike is not at the minimum), 2 has 30 %
    zeros, 3 spans a factor < 100, 4 is standard normal."""
    g = seeded(seed)
    keep = torch.rand(n, generator=g) < 0.1
    money = torch.where(keep, 100 * torch.exp(1.5 * torch.randn(n, generator=g)), 0.0)
    signed = money.clone()
    signed[torch.nonzero(money)[0]] = -1.0
    few = torch.where(torch.rand(n, generator=g) < 0.3, 0.0, money + 1.0)
    narrow = torch.where(keep, 10 + 10 * torch.rand(n, generator=g), 0.0)
    return torch.stack([money, signed, few, narrow, torch.randn(n, generator=g)], 1).double()


def test_the_rule_takes_columns_with_a_spike_at_the_minimum_spanning_two_decades() -> None:
    X = zero_inflated(4000, 0)
    mask, offset, scale = log_columns(X, torch.ones(5, dtype=torch.bool))
    assert mask.tolist() == [True, False, False, False, False]
    nonzero = X[:, 0][X[:, 0] > 0]
    assert float(scale[0]) == pytest.approx(float(nonzero.min()) / LOG_SPAN)
    assert offset.tolist() == [0.0] * 5 and scale[1:].tolist() == [1.0] * 4
    # units and origin do not matter: the spike is measured from the minimum
    moved = log_columns(3.0 * X - 7.0, torch.ones(5, dtype=torch.bool))
    assert moved[0].tolist() == mask.tolist() and float(moved[1][0]) == -7.0
    assert float(moved[2][0]) == pytest.approx(3.0 * float(scale[0]))
    # a categorical column never qualifies; missing cells are left out of the shares
    assert not log_columns(X, torch.tensor([False, True, True, True, True]))[0][0]
    Xn = X.clone()
    Xn[:2000, 0] = torch.nan
    assert log_columns(Xn, torch.ones(5, dtype=torch.bool))[0][0]
    # at the share boundary: exactly half at the minimum qualifies, one fewer does not
    half = torch.cat([torch.zeros(50), torch.logspace(0, 3, 50)]).double()[:, None]
    assert log_columns(half, torch.ones(1, dtype=torch.bool))[0].item()
    half[0] = 5.0
    assert not log_columns(half, torch.ones(1, dtype=torch.bool))[0].item()


def test_signed_log_is_odd_monotone_and_a_log_far_from_zero() -> None:
    x = torch.tensor([[-1e4], [-1.0], [0.0], [1e-3], [1.0], [1e4]], dtype=torch.float64)
    s = torch.tensor([0.5], dtype=torch.float64)
    u = signed_log(x, s)[:, 0]
    assert torch.equal(u, -signed_log(-x, s)[:, 0]) and float(u[2]) == 0.0
    assert bool((u.diff() > 0).all())
    assert float(u[5]) == pytest.approx(math.log(1 + 1e4 / 0.5))


def test_the_log_map_standardizes_the_signed_log_and_is_free_of_units() -> None:
    X = zero_inflated(3000, 1)
    imap = InputMap().fit(X, knots=False)
    assert imap.log_columns == [0]
    got = imap.encode(X, "log")
    u = torch.log1p(X[:, 0] / (X[:, 0][X[:, 0] > 0].min() / LOG_SPAN))
    torch.testing.assert_close(got[:, 0], (u - u.mean()) / u.std(correction=0))
    torch.testing.assert_close(got[:, 1:], imap.encode(X, "identity")[:, 1:])
    # the zeros sit log(1 + LOG_SPAN) below the smallest nonzero value, in log units
    zero, smallest = got[X[:, 0] == 0, 0][0], got[:, 0][X[:, 0] > 0].min()
    assert float((smallest - zero) * u.std(correction=0)) == pytest.approx(math.log(1 + LOG_SPAN))
    # dollars or cents, any origin: the same map
    moved = X * torch.tensor([100.0, 1.0, 1.0, 1.0, 1.0], dtype=torch.float64) + 5.0
    torch.testing.assert_close(InputMap().fit(moved, knots=False).encode(moved, "log"), got)


def test_quantile_log_is_the_log_map_beside_the_raw_columns_normal_scores() -> None:
    X = zero_inflated(2000, 2)
    imap = InputMap().fit(X)
    both = imap.encode(X, "quantile+log")
    torch.testing.assert_close(both[:, :5], imap.encode(X, "log"))
    torch.testing.assert_close(both[:, 5:], imap.encode(X, "quantile"))
    torch.testing.assert_close(imap.owners("quantile+log"), imap.owners("quantile+raw"))
    # "auto" never probes the log maps (a user chooses them)
    assert PROBED_MAPS == ("identity", "quantile", "quantile+raw")


def test_all_maps_at_once_are_each_map_on_its_own() -> None:
    # encode_many makes the parts the maps share once: the same values, bit for bit, with a
    # log column, a category column, a value-level column and missing cells
    g = seeded(4)
    X = zero_inflated(2000, 4)
    X[:, 3] = torch.randint(0, 4, (2000,), generator=g).double()  # category codes
    codes = torch.randint(1, 31, (2000,), generator=g).double()  # zero-inflated codes: levels
    X[:, 2] = torch.where(torch.rand(2000, generator=g) < 0.5, 0.0, codes)
    X[torch.rand(2000, generator=g) < 0.1, 4] = torch.nan
    y = torch.sin(3.0 * X[:, 2])[:, None]
    imap = InputMap().fit(X, categorical=[3], y=y)
    assert imap.log_columns == [0] and imap.missing_columns == [4]
    assert imap.levels.columns_.tolist() == [2]
    x = torch.cat([X[:500], X[:1]])  # other rows than the training block
    many = imap.encode_many(x, [*INPUT_MAPS, "identity"])
    assert list(many) == list(INPUT_MAPS)  # each map once, in the given order
    for name in INPUT_MAPS:
        assert torch.equal(many[name], imap.encode(x, name)), name


def test_a_tree_on_the_log_map_learns_what_only_the_log_scale_shows() -> None:
    # The target oscillates in the log of a zero-inflated amount: standardized raw values squeeze
    # the small amounts onto the zeros, the log map spreads them.
    def task(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        X = zero_inflated(n, seed)[:, [0, 4]].float()
        wave = torch.sin(2 * torch.log(X[:, 0].clamp_min(1e-30) / 100))
        y = torch.where(X[:, 0] > 0, wave, 0.0) + 0.1 * X[:, 1]
        return X, y

    (X, y), (Xv, yv), (Xt, yt) = task(1500, 3), task(500, 4), task(1000, 5)
    kw = {"max_leaf_size": 2000, "leaf": LeafConfig(n_iters=2)}
    logged = xRFMTree(input_transform="log", **kw).fit(X, y, Xv, yv, generator=seeded())
    raw = xRFMTree(input_transform="identity", **kw).fit(X, y, Xv, yv, generator=seeded())

    def rmse(m: xRFMTree) -> float:  # on the rows with an amount (the zeros are easy)
        some = Xt[:, 0] > 0
        return float(((m(Xt[some])[:, 0] - yt[some]) ** 2).mean().sqrt())

    assert rmse(logged) < 0.7 * rmse(raw)  # 0.052 vs 0.094
    # the map is a buffer: a rebuilt model predicts the same
    fresh = xRFMTree.from_config(logged.get_config())
    fresh.load_state_dict(logged.state_dict())
    torch.testing.assert_close(fresh(Xt), logged(Xt), rtol=0, atol=0)
