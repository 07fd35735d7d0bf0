"""scikit-learn regressor: :class:`XRFMRegressor`."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from sklearn.base import RegressorMixin

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
from xrfm_torch.tree.uncertainty import Uncertainty

log = logging.getLogger(__name__)


class XRFMRegressor(RegressorMixin, _XRFMEstimator):
    """xRFM regression as a scikit-learn estimator (parameters: see ``_XRFMEstimator``).

    Besides those: ``uncertainty`` (``"none"``, ``"calibrated"`` or ``"gp"``; see
    :class:`~xrfm_torch.xRFMTree`) enables ``predict(X, return_std=True)`` and
    :meth:`predict_interval`, standard deviations in the target's units.

    Attributes:
        model_: The fitted model: by default a :class:`~xrfm_torch.KernelBlend` of a Laplace and
            a Gaussian tree; one :class:`~xrfm_torch.xRFMTree` for one kernel (a ``BaggedTree``
            when ``n_bags > 1``).
        n_features_in_: Columns seen in ``fit``; ``feature_names_in_`` for named columns.

    Example:
        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> X = rng.normal(size=(300, 3)); y = np.sin(X[:, 0]) * 100
        >>> model = XRFMRegressor(n_iters=2, random_state=0).fit(X, y)
        >>> model.predict(X[:2]).shape, model.score(X, y) > 0.9
        ((2,), True)
        >>> noisy = XRFMRegressor(n_iters=2, uncertainty="calibrated", random_state=0).fit(X, y)
        >>> mean, std = noisy.predict(X[:2], return_std=True)
        >>> bool((std > 0).all())
        True
    """

    _task: Task = "regression"
    _OWN_PARAMS: ClassVar[dict[str, Destination]] = {"uncertainty": "model"}

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
        n_bags: int | str = 1,
        categorical_features: CategoricalSpec = "auto",
        value_levels: bool = _TREE.value_levels,
        time_limit: float | None = None,
        random_state: int | np.random.RandomState | None = None,
        verbose: bool = False,
        device: str = "cpu",
        dtype: str = "float32",
        uncertainty: Uncertainty = "none",
    ) -> None:
        self._keep(locals())

    def fit(
        self,
        X: Any,
        y: Any,
        sample_weight: Any | None = None,
        eval_set: tuple[Any, Any] | None = None,
        eval_sample_weight: Any | None = None,
    ) -> XRFMRegressor:
        """Fit on ``X`` (n, d) and targets ``y`` (n,) or (n, c).

        Args:
            X: Array or DataFrame (text categories and missing cells allowed).
            y: Targets.
            sample_weight: Row weights (n,): finite, non-negative, not all 0.
            eval_set: ``(X_val, y_val)`` for the validation-based choices; without it a seeded
                ``val_fraction`` of the rows is held out (and then refitted on).
            eval_sample_weight: Weights of the ``eval_set`` rows.
        """
        with self._budget():
            X, y = self._read_fit(X, y, y_numeric=True, multi_output=True)
            self._y_ndim = np.ndim(y)
            w = self._weights(sample_weight, len(y), "sample_weight")
            return self._fit(X, self._encode_y(y, "y"), eval_set, w, eval_sample_weight)

    def _encode_y(self, y: Any, name: str) -> np.ndarray:
        return np.asarray(y, dtype=np.float64)

    def predict(
        self, X: Any, return_std: bool = False
    ) -> np.ndarray | tuple[np.ndarray, np.ndarray]:
        """Predictions (n,) (or (n, c) for 2-D targets), float64.

        Args:
            X: Array or DataFrame.
            return_std: Also return the predictive standard deviations, like
                ``GaussianProcessRegressor.predict`` (needs ``uncertainty="calibrated"`` or
                ``"gp"``).

        Returns:
            The predictions, or ``(predictions, standard deviations)``.
        """
        if not return_std:
            return self._shaped(self._scores(X))
        x = self.encode(X)
        with torch.no_grad():
            mean, std = self.model_(x, return_std=True)
        return self._shaped(mean), self._shaped(std)

    def predict_interval(self, X: Any, coverage: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """Central predictive interval ``(lower, upper)`` holding ``coverage`` of the mass."""
        x = self.encode(X)
        with torch.no_grad():
            lower, upper = self.model_.predict_interval(x, coverage)
        return self._shaped(lower), self._shaped(upper)

    def _shaped(self, out: torch.Tensor) -> np.ndarray:
        a = out.double().cpu().numpy()
        return a[:, 0] if self._y_ndim == 1 else a

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags
