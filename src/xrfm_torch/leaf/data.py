"""Where validation rows come from: given by the user, or a seeded hold-out of the training rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from xrfm_torch.numerics.checks import (
    as_float_matrix,
    as_float_targets,
    as_tensor,
    as_weights,
    check_all_finite,
)


def holdout_rows(
    n: int, fraction: float, generator: torch.Generator | None, device: torch.device
) -> Tensor:
    """Seeded random ``round(fraction * n)`` of ``range(n)`` to hold out (at least one row, never all).

    ``n >= 2`` is required.
    """
    if n < 2:
        raise ValueError(f"need at least 2 rows to hold out validation data, got {n}")
    n_val = min(n - 1, max(1, round(fraction * n)))
    return torch.randperm(n, generator=generator)[:n_val].to(device)


@dataclass
class FitData:
    """Validated training data and where the validation rows come from.

    Attributes:
        X: Training inputs, shape (n, d).
        y: Training targets, shape (n, c).
        X_val: Validation inputs, shape (n_val, d) (the held-out training rows if ``holdout``).
        y_val: Validation targets, shape (n_val, c).
        holdout: Bool mask over the training rows that serve as validation (no user validation
            data), or ``None``.
        w: Sample weights of the training rows (n,), all positive, or ``None`` (unweighted).
        w_val: Weights of the validation rows (n_val,), or ``None``.
        val_rows: Each validation row's place among the rows as given, training rows first
            (``X`` then ``X_val``: a held-out row's index in ``X``, a given one's ``n + j``), or
            ``None`` where rows of weight 0 were dropped. Lets models fitted on the same rows
            compare their validation outputs row by row (``tree.honest``).
    """

    X: Tensor
    y: Tensor
    X_val: Tensor
    y_val: Tensor
    holdout: Tensor | None
    w: Tensor | None = None
    w_val: Tensor | None = None
    val_rows: Tensor | None = None

    def learning_rows(self) -> tuple[Tensor, Tensor, Tensor | None]:
        """``(X, y, w)`` of the rows a model learns from: the training rows less any held out."""
        if self.holdout is None:
            return self.X, self.y, self.w
        keep = ~self.holdout
        return self.X[keep], self.y[keep], self.weights(keep)

    def weights(self, rows: Tensor) -> Tensor | None:
        """The training weights of ``rows`` (indices or mask), or ``None`` when unweighted."""
        return None if self.w is None else self.w[rows]

    def val_weights(self, rows: Tensor) -> Tensor | None:
        """The validation weights of ``rows``, or ``None`` when unweighted."""
        return None if self.w_val is None else self.w_val[rows]


def fit_data(
    X: Any,
    y: Any,
    X_val: Any | None,
    y_val: Any | None,
    *,
    val_fraction: float,
    generator: torch.Generator | None,
    n_features: int | None = None,
    min_rows: int = 4,
    allow_nan: bool = False,
    sample_weight: Any | None = None,
    val_sample_weight: Any | None = None,
    relative_weights: bool = False,
    target_precision: bool = False,
    check_values: bool = True,
) -> FitData:
    """Validate ``fit`` arguments; without validation data, hold out a seeded ``val_fraction``.

    Targets are cast to the inputs' dtype, or with ``target_precision`` to the wider of it and
    their own (float64 targets stay float64 until they are standardized, so that an offset or
    scale of the targets does not cost their float32 digits).

    ``allow_nan`` lets missing cells (NaN) of ``X`` and ``X_val`` through; targets must be finite.
    ``check_values=False`` leaves out those checks of values (rows the caller checked already).
    Weights (:func:`~xrfm_torch.numerics.checks.as_weights`) must be finite and non-negative,
    not all zero; rows of weight 0 are dropped (they would have no influence), before the
    hold-out is drawn, so a zero weight is the row left out. ``relative_weights`` divides each
    set by its mean (the tree's rule: a weight's unit does not matter); weights that are then all
    1 become ``None``, so equal weights fit the unweighted model exactly.
    """
    # values are checked once all four arguments are in shape: one read back of their flags
    X = as_float_matrix(X, "X", n_features=n_features, allow_nan=allow_nan, finite=False)
    y = as_tensor(y, "y", X.device)
    wide = target_precision and y.dtype == torch.float64
    y = as_float_targets(
        y, "y", n_rows=X.shape[0], dtype=torch.float64 if wide else X.dtype, finite=False
    )
    # (check_values=False: the caller checked them; shapes and dtypes are checked either way)
    checks = [(X, "X", allow_nan), (y, "y", False)] if check_values else []
    n_given = X.shape[0]
    X, y, w = weighted_rows(X, y, sample_weight, "sample_weight", relative_weights)
    if X.shape[0] < min_rows:
        what = " of positive weight" if sample_weight is not None else ""
        raise ValueError(f"need at least {min_rows} training rows{what}, got {X.shape[0]}")
    if (X_val is None) != (y_val is None):
        raise ValueError("X_val and y_val must be given together")
    if X_val is None or y_val is None:
        check_all_finite(checks)
        if val_sample_weight is not None:
            raise ValueError("val_sample_weight needs X_val and y_val")
        va = holdout_rows(X.shape[0], val_fraction, generator, X.device)
        holdout = torch.zeros(X.shape[0], dtype=torch.bool, device=X.device)
        holdout[va] = True
        rows = va if X.shape[0] == n_given else None
        return FitData(X, y, X[va], y[va], holdout, w, None if w is None else w[va], rows)
    X_val = as_float_matrix(
        X_val, "X_val", n_features=X.shape[1], allow_nan=allow_nan, finite=False
    ).to(X.dtype)
    y_val = as_float_targets(y_val, "y_val", n_rows=X_val.shape[0], dtype=y.dtype, finite=False)
    if y_val.shape[1] != y.shape[1]:
        raise ValueError(f"y_val has {y_val.shape[1]} outputs but y has {y.shape[1]}")
    if check_values:
        check_all_finite([*checks, (X_val, "X_val", allow_nan), (y_val, "y_val", False)])
    n_val = X_val.shape[0]
    X_val, y_val, w_val = weighted_rows(
        X_val, y_val, val_sample_weight, "val_sample_weight", relative_weights
    )
    same = X.shape[0] == n_given and X_val.shape[0] == n_val
    rows = n_given + torch.arange(n_val, device=X.device) if same else None
    return FitData(X, y, X_val, y_val, None, w, w_val, rows)


def weighted_rows(
    X: Tensor, y: Tensor, w: Any | None, name: str, relative: bool = False
) -> tuple[Tensor, Tensor, Tensor | None]:
    """``(X, y, w)`` without the rows of weight 0; ``w`` relative (mean 1) if asked, else raw.

    ``w`` is checked by :func:`~xrfm_torch.numerics.checks.as_weights` (``name`` in messages);
    ``None`` passes through.
    """
    if w is None:
        return X, y, None
    w = as_weights(w, name, n_rows=X.shape[0], dtype=X.dtype, device=X.device)
    keep = w > 0
    if not bool(keep.all()):
        X, y, w = X[keep], y[keep], w[keep]
    if relative:
        w = w / w.mean()
        if bool((w == w[0]).all()):
            return X, y, None
    return X, y, w
