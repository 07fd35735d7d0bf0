"""Every pandas dtype a user brings: fit, then predict on other rows, equal to the plain form.

Each dtype's column is also given in its plain form (float64 with NaN for numbers, dates and
nullable numbers; object text with None for categories and strings; object True/False/None for
booleans): the model fitted on the dtype must predict exactly what the model fitted on the plain
form predicts, on rows it did not see (with category levels it never saw).
"""

from __future__ import annotations

import numpy as np
import pytest

pd = pytest.importorskip("pandas")

from xrfm_torch import XRFMClassifier, XRFMRegressor  # noqa: E402

LEVELS = np.array(["low", "mid", "high"])


def source(n: int, seed: int) -> dict[str, np.ndarray]:
    """Raw values: numbers, a level per row (some missing), flags, whole numbers, days."""
    r = np.random.default_rng(seed)
    miss = r.random(n) < 0.1
    # prediction rows (seed != 0) also hold a level the training rows never had
    levels = np.append(LEVELS, "unseen") if seed else LEVELS
    return {
        "x": r.normal(size=n),
        "level": np.where(miss, None, r.choice(levels, n)).astype(object),
        "flag": r.random(n) > 0.5,
        "count": r.integers(0, 6, n).astype(np.float64),
        "day": r.integers(0, 400, n).astype(np.float64),
        "miss": miss,
    }


def with_dtype(kind: str, raw: dict[str, np.ndarray]) -> tuple[pd.Series, pd.Series]:
    """The column as ``kind``, and the same values in plain form."""
    level, miss = raw["level"], raw["miss"]
    plain_level = pd.Series(level, dtype=object)
    if kind == "category":  # categories read from the rows: the prediction rows have one more
        return pd.Series(pd.Categorical(level)), plain_level
    if kind == "category_ordered":
        cats = pd.CategoricalDtype(["low", "mid", "high", "unseen"], ordered=True)
        return pd.Series(level, dtype=cats), plain_level
    if kind == "category_int":  # integer categories
        codes = np.array([{"low": 1, "mid": 2, "high": 3, "unseen": 4}.get(v, -1) for v in level])
        cat = pd.Series(pd.Categorical(np.where(miss, np.nan, codes)))
        return cat, pd.Series(np.where(miss, None, codes).astype(object), dtype=object)
    if kind == "string_python":
        return pd.Series(level, dtype="string[python]"), plain_level
    if kind == "string_pyarrow":
        return pd.Series(level, dtype="string[pyarrow]"), plain_level
    if kind == "object_mixed":  # numbers and text in one column: categories
        mixed = np.where(raw["flag"], level, raw["count"]).astype(object)
        mixed[miss] = None
        return pd.Series(mixed, dtype=object), pd.Series(mixed, dtype=object)
    if kind == "bool":
        flags = pd.Series(raw["flag"], dtype=bool)
        return flags, pd.Series(raw["flag"].astype(object), dtype=object)
    if kind == "boolean_na":
        flags = np.where(miss, None, raw["flag"]).astype(object)
        return pd.Series(flags, dtype="boolean"), pd.Series(flags, dtype=object)
    if kind == "Int64_na":
        ints = pd.array(np.where(miss, None, raw["count"].astype(int)), dtype="Int64")
        return pd.Series(ints), pd.Series(np.where(miss, np.nan, raw["count"]))
    if kind == "Float64_na":
        floats = pd.array(np.where(miss, None, raw["x"]), dtype="Float64")
        return pd.Series(floats), pd.Series(np.where(miss, np.nan, raw["x"]))
    if kind == "datetime":
        days = pd.Timestamp("2021-03-01") + pd.to_timedelta(raw["day"], unit="D")
        days = days.where(~miss)
        return pd.Series(days), pd.Series(np.where(miss, np.nan, raw["day"] + 18687.0))
    if kind == "datetime_tz":
        days = pd.Timestamp("2021-03-01", tz="Europe/Paris") + pd.to_timedelta(raw["day"], unit="D")
        # midnight in Paris on 2021-03-01 (UTC+1) is 23:00 UTC the day before; whole days of
        # 24 hours added to it stay 1/24 day before UTC midnight (DST moves the local clock)
        return pd.Series(days), pd.Series(raw["day"] + 18687.0 - 1 / 24)
    raise AssertionError(kind)


KINDS = [
    "category",
    "category_ordered",
    "category_int",
    "string_python",
    "string_pyarrow",
    "object_mixed",
    "bool",
    "boolean_na",
    "Int64_na",
    "Float64_na",
    "datetime",
    "datetime_tz",
]


def frames(kinds: list[str], n: int, seed: int) -> tuple[pd.DataFrame, pd.DataFrame, np.ndarray]:
    raw = source(n, seed)
    typed, plain = {"x": raw["x"]}, {"x": raw["x"]}
    for kind in kinds:
        typed[kind], plain[kind] = with_dtype(kind, raw)
    lev = np.array([{"low": -1.0, "mid": 0.0, "high": 1.0}.get(v, 0.0) for v in raw["level"]])
    y = np.sin(2 * raw["x"]) + lev + 0.5 * raw["flag"] + 0.1 * raw["count"] + raw["day"] / 400
    return pd.DataFrame(typed), pd.DataFrame(plain), y


#: Small fits: the tests are about reading the columns, not about the model's choices.
FAST = {"n_iters": 1, "random_state": 0, "dtype": "float64", "input_transform": "identity"}


def fit_both(kinds: list[str], estimator=XRFMRegressor, **kw):
    typed, plain, y = frames(kinds, 300, 0)
    new_typed, new_plain, y_new = frames(kinds, 80, 1)
    if estimator is XRFMClassifier:
        y = np.where(y > np.median(y), "yes", "no")
    args = {**FAST, **kw}
    a = estimator(**args).fit(typed, y)
    b = estimator(**args).fit(plain, y)
    return a, b, new_typed, new_plain, y_new


@pytest.mark.parametrize("kind", KINDS)
def test_each_dtype_predicts_as_its_plain_form(kind):
    a, b, new_typed, new_plain, y_new = fit_both([kind])
    pa, pb = a.predict(new_typed), b.predict(new_plain)
    assert np.isfinite(pa).all()
    np.testing.assert_array_equal(pa, pb)
    assert a.encoder_.categorical == b.encoder_.categorical


def test_all_dtypes_in_one_table_fit_predict_and_reorder_by_name(caplog):
    kinds = [k for k in KINDS if k != "category_int"]
    a, b, new_typed, new_plain, y_new = fit_both(kinds)
    pa = a.predict(new_typed)
    np.testing.assert_array_equal(pa, b.predict(new_plain))
    # the model learned the planted target on rows it never saw
    assert np.corrcoef(pa, y_new)[0, 1] > 0.8
    # columns in another order, plus one the fit never saw: read by name, the extra one ignored
    shuffled = new_typed[list(reversed(new_typed.columns))].assign(extra=1.0)
    np.testing.assert_array_equal(a.predict(shuffled), pa)
    assert "extra" in caplog.text
    with pytest.raises(ValueError, match="lacks columns.*'bool'"):
        a.predict(new_typed.drop(columns="bool"))


def test_the_reported_category_and_bool_table_and_a_classifier():
    # a category-dtype text column next to a bool column failed in predict before
    a, b, new_typed, new_plain, _ = fit_both(["category", "bool"], XRFMClassifier)
    np.testing.assert_array_equal(a.predict_proba(new_typed), b.predict_proba(new_plain))
    assert set(a.predict(new_typed)) <= {"yes", "no"}


def test_numpy_object_arrays_and_polars_frames():
    typed, plain, y = frames(["string_python", "bool", "Float64_na"], 200, 0)
    new_typed, new_plain, _ = frames(["string_python", "bool", "Float64_na"], 50, 1)
    kw = FAST
    from_frame = XRFMRegressor(**kw).fit(plain, y)
    # an object array's "auto" categories are its text columns: name the flags too
    from_array = XRFMRegressor(categorical_features=[1, 2], **kw).fit(
        plain.to_numpy(dtype=object), y
    )
    np.testing.assert_array_equal(
        from_array.predict(new_plain.to_numpy(dtype=object)), from_frame.predict(new_plain)
    )
    pl = pytest.importorskip("polars")
    frame = pl.from_pandas(typed)
    from_polars = XRFMRegressor(**kw).fit(frame, y)
    np.testing.assert_array_equal(
        from_polars.predict(pl.from_pandas(new_typed)), from_frame.predict(new_plain)
    )
