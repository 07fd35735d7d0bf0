"""The temperature search on a subsample of the validation rows (``temperature_rows``)."""

from __future__ import annotations

import pytest
import torch

import xrfm_torch.tree.fit as tree_fit
from conftest import planted
from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.tree.temperature import search_rows

KW = {"max_leaf_size": 300, "leaf": LeafConfig(n_iters=2)}


def fit(X, y, Xv, yv, **kw):
    return xRFMTree(**KW, **kw).fit(X, y, Xv, yv, generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def data():
    return (*planted(1500, d=6), *planted(400, d=6, seed=1))


def test_search_rows_draws_only_above_the_cap():
    g = torch.Generator().manual_seed(3)
    state = g.get_state()
    assert search_rows(400, None, g) is None and search_rows(400, 400, g) is None
    assert torch.equal(g.get_state(), state)  # nothing drawn: a small fit's streams are unchanged
    rows = search_rows(400, 150, g)
    assert rows is not None and rows.numel() == 150 and rows.unique().numel() == 150
    assert bool((rows[1:] > rows[:-1]).all()) and int(rows.max()) < 400


def test_a_cap_at_or_above_the_rows_is_the_full_search(data):
    full, capped = fit(*data, temperature_rows=None), fit(*data, temperature_rows=400)
    a, b = full.state_dict(), capped.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]) if torch.is_tensor(a[k]) else a[k] == b[k], k


def test_the_search_scores_its_subsample_and_the_outputs_cover_all_rows(data, monkeypatch):
    X, y, Xv, yv = data
    drawn = []

    def spy(n_val, max_rows, generator):
        drawn.append(search_rows(n_val, max_rows, generator))
        return drawn[-1]

    monkeypatch.setattr(tree_fit, "search_rows", spy)
    model = fit(X, y, Xv, yv, temperature_rows=120)
    full = fit(X, y, Xv, yv, temperature_rows=None)
    (rows,) = drawn[:1]
    assert rows is not None and rows.numel() == 120
    # the leaves are fitted before the draw: only the temperature may differ from the full search
    assert all(
        torch.equal(a.alpha_, b.alpha_) for a, b in zip(model.leaves(), full.leaves(), strict=True)
    )
    # the chosen temperature is the grid's best on exactly the drawn rows
    grid = list(model.config.temperature_grid)
    errs = model.temperature_errors(Xv[rows], yv[rows], grid)
    assert float(model.temperature_) == pytest.approx(
        grid[min(range(len(errs)), key=errs.__getitem__)]
    )
    # the honest validation outputs are the model's own predictions on every validation row
    honest = model.honest_outputs()
    assert honest.outputs.shape[0] == 400
    torch.testing.assert_close(honest.outputs[:, 0], model(Xv)[:, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad", [0, -5, 2.5])
def test_bad_temperature_rows_is_named(bad):
    with pytest.raises(ValueError, match="temperature_rows"):
        xRFMTree(temperature_rows=bad)
