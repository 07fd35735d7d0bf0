"""TabularDataModule: registry / CSV / OpenML / synthetic data with the benchmark protocol split."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from xrfm_torch.data.protocol import ProtocolData, Task, prepare
from xrfm_torch.data.registry import DATASETS
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
    ) -> None:
        super().__init__()
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
            self.categorical_features = table.categorical
            return table.X, table.y, table.names
        return make_synthetic(hp["n_samples"], hp["n_features"], hp["noise"], hp["seed"])

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
        for split, (Xs, ys) in {
            "train": (d.X_train, d.y_train),
            "val": (d.X_val, d.y_val),
            "test": (d.X_test, d.y_test),
        }.items():
            # (x, y, row index): the index lets head training tell support rows apart
            idx = torch.arange(len(Xs))
            self.datasets[split] = TensorDataset(torch.from_numpy(Xs), torch.from_numpy(ys), idx)
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
        if self.task == "classification":
            kw["num_classes"] = self.num_classes
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
