"""The shared part of the scikit-learn estimators: parameters, input reading, the fit.

:class:`_XRFMEstimator` holds what :class:`~xrfm_torch.estimators.XRFMRegressor` and
:class:`~xrfm_torch.estimators.XRFMClassifier` share (the package docstring says what they are).
"""

from __future__ import annotations

import logging
from contextlib import AbstractContextManager
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from sklearn.base import BaseEstimator
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted, validate_data

from xrfm_torch.data.tabular import (
    TableEncoder,
    by_name,
    categorical_columns,
    plain_frame,
)
from xrfm_torch.kernels import Kernel
from xrfm_torch.leaf import LeafConfig
from xrfm_torch.models import xRFMTree
from xrfm_torch.models.contract import Model
from xrfm_torch.models.factory import (  # noqa: F401 (AUTO_*: re-exported)
    AUTO_BAG_ROWS,
    AUTO_BAGS,
    build_model,
    resolve_bags,
)
from xrfm_torch.models.ladder import check_time_limit
from xrfm_torch.numerics import deadline
from xrfm_torch.numerics.progress import FitBar, on_iteration
from xrfm_torch.numerics.threads import check_threads
from xrfm_torch.tree.config import DEFAULTS, TreeConfig
from xrfm_torch.tree.targets import Task

log = logging.getLogger(__name__)

# the defaults come from the configs' own (tree.config.DEFAULTS), never repeated here
_TREE = DEFAULTS
_LEAF = DEFAULTS.leaf

#: Where a parameter goes: a field of every leaf's ``LeafConfig`` (``"leaf"``), of the tree's
#: ``TreeConfig`` (``"tree"``), another ``xRFMTree`` argument (``"model"``) or the estimator's
#: own use (``"fit"``: kernels, bags, table reading, time limit, seed, device).
Destination = Literal["leaf", "tree", "model", "fit"]

#: The one table of the parameters both estimators share, in signature order, and where each
#: goes. Each estimator's signature lists them (scikit-learn reads parameters from the
#: signature) with their defaults read from the configs; ``tests/test_estimators.py`` checks the
#: signatures against this table and the configs.
PARAMS: dict[str, Destination] = {
    "kernel": "fit",
    "max_leaf_size": "tree",
    "n_iters": "leaf",
    "reg": "leaf",
    "diag": "leaf",
    "linear_mix": "leaf",
    "input_transform": "tree",
    "n_trees": "tree",
    "temperature": "tree",
    "val_fraction": "tree",
    "n_bags": "fit",
    "categorical_features": "fit",  # a table's columns; the tree gets their encoded indices
    "value_levels": "tree",
    "time_limit": "fit",
    "random_state": "fit",
    "verbose": "fit",
    "device": "fit",
    "dtype": "fit",
}


class _XRFMEstimator(BaseEstimator):
    """Shared parameters, fitting and prediction of the two estimators.

    Args:
        kernel: ``"laplace"``, ``"lpq"``, ``"product_laplace"``, ``"gaussian"`` or a ``Kernel``;
            or a tuple of names, such as the default ``("laplace", "gaussian")``:
            the model (one tree or its bags) is fitted once per kernel, and the fits are mixed
            with weights in ``{0, 0.25, ..., 1}`` chosen on their honest outputs (out-of-fold
            with bags, else the validation rows'; :class:`~xrfm_torch.models.blend.KernelBlend`,
            ``model_``), about one fit's time per kernel.
        max_leaf_size: ``L_max``: a node with more training rows is split. A classifier's
            bags split down to half of it (``BaggedTree(size_fraction)``).
        n_iters: ``tau``: most AGOP updates per leaf (leaves stop when their validation error
            levels off).
        reg: Ridge of the leaves' kernel ridge regressions.
        diag: Diagonal ``M`` (``True``), full (``False``) or chosen per leaf (``"auto"``).
        linear_mix: Weight of the constant + linear part of the leaf kernel.
        input_transform: What the trees see: ``"identity"``, ``"quantile"``, ``"quantile+raw"``,
            ``"log"`` / ``"quantile+log"`` (the first / third with zero-inflated money and count
            columns on a log scale), a list of these, or ``"auto"``.
        n_trees: Trees per input map, averaged (``None``: 2 for classification, else 1).
        temperature: Soft-routing temperature; ``None`` tunes it on validation data.
        val_fraction: Share of the training rows held out for the validation-based choices when
            ``fit`` gets no ``eval_set``.
        n_bags: ``1``: one model. ``K >= 2``: ``K`` cross-fitted bags
            (:class:`~xrfm_torch.models.bagging.BaggedTree`): the training and ``eval_set`` rows are
            pooled and cut into ``K`` folds, bag ``k`` validating on fold ``k``, predictions
            averaged; ``model_.oof_`` holds the out-of-fold predictions (mixed, for a kernel
            blend; about ``K`` times the fit time). ``"auto"``: ``AUTO_BAGS`` bags when the fit has at most
            ``AUTO_BAG_ROWS`` rows (training plus ``eval_set``), else one model (the
            classifier's default: on small tables a single model's validation rows are too few
            to calibrate its probabilities, and up to ~20 000 rows the bags still lowered the
            log-loss on every dev table; docs/benchmarks.md).
        categorical_features: ``"auto"`` (a DataFrame's text, category and bool columns; the
            text columns of an object array), a list of column indices or names, or ``None``.
            Their levels are learned in ``fit`` (:class:`~xrfm_torch.data.tabular.TableEncoder`);
            the trees see each as a one-hot block of at most 256 columns; a level ``fit`` never
            saw, like a missing cell, lights none.
        value_levels: Give numeric columns whose values act as codes for the target (mostly one
            value, otherwise repeated amounts whose outcome differs amount by amount, such as
            capital gains; or identifiers written as numbers, such as subject or store numbers)
            a one-hot block of their values beside the number
            (:func:`~xrfm_torch.inputs.levels.level_columns`; docs/design.md).
        time_limit: Seconds the fit may take, or ``None`` (no limit: the model above). With a
            limit the fit is anytime (:class:`~xrfm_torch.models.anytime.Anytime`): it fits a
            quick small-leaf tree first, then the model above's cheaper parts (one tree per
            kernel, their mix, the bags, their mix) while the time lasts, and keeps the one
            with the lowest honest loss (the model above, where it was fitted, unless another
            beats it clearly); a single kernel's model is followed, with the time it
            leaves, by the other kernel's and their mix. It ends within 10 % plus a second of
            the limit (``model_.summary()`` says what it tried and the share left unused).
        random_state: Seed (int), ``numpy.random.RandomState``, or ``None`` (numpy's global
            generator draws one). An int gives the model ``xRFMTree`` fits with that seed.
        verbose: Show a progress bar over the leaf fits.
        device: Torch device of the fit (``"cpu"``, ``"cuda"``).
        dtype: ``"float32"`` or ``"float64"``.

    Missing cells (NaN, None, empty) are handled in every column: a numeric one's training mean,
    plus a missing indicator where the training rows had missing cells; a categorical one lights
    no level.

    ``fit(X, y, sample_weight=w)`` weights every part of the fit (the solves, the AGOP, the
    splits and every validation-based choice; :meth:`xrfm_torch.xRFMTree.fit`), with
    ``eval_sample_weight`` for the rows of ``eval_set``. Only the weights' ratios matter; rows of
    weight 0 are left out.
    """

    _task: Task = "regression"
    #: The estimator's own parameters besides :data:`PARAMS`, and where each goes.
    _OWN_PARAMS: ClassVar[dict[str, Destination]] = {}

    @classmethod
    def _param_table(cls) -> dict[str, Destination]:
        """Every parameter of this estimator and where it goes (:data:`PARAMS` and its own)."""
        return {**PARAMS, **cls._OWN_PARAMS}

    def _keep(self, args: dict[str, Any]) -> None:
        """Store the constructor's arguments as they came (scikit-learn's ``__init__`` rule)."""
        for name in self._param_table():
            setattr(self, name, args[name])

    def _params(self, destination: Destination) -> dict[str, Any]:
        """The parameters that go to ``destination``, by name."""
        return {k: getattr(self, k) for k, to in self._param_table().items() if to == destination}

    # ---- conversions ---------------------------------------------------------------------------
    def _torch_dtype(self) -> torch.dtype:
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")
        return getattr(torch, self.dtype)

    def _tensor(self, a: np.ndarray, dtype: torch.dtype | None = None) -> torch.Tensor:
        # a copy: the input may be read-only (memory-mapped), and torch wants writable memory
        return torch.tensor(np.asarray(a), dtype=dtype or self._torch_dtype(), device=self.device)

    def _y_tensor(self, y: np.ndarray) -> torch.Tensor:
        """Targets as a tensor: labels in ``dtype``, regression targets in float64.

        The model standardizes float64 targets before the cast to ``dtype``, so an offset or a
        scale of the targets costs none of their digits.
        """
        return self._tensor(y, torch.float64 if self._task == "regression" else None)

    def _bags(self, y: np.ndarray) -> int:
        """The number of bags for a fit on the (pooled) targets ``y`` (``"auto"`` resolved).

        ``"auto"`` keeps one model where bags could not all train on every class (a class of a
        single row) or folds would hold fewer than 4 rows.
        """
        classes = self._task == "classification" and self.n_bags == "auto"
        rarest = int(np.unique(y, return_counts=True)[1].min()) if classes else None
        return resolve_bags(self.n_bags, self._task, len(y), rarest)

    def _kernels(self) -> list[str | Kernel]:
        """``kernel`` as a list: one name or ``Kernel``, or the names of a blend."""
        k = self.kernel
        if isinstance(k, (str, Kernel)):
            return [k]
        names: list[str | Kernel] = list(k) if isinstance(k, (list, tuple)) else []
        if not names or not all(isinstance(n, str) for n in names):
            raise ValueError(
                f"kernel must be a kernel name, a Kernel or a tuple of names, got {k!r}"
            )
        return names

    def _new_tree(self, y: np.ndarray) -> Model:
        kernels = self._kernels()
        n_bags = self._bags(y)
        config = TreeConfig(
            leaf=LeafConfig(**self._params("leaf")),
            categorical_features=self.encoder_.categorical or None,
            **self._params("tree"),
        )
        tree = xRFMTree(
            kernels[0],
            config,
            task=self._task,
            missing_values="any",  # tables: a missing cell may turn up in any column
            **self._params("model"),
        )
        blend = None if len(kernels) == 1 else [str(k) for k in kernels]
        return build_model(tree, n_bags, blend, check_time_limit(self.time_limit))

    def _budget(self) -> AbstractContextManager[None]:
        """The fit's time limit, from the start of ``fit`` (reading the table counts)."""
        return deadline.within(check_time_limit(self.time_limit))

    def _generator(self) -> torch.Generator:
        if isinstance(self.random_state, (int, np.integer)):
            seed = int(self.random_state)
        else:
            seed = int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
        return torch.Generator().manual_seed(seed)

    def _progress(self) -> FitBar | None:
        return FitBar(f"{type(self).__name__} fit") if self.verbose else None

    # ---- fitting and prediction ----------------------------------------------------------------
    def _weights(self, w: Any, n: int, name: str) -> np.ndarray | None:
        """``w`` as a float64 (n,) array (the core checks the values), or ``None``."""
        if w is None:
            return None
        try:
            a = np.asarray(w, dtype=np.float64)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{name} must be numbers, got {type(w).__name__}") from err
        if a.ndim != 1 or a.shape[0] != n:
            raise ValueError(f"{name} must have shape ({n},), got {a.shape}")
        return a

    def _fit(
        self,
        X: np.ndarray,
        y: np.ndarray,
        eval_set: tuple[Any, Any] | None,
        sample_weight: np.ndarray | None = None,
        eval_sample_weight: Any | None = None,
    ) -> Any:
        val = None
        if eval_set is not None:
            if not (isinstance(eval_set, (tuple, list)) and len(eval_set) == 2):
                raise ValueError("eval_set must be a pair (X_val, y_val)")
            val = (self._read(eval_set[0]), self._encode_y(eval_set[1], "eval_set y"))
        elif eval_sample_weight is not None:
            raise ValueError("eval_sample_weight needs eval_set")
        w_val = (
            None
            if val is None
            else self._weights(eval_sample_weight, len(val[1]), "eval_sample_weight")
        )
        sample_weight, w_val = self._class_weighted(y, sample_weight, val, w_val)
        check_threads(self.device)  # a busy CPU: say which threads to set (numerics.threads)
        self.model_ = self._new_tree(y if val is None else np.concatenate([y, val[1]]))
        bar = self._progress()
        try:
            with on_iteration(None if bar is None else bar.iteration):
                self.model_.fit(
                    self._tensor(X),
                    self._y_tensor(y),
                    None if val is None else self._tensor(val[0]),
                    None if val is None else self._y_tensor(val[1]),
                    sample_weight=None if sample_weight is None else self._tensor(sample_weight),
                    val_sample_weight=None if w_val is None else self._tensor(w_val),
                    generator=self._generator(),
                    progress=None if bar is None else bar.leaf_done,
                )
        finally:
            if bar is not None:
                bar.close()
        return self

    def _encode_y(self, y: Any, name: str) -> np.ndarray:
        raise NotImplementedError

    def _class_weighted(
        self,
        y: np.ndarray,
        w: np.ndarray | None,
        val: tuple[np.ndarray, np.ndarray] | None,
        w_val: np.ndarray | None,
    ) -> tuple[np.ndarray | None, np.ndarray | None]:
        """The training and validation weights with the class weights applied (classifier)."""
        return w, w_val

    def _read_fit(self, X: Any, y: Any, **y_checks: Any) -> tuple[np.ndarray, np.ndarray]:
        """Check ``X`` and ``y``, learn the categorical columns' levels, give the float matrix."""
        table = X = plain_frame(X)  # a DataFrame's columns as float64 or object (any dtype)
        X, y = validate_data(
            self, X, y, dtype=None, ensure_all_finite=False, ensure_min_samples=4, **y_checks
        )
        names = getattr(self, "feature_names_in_", None)
        names = (
            [str(n) for n in names] if names is not None else [f"x{j}" for j in range(X.shape[1])]
        )
        dtypes = getattr(table, "dtypes", None)  # a DataFrame's column dtypes
        categorical = categorical_columns(X, self.categorical_features, names, dtypes)
        self.encoder_ = TableEncoder.fit(X, categorical, names)
        return self.encoder_.transform(X), y

    def _read(self, X: Any) -> np.ndarray:
        """``X`` as the float matrix of the fitted columns (codes for the categorical ones)."""
        X = validate_data(
            self, plain_frame(self._by_name(X)), reset=False, dtype=None, ensure_all_finite=False
        )
        return self.encoder_.transform(X)

    def _by_name(self, X: Any) -> Any:
        """A DataFrame's columns in the order ``fit`` saw them (:func:`~xrfm_torch.data.tabular.by_name`)."""
        names = getattr(self, "feature_names_in_", None)
        return X if names is None else by_name(X, list(names))

    def encode(self, X: Any) -> torch.Tensor:
        """The rows ``model_`` reads: ``X`` (array or DataFrame) encoded as ``fit`` learned.

        Columns by name, numbers as floats, text categories as codes of the training levels
        (a level never seen, like a missing cell, as NaN or -1), in the estimator's ``dtype`` and
        on its ``device``. ``model_(est.encode(X))`` gives what ``predict`` / ``predict_proba``
        give, and so do an exported program or ONNX file of the estimator
        (:func:`~xrfm_torch.export_program`), which take these rows; this is the one step
        between a DataFrame and them.

        Returns:
            A float tensor (n, n_features_in_).
        """
        check_is_fitted(self, "model_")
        return self._tensor(self._read(X))

    def _scores(self, X: Any) -> torch.Tensor:
        x = self.encode(X)
        with torch.no_grad():
            return self.model_(x)

    def compress(self, max_support: int = 1000) -> Any:
        """A lighter predictor, in place: ``model_.compress(max_support)`` (seeded by ``random_state``).

        Every large exact leaf then predicts from at most ``max_support`` k-means centres
        (:meth:`xrfm_torch.models.contract.Model.compress`). Returns ``self``.
        """
        check_is_fitted(self, "model_")
        self.model_.compress(max_support, generator=self._generator())
        return self

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        tags.input_tags.allow_nan = True  # missing cells: see xrfm_torch.inputs.input_map.InputMap
        return tags
