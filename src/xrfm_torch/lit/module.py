"""XRFMLitModule: fits an xRFMTree in closed form inside ``trainer.fit`` and evaluates it."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Timer
from torch import Tensor
from torchmetrics import MetricCollection

from xrfm_torch.data.protocol import Task
from xrfm_torch.lit.metrics import GaussianNLL, make_metrics
from xrfm_torch.models import xRFMTree
from xrfm_torch.models.anytime import Anytime
from xrfm_torch.models.contract import Model
from xrfm_torch.models.factory import (
    build_model,
    model_from_config,
    resolve_bags,
    resolve_kernels,
)
from xrfm_torch.models.ladder import check_time_limit
from xrfm_torch.numerics.progress import IterationHook, on_iteration
from xrfm_torch.numerics.threads import check_threads
from xrfm_torch.tree.grow import Progress

log = logging.getLogger(__name__)


def collect(loader: Any, device: torch.device) -> tuple[Tensor, Tensor]:
    """Concatenate every ``(x, y)`` batch of a dataloader (or list of them) onto ``device``."""
    X, y, _ = collect_indexed(loader, device)
    return X, y


def collect_indexed(loader: Any, device: torch.device) -> tuple[Tensor, Tensor, Tensor | None]:
    """Like :func:`collect`, plus the batches' row indices (third element) when they carry one."""
    X, y, rows, _ = collect_all(loader, device)
    return X, y, rows


def collect_all(
    loader: Any, device: torch.device
) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """``(X, y, row indices or None, sample weights or None)`` of every batch.

    Batches are ``(x, y)``, ``(x, y, row index)`` or ``(x, y, row index, weight)``
    (:class:`~xrfm_torch.lit.datamodule.TabularDataModule` with a ``weight`` column).
    """
    loaders = loader if isinstance(loader, (list, tuple)) else [loader]
    xs, ys, idx, ws = [], [], [], []
    for dl in loaders:
        for batch in dl:
            xs.append(batch[0])
            ys.append(batch[1])
            if len(batch) > 2:
                idx.append(batch[2])
            if len(batch) > 3:
                ws.append(batch[3])
    if not xs:
        raise ValueError("the dataloader yielded no batches; cannot fit the tree")
    rows = torch.cat(idx).to(device) if len(idx) == len(xs) else None
    w = torch.cat(ws).to(device) if len(ws) == len(xs) else None
    return torch.cat(xs).to(device), torch.cat(ys).to(device), rows, w


def _floats(value: float | Sequence[float]) -> float | list[float]:
    """A number or a sequence of numbers as plain Python floats."""
    if isinstance(value, (int, float)):
        return float(value)
    return [float(v) for v in value]


class XRFMLitModule(pl.LightningModule):
    """Lightning system around an :class:`~xrfm_torch.xRFMTree` (the model).

    ``on_fit_start`` gathers the train and validation loaders once and fits the tree in closed form
    under ``no_grad`` on the module's device (no optimizer, no SGD). Lightning's loops then only
    evaluate: ``train/*``, ``val/*`` and ``test/*`` metrics (MSE, RMSE, MAE, R² in original target units
    for regression; accuracy, AUROC, log-loss for classification). The hook runs before Lightning's
    sanity check, so every validation pass already sees the fitted tree.

    Regression targets may be standardized by the datamodule; ``target_mean``/``target_std`` map
    predictions back so metrics and ``predict_step`` are in original units. Classification fits the tree
    on class labels and turns its outputs into probabilities with ``tree.predict_proba``'s rule
    (clipped scores, or their softmax calibrated on the validation rows).

    Args:
        tree: The (unfitted) model. Excluded from hyperparameters; its config goes into checkpoints.
        task: ``"regression"`` or ``"classification"``.
        num_classes: Number of classes (classification).
        target_mean: Mean(s) of the original regression target.
        target_std: Std(s) of the original regression target.
        seed: Seed of the tree's random generator.
        feature_names: Names of the input columns (for reports).
        weighted: The batches carry sample weights (4th element; the datamodule's ``weight``
            column): the tree is fitted with them and the metrics are weighted
            (:mod:`xrfm_torch.lit.weighted_metrics`; AUROC stays unweighted).
        n_bags: ``K >= 2`` wraps the tree in a :class:`~xrfm_torch.models.bagging.BaggedTree`:
            ``K`` cross-fitted copies on the pooled training and validation rows, averaged
            (``system.n_bags=5``; ``experiment=bagged``). The ``val/*`` metrics are then those of
            rows every bag but one trained on; ``val/oof_*`` (the same metrics) score each row by
            the bag that did not (with ``blend_kernels`` too: the blend's mixed out-of-fold
            outputs). ``"auto"``: 5 bags up to 20 000 fit rows (``n_fit_rows``), else one
            model. ``None`` (default): the task's default, as ``XRFMClassifier`` /
            ``XRFMRegressor`` build it (:mod:`xrfm_torch.models.factory`): ``"auto"`` for
            classification, 1 for regression.
        blend_kernels: Two or more kernel names wrap the model (tree or bags) in a
            :class:`~xrfm_torch.models.blend.KernelBlend`: one fit per kernel, mixed by weights
            chosen on the honest outputs (``system.blend_kernels=[laplace,gaussian]``;
            ``experiment=kernel_blend``). ``None``: the tree's own kernel. ``"auto"`` (default):
            the default's Laplace and Gaussian kernels (both tasks).
        n_fit_rows: Training plus validation rows (the datamodule passes it; ``n_bags="auto"``).
        rarest_class_rows: Rows of the rarest class among them (classification; no bags below
            2).
        time_limit: Seconds the fit may take (``system.time_limit=60``): the model above becomes
            the target of an anytime fit (:class:`~xrfm_torch.models.anytime.Anytime`), as in the
            estimators. ``None``: no limit, unless the trainer has one (``trainer.max_time``,
            Lightning's ``Timer``), whose remaining time then becomes the fit's limit (and this
            hyperparameter, so that the checkpoint rebuilds the same model).
    """

    target_mean: Tensor
    target_std: Tensor

    def __init__(
        self,
        tree: xRFMTree | None = None,
        *,
        task: Task = "regression",
        num_classes: int | None = None,
        target_mean: float | Sequence[float] = 0.0,
        target_std: float | Sequence[float] = 1.0,
        seed: int = 0,
        feature_names: Sequence[str] | None = None,
        weighted: bool = False,
        n_bags: int | str | None = None,
        blend_kernels: Sequence[str] | str | None = "auto",
        n_fit_rows: int | None = None,
        rarest_class_rows: int | None = None,
        time_limit: float | None = None,
    ) -> None:
        super().__init__()
        if task not in ("regression", "classification"):
            raise ValueError(f"task must be 'regression' or 'classification', got {task!r}")
        if task == "classification" and (num_classes is None or num_classes < 2):
            raise ValueError(f"classification needs num_classes >= 2, got {num_classes!r}")
        # plain Python values (Hydra passes lists as ListConfig), so that checkpoints load with
        # torch.load(weights_only=True)
        feature_names = None if feature_names is None else [str(n) for n in feature_names]
        target_mean = _floats(target_mean)
        target_std = _floats(target_std)
        if blend_kernels is not None and not isinstance(blend_kernels, str):
            blend_kernels = [str(k) for k in blend_kernels]  # plain values, not a ListConfig
        self.save_hyperparameters(ignore=["tree", "encoder"])
        tree = tree if tree is not None else xRFMTree(task=task)
        # the task's default ensemble, as the estimators build it (xrfm_torch.models.factory)
        bags = resolve_bags(n_bags, task, n_fit_rows, rarest_class_rows)
        kernels = resolve_kernels(blend_kernels, "blend_kernels")
        model = build_model(tree, bags, kernels, check_time_limit(time_limit))
        if tree.task != task:
            raise ValueError(
                f"the tree's task is {tree.task!r} but the system's is {task!r}: pass "
                f"xRFMTree(task={task!r}) (the pipeline takes it from the dataset)"
            )
        self.model: Model = model
        self.automatic_optimization = False
        self.register_buffer("target_mean", torch.as_tensor(target_mean, dtype=torch.float32))
        self.register_buffer("target_std", torch.as_tensor(target_std, dtype=torch.float32))
        # ("train" cannot be a ModuleDict key: it would shadow nn.Module.train)
        self.train_metrics = make_metrics(task, num_classes, "train/", weighted)
        self.val_metrics = make_metrics(task, num_classes, "val/", weighted)
        self.test_metrics = make_metrics(task, num_classes, "test/", weighted)
        # a tree with predictive variances: Gaussian NLL on rows it did not fit
        self.val_nll = GaussianNLL() if tree.uncertainty != "none" else None
        self.test_nll = GaussianNLL() if tree.uncertainty != "none" else None
        self.fit_progress: list[Progress] = []  # filled by callbacks (e.g. FitProgressBar)
        self.fit_iterations: list[IterationHook] = []  # called after every leaf iteration
        self.fit_data: dict[str, tuple[Tensor, Tensor]] = {}  # model-space data of the last fit
        self.oof_metrics: dict[str, float] = {}  # bags' out-of-fold scores (n_bags > 1)

    # ---- fitting -------------------------------------------------------------------------------
    def encode_targets(self, y: Tensor) -> Tensor:
        """What the tree is fitted on: the (standardized) targets, or the class labels."""
        return y.float()

    def _fit_sources(self) -> tuple[Any, Any]:
        """The training and validation loaders of this ``trainer.fit`` call (public API only).

        ``on_fit_start`` runs before Lightning sets up its loops' data, so the loops are asked to
        set it up now (``setup_data`` is idempotent; the loops reuse it).
        """
        trainer = self.trainer
        dm = getattr(trainer, "datamodule", None)
        if dm is not None:
            return dm.train_dataloader(), dm.val_dataloader()
        trainer.fit_loop.setup_data()
        trainer.fit_loop.epoch_loop.val_loop.setup_data()
        train = trainer.train_dataloader
        if train is None:
            raise RuntimeError(
                "XRFMLitModule could not read the training data; pass a datamodule or "
                "train_dataloaders (and val_dataloaders) to trainer.fit"
            )
        return train, trainer.val_dataloaders

    def _limit_to_max_time(self) -> None:
        """Make ``trainer.max_time`` the fit's time limit where ``time_limit`` sets none."""
        if self.hparams.get("time_limit") is not None or self.model.fit_time_limit is not None:
            return
        timers = [c for c in getattr(self.trainer, "callbacks", []) if isinstance(c, Timer)]
        left = timers[0].time_remaining() if timers else None
        if left is None:
            return
        self.hparams["time_limit"] = limit = max(float(left), 1e-3)
        self.model = Anytime(self.model, time_limit=limit)
        log.info("fit limited to trainer.max_time: %.1fs", limit)

    def on_fit_start(self) -> None:
        self._limit_to_max_time()
        check_threads(self.device)  # a busy CPU: say which threads to set (numerics.threads)
        if self.trainer.world_size > 1:
            # every rank reads the whole table (the datamodule's own loaders, not Lightning's
            # sharded ones), grows the same tree top and fits its share of the leaves
            self.model.distributed = True
        train_loader, val_loader = self._fit_sources()
        X, y, _, w = collect_all(train_loader, self.device)
        data = {"train": (X, self.encode_targets(y))}
        weights = {} if w is None else {"train": w}
        if val_loader is not None and not (isinstance(val_loader, list) and not val_loader):
            Xv, yv, _, wv = collect_all(val_loader, self.device)
            data["val"] = (Xv, self.encode_targets(yv))
            if wv is not None:
                weights["val"] = wv
        self.fit_tree(data, weights)

    @torch.no_grad()
    def fit_tree(
        self, data: dict[str, tuple[Tensor, Tensor]], weights: dict[str, Tensor] | None = None
    ) -> None:
        """Fit the tree on model-space ``data['train']`` (and ``data['val']`` if present).

        ``weights``: sample weights of those rows (same keys), if any.
        """
        X, y = data["train"]
        Xv, yv = data.get("val", (None, None))
        weights = weights or {}
        generator = torch.Generator().manual_seed(int(self.hparams["seed"]))

        def progress(tree: int, done: int, total: int) -> None:
            for fn in self.fit_progress:
                fn(tree, done, total)

        def iteration(t: int, tau: int) -> None:
            for fn in self.fit_iterations:
                fn(t, tau)

        log.info(
            "fitting %s on %d rows (%d validation) on %s",
            type(self.model).__name__,  # the model's kind: a tree, bags, a blend, an anytime fit
            len(X),
            0 if Xv is None else len(Xv),
            self.device,
        )
        with on_iteration(iteration):
            self.model.fit(
                X,
                y,
                Xv,
                yv,
                sample_weight=weights.get("train"),
                val_sample_weight=weights.get("val") if Xv is not None else None,
                generator=generator,
                progress=progress,
            )
        self.fit_data = data
        k = self.hparams["num_classes"]
        if self.hparams["task"] == "classification" and self.model.n_outputs_ != k:
            raise ValueError(
                f"the training rows hold labels 0 .. {self.model.n_outputs_ - 1}, "
                f"but num_classes={k}: every class needs training rows"
            )
        pooled = y if yv is None else torch.cat([y, yv.to(y.dtype)])
        honest = self.model.honest_outputs()
        if len(honest.outputs) == len(pooled):
            # out-of-fold outputs of every pooled row (bags, or a blend of bags: its mixed ones,
            # those its weights were chosen on); a single tree's cover only its validation rows
            self.log_oof(honest.outputs, pooled)

    @torch.no_grad()
    def log_oof(self, oof: Tensor, y: Tensor) -> None:
        """Score the bags' out-of-fold predictions as ``val/oof_*`` with this system's metrics.

        Args:
            oof: Out-of-fold outputs of the pooled rows (``BaggedTree.oof_``).
            y: Their model-space targets. Unweighted, even in a weighted fit.
        """
        task = self.hparams["task"]
        metrics = make_metrics(task, self.hparams["num_classes"], "val/oof_").to(oof.device)
        target = y.long().reshape(-1) if task == "classification" else self.original_targets(y)
        metrics.update(self.to_output(oof), target)
        self.oof_metrics = {k: float(v) for k, v in metrics.compute().items()}
        log.info("out-of-fold scores of the bags: %s", self.oof_metrics)

    def configure_optimizers(self) -> None:
        """No optimizer: the tree is fitted in closed form."""
        return

    # ---- prediction ----------------------------------------------------------------------------
    def model_inputs(self, x: Tensor) -> Tensor:
        """What the tree sees for inputs ``x`` (the inputs themselves; a head module encodes them)."""
        return x

    def forward(self, x: Tensor) -> Tensor:
        """Tree output: standardized-target predictions (n, c) or class scores (n, K)."""
        return self.model(x)

    def to_output(self, raw: Tensor) -> Tensor:
        """Original-unit predictions (regression, (n,) for one target) or probabilities (n, K).

        ``raw``: the tree's output (regression), or its class probabilities (classification;
        :meth:`predict_output` computes them).
        """
        if self.hparams["task"] == "classification":
            return raw
        out = raw * self.target_std + self.target_mean
        return out[:, 0] if out.shape[1] == 1 else out

    def predict_output(self, x: Tensor) -> Tensor:
        """Predictions in original units, or class probabilities (bags: their mean), for ``x``."""
        if self.hparams["task"] == "classification":
            return self.model.predict_proba(self.model_inputs(x))
        return self.to_output(self(x))

    def to_output_std(self, std: Tensor) -> Tensor:
        """Predictive standard deviations (n, c) in original units, shaped like :meth:`to_output`."""
        out = std * self.target_std
        return out[:, 0] if out.shape[1] == 1 else out

    def original_targets(self, y: Tensor) -> Tensor:
        """Batch targets in original units (regression targets arrive standardized)."""
        if self.hparams["task"] == "classification":
            return y
        return y * self.target_std + self.target_mean

    def _evaluate(self, batch: Any, stage: str) -> dict[str, Tensor]:
        x, y = batch[0], self.original_targets(batch[1])
        nll = cast(GaussianNLL | None, getattr(self, f"{stage}_nll", None))
        out: dict[str, Tensor] = {"x": x, "y": y}
        if nll is not None:
            mean, std = self.model(self.model_inputs(x), return_std=True)
            out["pred"] = pred = self.to_output(mean)
            out["std"] = std = self.to_output_std(std)
            nll.update(pred, std, y)
            self.log(f"{stage}/nll", nll, on_step=False, on_epoch=True, batch_size=len(x))
        else:
            out["pred"] = pred = self.predict_output(x)
        metrics = cast(MetricCollection, getattr(self, f"{stage}_metrics"))
        if self.hparams.get("weighted", False):
            if len(batch) < 4:
                raise ValueError("weighted=True needs batches (x, y, row index, weight)")
            metrics.update(pred, y, batch[3])
        else:
            metrics.update(pred, y)
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=len(x))
        return out

    def training_step(self, batch: Any, batch_idx: int) -> None:
        self._evaluate(batch, "train")  # evaluation only: nothing to optimize

    def validation_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor]:
        return self._evaluate(batch, "val")

    def test_step(self, batch: Any, batch_idx: int) -> dict[str, Tensor]:
        return self._evaluate(batch, "test")

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Tensor:
        x = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self.predict_output(x)

    # ---- checkpoints ---------------------------------------------------------------------------
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["xrfm_model_config"] = self.model.get_config()

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Runs before load_state_dict: rebuild an empty model with the saved constructor arguments.
        # Checkpoints written before 0.16 name it "tree" (the config key and the state's prefix).
        config = checkpoint.get("xrfm_model_config", checkpoint.get("xrfm_tree_config"))
        if config is not None:
            self.model = model_from_config(config).to(self.device)
        state = checkpoint.get("state_dict")
        if isinstance(state, dict) and any(k.startswith("tree.") for k in state):
            checkpoint["state_dict"] = {
                "model." + k.removeprefix("tree.") if k.startswith("tree.") else k: v
                for k, v in state.items()
            }
