"""The benchmark protocol shared by tests, README figures and benchmarks.

Split: ``idx = np.random.default_rng(seed).permutation(n)``; train = first 70 %, validation = next
10 %, test = last 20 %. Features are standardized with the training mean and std (+1e-12); a
regression target is standardized the same way for fitting and errors are reported in original units.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# What a dataset's target is: the model's own Literal, re-exported for the data modules.
from xrfm_torch.tree.targets import Task

__all__ = ["ProtocolData", "Standardizer", "Task", "prepare", "protocol_split"]


def protocol_split(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Seeded 70/10/20 index split (train, validation, test)."""
    if n < 10:
        raise ValueError(f"the protocol split needs at least 10 rows, got {n}")
    idx = np.random.default_rng(seed).permutation(n)
    a, b = int(0.7 * n), int(0.8 * n)
    return idx[:a], idx[a:b], idx[b:]


@dataclass
class Standardizer:
    """Column-wise ``(x - mean) / (std + 1e-12)`` with statistics from the training rows."""

    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray) -> Standardizer:
        """Statistics of ``x`` (n, k) or (n,); missing cells (NaN) are left out."""
        if np.isnan(x).any():
            return cls(np.nanmean(x, 0), np.nanstd(x, 0) + 1e-12)
        return cls(x.mean(0), x.std(0) + 1e-12)

    def transform(self, x: np.ndarray) -> np.ndarray:
        """Standardize."""
        return (x - self.mean) / self.std

    def inverse(self, z: np.ndarray) -> np.ndarray:
        """Map standardized values back to original units."""
        return z * self.std + self.mean


@dataclass
class ProtocolData:
    """Standardized protocol splits of one dataset (float32), plus the target scaler."""

    X_train: np.ndarray
    y_train: np.ndarray
    X_val: np.ndarray
    y_val: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    y_scaler: Standardizer | None
    feature_names: list[str]
    x_scaler: Standardizer | None = None  # what new rows need before the model reads them


def prepare(
    X: np.ndarray,
    y: np.ndarray,
    seed: int,
    *,
    regression: bool = True,
    feature_names: list[str] | None = None,
    categorical: list[int] | None = None,
) -> ProtocolData:
    """Split and standardize ``X`` (n, d) and ``y`` (n,) exactly as the protocol says.

    Targets of the returned splits are standardized for regression (use ``y_scaler.inverse`` on
    predictions); classification labels are returned unchanged. ``categorical`` columns hold
    category codes and are left as they are; missing cells (NaN) stay missing.
    """
    tr, va, te = protocol_split(len(X), seed)
    xs = Standardizer.fit(X[tr])
    if categorical:
        xs.mean[categorical], xs.std[categorical] = 0.0, 1.0
    ys = Standardizer.fit(y[tr]) if regression else None

    def tx(rows: np.ndarray) -> np.ndarray:
        return xs.transform(X[rows]).astype(np.float32)

    def ty(rows: np.ndarray) -> np.ndarray:
        return (ys.transform(y[rows]) if ys is not None else y[rows]).astype(
            np.float32 if regression else np.int64
        )

    names = feature_names or [f"x{i}" for i in range(X.shape[1])]
    return ProtocolData(tx(tr), ty(tr), tx(va), ty(va), tx(te), ty(te), ys, names, xs)
