"""New rows as a fitted model reads them: the column encoding of a table, as plain data.

A table read by the Lightning path (``dataset=csv``, ``openml``, a packaged dataset) goes
through three steps before the model sees it: columns by name, text categories as codes of the
levels learned from the table (:class:`~xrfm_torch.data.tabular.TableEncoder`), and the
protocol's standardization with the training rows' statistics
(:func:`~xrfm_torch.data.protocol.prepare`). :class:`RowEncoding` holds all three as plain data,
so it travels in a checkpoint (the datamodule's state) and turns new raw rows into the model's
inputs (:func:`xrfm_torch.lit.predict_rows`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from xrfm_torch.data.tabular import TableEncoder, by_name, plain_frame

_SCALARS = (str, int, float, bool)


@dataclass
class RowEncoding:
    """How raw rows become the model's inputs.

    Attributes:
        names: The feature columns, in the model's order.
        categorical: Indices of the categorical ones.
        levels: Per categorical column, its levels (their codes are their places).
        mean: Per column, the training rows' mean (0 for a categorical column).
        std: Per column, the training rows' standard deviation (1 for a categorical column).
        classes: The class labels in index order (a table with a text target), else ``None``.
    """

    names: list[str]
    categorical: list[int]
    levels: list[list[Any]]
    mean: list[float]
    std: list[float]
    classes: list[Any] | None = None

    def to_state(self) -> dict[str, Any]:
        """As plain data (``torch.load(weights_only=True)`` reads it back)."""
        return {
            "names": list(self.names),
            "categorical": list(self.categorical),
            "levels": [[_scalar(v) for v in lv] for lv in self.levels],
            "mean": [float(m) for m in self.mean],
            "std": [float(s) for s in self.std],
            "classes": None if self.classes is None else [_scalar(c) for c in self.classes],
        }

    @classmethod
    def from_state(cls, state: Any) -> RowEncoding:
        """Read :meth:`to_state`'s data back, checked.

        Raises:
            ValueError: A field is missing or disagrees with the others (naming it).
        """
        if not isinstance(state, dict):
            raise ValueError(f"a row encoding must be a dict, got {type(state).__name__}")
        names = state.get("names")
        if not isinstance(names, list) or not names or not all(isinstance(n, str) for n in names):
            raise ValueError(f"the row encoding's names must be a list of text, got {names!r}")
        d = len(names)
        cat, levels = state.get("categorical"), state.get("levels")
        if not isinstance(cat, list) or not all(isinstance(j, int) and 0 <= j < d for j in cat):
            raise ValueError(f"the row encoding's categorical must be indices < {d}, got {cat!r}")
        if not isinstance(levels, list) or len(levels) != len(cat):
            raise ValueError("the row encoding needs one list of levels per categorical column")
        for key in ("mean", "std"):
            v = state.get(key)
            if not isinstance(v, list) or len(v) != d:
                raise ValueError(f"the row encoding's {key} must hold {d} numbers, got {v!r}")
        classes = state.get("classes")
        if classes is not None and not isinstance(classes, list):
            raise ValueError(f"the row encoding's classes must be a list, got {classes!r}")
        return cls(names, cat, levels, state["mean"], state["std"], classes)

    def transform(self, rows: Any) -> np.ndarray:
        """Raw rows as the model's inputs, float32 (n, d).

        ``rows``: a DataFrame with these columns by name, or an (n, d) array in this order.

        Raises:
            ValueError: A column is missing, or a numeric column holds text (naming it).
        """
        if hasattr(rows, "columns"):
            rows = plain_frame(by_name(rows, self.names, "the rows"))
        X = np.asarray(rows, dtype=object)
        if X.ndim != 2 or X.shape[1] != len(self.names):
            raise ValueError(f"rows must have {len(self.names)} columns, got shape {X.shape}")
        encoder = TableEncoder(
            list(self.categorical), [np.array(lv, dtype=object) for lv in self.levels], self.names
        )
        x = encoder.transform(X)
        return ((x - np.asarray(self.mean)) / np.asarray(self.std)).astype(np.float32)


def _scalar(v: Any) -> Any:
    """A level or label as a plain Python value."""
    v = v.item() if isinstance(v, np.generic) else v
    if not isinstance(v, _SCALARS):
        raise ValueError(f"a level or label must be text, a number or a bool, got {v!r}")
    return v
