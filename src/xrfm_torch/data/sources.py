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

from xrfm_torch.data.tabular import Table, read_any

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


def parse_arff(text: str) -> tuple[list[str], list[bool], list[list[str]]]:
    """Parse a dense ARFF file: ``(attribute names, which are nominal, rows of text cells)``.

    Numeric and nominal (``{a, b, ...}``) and string attributes are read; a missing cell (``?``)
    becomes an empty cell. Quoted values (single or double quotes) are unquoted.
    """
    names: list[str] = []
    nominal: list[bool] = []
    rows: list[list[str]] = []
    in_data = False
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("%"):
            continue
        if not in_data:
            low = line.lower()
            if low.startswith("@attribute"):
                parts = line.split(None, 1)[1]
                if parts[0] in "'\"":
                    end = parts.index(parts[0], 1)
                    name, kind = parts[1:end], parts[end + 1 :].strip()
                else:
                    name, _, kind = parts.partition(" ")
                kind_low = kind.strip().lower()
                if kind_low.startswith(("numeric", "real", "integer")):
                    nominal.append(False)
                elif kind_low.startswith(("{", "string")):
                    nominal.append(True)
                else:
                    raise ValueError(f"ARFF attribute {name!r} has an unsupported type {kind!r}")
                names.append(name)
            elif low.startswith("@data"):
                in_data = True
            continue
        if line.startswith("{"):
            raise ValueError("sparse ARFF data is not supported")
        quote = "'" if "'" in line else '"'
        values = next(csv.reader([line], quotechar=quote, skipinitialspace=True))
        if len(values) != len(names):
            raise ValueError(
                f"ARFF row {len(rows)} has {len(values)} cells for {len(names)} attributes"
            )
        rows.append(["" if v.strip() == "?" else v.strip() for v in values])
    if not in_data:
        raise ValueError("ARFF text has no @data section")
    return names, nominal, rows


def _cache_paths(openml_id: int, cache_dir: Path) -> tuple[Path, Path]:
    return cache_dir / f"{openml_id}.csv.gz", cache_dir / f"{openml_id}.json"


def download_openml(
    openml_id: int, cache_dir: str | Path | None = None, timeout: float = 30.0
) -> Path:
    """Download an OpenML dataset into the cache (CSV with text cells + metadata JSON); needs network."""
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    data_path, meta_path = _cache_paths(openml_id, cache)
    if data_path.exists() and meta_path.exists():
        return data_path
    with urllib.request.urlopen(OPENML_API.format(id=openml_id), timeout=timeout) as resp:
        desc = json.load(resp)["data_set_description"]
    with urllib.request.urlopen(desc["url"], timeout=timeout) as resp:
        names, _, rows = parse_arff(resp.read().decode("utf-8"))
    cache.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(names)
    writer.writerows(rows)
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
    openml_id: int,
    cache_dir: str | Path | None = None,
    target: str | None = None,
    task: str | None = None,
) -> Table:
    """Load an OpenML dataset from the local cache (``download_openml`` fills it).

    The cache holds ``{id}.csv.gz`` (header row; text cells for nominal attributes) and
    ``{id}.json`` with the default target attribute. Read like any CSV table (:func:`read_any`).
    """
    cache = Path(cache_dir) if cache_dir is not None else DEFAULT_CACHE
    data_path, meta_path = _cache_paths(openml_id, cache)
    if not data_path.exists() or not meta_path.exists():
        raise FileNotFoundError(
            f"OpenML dataset {openml_id} is not cached in {cache} (expected {data_path.name} and "
            f"{meta_path.name}); run with network access once so prepare_data can download it"
        )
    meta = json.loads(meta_path.read_text())
    return read_any(data_path, target or meta["target"], task)
