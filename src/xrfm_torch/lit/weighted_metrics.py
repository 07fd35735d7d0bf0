"""Sample-weighted metrics for tables with a weight column (``dataset.weight=COL``).

torchmetrics' MSE, MAE, R² and accuracy take no sample weights, so these keep weighted sums
(``sum_i w_i s_i`` and ``sum_i w_i``) and report their ratio; every ``update`` takes
``(prediction, target, weight)``. Integer weights give the metric of the repeated rows.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor
from torchmetrics import Metric

#: Per-row scores: squared error, absolute error (both averaged over outputs), whether the most
#: probable class is the true one, and the negative log-probability of the true class.
Score = Literal["se", "ae", "correct", "logloss"]


def row_scores(score: Score, pred: Tensor, target: Tensor, eps: float = 1e-15) -> Tensor:
    """Per-row scores (n,) of predictions against targets (see :data:`Score`)."""
    if score in ("se", "ae"):
        e = (pred.double() - target.double()).reshape(pred.shape[0], -1)
        return (e * e if score == "se" else e.abs()).mean(1)
    labels = target.long()
    if score == "correct":
        return (pred.argmax(1) == labels).double()
    return -pred.gather(1, labels[:, None])[:, 0].double().clamp_min(eps).log()


class WeightedMean(Metric):
    """``sum_i w_i s_i / sum_i w_i`` of a per-row score ``s`` (its square root with ``root``)."""

    full_state_update = False
    total: Tensor
    weight: Tensor

    def __init__(self, score: Score, root: bool = False) -> None:
        super().__init__()
        self.score, self.root = score, root  # (higher is better only for "correct")
        self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("weight", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, pred: Tensor, target: Tensor, weight: Tensor) -> None:
        w = weight.double().reshape(-1)
        self.total += (w * row_scores(self.score, pred, target)).sum()
        self.weight += w.sum()

    def compute(self) -> Tensor:
        value = self.total / self.weight
        return (value.sqrt() if self.root else value).float()


class WeightedR2(Metric):
    """Weighted R² ``1 - sum w e^2 / sum w (y - mean_w y)^2``, averaged over outputs."""

    higher_is_better = True
    full_state_update = False
    sw: Tensor
    swy: Tensor
    swyy: Tensor
    swee: Tensor

    def __init__(self) -> None:
        super().__init__()
        for name in ("sw", "swy", "swyy", "swee"):
            self.add_state(name, torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")

    def update(self, pred: Tensor, target: Tensor, weight: Tensor) -> None:
        y = target.double().reshape(target.shape[0], -1)
        e = pred.double().reshape(y.shape) - y
        w = weight.double().reshape(-1, 1)
        self.sw = self.sw + w.sum()
        self.swy = self.swy + (w * y).sum(0)
        self.swyy = self.swyy + (w * y * y).sum(0)
        self.swee = self.swee + (w * e * e).sum(0)

    def compute(self) -> Tensor:
        total = self.swyy - self.swy * self.swy / self.sw
        return (1.0 - self.swee / total).mean().float()


class IgnoreWeight(Metric):
    """Adapter: an unweighted metric in a weighted collection (``update`` drops the weight)."""

    full_state_update = False

    def __init__(self, inner: Metric) -> None:
        super().__init__()
        self.inner = inner

    def update(self, pred: Tensor, target: Tensor, weight: Tensor) -> None:
        self.inner.update(pred, target)

    def compute(self) -> Tensor:
        return self.inner.compute()

    def reset(self) -> None:
        super().reset()
        self.inner.reset()
