"""Data sources besides the packaged registry: synthetic generator and OpenML with a local cache."""

from __future__ import annotations

import csv
import gzip
import io
import json
import logging
import urllib.request
from pathlib import Path

import numpy as np

from xrfm_torch.data.registry import read_csv

log = logging.getLogger(__name__)

OPENML_API = "https://www.openml.org/api/v1/json/data/{id}"
DEFAULT_CACHE = Path.home() / ".cache" / "xrfm_torch" / "openml"


def make_synthetic(
    n_samples: int = 4000, n_features: int = 20, noise: float = 0.1, seed: int = 0
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """The protocol's scaling task: only features x0..x5 matter.

    ``y = sin(2 x0) + x1^2 - x2 x3 + 0.5 tanh(x4 + x5) + noise * N(0, 1)``, ``x ~ N(0, I_d)``.
    """
    if n_features < 6:
        raise ValueError(f"the synthetic task needs n_features >= 6, got {n_features}")
    if n_samples < 10:
        raise ValueError(f"n_samples must be >= 10, got {n_samples}")
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n_samples, n_features)).astype(np.float32)
    y = (
        np.sin(2 * X[:, 0])
        + X[:, 1] ** 2
        - X[:, 2] * X[:, 3]
        + 0.5 * np.tanh(X[:, 4] + X[:, 5])
        + noise * rng.standard_normal(n_samples)
    ).astype(np.float32)
    return X.astype(np.float64), y.astype(np.float64), [f"x{i}" for i in range(n_features)]


def parse_arff(text: str) -> tuple[np.ndarray, list[str]]:
    """Parse a dense, all-numeric ARFF file into ``(data (n, k), attribute names)``."""
    names: list[str] = []
    rows: list[list[float]] = []
    in_data = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("%"):
            continue
        low = line.lower()
        if not in_data:
            if low.startswith("@attribute"):
                parts = line.split(None, 2)
                name = parts[1].strip("'\"")
                kind = parts[2].strip().lower() if len(parts) > 2 else ""
                if not kind.startswith(("numeric", "real", "integer")):
                    raise ValueError(f"ARFF attribute {name!r} is not numeric ({kind!r})")
                names.append(name)
            elif low.startswith("@data"):
                in_data = True
            continue
        values = next(csv.reader([line]))
        rows.append([float("nan") if v.strip() == "?" else float(v) for v in values])
    if not in_data:
        raise ValueError("ARFF text has no @data section")
    return np.asarray(rows, dtype=np.float64).reshape(-1, len(names)), names


def _cache_paths(openml_id: int, cache_dir: Path) -> tuple[Path, Path]:
    return cache_dir / f"{openml_id}.csv.gz", cache_dir / f"{openml_id}.json"


def download_openml(
    openml_id: int, cache_dir: str | Path | None = None, timeout: float = 30.0
) -> Path:
    """Download an all-numeric OpenML dataset into the cache (CSV + metadata JSON); needs network."""
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    data_path, meta_path = _cache_paths(openml_id, cache)
    if data_path.exists() and meta_path.exists():
        return data_path
    with urllib.request.urlopen(OPENML_API.format(id=openml_id), timeout=timeout) as resp:
        desc = json.load(resp)["data_set_description"]
    with urllib.request.urlopen(desc["url"], timeout=timeout) as resp:
        data, names = parse_arff(resp.read().decode("utf-8"))
    cache.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(names)
    writer.writerows(data.tolist())
    with gzip.open(data_path, "wt") as fh:
        fh.write(buf.getvalue())
    meta = {
        "id": openml_id,
        "name": desc.get("name"),
        "target": desc.get("default_target_attribute"),
        "version": desc.get("version"),
    }
    meta_path.write_text(json.dumps(meta, indent=1))
    log.info("cached OpenML %d (%s) at %s", openml_id, meta["name"], data_path)
    return data_path


def load_openml(
    openml_id: int, cache_dir: str | Path | None = None, target: str | None = None
) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Load an OpenML dataset from the local cache (``download_openml`` fills it).

    The cache holds ``{id}.csv.gz`` (header row, numeric cells) and ``{id}.json`` with the default
    target attribute.
    """
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    data_path, meta_path = _cache_paths(openml_id, cache)
    if not data_path.exists() or not meta_path.exists():
        raise FileNotFoundError(
            f"OpenML dataset {openml_id} is not cached in {cache} (expected {data_path.name} and "
            f"{meta_path.name}); run with network access once so prepare_data can download it"
        )
    meta = json.loads(meta_path.read_text())
    return read_csv(data_path, target or meta["target"])
