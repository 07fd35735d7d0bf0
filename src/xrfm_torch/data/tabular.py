"""Ordinary tables to the float matrix the model reads: numbers stay, text categories become codes.

A categorical column's levels are the sorted distinct values of the training rows; a cell becomes
its level's index (a code ``0 .. L-1``), a missing cell NaN, a level the training rows never had
-1 (the model lights no indicator for either). Numeric columns become floats (missing cells NaN);
a text cell in a numeric column is an error naming the column and row. numpy only: a pandas
DataFrame is read through its columns' dtypes when one is given.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from xrfm_torch.data.registry import read_csv, target_column

log = logging.getLogger(__name__)

#: ``"auto"``: text, category and bool columns of a DataFrame (text cells in an object array).
CategoricalSpec = str | Sequence[int | str] | None


def is_missing(values: np.ndarray) -> np.ndarray:
    """Missing cells of a column: NaN in a float one; None, NaN, pandas' NA/NaT in an object one."""
    if values.dtype.kind == "f":
        return np.isnan(values)
    if values.dtype.kind != "O":
        return np.zeros(len(values), dtype=bool)
    out = np.zeros(len(values), dtype=bool)
    for i, v in enumerate(values):
        out[i] = v is None or (isinstance(v, float) and np.isnan(v)) or str(v) in ("<NA>", "NaT")
    return out


def plain_frame(X: Any) -> Any:
    """A DataFrame as columns numpy reads without surprises (other inputs are returned as given).

    pandas columns of any dtype become float64 or object columns, keeping their names:

    - numbers, nullable ``Int64``/``Float64`` (``pd.NA`` -> NaN): float64;
    - ``bool`` and nullable ``boolean`` (``pd.NA`` -> None): object (``True``/``False``), so
      ``categorical_features="auto"`` reads them as two-level categories, as before;
    - ``category`` (ordered or not, any category dtype), ``string`` (python or pyarrow), ``str``
      and object columns: object, missing cells None;
    - datetimes (time zones too): float64 days since 1970-01-01 UTC (``NaT`` -> NaN), a numeric
      column like any other (its knots are dates); timedeltas: float64 days.

    A whole frame converted at once would take one common dtype (text categories next to a
    ``bool`` column made pandas cast the categories to float and fail). A polars DataFrame is
    read through ``to_pandas()`` (which needs pyarrow); anything else with ``__dataframe__`` is
    refused with a message.
    """
    module = type(X).__module__.split(".")[0]
    if module == "polars":
        try:
            X = X.to_pandas()
        except Exception as err:  # polars raises its own ModuleNotFoundError for pyarrow
            raise TypeError(
                f"reading a polars DataFrame goes through pandas and pyarrow ({err}); pass "
                "X.to_pandas() or X.to_numpy()"
            ) from err
    if not (hasattr(X, "dtypes") and hasattr(X, "columns") and hasattr(X, "iloc")):
        if hasattr(X, "__dataframe__"):
            raise TypeError(
                f"{type(X).__name__} is a dataframe this package does not read; pass a pandas "
                "DataFrame or a numpy array"
            )
        return X
    import pandas as pd

    cols: dict[Any, np.ndarray] = {}
    for j, name in enumerate(X.columns):
        cols[name] = _plain_column(X.iloc[:, j], pd)
    out = pd.DataFrame(cols, index=X.index)
    out.columns = X.columns
    return out


def by_name(frame: Any, names: Sequence[str], what: str = "X") -> Any:
    """``frame``'s columns ``names``, in that order (a DataFrame; anything else as it is).

    A column in ``names`` that ``frame`` lacks is an error naming it; a column ``frame`` has
    beyond them is dropped with a warning naming it (the model has no use for it).

    Raises:
        ValueError: ``frame`` lacks some of ``names`` (naming up to ten).
    """
    columns = getattr(frame, "columns", None)
    if columns is None:
        return frame
    have = [str(c) for c in columns]
    if have == list(names):
        return frame
    missing = [n for n in names if n not in have]
    if missing:
        raise ValueError(f"{what} lacks columns the model was fitted on: {missing[:10]}")
    extra = [c for c in have if c not in set(names)]
    if extra:
        log.warning("%s has columns the model was not fitted on; ignoring %s", what, extra[:10])
    return frame[[columns[have.index(n)] for n in names]]


def _plain_column(col: Any, pd: Any) -> np.ndarray:
    """One pandas column as float64 or object values (see :func:`plain_frame`)."""
    dt = col.dtype
    types = pd.api.types
    if isinstance(dt, pd.CategoricalDtype):
        values = col.astype(object)
        return values.where(values.notna(), None).to_numpy(dtype=object)
    if types.is_datetime64_any_dtype(dt):
        utc = col.dt.tz_convert("UTC").dt.tz_localize(None) if col.dt.tz is not None else col
        days = (utc - pd.Timestamp(0)) / pd.Timedelta(days=1)
        return days.to_numpy(dtype=np.float64, na_value=np.nan)
    if types.is_timedelta64_dtype(dt):
        return (col / pd.Timedelta(days=1)).to_numpy(dtype=np.float64, na_value=np.nan)
    if types.is_bool_dtype(dt):
        return col.astype(object).where(col.notna(), None).to_numpy(dtype=object)
    if types.is_numeric_dtype(dt) and not types.is_complex_dtype(dt):
        return col.to_numpy(dtype=np.float64, na_value=np.nan)
    if types.is_string_dtype(dt) or types.is_object_dtype(dt):
        return col.astype(object).where(col.notna(), None).to_numpy(dtype=object)
    raise TypeError(f"column {col.name!r} has dtype {dt}, which this package cannot read")


def categorical_columns(
    X: np.ndarray,
    spec: CategoricalSpec,
    feature_names: Sequence[str] | None = None,
    dtypes: Sequence[Any] | None = None,
) -> list[int]:
    """The indices of the categorical columns of ``X`` (2-D; ``dtypes``: a DataFrame's, if any)."""
    n_cols = X.shape[1]
    if spec is None:
        return []
    if isinstance(spec, str):
        if spec != "auto":
            raise ValueError(f"categorical_features must be 'auto', None or a list, got {spec!r}")
        if dtypes is not None:
            kinds = ("category", "string", "str")
            return [j for j, dt in enumerate(dtypes) if dt.kind in "OUSb" or str(dt) in kinds]
        if X.dtype.kind in "US":
            return list(range(n_cols))
        if X.dtype.kind != "O":
            return []
        return [j for j in range(n_cols) if any(isinstance(v, str) for v in X[:, j])]
    names = list(feature_names) if feature_names is not None else None
    out = []
    for c in spec:
        if isinstance(c, str):
            if names is None or c not in names:
                raise ValueError(f"categorical feature {c!r} is not a column name")
            out.append(names.index(c))
        elif not 0 <= int(c) < n_cols:
            raise ValueError(f"categorical feature index {c} is out of range for {n_cols} columns")
        else:
            out.append(int(c))
    return sorted(set(out))


@dataclass
class TableEncoder:
    """Learned levels of the categorical columns; :meth:`transform` gives the float matrix.

    Attributes:
        categorical: Indices of the categorical columns.
        levels: Per categorical column, its training levels (sorted by their text).
        names: Column names (for messages).
    """

    categorical: list[int]
    levels: list[np.ndarray]
    names: list[str]

    @classmethod
    def fit(cls, X: np.ndarray, categorical: Sequence[int], names: Sequence[str]) -> TableEncoder:
        """Learn the levels of ``X``'s categorical columns (``X``: 2-D, any dtype)."""
        levels = []
        for j in categorical:
            col = X[:, j]
            present = col[~is_missing(col)]
            values = dict.fromkeys(present.tolist())  # distinct, in order of appearance
            levels.append(np.array(sorted(values, key=str), dtype=object))
        return cls(list(categorical), levels, list(names))

    def transform(self, X: np.ndarray) -> np.ndarray:
        """``X`` (n, d) as float64: numeric columns as floats, categorical ones as codes."""
        out = np.empty(X.shape, dtype=np.float64)
        cat = set(self.categorical)
        for j in range(X.shape[1]):
            if j not in cat:
                out[:, j] = self._numeric(X[:, j], j)
        for j, levels in zip(self.categorical, self.levels):
            col = X[:, j]
            index = {v: k for k, v in enumerate(levels.tolist())}
            missing = is_missing(col)
            codes = [-1.0 if v not in index else float(index[v]) for v in col.tolist()]
            out[:, j] = np.where(missing, np.nan, codes)
        return out

    def _numeric(self, col: np.ndarray, j: int) -> np.ndarray:
        if col.dtype.kind in "fiub":
            values = col.astype(np.float64)
        else:
            values = np.empty(len(col), dtype=np.float64)
            missing = is_missing(col)
            for i, v in enumerate(col.tolist()):
                if missing[i]:
                    values[i] = np.nan
                    continue
                try:
                    values[i] = float(v)
                except (TypeError, ValueError) as err:
                    if isinstance(v, str):
                        raise ValueError(
                            f"column {self.names[j]!r} (index {j}) has text {v!r} at row {i}; "
                            "name it in categorical_features to read it as categories"
                        ) from err
                    raise
        if np.isinf(values).any():
            i = int(np.isinf(values).nonzero()[0][0])
            raise ValueError(
                f"Input X contains infinity: column {self.names[j]!r} (index {j}), row {i}"
            )
        return values


@dataclass
class Table:
    """A table read for the model: float features (codes for categories, NaN missing), targets.

    Attributes:
        X: Features, (n, d) float64.
        y: Targets (n,): floats (regression) or class indices ``0 .. K-1`` (classification).
        names: Feature names.
        categorical: Indices of the categorical columns.
        classes: The class labels in index order (classification), else ``None``.
        encoder: The categorical columns' learned levels (a table read with pandas), else
            ``None`` (a table of numbers).
    """

    X: np.ndarray
    y: np.ndarray
    names: list[str]
    categorical: list[int]
    classes: np.ndarray | None
    encoder: TableEncoder | None = None


def read_table(path: Any, target: str | int | None = None, task: str | None = None) -> Table:
    """Read a CSV table with pandas: text categories, empty cells, text labels.

    Args:
        path: A ``.csv`` or ``.csv.gz`` file with a header row.
        target: Target column name or index (default: the last column).
        task: ``"regression"``, ``"classification"``, or ``None``: classification when the target
            column is text, else regression.
    """
    try:
        import pandas as pd
    except ImportError as err:  # pragma: no cover - pandas is a dev/tables extra
        raise ImportError(
            "reading tables with text cells needs pandas: pip install 'xrfm-torch[tables]'"
        ) from err
    df = pd.read_csv(path)
    columns = [str(c) for c in df.columns]
    j = target_column(columns, target, path)
    y_raw = df.iloc[:, j]
    features = df.drop(columns=df.columns[j])
    names = [str(c) for c in features.columns]
    if y_raw.isna().any():
        i = int(np.flatnonzero(y_raw.isna().to_numpy())[0])
        raise ValueError(f"{path}: the target column {columns[j]!r} is missing at row {i}")
    if task is None:
        task = "regression" if y_raw.dtype.kind in "fiu" else "classification"
    plain = plain_frame(features)
    X_obj = plain.to_numpy(dtype=object)
    categorical = categorical_columns(X_obj, "auto", names, list(plain.dtypes))
    encoder = TableEncoder.fit(X_obj, categorical, names)
    X = encoder.transform(X_obj)
    if task == "classification":
        classes, y = np.unique(y_raw.to_numpy(), return_inverse=True)
        return Table(X, y.astype(np.float64), names, categorical, classes, encoder)
    if y_raw.dtype.kind not in "fiu":
        raise ValueError(f"{path}: regression target {columns[j]!r} has text cells")
    return Table(X, y_raw.to_numpy(np.float64), names, categorical, None, encoder)


def read_any(path: Any, target: str | int | None = None, task: str | None = None) -> Table:
    """A CSV table: read as numbers when it holds only numbers, else with pandas.

    Numbers go through :func:`~xrfm_torch.data.registry.read_csv` (no pandas needed); a table with
    text or empty cells through :func:`read_table`.
    """
    try:
        X, y, names = read_csv(path, -1 if target is None else target)
    except ValueError as err:  # text or empty cells, or a bad target
        failed = str(err)
    else:
        return Table(X, y, names, [], None)
    if importlib.util.find_spec("pandas") is None:
        raise ValueError(
            f"{failed}; tables with text or empty cells need pandas: "
            "pip install 'xrfm-torch[tables]'"
        )
    # outside the except block: an error pandas raises too (a missing column) is one traceback
    return read_table(path, target, task)
