"""The training pipeline behind ``train.py``: everything instantiated from the Hydra config.

Tests call :func:`run` directly with a composed config; no process is started.
"""

from __future__ import annotations

import logging
import time
import warnings
from pathlib import Path
from typing import Any

import hydra
import lightning.pytorch as pl
from omegaconf import DictConfig, OmegaConf

from xrfm_torch.lit.datamodule import TabularDataModule
from xrfm_torch.lit.module import XRFMLitModule

log = logging.getLogger(__name__)


def _instantiate_group(cfg: DictConfig | None) -> list[Any]:
    if not cfg:
        return []
    return [hydra.utils.instantiate(c) for _, c in cfg.items() if c is not None and "_target_" in c]


class _DropTip(logging.Filter):
    """Drops Lightning's advertising tip ("💡 Tip: ... litlogger"); every other record passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("💡 Tip")


def quiet_third_party() -> None:
    """Silence the messages our calls trigger in Lightning that say nothing about the run.

    Each is filtered by its text, so that anything else those libraries say still shows.
    """
    # The tree is fitted in closed form, so there is deliberately no optimizer.
    warnings.filterwarnings("ignore", message=".*this fit will run with no optimizer")
    # Lightning 2.6's own pytree helper uses a torch API that newer torch deprecates; nothing
    # of ours calls it, and the user cannot act on it.
    warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)")
    # An advertisement for a cloud logger, printed by every Trainer without one.
    tip_logger = logging.getLogger("lightning.pytorch.utilities.rank_zero")
    if not any(isinstance(f, _DropTip) for f in tip_logger.filters):
        tip_logger.addFilter(_DropTip())


def run(cfg: DictConfig) -> dict[str, Any]:
    """Fit and evaluate as configured.

    Steps: seed; datamodule (set up once, so the system gets the task and target scaling); tree
    (``cfg.model``); system (``cfg.system`` + data facts); callbacks, loggers, trainer; ``trainer.fit``
    (closed-form tree fit + validation); optional checkpoint; optional ``trainer.test``.

    Returns:
        ``{"metrics": {name: float}, "is_global_zero": bool, "output_dir": str,
        "checkpoint": str | None, "objects": {...}}`` (``is_global_zero``: this process is rank 0,
        the one that writes ``metrics.yaml`` and the checkpoint).
    """
    quiet_third_party()
    pl.seed_everything(int(cfg.seed), workers=True)
    out_dir = Path(cfg.paths.output_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    dm: TabularDataModule = hydra.utils.instantiate(cfg.dataset)
    dm.prepare_data()
    dm.setup("fit")
    tree = hydra.utils.instantiate(cfg.model, **dm.model_kwargs())  # task, columns: the data's
    system: XRFMLitModule = hydra.utils.instantiate(cfg.system, tree=tree, **dm.system_kwargs())
    callbacks = _instantiate_group(cfg.get("callbacks"))
    loggers = _instantiate_group(cfg.get("logger"))
    trainer: pl.Trainer = hydra.utils.instantiate(
        cfg.trainer, callbacks=callbacks, logger=loggers or False, default_root_dir=str(out_dir)
    )
    start = time.perf_counter()
    trainer.fit(system, datamodule=dm)
    fit_seconds = time.perf_counter() - start
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    ckpt_path = None
    if cfg.get("ckpt", True):
        ckpt_path = str(out_dir / "checkpoints" / "last.ckpt")
        # full checkpoint (callbacks' state too), said explicitly: Lightning logs its default
        trainer.save_checkpoint(ckpt_path, weights_only=False)
    if cfg.get("test", True):
        trainer.test(system, datamodule=dm, verbose=False)
        metrics.update({k: float(v) for k, v in trainer.callback_metrics.items()})
    metrics["time/fit_seconds"] = fit_seconds
    metrics.update(system.oof_metrics)
    if system.model.fit_seconds_ is not None:
        metrics["time/tree_fit_seconds"] = system.model.fit_seconds_
    if trainer.is_global_zero:  # one writer when several processes share the run directory
        (out_dir / "metrics.yaml").write_text(OmegaConf.to_yaml(OmegaConf.create(metrics)))
    return {
        "metrics": metrics,
        "is_global_zero": trainer.is_global_zero,
        "output_dir": str(out_dir),
        "checkpoint": ckpt_path,
        "objects": {"datamodule": dm, "system": system, "trainer": trainer},
    }


def format_metrics(metrics: dict[str, float]) -> str:
    """A small aligned table of ``stage/name  value`` lines (test metrics first)."""
    keys = sorted(metrics, key=lambda k: (not k.startswith("test/"), k))
    width = max(len(k) for k in keys) if keys else 0
    return "\n".join(f"{k:<{width}}  {metrics[k]:.6g}" for k in keys)
