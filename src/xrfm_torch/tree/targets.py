"""What the leaves fit: standardized regression targets, or class codes (one-hot rows).

Regression targets are standardized with training statistics (predictions come back in the
targets' units), so the model does not depend on their scale. Class labels ``0 .. K-1`` become
one-hot rows (the reference's ``zero_one`` coding, also for two classes); the leaves regress on them
and every choice made on validation data minimizes the leaves' criterion on these codes
(the Brier score by default, :mod:`xrfm_torch.leaf.criteria`).
Probabilities are the scores clipped to ``[CLIP, 1 - CLIP]`` and renormalized per row
(:func:`xrfm_torch.leaf.criteria.class_probabilities`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Literal

import torch
from torch import Tensor

from xrfm_torch.inputs.transforms import Standardize
from xrfm_torch.leaf.criteria import class_probabilities
from xrfm_torch.leaf.data import FitData
from xrfm_torch.numerics.state import ResizableBuffers

#: What a model predicts: real values, or one of ``K`` classes.
Task = Literal["regression", "classification"]


class TargetCoding(ResizableBuffers):
    """Targets to the codes the leaves fit, and the leaves' outputs back.

    Args:
        task: ``"regression"`` (targets (n, c) standardized) or ``"classification"`` (labels
            ``0 .. K-1``, one per row, coded one-hot: (n, K)).

    Buffers:
        ``scaler.center_``, ``scaler.scale_`` (c,) for regression; ``n_classes_`` () for
        classification (0 until fitted).
    """

    n_classes_: Tensor

    def __init__(self, task: Task = "regression") -> None:
        super().__init__()
        if task not in ("regression", "classification"):
            raise ValueError(f"task must be 'regression' or 'classification', got {task!r}")
        self.task: Task = task
        self.scaler = Standardize()
        self.register_buffer("n_classes_", torch.tensor(0))

    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`fit` has run (or a fitted state was loaded)."""
        return self.scaler.is_fitted if self.task == "regression" else int(self.n_classes_) > 0

    def labels(self, y: Tensor, name: str = "y") -> Tensor:
        """Class labels of ``y`` ((n,) or (n, 1), integer-valued) as a long tensor (n,)."""
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1:
            raise ValueError(
                f"{name} must hold one class label per row, got shape {tuple(y.shape)}"
            )
        as_long = y.long()
        bad = (as_long != y) | (as_long < 0)
        if bool(bad.any()):
            i = int(bad.nonzero()[0])
            raise ValueError(
                f"{name} must hold class labels 0 .. K-1 (integers >= 0), got {y[i].item()!r} "
                f"at row {i}; map other labels first (XRFMClassifier does)"
            )
        return as_long

    @torch.no_grad()
    def fit(self, y: Tensor) -> TargetCoding:
        """Fit to training targets: regression (n, c) statistics, or the number of classes."""
        if self.task == "regression":
            self.scaler.fit(y)
            return self
        k = int(self.labels(y).max()) + 1
        if k < 2:
            raise ValueError(f"classification needs at least 2 classes, got labels 0 .. {k - 1}")
        self.n_classes_ = torch.tensor(k, device=y.device)
        return self

    def encode(self, y: Tensor, name: str = "y") -> Tensor:
        """The codes the leaves fit: (n, c) standardized targets, or (n, K) one-hot rows."""
        if self.task == "regression":
            return self.scaler(y)
        labels = self.labels(y, name)
        k = int(self.n_classes_)
        if int(labels.max()) >= k:
            raise ValueError(
                f"{name} has label {int(labels.max())}, but the model was fitted on {k} classes"
            )
        return torch.nn.functional.one_hot(labels, k).to(y.dtype)

    def encode_data(self, data: FitData) -> FitData:
        """``data`` with its training and validation targets coded (:meth:`encode`)."""
        return replace(data, y=self.encode(data.y), y_val=self.encode(data.y_val, "y_val"))

    def decode(self, scores: Tensor) -> Tensor:
        """The leaves' outputs in the targets' units (regression) or as class scores (n, K)."""
        return self.scaler.inverse(scores) if self.task == "regression" else scores

    def probabilities(self, scores: Tensor) -> Tensor:
        """Class probabilities (n, K) from scores: clipped to ``[CLIP, 1 - CLIP]``, rows sum to 1."""
        if self.task != "classification":
            raise ValueError("probabilities need a classification model (task='classification')")
        return class_probabilities(scores)
