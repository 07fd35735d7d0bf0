"""Where validation rows come from: given by the user, or a seeded hold-out of the training rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from xrfm_torch.numerics.checks import as_float_matrix, as_float_targets


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
    """

    X: Tensor
    y: Tensor
    X_val: Tensor
    y_val: Tensor
    holdout: Tensor | None


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
) -> FitData:
    """Validate ``fit`` arguments; without validation data, hold out a seeded ``val_fraction``.

    ``allow_nan`` lets missing cells (NaN) of ``X`` and ``X_val`` through; targets must be finite.
    """
    X = as_float_matrix(X, "X", n_features=n_features, allow_nan=allow_nan)
    y = as_float_targets(y, "y", n_rows=X.shape[0], dtype=X.dtype)
    if X.shape[0] < min_rows:
        raise ValueError(f"need at least {min_rows} training rows, got {X.shape[0]}")
    if (X_val is None) != (y_val is None):
        raise ValueError("X_val and y_val must be given together")
    if X_val is None or y_val is None:
        va = holdout_rows(X.shape[0], val_fraction, generator, X.device)
        holdout = torch.zeros(X.shape[0], dtype=torch.bool, device=X.device)
        holdout[va] = True
        return FitData(X, y, X[va], y[va], holdout)
    X_val = as_float_matrix(X_val, "X_val", n_features=X.shape[1], allow_nan=allow_nan).to(X.dtype)
    y_val = as_float_targets(y_val, "y_val", n_rows=X_val.shape[0], dtype=X.dtype)
    if y_val.shape[1] != y.shape[1]:
        raise ValueError(f"y_val has {y_val.shape[1]} outputs but y has {y.shape[1]}")
    return FitData(X, y, X_val, y_val, None)
