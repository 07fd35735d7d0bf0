"""What the leaves fit: standardized regression targets, or class codes (one-hot rows).

Regression targets are standardized with training statistics (predictions come back in the
targets' units), so the model does not depend on their scale. Class labels ``0 .. K-1`` become
one-hot rows (the reference's ``zero_one`` coding, also for two classes) or, with
``class_coding="prevalence"``, one-hot rows minus the training class prior ``π``: a leaf then
predicts ``π`` where its kernel sees no training row, as the reference's ``prevalence`` simplex code
does. That code is these rows in an orthonormal basis of the sum-zero plane, so KRR, the AGOP and
the squared error are the same under either (KRR is linear in the targets, a rotation keeps norms);
its decoding ``π + score`` needs no matrix inverse. The leaves regress on the codes and every
choice made on validation data minimizes the leaves' criterion on them (the Brier score by default,
:mod:`xrfm_torch.leaf.criteria`). Probabilities are the decoded scores mapped by a Platt map
on their logarithms (by default), or a softmax, fitted on validation rows
(:meth:`TargetCoding.calibrate`), clipped to ``[CLIP, 1 - CLIP]`` and renormalized per row (:func:`xrfm_torch.leaf.criteria.class_probabilities`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal

import torch
from torch import Tensor

from xrfm_torch.inputs.transforms import Standardize
from xrfm_torch.leaf.criteria import (
    choose_softmax_scale,
    class_probabilities,
    fit_platt,
    fit_softmax_scale,
)
from xrfm_torch.leaf.data import FitData
from xrfm_torch.numerics.deterministic import bincount
from xrfm_torch.numerics.host import read_scalars
from xrfm_torch.numerics.state import ResizableBuffers

#: What a model predicts: real values, or one of ``K`` classes.
Task = Literal["regression", "classification"]
#: How class labels are coded for the leaves (module docstring).
ClassCoding = Literal["one_hot", "prevalence"]
CLASS_CODINGS: tuple[ClassCoding, ...] = ("one_hot", "prevalence")
#: How class scores become probabilities: clipped, a softmax fitted on validation rows, the one
#: of the two a paired test on them supports, or Platt's map on the log-scores fitted on them
#: (:mod:`xrfm_torch.leaf.criteria`).
Calibration = Literal["platt", "auto", "clip", "softmax"]
CALIBRATIONS: tuple[Calibration, ...] = ("platt", "auto", "clip", "softmax")


class TargetCoding(ResizableBuffers):
    """Targets to the codes the leaves fit, and the leaves' outputs back.

    Args:
        task: ``"regression"`` (targets (n, c) standardized) or ``"classification"`` (labels
            ``0 .. K-1``, one per row, coded (n, K)).
        class_coding: ``"one_hot"`` or ``"prevalence"`` (one-hot minus the training prior).
        calibration: ``"platt"``, ``"clip"``, ``"softmax"`` or ``"auto"`` (:meth:`calibrate`).

    Buffers:
        ``scaler.center_``, ``scaler.scale_`` (c,) for regression; ``n_classes_`` (),
        ``prior_`` (K,) (zeros for ``"one_hot"``), ``softmax_scale_`` () (0: none) and
        ``platt_`` (K + 1,) (empty: none) for classification.
    """

    n_classes_: Tensor
    prior_: Tensor
    softmax_scale_: Tensor
    platt_: Tensor

    def __init__(
        self,
        task: Task = "regression",
        class_coding: ClassCoding = "one_hot",
        calibration: Calibration = "platt",
    ) -> None:
        super().__init__()
        if task not in ("regression", "classification"):
            raise ValueError(f"task must be 'regression' or 'classification', got {task!r}")
        if class_coding not in CLASS_CODINGS:
            raise ValueError(f"class_coding must be one of {CLASS_CODINGS}, got {class_coding!r}")
        if calibration not in CALIBRATIONS:
            raise ValueError(f"calibration must be one of {CALIBRATIONS}, got {calibration!r}")
        self.task: Task = task
        self.class_coding: ClassCoding = class_coding
        self.calibration: Calibration = calibration
        self.scaler = Standardize()
        self.register_buffer("n_classes_", torch.tensor(0))
        self.register_buffer("prior_", torch.zeros(0))
        self.register_buffer("softmax_scale_", torch.tensor(0.0))
        self.register_buffer("platt_", torch.zeros(0))

    def check_criterion(self, criterion: str) -> None:
        """Refuse a leaf criterion this task and coding cannot use (``ValueError``)."""
        if self.task == "regression" and criterion != "mse":
            raise ValueError(
                f"criterion {criterion!r} needs task='classification'; regression uses 'mse'"
            )
        if self.class_coding == "prevalence" and criterion != "mse":
            raise ValueError(
                f"class_coding='prevalence' needs criterion 'mse' (the Brier score), got "
                f"{criterion!r}: the other criteria read the codes as class scores"
            )

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        # states saved before class codings and calibrations existed: a zero prior (one-hot
        # codes), a zero softmax scale and no Platt map (clipping) are what they used
        if prefix + "n_classes_" in state_dict:
            k = int(state_dict[prefix + "n_classes_"])
            state_dict.setdefault(prefix + "prior_", torch.zeros(k, device=self.prior_.device))
            state_dict.setdefault(prefix + "softmax_scale_", torch.tensor(0.0))
            state_dict.setdefault(prefix + "platt_", torch.zeros(0))
        super()._load_from_state_dict(state_dict, prefix, *args)

    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`fit` has run (or a fitted state was loaded)."""
        return self.scaler.is_fitted if self.task == "regression" else int(self.n_classes_) > 0

    def labels(self, y: Tensor, name: str = "y") -> Tensor:
        """Class labels of ``y`` ((n,) or (n, 1), integer-valued) as a long tensor (n,)."""
        as_long, bad = self._labels(y, name)
        self._refuse(y, bad, bool(bad.any()), name)
        return as_long

    @staticmethod
    def _labels(y: Tensor, name: str) -> tuple[Tensor, Tensor]:
        """``y`` as labels (n,) and the rows that are no label (n,), without a read back."""
        if y.ndim == 2 and y.shape[1] == 1:
            y = y[:, 0]
        if y.ndim != 1:
            raise ValueError(
                f"{name} must hold one class label per row, got shape {tuple(y.shape)}"
            )
        as_long = y.long()
        return as_long, (as_long != y) | (as_long < 0)

    @staticmethod
    def _refuse(y: Tensor, bad: Tensor, any_bad: bool, name: str) -> None:
        """Raise naming the first row of ``y`` that is no class label (``any_bad``: read)."""
        if any_bad:
            i = int(bad.nonzero()[0])
            value = y.reshape(-1)[i].item()
            raise ValueError(
                f"{name} must hold class labels 0 .. K-1 (integers >= 0), got {value!r} "
                f"at row {i}; map other labels first (XRFMClassifier does)"
            )

    @torch.no_grad()
    def fit(
        self, y: Tensor, weights: Tensor | None = None, y_val: Tensor | None = None
    ) -> TargetCoding:
        """Fit to training targets: regression (n, c) statistics, or the number of classes.

        ``weights`` (n,) weight the class prior of ``"prevalence"`` codes; the regression
        statistics only fix the units the leaves work in and stay unweighted. For
        classification the labels of the training and validation rows (``y_val``) together must
        be ``0 .. K-1`` with every class present: a missing label would become a class column no
        row has (labels 1..3 would give 4 columns), so it is refused, naming the labels.
        """
        if self.task == "regression":
            self.scaler.fit(y)
            return self
        labels = self.labels(y)
        seen = labels if y_val is None else torch.cat([labels, self.labels(y_val, "y_val")])
        present = torch.unique(seen)
        k = int(present.max()) + 1
        if k < 2:
            raise ValueError(f"classification needs at least 2 classes, got labels 0 .. {k - 1}")
        if len(present) != k:
            shown = present[:10].tolist()
            absent = sorted(set(range(k)) - set(present.tolist()))[:10]
            raise ValueError(
                f"classification labels must be 0 .. K-1 with every class present; got labels "
                f"{shown}{' ...' if len(present) > 10 else ''}, missing {absent}. Map them to "
                "0 .. K-1 first, or use XRFMClassifier (any labels, kept in classes_)"
            )
        self.n_classes_ = torch.tensor(k, device=y.device)
        counts = bincount(labels, weights, minlength=k).to(y.dtype)
        prior = counts / counts.sum()
        self.prior_ = prior if self.class_coding == "prevalence" else torch.zeros_like(prior)
        return self

    def encode(self, y: Tensor, name: str = "y") -> Tensor:
        """The codes the leaves fit: (n, c) standardized targets, or (n, K) one-hot rows."""
        if self.task == "regression":
            return self.scaler(y)
        labels, bad = self._labels(y, name)
        # the checks' three scalars read back together (one synchronization on a GPU)
        any_bad, top, n_classes = read_scalars(bad.any(), labels.max(), self.n_classes_)
        self._refuse(y, bad, bool(any_bad), name)
        k = int(n_classes)
        if int(top) >= k:
            raise ValueError(
                f"{name} has label {int(top)}, but the model was fitted on {k} classes"
            )
        return torch.nn.functional.one_hot(labels, k).to(y.dtype) - self.prior_.to(y.dtype)

    def encode_data(self, data: FitData) -> FitData:
        """``data`` with its training and validation targets coded (:meth:`encode`).

        The codes are cast to the inputs' dtype after coding: float64 targets are standardized
        in float64 (the statistics stay float64, so predictions come back in float64).
        """
        dtype = data.X.dtype
        y = self.encode(data.y).to(dtype)
        return replace(data, y=y, y_val=self.encode(data.y_val, "y_val").to(dtype))

    def decode(self, scores: Tensor) -> Tensor:
        """The leaves' outputs in the targets' units (regression) or as class scores (n, K)."""
        if self.task == "regression":
            return self.scaler.inverse(scores)
        return scores + self.prior_.to(scores.dtype)  # affine: commutes with mixing leaves

    @torch.no_grad()
    def calibrate(self, scores: Tensor, y_val: Tensor, weights: Tensor | None = None) -> str:
        """Choose how scores become probabilities, from validation rows the leaves did not fit.

        ``"platt"`` fits ``softmax(a log max(s, 0.01) + b)`` by validation log-loss
        (:func:`~xrfm_torch.leaf.criteria.fit_platt`), ``"clip"`` keeps clipping, ``"softmax"``
        fits the scale ``a`` of ``softmax(a * scores)``, ``"auto"`` takes that softmax only where
        it beats clipping by ``SOFTMAX_MARGIN`` paired standard errors
        (:func:`~xrfm_torch.leaf.criteria.choose_softmax_scale`).

        Args:
            scores: Decoded class scores of the validation rows (n_val, K).
            y_val: Their codes (:meth:`encode`), (n_val, K).
            weights: The validation rows' sample weights (n_val,): a weighted log-loss.

        Returns:
            What was chosen, in words (for the log).
        """
        scale, platt = 0.0, torch.zeros(0, dtype=scores.dtype, device=scores.device)
        if self.task == "classification" and self.calibration != "clip" and len(scores) > 0:
            labels = (y_val + self.prior_.to(y_val.dtype)).argmax(1)
            if self.calibration == "platt":
                platt = fit_platt(scores, labels, weights)
            elif self.calibration == "softmax":
                scale = fit_softmax_scale(scores, labels, weights=weights)
            else:
                scale = choose_softmax_scale(scores, labels, weights=weights)
        self.softmax_scale_ = torch.tensor(scale, device=scores.device)
        self.platt_ = platt
        if platt.numel():
            return f"Platt map on log-scores, slope {float(platt[0]):.4g}"
        return f"softmax, scale {scale:.4g}" if scale else "clipped"

    def probabilities(self, scores: Tensor) -> Tensor:
        """Class probabilities (n, K) from decoded scores, rows summing to 1.

        Scores, ``softmax(a * scores)`` or the Platt map, as :meth:`calibrate` chose, clipped
        to ``[CLIP, 1 - CLIP]`` and renormalized.
        """
        if self.task != "classification":
            raise ValueError("probabilities need a classification model (task='classification')")
        return class_probabilities(scores, float(self.softmax_scale_), self.platt_)
