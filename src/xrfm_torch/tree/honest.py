"""Honest outputs: a fitted model's predictions on rows it did not train on, and their losses.

A single tree keeps its outputs on its validation rows (the ``eval`` rows, or the held-out share
before it joined the leaves); a cross-fitted :class:`~xrfm_torch.models.bagging.BaggedTree` keeps
its out-of-fold outputs of the pooled rows. Those rows chose the model's settings (iterations,
ridge, temperature, calibration), so the loss is slightly optimistic, alike for every model
fitted on them: good enough to weigh models against each other
(:class:`~xrfm_torch.models.blend.KernelBlend`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

#: Probabilities are clipped to this before the log (as the benchmarks score them).
PROB_FLOOR = 1e-15


class HonestOutputs(NamedTuple):
    """Outputs of rows the model did not train on.

    Attributes:
        outputs: Class probabilities (n, K) or predictions in the targets' units (n, c).
        targets: Class labels (n,), or targets (n,) / (n, c).
        weights: Row weights (n,) or ``None``.
        rows: Each row's place among the rows the fit was given (training rows, then
            validation rows; ``leaf.data.FitData.val_rows``), or ``None`` where unknown.
    """

    outputs: Tensor
    targets: Tensor
    weights: Tensor | None
    rows: Tensor | None = None


class HasHonestOutputs:
    """Mixin: a model that keeps its last fit's :class:`HonestOutputs` (not saved)."""

    _honest: HonestOutputs | None = None

    def honest_outputs(self) -> HonestOutputs:
        """The last fit's outputs of rows it did not train on (see the module docstring).

        Raises:
            RuntimeError: The model was not fitted in this session (a loaded model has none).
        """
        if self._honest is None:
            raise RuntimeError("honest_outputs needs a model fitted in this session (.fit)")
        return self._honest


def row_losses(outputs: Tensor, targets: Tensor, task: str) -> Tensor:
    """Per-row loss (n,): log-loss of probabilities (classification), else mean squared error.

    Args:
        outputs: Probabilities (n, K) (clipped at :data:`PROB_FLOOR` and renormalized) or
            predictions (n, c).
        targets: Labels ``0 .. K-1`` (n,) or targets (n,) / (n, c).
        task: ``"classification"`` or ``"regression"``.
    """
    if task == "classification":
        p = outputs.clamp_min(PROB_FLOOR)
        p = p / p.sum(1, keepdim=True)
        labels = targets.reshape(-1).round().long()
        return -p.gather(1, labels[:, None]).squeeze(1).log()
    return (outputs - targets.reshape(outputs.shape).to(outputs.dtype)).square().mean(1)


def mean_loss(losses: Tensor, weights: Tensor | None) -> Tensor:
    """The (weighted) mean of per-row losses, a scalar."""
    if weights is None:
        return losses.mean()
    w = weights.to(losses)
    return (losses * w).sum() / w.sum()


def check_same_rows(parts: list[HonestOutputs]) -> None:
    """Refuse honest outputs of different rows (models fitted on different data or splits)."""
    first = parts[0]
    for p in parts[1:]:
        same_rows = (
            first.rows is None or p.rows is None or torch.equal(p.rows.cpu(), first.rows.cpu())
        )
        if (
            p.targets.shape != first.targets.shape
            or not torch.equal(p.targets, first.targets)
            or not same_rows
        ):
            raise ValueError(
                "the models' honest outputs are of different rows: fit them on the same data "
                "with the same generator seed"
            )
