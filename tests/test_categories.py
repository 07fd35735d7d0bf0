"""Category columns: codes to bounded one-hot blocks, in the core and the estimators."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.inputs.categories import MAX_LEVELS, ONE_HOT, CategoryColumns


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_codes_become_scaled_indicators_and_unknowns_none():
    X = torch.tensor([[0.0, 5.0], [2.0, 5.0], [2.0, 1.0], [float("nan"), 3.0]])
    cats = CategoryColumns().fit(X, [0])
    assert cats.width == 2  # levels 0 and 2 seen; 1 never
    out = cats(torch.tensor([[2.0, 0.0], [0.0, 0.0], [1.0, 0.0], [float("nan"), 0.0], [7.0, 0.0]]))
    # slots by frequency: level 2 (twice) first, then level 0; level 1, NaN and 7 light none
    expected = torch.tensor([[1.0, 0.0], [0.0, 1.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0]])
    torch.testing.assert_close(out, expected * ONE_HOT)
    assert math.isclose(float(torch.dist(out[0], out[1])), 1.0, rel_tol=1e-6)  # levels 1 apart
    with pytest.raises(ValueError, match="integer codes >= 0, -1 .*got 0.5"):
        CategoryColumns().fit(torch.tensor([[0.5], [1.0]]), [0])


def test_many_levels_cost_a_bounded_block():
    g = seeded(1)
    codes = torch.randint(0, 300, (5000, 1), generator=g).float()
    codes[:2000] = 7.0  # one frequent level
    cats = CategoryColumns(max_levels=16).fit(codes, [0])
    assert cats.width == 16  # 15 most frequent levels + "other"
    out = cats(codes)
    assert torch.equal(out[:2000].argmax(1), torch.zeros(2000, dtype=torch.long))  # 7 ranks first
    assert torch.allclose(out.sum(1), torch.full((5000,), ONE_HOT))  # every seen level lights one


def test_the_default_bound_keeps_each_of_an_identifiers_levels():
    g = seeded(3)
    codes = torch.randint(0, 200, (4000, 1), generator=g).float()
    assert CategoryColumns().fit(codes, [0]).width == 200  # one indicator per level
    many = torch.randint(0, 400, (8000, 1), generator=g).float()
    assert CategoryColumns().fit(many, [0]).width == MAX_LEVELS == 256  # 255 levels + "other"


def test_an_estimator_learns_each_level_of_an_identifier_column():
    # a panel: 40 units, each with its own level; the value is the unit's effect plus a trend.
    # A bound of 16 indicators pools 25 units into "other" and cannot tell them apart.
    pd = pytest.importorskip("pandas")
    from xrfm_torch import XRFMRegressor

    rng = np.random.default_rng(0)
    units, n = 40, 1000
    effect = rng.normal(0, 1, units)
    unit = rng.integers(0, units, n)
    t = rng.uniform(0, 1, n)
    y = effect[unit] + 0.5 * t + 0.05 * rng.normal(size=n)
    df = pd.DataFrame({"unit": [f"u{u}" for u in unit], "t": t})
    tr, te = slice(0, 800), slice(800, n)
    model = XRFMRegressor(random_state=0).fit(df[tr], y[tr])
    rmse = float(np.sqrt(np.mean((model.predict(df[te]) - y[te]) ** 2)))
    assert rmse < 0.25 * float(np.std(y[te]))  # 16 indicators: about 0.85 of the spread


def test_a_tree_learns_a_categorical_effect_and_folds_its_importance():
    g = seeded(2)
    n = 2000
    level = torch.randint(0, 5, (n,), generator=g)
    x = torch.randn(n, 2, generator=g)
    effect = torch.tensor([0.0, 2.0, -1.0, 3.0, 0.5])
    y = effect[level] + 0.5 * x[:, 0]
    X = torch.cat([x, level[:, None].float()], 1)
    model = xRFMTree(
        categorical_features=[2], leaf=LeafConfig(n_iters=2), input_transform="identity"
    )
    model.fit(X[:1500], y[:1500], X[1500:1700], y[1500:1700], generator=seeded())
    assert model.leaves()[0].support_.shape[1] == 2 + 5  # 2 numeric + 5 indicators
    rmse = float(((model(X[1700:])[:, 0] - y[1700:]) ** 2).mean().sqrt())
    assert rmse < 0.15
    imp = model.feature_importance()
    assert imp.shape == (3,) and int(imp.argmax()) == 2  # the category carries most of y
    # a level never seen in training and a missing category both light no indicator
    row = X[1700:1702].clone()
    row[0, 2], row[1, 2] = 9.0, float("nan")
    assert torch.isfinite(model(row)).all()
    assert model.get_config()["config"]["categorical_features"] == [2]


def test_estimators_read_text_categories_missing_cells_and_unseen_levels():
    pd = pytest.importorskip("pandas")
    from xrfm_torch import XRFMClassifier, XRFMRegressor

    rng = np.random.default_rng(0)
    n = 1200
    city = rng.choice(["paris", "oslo", "lima", "cairo"], size=n)
    num = rng.normal(size=n)
    y = np.select([city == "paris", city == "oslo", city == "lima"], [2.0, -1.0, 0.5], 0.0) + num
    df = pd.DataFrame({"city": city, "num": num, "flag": rng.normal(size=n)})
    df.loc[::9, "city"] = None  # missing text cells
    df.loc[::11, "flag"] = np.nan  # missing numbers
    est = XRFMRegressor(n_iters=2, random_state=0).fit(df.iloc[:1000], y[:1000])
    assert est.encoder_.categorical == [0] and list(est.encoder_.levels[0]) == [
        "cairo",
        "lima",
        "oslo",
        "paris",
    ]
    for _, tree in est.model_.single_trees():  # the default blend's trees read them alike
        assert tree.config.categorical_features == (0,)
        assert tree.input_map.missing_columns == [2]
    pred = est.predict(df.iloc[1000:])
    seen = df.iloc[1000:]["city"].notna().to_numpy()
    assert np.sqrt(np.mean((pred[seen] - y[1000:][seen]) ** 2)) < 0.3
    new = df.iloc[1000:1003].copy()
    new["city"] = ["tokyo", None, "paris"]  # unseen, missing, seen
    assert np.isfinite(est.predict(new)).all()
    # by name, and text in a numeric column is named in the error
    XRFMRegressor(n_iters=1, categorical_features=["city"]).fit(df.iloc[:300], y[:300])
    with pytest.raises(ValueError, match="column 'city' \\(index 0\\) has text 'paris' at row 0"):
        XRFMRegressor(n_iters=1, categorical_features=None).fit(df.assign(city="paris"), y)
    labels = np.where(y > 0.5, "high", "low")
    clf = XRFMClassifier(n_iters=2, random_state=0).fit(df.iloc[:1000], labels[:1000])
    assert clf.score(df.iloc[1000:], labels[1000:]) > 0.8


def test_code_minus_one_is_an_unknown_level_in_training_rows_too():
    # the table encoder codes a level it never saw -1; pooled into training rows (cross-fitted
    # bags train on eval_set rows) it must light no indicator, exactly like a missing cell
    X = torch.tensor([[0.0], [2.0], [2.0], [-1.0], [-1.0], [1.0]])
    with_nan = torch.where(X < 0, torch.tensor(float("nan")), X)
    cats, ref = CategoryColumns().fit(X, [0]), CategoryColumns().fit(with_nan, [0])
    assert torch.equal(cats.slots_, ref.slots_) and cats.width == ref.width == 3
    torch.testing.assert_close(cats(X), ref(with_nan))
    assert float(cats(X)[3:5].abs().sum()) == 0.0
    with pytest.raises(ValueError, match="got -2.0"):
        CategoryColumns().fit(torch.tensor([[-2.0], [1.0]]), [0])


def test_bagged_estimator_fits_an_eval_set_with_a_level_unseen_in_training():
    pd = pytest.importorskip("pandas")
    from xrfm_torch import XRFMClassifier

    rng = np.random.default_rng(3)
    n = 400
    city = rng.choice(["paris", "oslo", "lima"], size=n).astype(object)
    num = rng.normal(size=n)
    labels = np.where((city == "paris") | (num > 1.0), "yes", "no")
    df = pd.DataFrame({"city": city, "num": num})
    val = df.iloc[300:].copy()
    val.iloc[:5, 0] = "tokyo"  # only in the eval_set: the encoder codes it -1
    clf = XRFMClassifier(n_iters=1, n_bags=2, random_state=0)
    clf.fit(df.iloc[:300], labels[:300], eval_set=(val, labels[300:]))
    # the unseen level predicts exactly as a missing cell does, and the seen ones are learned
    rows = val.iloc[:5].copy()
    missing = rows.assign(city=None)
    np.testing.assert_allclose(clf.predict_proba(rows), clf.predict_proba(missing))
    assert clf.score(val.iloc[5:], labels[305:]) > 0.85
