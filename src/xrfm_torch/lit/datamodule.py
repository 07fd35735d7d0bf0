"""TabularDataModule: registry / CSV / OpenML / synthetic data with the benchmark protocol split."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from xrfm_torch.data.protocol import ProtocolData, Standardizer, Task, prepare, protocol_split
from xrfm_torch.data.registry import DATASETS
from xrfm_torch.data.rows import RowEncoding
from xrfm_torch.data.sources import download_openml, load_openml, make_synthetic
from xrfm_torch.data.tabular import read_any

log = logging.getLogger(__name__)


class TabularDataModule(pl.LightningDataModule):
    """Numeric tabular data split and standardized as ``BENCHMARK_PROTOCOL.md`` says.

    ``name`` picks the source: a registry key (e.g. ``"cpu_act"``, shipped in the package),
    ``"csv"`` (``path``, ``target``), ``"openml"`` (``openml_id``, cached in ``cache_dir``; the download
    happens in ``prepare_data`` and needs network) or ``"synthetic"`` (``n_samples``, ``n_features``,
    ``noise``). Rows are split 70/10/20 by ``seed``; features (and a regression target) are
    standardized with training statistics.

    Args:
        name: Source, see above.
        path: CSV path (``name="csv"``).
        target: Target column (CSV/OpenML; default: last column / OpenML default target).
        task: ``"regression"`` or ``"classification"`` (default: the registry's, else regression).
        openml_id: OpenML dataset id (``name="openml"``).
        cache_dir: OpenML cache folder (default ``~/.cache/xrfm_torch/openml``).
        n_samples: Rows of the synthetic task.
        n_features: Features of the synthetic task (>= 6).
        noise: Noise std of the synthetic task.
        seed: Split (and synthetic data) seed.
        batch_size: Batch size of the evaluation loaders.
        num_workers: DataLoader workers.
        weight: A column of sample weights (``csv`` and ``openml`` sources): taken out of the
            features, split with the rows, and carried as each batch's 4th element; the system
            (``weighted=True``, from :meth:`system_kwargs`) fits the tree with them and weights
            its metrics.
    """

    def __init__(
        self,
        name: str = "cpu_act",
        *,
        path: str | None = None,
        target: str | None = None,
        task: Task | None = None,
        openml_id: int | None = None,
        cache_dir: str | None = None,
        n_samples: int = 4000,
        n_features: int = 20,
        noise: float = 0.1,
        seed: int = 0,
        batch_size: int = 4096,
        num_workers: int = 0,
        weight: str | None = None,
    ) -> None:
        super().__init__()
        if weight is not None and name not in ("csv", "openml"):
            raise ValueError(f"a weight column needs a csv or openml table, not dataset {name!r}")
        sources = sorted([*DATASETS, "csv", "openml", "synthetic"])
        if name not in sources:
            raise ValueError(f"unknown dataset {name!r}; choose one of {sources}")
        if name == "csv" and not path:
            raise ValueError("dataset 'csv' needs path=... (and optionally target=...)")
        if name == "openml" and openml_id is None:
            raise ValueError("dataset 'openml' needs openml_id=...")
        if task is not None and task not in ("regression", "classification"):
            raise ValueError(f"task must be 'regression' or 'classification', got {task!r}")
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        # resolve the task before saving hparams, so they agree with the system's (a CSV table with
        # a text target, read with pandas, turns it into classification in setup)
        self._task_given = task is not None
        task = task or (DATASETS[name].task if name in DATASETS else "regression")  # type: ignore[assignment]
        self.save_hyperparameters()
        self.name = name
        self.task: Task = task  # type: ignore[assignment]
        self.data: ProtocolData | None = None
        self.datasets: dict[str, TensorDataset] = {}
        self.categorical_features: list[int] = []  # columns of category codes (CSV tables)
        self.has_missing = False  # whether any feature cell is missing (NaN)
        self.sample_weight: np.ndarray | None = None  # the weight column (all rows), if any
        #: How new raw rows become the model's inputs (set up with the data; in checkpoints).
        self.rows: RowEncoding | None = None
        self._levels: list[list[Any]] = []  # the categorical columns' levels (CSV tables)
        self._classes: list[Any] | None = None  # a text target's labels

    def prepare_data(self) -> None:
        if self.name == "openml":
            download_openml(int(self.hparams["openml_id"]), self.hparams["cache_dir"])

    def load_arrays(self) -> tuple[np.ndarray, np.ndarray, list[str]]:
        """Raw ``(X, y, feature_names)`` of the configured source."""
        hp = self.hparams
        if self.name in DATASETS:
            return DATASETS[self.name].loader()
        if self.name in ("csv", "openml"):
            task = self.task if self._task_given else None
            if self.name == "csv":
                table = read_any(Path(hp["path"]).expanduser(), hp["target"], task)
            else:
                table = load_openml(int(hp["openml_id"]), hp["cache_dir"], hp["target"], task)
            if table.classes is not None:  # a text target
                self.task = "classification"
            elif not self._task_given:
                _say_numeric_task(table.y, hp["target"])
            X, names, categorical = table.X, table.names, table.categorical
            if table.encoder is not None:
                self._levels = [lv.tolist() for lv in table.encoder.levels]
            if table.classes is not None:
                self._classes = table.classes.tolist()
            if hp.get("weight") is not None:
                X, names, categorical = self._take_weights(X, names, categorical, hp["weight"])
            self.categorical_features = categorical
            return X, table.y, names
        return make_synthetic(hp["n_samples"], hp["n_features"], hp["noise"], hp["seed"])

    def _take_weights(
        self, X: np.ndarray, names: list[str], categorical: list[int], column: str
    ) -> tuple[np.ndarray, list[str], list[int]]:
        """Move the weight column out of the features into :attr:`sample_weight`."""
        if column not in names:
            raise ValueError(f"weight column {column!r} is not a column of the table: {names[:20]}")
        j = names.index(column)
        if j in categorical:
            raise ValueError(f"weight column {column!r} holds text; weights must be numbers")
        w = X[:, j].astype(np.float64)
        if not np.isfinite(w).all() or (w < 0).any():
            i = int(np.flatnonzero(~np.isfinite(w) | (w < 0))[0])
            raise ValueError(f"weight column {column!r} has {w[i]!r} at row {i}; need finite >= 0")
        self.sample_weight = w
        keep = [k for k in range(X.shape[1]) if k != j]
        shifted = [c - (c > j) for c in categorical]
        return X[:, keep], [names[k] for k in keep], shifted

    def setup(self, stage: str | None = None) -> None:
        if self.data is not None:
            return
        X, y, names = self.load_arrays()
        regression = self.task == "regression"
        if not regression and (np.any(y != np.round(y)) or y.min() < 0):
            raise ValueError("classification targets must be integer labels 0..K-1")
        self.has_missing = bool(np.isnan(X).any())
        self.data = prepare(
            X,
            y,
            int(self.hparams["seed"]),
            regression=regression,
            feature_names=names,
            categorical=self.categorical_features,
        )
        d = self.data
        scaler = cast(Standardizer, d.x_scaler)  # prepare always fits it
        self.rows = RowEncoding(
            list(names),
            list(self.categorical_features),
            self._levels,
            np.atleast_1d(scaler.mean).tolist(),
            np.atleast_1d(scaler.std).tolist(),
            self._classes,
        )
        # the protocol's rows of each split (prepare draws the same), for the weight column
        rows = dict(
            zip(("train", "val", "test"), protocol_split(len(X), int(self.hparams["seed"])))
        )
        for split, (Xs, ys) in {
            "train": (d.X_train, d.y_train),
            "val": (d.X_val, d.y_val),
            "test": (d.X_test, d.y_test),
        }.items():
            # (x, y, row index[, weight]): the index lets head training tell support rows apart
            idx = torch.arange(len(Xs))
            parts = [torch.from_numpy(Xs), torch.from_numpy(ys), idx]
            if self.sample_weight is not None:
                parts.append(torch.from_numpy(self.sample_weight[rows[split]]).float())
            self.datasets[split] = TensorDataset(*parts)
        log.info(
            "dataset %s: %d train / %d val / %d test rows, %d features",
            self.name,
            len(d.X_train),
            len(d.X_val),
            len(d.X_test),
            X.shape[1],
        )

    # ---- facts the system needs (passed at instantiate time by the pipeline) -------------------
    def _loaded(self) -> ProtocolData:
        if self.data is None:
            raise RuntimeError("call setup() before reading dataset properties")
        return self.data

    @property
    def num_classes(self) -> int | None:
        """Number of classes (classification), else ``None``."""
        d = self._loaded()
        if self.task != "classification":
            return None
        return int(max(d.y_train.max(), d.y_val.max(), d.y_test.max())) + 1

    @property
    def feature_names(self) -> list[str]:
        """Names of the input columns."""
        return self._loaded().feature_names

    def model_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`~xrfm_torch.xRFMTree` that depend on the data."""
        self._loaded()
        kw: dict[str, Any] = {"task": self.task}
        if self.categorical_features:
            kw["categorical_features"] = self.categorical_features
        if self.has_missing:  # a table with empty cells: expect them in any column
            kw["missing_values"] = "any"
        return kw

    def system_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :class:`~xrfm_torch.lit.XRFMLitModule` that depend on the data."""
        d = self._loaded()
        kw: dict[str, Any] = {"task": self.task, "feature_names": self.feature_names}
        if self.sample_weight is not None:
            kw["weighted"] = True
        kw["n_fit_rows"] = len(d.y_train) + len(d.y_val)  # what sizes the default ensemble
        if self.task == "classification":
            kw["num_classes"] = self.num_classes
            labels = np.concatenate([np.asarray(d.y_train), np.asarray(d.y_val)]).reshape(-1)
            kw["rarest_class_rows"] = int(np.unique(labels, return_counts=True)[1].min())
        elif d.y_scaler is not None:
            kw["target_mean"] = float(d.y_scaler.mean)
            kw["target_std"] = float(d.y_scaler.std)
        return kw

    def _loader(self, split: str) -> DataLoader:
        self._loaded()
        return DataLoader(
            self.datasets[split],
            batch_size=int(self.hparams["batch_size"]),
            shuffle=False,
            num_workers=int(self.hparams["num_workers"]),
        )

    def train_dataloader(self) -> DataLoader:
        return self._loader("train")

    def val_dataloader(self) -> DataLoader:
        return self._loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._loader("test")

    def predict_dataloader(self) -> DataLoader:
        return self._loader("test")

    # ---- checkpoints: the row encoding travels with the model ----------------------------------
    def state_dict(self) -> dict[str, Any]:
        """``{"rows": RowEncoding.to_state()}`` once set up (Lightning saves it in checkpoints)."""
        return {} if self.rows is None else {"rows": self.rows.to_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Read the row encoding back (checked: :meth:`RowEncoding.from_state`)."""
        if "rows" in state_dict:
            self.rows = RowEncoding.from_state(state_dict["rows"])


#: A numeric target of at most this many distinct whole values may be labels: the log says so.
LABEL_LIKE_VALUES = 10


def _say_numeric_task(y: np.ndarray, target: Any) -> None:
    """Log why a table without ``task`` fits a regression: its target column is numeric.

    A target of few whole values (0/1, 1..5) reads as labels to a person but as numbers here, so
    that case is a warning naming the setting that makes it a classification.
    """
    values = np.unique(y[np.isfinite(y)])  # a table without classes has float64 targets
    name = "the last column" if target is None else f"column {target!r}"
    if len(values) <= LABEL_LIKE_VALUES and bool(np.all(values == np.round(values))):
        shown = ", ".join(f"{v:g}" for v in values)
        log.warning(
            "dataset.task not given: the target (%s) is numeric, so this is a regression; it "
            "holds only the whole values %s: pass dataset.task=classification to fit labels",
            name,
            shown,
        )
    else:
        log.info("dataset.task not given: the target (%s) is numeric, so a regression", name)
