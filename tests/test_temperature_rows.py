"""The temperature search on a subsample of the validation rows (``temperature_rows``)."""

from __future__ import annotations

from typing import cast

import pytest
import torch
from torch import Tensor

from conftest import planted
from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.models.blend import KernelBlend
from xrfm_torch.tree.temperature import search_rows

KW = {"max_leaf_size": 300, "leaf": LeafConfig(n_iters=2)}


def fit(X, y, Xv, yv, **kw):
    return xRFMTree(**KW, **kw).fit(X, y, Xv, yv, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def data():
    return (*planted(1500, d=6), *planted(400, d=6, seed=1))


def test_search_rows_are_evenly_spaced_above_the_cap():
    assert search_rows(400, None) is None and search_rows(400, 400) is None
    rows = search_rows(400, 150)
    assert rows is not None and rows.numel() == 150 and rows.unique().numel() == 150
    assert int(rows[0]) == 0 and int(rows[-1]) == 399  # from end to end of the rows' order
    gaps = rows.diff()
    assert bool((gaps >= 2).all()) and bool((gaps <= 3).all())  # 399 / 149 = 2.68 apart
    assert torch.equal(search_rows(7, 1), torch.tensor([0]))
    assert torch.equal(search_rows(5, 4), torch.tensor([0, 1, 3, 4]))  # 4/3 apart, rounded


def test_a_cap_at_or_above_the_rows_is_the_full_search(data):
    full, capped = fit(*data, temperature_rows=None), fit(*data, temperature_rows=400)
    a, b = full.state_dict(), capped.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k], k


def test_the_search_scores_its_subsample_and_the_honest_outputs_are_those_rows(data):
    X, y, Xv, yv = data
    model = fit(X, y, Xv, yv, temperature_rows=120)
    full = fit(X, y, Xv, yv, temperature_rows=None)
    rows = search_rows(400, 120)
    assert rows is not None
    # the leaves are fitted before the search: only the temperature may differ from the full one
    assert all(
        torch.equal(a.alpha_, b.alpha_) for a, b in zip(model.leaves(), full.leaves(), strict=True)
    )
    # the chosen temperature is the grid's best on exactly those rows
    grid = list(model.config.temperature_grid)
    errs = model.temperature_errors(Xv[rows], yv[rows], grid)
    assert float(model.temperature_) == pytest.approx(
        grid[min(range(len(errs)), key=errs.__getitem__)]
    )
    # the honest outputs are the model's own predictions on those rows, placed after the
    # 1500 training rows among the rows the fit was given
    honest = model.honest_outputs()
    assert honest.rows is not None and torch.equal(honest.rows.cpu(), 1500 + rows)
    torch.testing.assert_close(honest.targets.reshape(-1), yv[rows])
    torch.testing.assert_close(honest.outputs[:, 0], model(Xv[rows])[:, 0], rtol=1e-5, atol=1e-5)
    assert full.honest_outputs().outputs.shape[0] == 400  # no cap: every validation row


def test_a_capped_blend_mixes_its_members_on_the_same_rows(data):
    X, y, Xv, yv = data
    proto = xRFMTree(**KW, temperature_rows=150)
    blend = KernelBlend(proto, race_margin=None).fit(
        X, y, Xv, yv, generator=torch.Generator().manual_seed(0)
    )
    rows = search_rows(400, 150)
    assert rows is not None
    honest = blend.honest_outputs()
    assert honest.rows is not None and torch.equal(honest.rows.cpu(), 1500 + rows)
    # each member's honest outputs are of those rows; the blend mixes them with the weights
    # of least loss there
    parts = [m.honest_outputs() for m in blend.models()]
    assert all(torch.equal(cast(Tensor, p.rows), honest.rows) for p in parts)
    members = [p.outputs[:, 0] for p in parts]
    w = blend.member_weights()
    mixed = sum(wi * m for wi, m in zip(w, members))
    torch.testing.assert_close(honest.outputs[:, 0], mixed, rtol=1e-5, atol=1e-5)
    loss = float(((mixed - yv[rows]) ** 2).mean())
    assert loss == pytest.approx(min(blend.honest_losses_.values()), rel=1e-4)


def test_a_capped_classifier_calibrates_on_the_searched_rows():
    X, y = planted(1500, d=6)
    Xv, yv = planted(400, d=6, seed=1)
    labels, val_labels = (y > y.median()).long(), (yv > y.median()).long()
    model = xRFMTree(**KW, task="classification", temperature_rows=100).fit(
        X, labels, Xv, val_labels, generator=torch.Generator().manual_seed(0)
    )
    rows = search_rows(400, 100)
    assert rows is not None
    honest = model.honest_outputs()
    assert torch.equal(honest.targets.reshape(-1).long(), val_labels[rows])
    # the calibrated probabilities are the model's predicted ones on those rows
    torch.testing.assert_close(honest.outputs, model.predict_proba(Xv[rows]), rtol=1e-5, atol=1e-5)
    assert torch.allclose(honest.outputs.sum(1), torch.ones(100))


@pytest.mark.parametrize("bad", [0, -5, 2.5])
def test_bad_temperature_rows_is_named(bad):
    with pytest.raises(ValueError, match="temperature_rows"):
        xRFMTree(temperature_rows=bad)
