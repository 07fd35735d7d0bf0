"""An AutoGluon model: xRFM beside AutoGluon's GBDTs, in its ensembles and its k-fold bags.

:class:`XRFMModel` is AutoGluon's ``AbstractModel`` around ``XRFMRegressor`` /
``XRFMClassifier``::

    from autogluon.tabular import TabularPredictor
    from xrfm_torch.integrations.autogluon import XRFMModel

    TabularPredictor(label="y").fit(train, hyperparameters={XRFMModel: {}, "GBM": {}}, time_limit=120)

Regression, binary and multiclass. The estimators' own handling of categories (AutoGluon's
``category`` columns become one-hot blocks inside the model) and missing cells (a column's mean
plus an indicator) is used as it is: no one-hot encoding or imputation before. The time limit
AutoGluon gives a fit goes to the anytime fit (``time_limit``) with headroom for its tolerance;
``num_cpus`` sets torch's threads for the fit, ``num_gpus`` > 0 fits on CUDA; the validation
rows AutoGluon holds out are the estimator's ``eval_set``. Hyperparameters are the estimators'
constructor arguments (``{XRFMModel: {"n_iters": 10}}``).

Needs AutoGluon (``pip install 'xrfm-torch[autogluon]'``).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

try:
    from autogluon.core.constants import REGRESSION
    from autogluon.core.models import AbstractModel
except ModuleNotFoundError as err:  # pragma: no cover - exercised by the missing-extra test
    raise ModuleNotFoundError(
        f"the AutoGluon model needs autogluon.tabular ({err.name} is missing): "
        "pip install 'xrfm-torch[autogluon]'"
    ) from err

log = logging.getLogger(__name__)

#: The share of AutoGluon's time limit given to the anytime fit, less ``TIME_MARGIN_S``: the
#: anytime fit may end up to 10 % + 1 s past its own limit, and reading the table counts.
TIME_SHARE = 0.8
TIME_MARGIN_S = 1.0
#: Bytes of float32 kernel-matrix copies a leaf's solve holds at its peak (matrix, factor, work).
KERNEL_COPIES = 3
#: The process's baseline (torch, the model's buffers) in bytes.
BASELINE_BYTES = 400_000_000


def fit_time_limit(time_limit: float | None) -> float | None:
    """The anytime fit's limit for AutoGluon's ``time_limit`` seconds (``None``: no limit).

    ``TIME_SHARE * time_limit - TIME_MARGIN_S``, at least 0.5 s (a fit always returns a model:
    the quickest candidate, cut short).
    """
    if time_limit is None:
        return None
    return max(0.5, TIME_SHARE * float(time_limit) - TIME_MARGIN_S)


class XRFMModel(AbstractModel):
    """xRFM for ``TabularPredictor`` (the module docstring says what it does)."""

    ag_key = "XRFM_TORCH"
    ag_name = "XRFMTorch"
    ag_priority = 40
    seed_name = "random_state"

    def _estimator_class(self) -> Any:
        from xrfm_torch.estimators import XRFMClassifier, XRFMRegressor

        return XRFMRegressor if self.problem_type == REGRESSION else XRFMClassifier

    def _fit(
        self,
        X: Any,
        y: Any,
        X_val: Any = None,
        y_val: Any = None,
        time_limit: float | None = None,
        sample_weight: Any = None,
        sample_weight_val: Any = None,
        num_cpus: int | None = None,
        num_gpus: float | None = None,
        **kwargs: Any,
    ) -> None:
        import torch

        X = self.preprocess(X, is_train=True)
        params = dict(self._get_model_params())
        params.setdefault("device", "cuda" if num_gpus and torch.cuda.is_available() else "cpu")
        params["time_limit"] = fit_time_limit(time_limit)
        estimator = self._estimator_class()(**params)
        eval_set = None
        if X_val is not None and y_val is not None:
            eval_set = (self.preprocess(X_val), np.asarray(y_val))
        weights = None if sample_weight is None else np.asarray(sample_weight, dtype=np.float64)
        eval_weights = None
        if eval_set is not None and sample_weight_val is not None:
            eval_weights = np.asarray(sample_weight_val, dtype=np.float64)
        threads = torch.get_num_threads()
        if num_cpus is not None and int(num_cpus) >= 1:
            torch.set_num_threads(int(num_cpus))  # AutoGluon's share of the machine
        try:
            estimator.fit(
                X,
                np.asarray(y),
                sample_weight=weights,
                eval_set=eval_set,
                eval_sample_weight=eval_weights,
            )
        finally:
            torch.set_num_threads(threads)
        self.model = estimator

    @classmethod
    def _estimate_memory_usage_static(
        cls, *, X: Any, hyperparameters: dict[str, Any] | None = None, **kwargs: Any
    ) -> int:
        """Peak bytes of a fit: the largest leaf's kernel matrices plus copies of the inputs.

        ``BASELINE_BYTES + 4 * (KERNEL_COPIES * L^2 + 8 * n * d)`` with ``L = min(n,
        max_leaf_size)`` (the largest leaf's rows), ``n`` rows and ``d`` the model's input
        columns (a categorical column: its levels, at most 256; others: one each), in float32.
        """
        from xrfm_torch.tree.config import DEFAULTS

        n = len(X)
        leaf = min(n, int((hyperparameters or {}).get("max_leaf_size", DEFAULTS.max_leaf_size)))
        d = 0
        for name in X.columns:
            col = X[name]
            d += min(int(col.nunique()), 256) if str(col.dtype) in ("category", "object") else 1
        return int(BASELINE_BYTES + 4 * (KERNEL_COPIES * leaf**2 + 8 * n * max(d, 1)))

    def _more_tags(self) -> dict[str, Any]:
        # a refit on all rows holds out its own validation rows (val_fraction)
        return {"can_refit_full": True}
