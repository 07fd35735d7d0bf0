"""scikit-learn classifier: :class:`XRFMClassifier`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from sklearn.base import ClassifierMixin
from sklearn.utils.multiclass import check_classification_targets

from xrfm_torch.data.tabular import (
    CategoricalSpec,
)
from xrfm_torch.estimators.base import (
    _LEAF,
    _TREE,
    Destination,
    _XRFMEstimator,
)
from xrfm_torch.kernels import Kernel
from xrfm_torch.models.factory import DEFAULT_KERNELS
from xrfm_torch.tree.targets import Task

log = logging.getLogger(__name__)


class XRFMClassifier(ClassifierMixin, _XRFMEstimator):
    """xRFM classification as a scikit-learn estimator (parameters: see ``_XRFMEstimator``).

    Labels may be of any type (str, int, bool); the leaves fit one-hot codes and
    ``predict_proba`` maps their scores to probabilities with a Platt map on the log-scores
    fitted on the validation rows (``xRFMTree(calibration="platt")``), clipped to
    [1e-3, 1 - 1e-3] and renormalized. By default the model is fitted with the Laplace and
    with the Gaussian kernel and the two are mixed by weights chosen on honest outputs
    (``kernel``; about twice one kernel's fit time): which kernel suits a table varies from table
    to table (docs/benchmarks.md, the kernel blend).

    ``class_weight``: ``None``, ``"balanced"`` (class ``k`` weighs ``n / (K n_k)``, ``n_k`` its
    training rows, as scikit-learn's) or a dict ``{label: weight}`` (labels not named weigh 1).
    The class weights multiply ``sample_weight`` and ``eval_sample_weight``, so the
    validation-based choices (iterations, ridge, temperature, the Platt map) are made on the
    class-weighted error too.

    Attributes:
        model_: The fitted model (``task="classification"``): a
            :class:`~xrfm_torch.models.blend.KernelBlend` of the Laplace- and Gaussian-kernel fits
            (the default), each an :class:`~xrfm_torch.xRFMTree`, or a ``BaggedTree`` when
            ``n_bags > 1``; with one kernel, that model itself.
        classes_: The labels, sorted; column ``k`` of ``predict_proba`` is ``classes_[k]``.
        n_features_in_: Columns seen in ``fit``; ``feature_names_in_`` for named columns.
    """

    _task: Task = "classification"
    _OWN_PARAMS: ClassVar[dict[str, Destination]] = {"class_weight": "fit"}

    def __init__(
        self,
        kernel: str | Kernel | tuple[str, ...] = DEFAULT_KERNELS,
        *,
        max_leaf_size: int = _TREE.max_leaf_size,
        n_iters: int = _LEAF.n_iters,
        reg: float = _LEAF.reg,
        diag: bool | str = _LEAF.diag,
        linear_mix: float = _LEAF.linear_mix,
        input_transform: str | Sequence[str] = _TREE.input_transform,
        n_trees: int | None = _TREE.n_trees,
        temperature: float | None = _TREE.temperature,
        val_fraction: float = _TREE.val_fraction,
        n_bags: int | str = "auto",
        categorical_features: CategoricalSpec = "auto",
        value_levels: bool = _TREE.value_levels,
        time_limit: float | None = None,
        random_state: int | np.random.RandomState | None = None,
        verbose: bool = False,
        device: str = "cpu",
        dtype: str = "float32",
        class_weight: str | dict[Any, float] | None = None,
    ) -> None:
        self._keep(locals())

    def fit(
        self,
        X: Any,
        y: Any,
        sample_weight: Any | None = None,
        eval_set: tuple[Any, Any] | None = None,
        eval_sample_weight: Any | None = None,
    ) -> XRFMClassifier:
        """Fit on ``X`` (n, d) and labels ``y`` (n,).

        Args:
            X: Array or DataFrame (text categories and missing cells allowed).
            y: Class labels (at least two classes).
            sample_weight: Row weights (n,): finite, non-negative, not all 0.
            eval_set: ``(X_val, y_val)`` for the validation-based choices; without it a seeded
                ``val_fraction`` of the rows is held out (and then refitted on).
            eval_sample_weight: Weights of the ``eval_set`` rows.
        """
        with self._budget():
            X, y = self._read_fit(X, y)
            check_classification_targets(y)
            self.classes_ = np.unique(y)
            if len(self.classes_) < 2:
                raise ValueError(
                    "XRFMClassifier needs at least 2 classes in y, got 1 class: "
                    f"{self.classes_[0]!r}"
                )
            w = self._weights(sample_weight, len(y), "sample_weight")
            return self._fit(X, self._encode_y(y, "y"), eval_set, w, eval_sample_weight)

    def _class_weighted(
        self,
        y: np.ndarray,
        w: np.ndarray | None,
        val: tuple[np.ndarray, np.ndarray] | None,
        w_val: np.ndarray | None,
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        per_class = self._class_weights(y)
        if per_class is None:
            return w, w_val
        cw = per_class[y.astype(np.int64)]
        w = cw if w is None else w * cw
        if val is not None:
            cv = per_class[val[1].astype(np.int64)]
            w_val = cv if w_val is None else w_val * cv
        return w, w_val

    def _class_weights(self, y: np.ndarray) -> np.ndarray | None:
        """Per class index, its weight (``class_weight``), or ``None``; ``y``: class indices."""
        cw, k = self.class_weight, len(self.classes_)
        if cw is None:
            return None
        if isinstance(cw, str):
            if cw != "balanced":
                raise ValueError(f"class_weight must be None, 'balanced' or a dict, got {cw!r}")
            counts = np.bincount(y.astype(np.int64), minlength=k).astype(np.float64)
            return len(y) / (k * np.maximum(counts, 1.0))
        if not isinstance(cw, dict):
            raise ValueError(f"class_weight must be None, 'balanced' or a dict, got {cw!r}")
        unknown = [c for c in cw if c not in set(self.classes_.tolist())]
        if unknown:
            raise ValueError(f"class_weight names labels not in y: {unknown[:5]}")
        out = np.ones(k)
        for label, value in cw.items():
            out[int(np.searchsorted(self.classes_, label))] = float(value)
        return out

    def _encode_y(self, y: Any, name: str) -> np.ndarray:
        y = np.asarray(y).ravel()
        index = np.searchsorted(self.classes_, y)
        index = np.clip(index, 0, len(self.classes_) - 1)
        unseen = self.classes_[index] != y
        if unseen.any():
            raise ValueError(
                f"{name} has labels not seen in fit: {sorted(set(y[unseen].tolist()))[:5]}"
            )
        return index.astype(np.float64)

    def predict_proba(self, X: Any) -> np.ndarray:
        """Class probabilities (n, K), rows summing to 1, columns in the order of ``classes_``."""
        x = self.encode(X)
        with torch.no_grad():
            p = self.model_.predict_proba(x).double()
        # renormalized in float64: rows that summed to 1 in float32 sum to 1 within 1e-15 here
        return (p / p.sum(1, keepdim=True)).cpu().numpy()

    def predict(self, X: Any) -> np.ndarray:
        """The most probable label of each row."""
        p = self.predict_proba(X)  # first: it raises NotFittedError before classes_ exists
        return self.classes_[p.argmax(1)]
