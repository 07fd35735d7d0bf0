"""torchmetrics collections per task (names become ``stage/name`` in the logs)."""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import AUROC, Accuracy
from torchmetrics.regression import MeanAbsoluteError, MeanSquaredError, R2Score

from xrfm_torch.data.protocol import Task
from xrfm_torch.lit.weighted_metrics import IgnoreWeight, WeightedMean, WeightedR2


class LogLoss(Metric):
    """Mean negative log-likelihood of the true class, ``-mean(log p[y])``, from probabilities (n, K)."""

    higher_is_better = False
    is_differentiable = True
    full_state_update = False
    total: Tensor
    count: Tensor

    def __init__(self, eps: float = 1e-15) -> None:
        super().__init__()
        self.eps = eps
        self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0), dist_reduce_fx="sum")

    def update(self, probs: Tensor, target: Tensor) -> None:
        p = probs.gather(1, target.long()[:, None])[:, 0].clamp_min(self.eps)
        self.total += -p.log().double().sum()
        self.count += target.numel()

    def compute(self) -> Tensor:
        return (self.total / self.count).float()


class GaussianNLL(Metric):
    """Mean Gaussian negative log-likelihood per target entry.

    ``mean(log(2 pi std^2) / 2 + (y - mean)^2 / (2 std^2))`` over rows and outputs, in the units of
    the inputs (original target units give the figure papers report).
    """

    higher_is_better = False
    is_differentiable = True
    full_state_update = False
    total: Tensor
    count: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.tensor(0), dist_reduce_fx="sum")

    def update(self, mean: Tensor, std: Tensor, target: Tensor) -> None:
        if not mean.shape == std.shape == target.shape:
            raise ValueError(
                f"mean, std and target must have one shape, got {tuple(mean.shape)}, "
                f"{tuple(std.shape)}, {tuple(target.shape)}"
            )
        var = std.double() ** 2
        r = target.double() - mean.double()
        self.total += (0.5 * (torch.log(2 * torch.pi * var) + r * r / var)).sum()
        self.count += target.numel()

    def compute(self) -> Tensor:
        return (self.total / self.count).float()


class _ClassProbs(Metric):
    """Adapter: feed an (n, K) probability matrix to a metric that wants (n,) for binary tasks."""

    full_state_update = False

    def __init__(self, inner: Metric, binary: bool) -> None:
        super().__init__()
        self.inner = inner
        self.binary = binary

    def update(self, probs: Tensor, target: Tensor) -> None:
        self.inner.update(probs[:, 1] if self.binary else probs, target.long())

    def compute(self) -> Tensor:
        return self.inner.compute()

    def reset(self) -> None:
        super().reset()
        self.inner.reset()


def make_metrics(
    task: Task, num_classes: int | None = None, prefix: str = "", weighted: bool = False
) -> MetricCollection:
    """Metrics of a task: regression MSE, RMSE, MAE, R²; classification accuracy, AUROC, log-loss.

    ``weighted``: sample-weighted versions (:mod:`xrfm_torch.lit.weighted_metrics`) whose
    ``update`` takes ``(prediction, target, weight)``; AUROC stays unweighted.
    """
    if weighted:
        return _weighted_metrics(task, num_classes, prefix)
    if task == "regression":
        return MetricCollection(
            {
                "mse": MeanSquaredError(),
                "rmse": MeanSquaredError(squared=False),
                "mae": MeanAbsoluteError(),
                "r2": R2Score(),
            },
            prefix=prefix,
        )
    if num_classes is None or num_classes < 2:
        raise ValueError(f"classification metrics need num_classes >= 2, got {num_classes!r}")
    binary = num_classes == 2
    kind: Literal["binary", "multiclass"] = "binary" if binary else "multiclass"
    return MetricCollection(
        {
            "accuracy": _ClassProbs(Accuracy(task=kind, num_classes=num_classes), binary),
            "auroc": _ClassProbs(AUROC(task=kind, num_classes=num_classes), binary),
            "logloss": LogLoss(),
        },
        prefix=prefix,
        compute_groups=False,
    )


def _weighted_metrics(task: Task, num_classes: int | None, prefix: str) -> MetricCollection:
    if task == "regression":
        metrics: dict[str, Metric | MetricCollection] = {
            "mse": WeightedMean("se"),
            "rmse": WeightedMean("se", root=True),
            "mae": WeightedMean("ae"),
            "r2": WeightedR2(),
        }
        return MetricCollection(metrics, prefix=prefix, compute_groups=False)
    if num_classes is None or num_classes < 2:
        raise ValueError(f"classification metrics need num_classes >= 2, got {num_classes!r}")
    binary = num_classes == 2
    kind: Literal["binary", "multiclass"] = "binary" if binary else "multiclass"
    metrics = {
        "accuracy": WeightedMean("correct"),
        "auroc": IgnoreWeight(_ClassProbs(AUROC(task=kind, num_classes=num_classes), binary)),
        "logloss": WeightedMean("logloss"),
    }
    return MetricCollection(metrics, prefix=prefix, compute_groups=False)
