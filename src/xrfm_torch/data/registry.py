"""A small dataset registry: name -> loader, task, target and provenance."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np


@dataclass(frozen=True)
class DatasetSpec:
    """Metadata of a registered dataset.

    Attributes:
        name: Registry key (``dataset=NAME`` on the command line).
        task: ``"regression"`` or ``"classification"``.
        target: Name of the target column (original name in parentheses in ``source``).
        source: Provenance (where the file comes from, which version).
        loader: Returns ``(X, y, feature_names)``.
    """

    name: str
    task: str
    target: str
    source: str
    loader: Callable[[], tuple[np.ndarray, np.ndarray, list[str]]]


def target_column(header: list[str], target: str | int | None, path: Any) -> int:
    """The index of the target column: by name, by (negative) index, or the last (``None``)."""
    if target is None:
        return len(header) - 1
    if isinstance(target, str):
        if target not in header:
            raise ValueError(f"{path}: no column named {target!r}; columns are {header}")
        return header.index(target)
    return int(target) % len(header)


def read_csv(path: str | Path, target: str | int = -1) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Read a numeric CSV (optionally gzipped) with a header row.

    Args:
        path: File path (``.csv`` or ``.csv.gz``).
        target: Target column name or index (default: the last column).

    Returns:
        ``(X (n, d) float64, y (n,) float64, feature_names)``.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset file not found: {path}")
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        header = fh.readline().strip().split(",")
        data = np.loadtxt(fh, delimiter=",", dtype=np.float64, ndmin=2)
    if data.shape[1] != len(header):
        raise ValueError(f"{path}: header has {len(header)} columns, data has {data.shape[1]}")
    j = target_column(header, target, path)
    names = [h for i, h in enumerate(header) if i != j]
    X = np.delete(data, j, axis=1)
    y = data[:, j]
    if not np.isfinite(data).all():
        bad = np.argwhere(~np.isfinite(data))[0]
        raise ValueError(f"{path}: non-finite value at row {bad[0]}, column {header[bad[1]]!r}")
    return X, y, names


def _packaged(filename: str) -> Callable[[], tuple[np.ndarray, np.ndarray, list[str]]]:
    def load() -> tuple[np.ndarray, np.ndarray, list[str]]:
        with resources.as_file(resources.files("xrfm_torch.data") / "files" / filename) as p:
            return read_csv(p, "target")

    return load


DATASETS: dict[str, DatasetSpec] = {
    "cpu_act": DatasetSpec(
        name="cpu_act",
        task="regression",
        target="target",
        source=(
            "OpenML 44132 (Grinsztajn et al. tabular-benchmark version of DELVE comp-activ): "
            "8192 rows x 21 numeric features, target 'usr' (renamed 'target'), shipped in the package"
        ),
        loader=_packaged("cpu_act.csv.gz"),
    ),
}


def register_dataset(spec: DatasetSpec) -> None:
    """Add (or replace) a dataset in the registry."""
    DATASETS[spec.name] = spec


def load_dataset(name: str) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Load a registered dataset as ``(X, y, feature_names)``."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; registered: {sorted(DATASETS)}")
    return DATASETS[name].loader()
