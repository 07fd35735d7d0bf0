"""Code columns: numeric columns whose values are codes of their own (identifiers, subjects)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.inputs import levels
from xrfm_torch.inputs.levels import (
    FOLDS,
    MIN_CODE_R2,
    PRIOR_ROWS,
    ValueLevels,
    _code_fits,
    code_gain,
    level_columns,
)


def subjects(n: int, seed: int, n_ids: int = 40) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """An identifier column (each id its own effect), a smooth 20-value column and a target."""
    rng = np.random.default_rng(seed)
    effect = np.random.default_rng(99).normal(size=n_ids) * 2.0  # the same in every draw
    ids = rng.integers(0, n_ids, n).astype(float)
    dose = rng.integers(0, 20, n).astype(float)
    y = effect[ids.astype(int)] + np.sin(dose / 6.0) * 2.0 + rng.normal(size=n) * 0.5
    return ids, dose, y


def reference_fits(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """:func:`_code_fits` for one column and one target written row by row with numpy."""
    n = len(x)
    values = np.unique(x)
    fold = np.arange(n) % FOLDS
    e_val, e_nb = np.zeros(n), np.zeros(n)
    for i in range(n):
        tr = fold != fold[i]
        j = np.searchsorted(values, x[i])
        near = [values[k] for k in (j - 1, j + 1) if 0 <= k < len(values)]
        nb = tr & np.isin(x, near)
        m_nb = (y[nb].sum() + PRIOR_ROWS * y[tr].mean()) / (nb.sum() + PRIOR_ROWS)
        same = tr & (x == x[i])
        e_nb[i] = m_nb
        e_val[i] = (y[same].sum() + PRIOR_ROWS * m_nb) / (same.sum() + PRIOR_ROWS)
    sst = ((y - y.mean()) ** 2).sum()
    return 1 - ((y - e_val) ** 2).sum() / sst, 1 - ((y - e_nb) ** 2).sum() / sst


@pytest.mark.parametrize("block", [None, 2_000])
def test_code_fits_match_a_row_by_row_reference(monkeypatch, block):
    if block is not None:  # a column per chunk
        monkeypatch.setattr(levels, "GAIN_BLOCK", block)
    ids, dose, y = subjects(300, seed=1)
    rng = np.random.default_rng(2)
    cols = [ids, dose, rng.normal(size=300).round(1), np.where(rng.random(300) < 0.5, 1.0, 7.0)]
    got = _code_fits(torch.tensor(np.stack(cols, 1)), torch.tensor(y)[:, None])
    for j, x in enumerate(cols):
        want = reference_fits(x, y)
        assert got[j].tolist() == pytest.approx(want, rel=1e-9, abs=1e-12)
    # two target columns: sums of both over the sum of both variances
    both = torch.tensor(np.stack([y, 2 * y], 1))
    torch.testing.assert_close(_code_fits(torch.tensor(np.stack(cols, 1)), both), got)


def test_only_identifier_columns_are_chosen_as_codes():
    ids, dose, y = subjects(3000, seed=3)
    noise = np.random.default_rng(4).integers(0, 30, 3000).astype(float)  # 30 values, no effect
    X = torch.tensor(np.stack([dose, ids, noise], 1))
    Y = torch.tensor(y)[:, None]
    gains = [code_gain(X[:, j], Y) for j in range(3)]
    # the ids explain much and their neighbours nothing; the smooth dose's neighbours explain
    # as much as its values; the noise explains nothing
    assert gains[1] > MIN_CODE_R2 and gains[0] == 0.0 and gains[2] == 0.0
    assert level_columns(X, Y, [0, 1, 2]) == ([], [1])
    X[::9, 1] = float("nan")  # missing cells are left out of the test
    assert level_columns(X, Y, [1]) == ([], [1])
    # too few rows per value (CODE_ROWS) or too many values (MAX_CODES): not tested
    assert level_columns(X[:150], Y[:150], [1]) == ([], [])
    many = torch.tensor(np.random.default_rng(5).integers(0, 300, 3000)).double()[:, None]
    assert level_columns(many, Y, [0]) == ([], [])


def test_a_code_column_keeps_all_its_values():
    ids, _, _ = subjects(2000, seed=6)
    X = torch.tensor(np.stack([ids, np.zeros(2000)], 1))
    lv = ValueLevels().fit(X, [], codes=[0])
    assert lv.widths_.tolist() == [41] and sorted(lv.values_[0].tolist()) == list(range(40))
    out = lv(torch.tensor([[7.0, 0.0], [99.0, 0.0]]))
    assert out[0].argmax().item() == lv.values_[0].tolist().index(7.0) and out[1, 40] > 0


def test_a_tree_predicts_identifier_effects_better_with_the_code_block():
    def draw(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        ids, dose, y = subjects(n, seed, n_ids=80)
        noise = np.random.default_rng(seed + 50).normal(size=(n, 3))
        return torch.tensor(np.column_stack([dose, ids, noise])).float(), torch.tensor(y).float()

    (X, y), (Xv, yv), (Xt, yt) = draw(1200, 7), draw(400, 8), draw(1000, 9)
    kw = {"leaf": LeafConfig(n_iters=2), "input_transform": "identity"}
    g = torch.Generator
    on = xRFMTree(**kw).fit(X, y, Xv, yv, generator=g().manual_seed(0))
    off = xRFMTree(value_levels=False, **kw).fit(X, y, Xv, yv, generator=g().manual_seed(0))
    assert on.input_map.levels.columns_.tolist() == [1] and on.input_map.levels.width == 81

    def rmse(model: xRFMTree) -> float:
        return float((model(Xt).flatten() - yt).pow(2).mean().sqrt())

    assert rmse(on) < 0.5 * rmse(off)  # 80 ids: the kernel on their numbers blurs them
    fresh = xRFMTree(**kw)
    fresh.load_state_dict(on.state_dict())
    torch.testing.assert_close(fresh(Xt), on(Xt))
