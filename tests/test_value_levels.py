"""Value levels: numeric columns whose values act as codes get a one-hot block of their values."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.inputs import levels
from xrfm_torch.inputs.categories import ONE_HOT
from xrfm_torch.inputs.levels import (
    BINS,
    FOLDS,
    LEVEL_ROWS,
    MIN_GAIN,
    PRIOR_ROWS,
    ValueLevels,
    _gains,
    _levels,
    _quantiles,
    level_columns,
    level_gain,
)


def coded_amounts(n: int, seed: int, smooth: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A zero-inflated column of 40 amounts and a binary target.

    ``smooth=False``: each amount has its own rate (neighbouring amounts differ: codes);
    ``True``: the rate rises with the amount (a smooth function of it).
    """
    rng = np.random.default_rng(seed)
    amounts = np.arange(1, 41) * 37.0
    x = np.where(rng.random(n) < 0.6, 0.0, rng.choice(amounts, size=n))
    if smooth:
        effect = np.where(x > 0, (x / amounts[-1]) * 3 - 1.5, 0.0)
    else:
        signs = np.random.default_rng(99).choice([-2.5, 2.5], size=40)  # the same in every split
        effect = np.where(x > 0, signs[np.searchsorted(amounts, x).clip(0, 39)], 0.0)
    y = (rng.random(n) < 1 / (1 + np.exp(-effect))).astype(float)
    return x, y


def reference_gain(x: np.ndarray, y: np.ndarray) -> float:
    """:func:`level_gain` written row by row with numpy (y: (n,) one target column)."""
    n = len(x)
    vals, counts = np.unique(x, return_counts=True)
    spike = vals[counts.argmax()]
    fold = np.arange(n) % FOLDS
    e_bin, e_val = np.zeros(n), np.zeros(n)
    for j in range(FOLDS):
        tr = fold != j
        rest = x[tr & (x != spike)]  # empty: no edges, every other value in one bin
        probs = np.linspace(0, 1, BINS + 1)[1:-1]
        edges = np.unique(np.quantile(rest, probs)) if len(rest) else np.zeros(0)
        b = np.where(x == spike, -1, np.searchsorted(edges, x, side="right"))
        for i in np.nonzero(~tr)[0]:
            same_bin = tr & (b == b[i])
            s = y[same_bin].mean() if same_bin.any() else y[tr].mean()
            same = tr & (x == x[i])
            e_bin[i] = s
            e_val[i] = (y[same].sum() + PRIOR_ROWS * s) / (same.sum() + PRIOR_ROWS)
    sst = ((y - y.mean()) ** 2).sum()
    return (((y - e_bin) ** 2).sum() - ((y - e_val) ** 2).sum()) / sst


def test_masked_quantiles_match_numpy_on_the_kept_entries():
    rng = np.random.default_rng(3)
    v = np.round(rng.normal(size=200), 1)  # repeated values: equal neighbouring quantiles
    probs = np.linspace(0, 1, BINS + 1)[1:-1]
    keeps = rng.random((4, 200)) < np.array([0.9, 0.3, 0.01, 0.0])[:, None]
    keeps[:3, 0] = True  # at least one kept in the first three; none in the last
    got = _quantiles(torch.tensor(v), torch.tensor(keeps), torch.tensor(probs))  # row by row
    assert got.shape == (4, len(probs))
    for row, keep in zip(got[:3], keeps[:3]):
        np.testing.assert_allclose(row.numpy(), np.quantile(v[keep], probs), rtol=0, atol=1e-12)
    assert torch.isposinf(got[3]).all()  # no edges: every other value shares one bin


@pytest.mark.parametrize("block", [None, 2_000])
def test_gains_of_all_columns_at_once_are_each_columns_gain(monkeypatch, block):
    # coded, smooth and pure-noise columns, a continuous one and one with two equally frequent
    # values (the smaller is the spike, as np.unique + argmax pick it)
    if block is not None:  # a column per chunk
        monkeypatch.setattr(levels, "GAIN_BLOCK", block)
    rng = np.random.default_rng(11)
    n = 400
    coded, y = coded_amounts(n, 0)
    smooth, _ = coded_amounts(n, 1, smooth=True)
    noise = np.where(rng.random(n) < 0.7, 0.0, rng.integers(1, 30, n) * 1.5)
    tie = np.where(np.arange(n) % 2 == 0, 2.0, -1.0)
    cols = [coded, smooth, noise, rng.normal(size=n), tie]
    X = torch.tensor(np.stack(cols, 1))
    got = _gains(X, torch.tensor(y)[:, None])
    assert got.shape == (len(cols),)
    for j, x in enumerate(cols):
        assert float(got[j]) == pytest.approx(reference_gain(x, y), rel=1e-9, abs=1e-12)
    # two one-hot columns of the binary target: each column's gain as with one
    both = torch.tensor(np.stack([y, 1 - y], 1))
    torch.testing.assert_close(_gains(X, both), got, rtol=1e-9, atol=1e-12)
    assert got[0] > MIN_GAIN > got[2]  # the coded column passes, the noise does not


@pytest.mark.parametrize("block", [None, 300])
def test_levels_count_the_frequent_values_besides_the_spike(monkeypatch, block):
    if block is not None:  # a column per chunk
        monkeypatch.setattr(levels, "GAIN_BLOCK", block)
    rng = np.random.default_rng(5)
    for trial in range(8):
        n = int(rng.integers(50, 300))
        cols, wants = [], []
        for _ in range(3):  # the columns of one call, each with its own values and spike
            x = rng.choice(rng.normal(size=int(rng.integers(2, 60))).round(2), size=n)
            x[rng.random(n) < rng.random()] = 0.0  # a spike of any share
            x[rng.random(n) < 0.1 * (trial % 2)] = np.nan  # missing cells in every other trial
            seen = x[~np.isnan(x)]
            counts = np.sort(np.unique(seen, return_counts=True)[1])[::-1]
            wants.append(int((counts[1:] >= LEVEL_ROWS).sum()))  # counts[0]: the most frequent
            cols.append(x)
        assert _levels(torch.tensor(np.stack(cols, 1))).tolist() == wants


def test_level_gain_when_a_fold_sees_only_the_spike():
    # the only other values sit in fold 0's rows: the other folds' training rows hold the spike
    # alone, so their bins have no edges (the reference's empty quantile set)
    x = np.zeros(100)
    x[[0, 5, 10]] = [3.0, 4.0, 5.0]
    y = np.random.default_rng(0).random(100)
    got = level_gain(torch.tensor(x), torch.tensor(y)[:, None])
    assert got == pytest.approx(reference_gain(x, y), rel=1e-9, abs=1e-12)


def test_level_gain_matches_a_row_by_row_reference():
    for smooth in (False, True):
        x, y = coded_amounts(600, seed=1, smooth=smooth)
        got = level_gain(torch.tensor(x), torch.tensor(y)[:, None])
        assert got == pytest.approx(reference_gain(x, y), rel=1e-9, abs=1e-12)
    # two one-hot columns of a binary target count twice the variance and twice the errors
    both = torch.tensor(np.stack([y, 1 - y], 1))
    assert level_gain(torch.tensor(x), both) == pytest.approx(reference_gain(x, y), rel=1e-9)
    assert level_gain(torch.tensor(x), torch.ones(600, 1)) == 0.0  # constant target


def test_only_zero_inflated_columns_whose_values_act_as_codes_are_chosen():
    n = 4000
    codes, y = coded_amounts(n, seed=2)
    smooth, y_smooth = coded_amounts(n, seed=12, smooth=True)
    rng = np.random.default_rng(3)
    dense = np.round(rng.normal(size=n), 1)  # repeated values but no spike: never tested
    X = torch.tensor(np.stack([dense, codes, smooth], 1))
    gain_codes = level_gain(X[:, 1], torch.tensor(y)[:, None])
    gain_smooth = level_gain(X[:, 2], torch.tensor(y_smooth)[:, None])
    assert gain_codes > 5 * MIN_GAIN and gain_smooth < MIN_GAIN
    assert level_columns(X, torch.tensor(y)[:, None], [0, 1, 2]) == ([1], [])
    assert level_columns(X, torch.tensor(y_smooth)[:, None], [0, 1, 2]) == ([], [])
    X[::7, 1] = float("nan")  # missing cells are left out of the test
    assert level_columns(X, torch.tensor(y)[:, None], [1]) == ([1], [])


def test_value_levels_one_hot_the_frequent_values_and_pool_the_rest():
    X = torch.tensor([[0.0], [0.0], [0.0], [5.0], [5.0], [2.0], [2.0], [9.0], [float("nan")]])
    lv = ValueLevels(max_levels=3).fit(X, [0])
    # kept: 0 (three rows), then 2 and 5 tie at two rows: the smaller value first
    assert lv.width == 3 and lv.values_[0].tolist() == [0.0, 2.0]
    out = lv(torch.tensor([[0.0], [2.0], [5.0], [9.0], [123.0], [float("nan")]]))
    expected = torch.tensor([[1, 0, 0], [0, 1, 0], [0, 0, 1], [0, 0, 1], [0, 0, 1], [0, 0, 0]])
    torch.testing.assert_close(out, expected.float() * ONE_HOT)
    assert lv.owners().tolist() == [0, 0, 0]


def table(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    codes, y = coded_amounts(n, seed)
    rng = np.random.default_rng(seed + 10)
    noise = rng.normal(size=(n, 2))
    return torch.tensor(np.column_stack([noise, codes])).float(), torch.tensor(y).long()


def test_a_tree_sees_the_value_block_and_predicts_the_codes_better():
    X, y = table(3000, seed=4)
    Xv, yv = table(1000, seed=5)
    Xt, yt = table(2000, seed=6)
    kw = {"task": "classification", "leaf": LeafConfig(n_iters=2), "input_transform": "identity"}
    g = torch.Generator
    on = xRFMTree(**kw).fit(X, y, Xv, yv, generator=g().manual_seed(0))
    off = xRFMTree(value_levels=False, **kw).fit(X, y, Xv, yv, generator=g().manual_seed(0))
    assert on.input_map.levels.columns_.tolist() == [2] and off.input_map.levels.width == 0
    assert on.leaves()[0].support_.shape[1] == 3 + 16  # 3 numbers + 15 values and "other"

    def logloss(model: xRFMTree) -> float:
        p = model.predict_proba(Xt).clamp_min(1e-12)
        return float(-p[torch.arange(len(yt)), yt].log().mean())

    assert logloss(on) < 0.93 * logloss(off)  # 0.60 vs 0.68 (15 of the 40 amounts in the block)
    assert on.feature_importance().shape == (3,)  # the block folds back onto its column
    # a state round trip predicts the same; a format-5 state (no block) loads with none
    fresh = xRFMTree(**kw)
    fresh.load_state_dict(on.state_dict())
    torch.testing.assert_close(fresh.predict_proba(Xt), on.predict_proba(Xt))
    old = {k: v for k, v in off.state_dict().items() if ".levels." not in k}
    old["_extra_state"] = {"format_version": 5}
    loaded = xRFMTree(value_levels=False, **kw)
    loaded.load_state_dict(old)
    torch.testing.assert_close(loaded.predict_proba(Xt), off.predict_proba(Xt))


def test_the_value_block_exports_and_predicts_as_the_eager_model():
    from xrfm_torch.models.export import export_program

    X, y = table(1500, seed=7)
    Xv, yv = table(500, seed=8)
    model = xRFMTree(task="classification", leaf=LeafConfig(n_iters=1), input_transform="identity")
    model.fit(X, y, Xv, yv, generator=torch.Generator().manual_seed(0))
    assert model.input_map.levels.width == 16
    program = export_program(model, X[:4], output="proba")
    x = torch.cat([X[:50], torch.tensor([[0.1, 0.2, 5.0]])])  # 5.0: an unseen amount ("other")
    torch.testing.assert_close(program.module()(x), model.predict_proba(x))


def test_the_spike_cut_finds_a_half_share_value_at_either_median():
    # exactly half the rows at the largest value: with n even it sits at the upper median only,
    # and the first cut must still pass the column on to the full test
    rng = np.random.default_rng(9)
    n = 2000
    amounts = rng.choice(np.arange(1, 41) * 37.0, size=n // 2)
    signs = np.random.default_rng(99).choice([-2.5, 2.5], size=40)
    effect = signs[(amounts / 37).astype(int) - 1]
    x = np.concatenate([np.full(n // 2, 9999.0), amounts])
    p = np.concatenate([np.full(n // 2, 0.5), 1 / (1 + np.exp(-effect))])
    y = torch.tensor((rng.random(n) < p).astype(float))[:, None]
    X = torch.tensor(x)[:, None]
    assert float(X.nanmedian()) != 9999.0  # the lower median misses the spike
    assert level_gain(X[:, 0], y) >= MIN_GAIN
    assert level_columns(X, y, [0]) == ([0], [])
