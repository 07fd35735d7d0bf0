"""Calibration report of predictive intervals: coverage table and reliability plot."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from statistics import NormalDist
from typing import Any

import lightning.pytorch as pl
import torch
from torch import Tensor

from xrfm_torch.lit.callbacks import _FileCallback, _module, _pyplot

log = logging.getLogger(__name__)

#: Central-interval probabilities reported by default.
COVERAGES: tuple[float, ...] = (0.5, 0.8, 0.9, 0.95)


def interval_coverage(z: Tensor, levels: Sequence[float]) -> list[float]:
    """Share of rows inside each central interval: ``mean(|z| <= Phi^{-1}((1 + p) / 2))``.

    Args:
        z: Standardized residuals ``(y - mean) / std``, any shape.
        levels: Nominal probabilities ``p`` in (0, 1).
    """
    a = z.detach().abs().flatten().double()
    return [float((a <= NormalDist().inv_cdf(0.5 + p / 2)).double().mean()) for p in levels]


class IntervalCalibration(_FileCallback):
    """Coverage of the central predictive intervals on validation and test rows.

    Needs a tree fitted with ``uncertainty`` (the module then returns standard deviations). At the
    end of each validation and test epoch: logs ``{stage}/coverage{p}`` for each level, writes
    ``calibration_{stage}.json`` (nominal vs observed coverage at 5 %, 10 %, ..., 95 % and the
    levels) and, with matplotlib, ``calibration_{stage}.png``, the reliability plot (observed
    against nominal coverage; the diagonal is perfect calibration).

    Args:
        dirpath: Output folder (default: the trainer's ``default_root_dir``).
        levels: Central-interval probabilities logged as metrics.
    """

    def __init__(self, dirpath: str | None = None, levels: Sequence[float] = COVERAGES) -> None:
        super().__init__(dirpath)
        for p in levels:
            if not 0.0 < float(p) < 1.0:
                raise ValueError(f"coverage levels must be in (0, 1), got {p!r}")
        self.levels = [float(p) for p in levels]
        self._z: list[Tensor] = []

    def _start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if _module(pl_module).model.uncertainty == "none":
            raise ValueError(
                "IntervalCalibration needs a tree fitted with uncertainty='calibrated' or 'gp'"
            )
        self._z = []

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start(trainer, pl_module)

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start(trainer, pl_module)

    def _collect(self, outputs: Any) -> None:
        if isinstance(outputs, dict) and "std" in outputs:
            self._z.append((outputs["y"] - outputs["pred"]) / outputs["std"])

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._collect(outputs)

    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._collect(outputs)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._report(trainer, pl_module, "val")

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._report(trainer, pl_module, "test")

    def _report(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if not self._z or trainer.sanity_checking:
            return
        z = torch.cat([t.reshape(-1) for t in self._z])
        coverage = interval_coverage(z, self.levels)
        for p, c in zip(self.levels, coverage):
            pl_module.log(f"{stage}/coverage{round(100 * p)}", c)
        log.info("interval coverage (%s): %s", stage, dict(zip(self.levels, coverage)))
        nominal = [round(0.05 * k, 2) for k in range(1, 20)]
        observed = interval_coverage(z, nominal)
        out = self.out_dir(trainer)
        report = {"rows": int(z.numel()), "nominal": nominal, "observed": observed}
        (out / f"calibration_{stage}.json").write_text(json.dumps(report, indent=1))
        plt = _pyplot()
        if plt is None:
            return
        fig, ax = plt.subplots(figsize=(4, 4))
        ax.plot([0, 1], [0, 1], color="0.6", lw=1, label="calibrated")
        ax.plot(nominal, observed, "o-", ms=3, label="observed")
        ax.set(
            xlabel="nominal central-interval coverage",
            ylabel="observed coverage",
            title=f"{stage}: {z.numel()} rows",
            xlim=(0, 1),
            ylim=(0, 1),
        )
        ax.legend(loc="upper left")
        fig.tight_layout()
        fig.savefig(out / f"calibration_{stage}.png", dpi=100)
        plt.close(fig)
