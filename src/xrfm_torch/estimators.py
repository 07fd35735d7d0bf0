"""scikit-learn estimators: :class:`XRFMRegressor` and :class:`XRFMClassifier`.

Thin adapters around :class:`~xrfm_torch.xRFMTree`: numpy or pandas in (numbers, text categories,
missing cells), numpy out, labels of any type for the classifier, ``get_params``/``set_params``/``clone``. The fitted
tree is ``tree_`` (head use, interpretation, ``state_dict``). Defaults are the core's: each
parameter below defaults to the value of the same-named :class:`~xrfm_torch.LeafConfig` field or
``xRFMTree`` argument, read from there, so there is still one home for them.

Needs scikit-learn (``pip install 'xrfm-torch[sklearn]'``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from sklearn.base import BaseEstimator, ClassifierMixin, RegressorMixin
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_is_fitted, validate_data

from xrfm_torch.data.tabular import (
    CategoricalSpec,
    TableEncoder,
    categorical_columns,
    plain_frame,
)
from xrfm_torch.kernels import Kernel
from xrfm_torch.leaf import LeafConfig
from xrfm_torch.tree import BaggedTree, xRFMTree
from xrfm_torch.tree.config import DEFAULTS
from xrfm_torch.tree.targets import Task
from xrfm_torch.tree.uncertainty import Uncertainty

log = logging.getLogger(__name__)

# the defaults come from the configs' own (tree.config.DEFAULTS), never repeated here
_TREE = DEFAULTS
_LEAF = DEFAULTS.leaf
#: The leaf settings the estimators expose; the others keep LeafConfig's defaults.
LEAF_PARAMS = ("n_iters", "reg", "diag", "linear_mix")
#: ``n_bags="auto"``: this many cross-fitted bags for a fit of at most ``AUTO_BAG_ROWS`` rows.
AUTO_BAGS = 5
AUTO_BAG_ROWS = 5000
#: The tree arguments the estimators expose.
TREE_PARAMS = ("max_leaf_size", "input_transform", "n_trees", "temperature", "val_fraction")


class _XRFMEstimator(BaseEstimator):
    """Shared parameters, fitting and prediction of the two estimators.

    Args:
        kernel: ``"laplace"``, ``"lpq"``, ``"product_laplace"``, ``"gaussian"`` or a ``Kernel``.
        max_leaf_size: ``L_max``: a node with more training rows is split.
        n_iters: ``tau``: most AGOP updates per leaf (leaves stop when their validation error
            levels off).
        reg: Ridge of the leaves' kernel ridge regressions.
        diag: Diagonal ``M`` (``True``), full (``False``) or chosen per leaf (``"auto"``).
        linear_mix: Weight of the constant + linear part of the leaf kernel.
        input_transform: What the trees see: ``"identity"``, ``"quantile"``, ``"quantile+raw"``,
            a list of these, or ``"auto"``.
        n_trees: Trees per input map, averaged (``None``: 2 for classification, else 1).
        temperature: Soft-routing temperature; ``None`` tunes it on validation data.
        val_fraction: Share of the training rows held out for the validation-based choices when
            ``fit`` gets no ``eval_set``.
        n_bags: ``1``: one model. ``K >= 2``: ``K`` cross-fitted bags
            (:class:`~xrfm_torch.tree.bagging.BaggedTree`): the training and ``eval_set`` rows are
            pooled and cut into ``K`` folds, bag ``k`` validating on fold ``k``, predictions
            averaged; ``tree_.oof_`` holds the out-of-fold predictions (about ``K`` times the
            fit time). ``"auto"``: ``AUTO_BAGS`` bags when the fit has at most
            ``AUTO_BAG_ROWS`` rows (training plus ``eval_set``), else one model (the
            classifier's default: on small tables a single model's validation rows are too few
            to calibrate its probabilities; docs/benchmarks.md).
        categorical_features: ``"auto"`` (a DataFrame's text, category and bool columns; the
            text columns of an object array), a list of column indices or names, or ``None``.
            Their levels are learned in ``fit`` (:class:`~xrfm_torch.data.tabular.TableEncoder`);
            the trees see each as a one-hot block of at most 16 columns; a level ``fit`` never
            saw, like a missing cell, lights none.
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

    def __init__(
        self,
        kernel: str | Kernel = "laplace",
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
        random_state: int | np.random.RandomState | None = None,
        verbose: bool = False,
        device: str = "cpu",
        dtype: str = "float32",
    ) -> None:
        self.kernel = kernel
        self.max_leaf_size = max_leaf_size
        self.n_iters = n_iters
        self.reg = reg
        self.diag = diag
        self.linear_mix = linear_mix
        self.input_transform = input_transform
        self.n_trees = n_trees
        self.temperature = temperature
        self.val_fraction = val_fraction
        self.n_bags = n_bags
        self.categorical_features = categorical_features
        self.random_state = random_state
        self.verbose = verbose
        self.device = device
        self.dtype = dtype

    # ---- conversions ---------------------------------------------------------------------------
    def _torch_dtype(self) -> torch.dtype:
        if self.dtype not in ("float32", "float64"):
            raise ValueError(f"dtype must be 'float32' or 'float64', got {self.dtype!r}")
        return getattr(torch, self.dtype)

    def _tensor(self, a: np.ndarray) -> torch.Tensor:
        # a copy: the input may be read-only (memory-mapped), and torch wants writable memory
        return torch.tensor(np.asarray(a), dtype=self._torch_dtype(), device=self.device)

    def _bags(self, y: np.ndarray) -> int:
        """The number of bags for a fit on the (pooled) targets ``y`` (``"auto"`` resolved).

        ``"auto"`` keeps one model where bags could not all train on every class (a class of a
        single row) or folds would hold fewer than 4 rows.
        """
        n = self.n_bags
        if isinstance(n, str) and n == "auto":
            if not 4 * AUTO_BAGS <= len(y) <= AUTO_BAG_ROWS:
                return 1
            if self._task == "classification" and np.unique(y, return_counts=True)[1].min() < 2:
                return 1
            return AUTO_BAGS
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"n_bags must be an int >= 1 or 'auto', got {n!r}")
        return int(n)

    def _new_tree(self, y: np.ndarray) -> xRFMTree | BaggedTree:
        n_bags = self._bags(y)
        leaf = LeafConfig(**{k: getattr(self, k) for k in LEAF_PARAMS})
        tree_args = {k: getattr(self, k) for k in TREE_PARAMS}
        categorical = self.encoder_.categorical or None
        tree = xRFMTree(
            self.kernel,
            task=self._task,
            leaf=leaf,
            categorical_features=categorical,
            missing_values="any",  # tables: a missing cell may turn up in any column
            **tree_args,
            **self._task_args(),
        )
        return tree if n_bags == 1 else BaggedTree(tree, n_bags=n_bags)

    def _task_args(self) -> dict[str, Any]:
        """Tree arguments only one task has."""
        return {}

    def _generator(self) -> torch.Generator:
        if isinstance(self.random_state, (int, np.integer)):
            seed = int(self.random_state)
        else:
            seed = int(check_random_state(self.random_state).randint(np.iinfo(np.int32).max))
        return torch.Generator().manual_seed(seed)

    def _progress(self) -> Any:
        if not self.verbose:
            return None, None
        from tqdm.auto import tqdm  # lightning's dependency

        bar = tqdm(desc=f"{type(self).__name__} leaves", unit="leaf")

        def progress(tree: int, done: int, total: int) -> None:
            bar.set_postfix(tree=tree + 1)
            bar.total = (bar.total or 0) + (total if done == 1 else 0)
            bar.update(1)

        return progress, bar

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
        self.tree_ = self._new_tree(y if val is None else np.concatenate([y, val[1]]))
        progress, bar = self._progress()
        try:
            self.tree_.fit(
                self._tensor(X),
                self._tensor(y),
                None if val is None else self._tensor(val[0]),
                None if val is None else self._tensor(val[1]),
                sample_weight=None if sample_weight is None else self._tensor(sample_weight),
                val_sample_weight=None if w_val is None else self._tensor(w_val),
                generator=self._generator(),
                progress=progress,
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
        """A DataFrame's columns in the order ``fit`` saw them (by name; extra ones dropped).

        A column ``fit`` had and ``X`` lacks is an error naming it; a column ``fit`` never saw is
        dropped with a warning naming it (the model has no use for it).
        """
        names = getattr(self, "feature_names_in_", None)
        columns = getattr(X, "columns", None)
        if names is None or columns is None or list(columns) == list(names):
            return X
        have = [str(c) for c in columns]
        missing = [n for n in names if n not in have]
        if missing:
            raise ValueError(f"X lacks columns the model was fitted on: {missing[:10]}")
        extra = [c for c in have if c not in set(names)]
        if extra:
            log.warning("X has columns the model was not fitted on; ignoring %s", extra[:10])
        return X[list(names)]

    def _scores(self, X: Any) -> torch.Tensor:
        check_is_fitted(self, "tree_")
        X = self._read(X)
        with torch.no_grad():
            return self.tree_(self._tensor(X))

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.non_deterministic = False
        tags.input_tags.allow_nan = True  # missing cells: see xrfm_torch.inputs.input_map.InputMap
        return tags


class XRFMRegressor(RegressorMixin, _XRFMEstimator):
    """xRFM regression as a scikit-learn estimator (parameters: see ``_XRFMEstimator``).

    Besides those: ``uncertainty`` (``"none"``, ``"calibrated"`` or ``"gp"``; see
    :class:`~xrfm_torch.xRFMTree`) enables ``predict(X, return_std=True)`` and
    :meth:`predict_interval`, standard deviations in the target's units.

    Attributes:
        tree_: The fitted :class:`~xrfm_torch.xRFMTree` (a ``BaggedTree`` when ``n_bags > 1``).
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

    def __init__(
        self,
        kernel: str | Kernel = "laplace",
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
        random_state: int | np.random.RandomState | None = None,
        verbose: bool = False,
        device: str = "cpu",
        dtype: str = "float32",
        uncertainty: Uncertainty = "none",
    ) -> None:
        super().__init__(
            kernel,
            max_leaf_size=max_leaf_size,
            n_iters=n_iters,
            reg=reg,
            diag=diag,
            linear_mix=linear_mix,
            input_transform=input_transform,
            n_trees=n_trees,
            temperature=temperature,
            val_fraction=val_fraction,
            n_bags=n_bags,
            categorical_features=categorical_features,
            random_state=random_state,
            verbose=verbose,
            device=device,
            dtype=dtype,
        )
        self.uncertainty = uncertainty

    def _task_args(self) -> dict[str, Any]:
        return {"uncertainty": self.uncertainty}

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
        check_is_fitted(self, "tree_")
        x = self._tensor(self._read(X))
        with torch.no_grad():
            mean, std = self.tree_(x, return_std=True)
        return self._shaped(mean), self._shaped(std)

    def predict_interval(self, X: Any, coverage: float = 0.9) -> tuple[np.ndarray, np.ndarray]:
        """Central predictive interval ``(lower, upper)`` holding ``coverage`` of the mass."""
        check_is_fitted(self, "tree_")
        x = self._tensor(self._read(X))
        with torch.no_grad():
            lower, upper = self.tree_.predict_interval(x, coverage)
        return self._shaped(lower), self._shaped(upper)

    def _shaped(self, out: torch.Tensor) -> np.ndarray:
        a = out.double().cpu().numpy()
        return a[:, 0] if self._y_ndim == 1 else a

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True
        return tags


class XRFMClassifier(ClassifierMixin, _XRFMEstimator):
    """xRFM classification as a scikit-learn estimator (parameters: see ``_XRFMEstimator``).

    Labels may be of any type (str, int, bool); the leaves fit one-hot codes and
    ``predict_proba`` maps their scores to probabilities with a Platt map on the log-scores
    fitted on the validation rows (``xRFMTree(calibration="platt")``), clipped to
    [1e-3, 1 - 1e-3] and renormalized.

    ``class_weight``: ``None``, ``"balanced"`` (class ``k`` weighs ``n / (K n_k)``, ``n_k`` its
    training rows, as scikit-learn's) or a dict ``{label: weight}`` (labels not named weigh 1).
    The class weights multiply ``sample_weight`` and ``eval_sample_weight``, so the
    validation-based choices (iterations, ridge, temperature, the Platt map) are made on the
    class-weighted error too.

    Attributes:
        tree_: The fitted :class:`~xrfm_torch.xRFMTree` (``task="classification"``; a
            ``BaggedTree`` when ``n_bags > 1``).
        classes_: The labels, sorted; column ``k`` of ``predict_proba`` is ``classes_[k]``.
        n_features_in_: Columns seen in ``fit``; ``feature_names_in_`` for named columns.
    """

    _task: Task = "classification"

    def __init__(
        self,
        kernel: str | Kernel = "laplace",
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
        random_state: int | np.random.RandomState | None = None,
        verbose: bool = False,
        device: str = "cpu",
        dtype: str = "float32",
        class_weight: str | dict[Any, float] | None = None,
    ) -> None:
        super().__init__(
            kernel,
            max_leaf_size=max_leaf_size,
            n_iters=n_iters,
            reg=reg,
            diag=diag,
            linear_mix=linear_mix,
            input_transform=input_transform,
            n_trees=n_trees,
            temperature=temperature,
            val_fraction=val_fraction,
            n_bags=n_bags,
            categorical_features=categorical_features,
            random_state=random_state,
            verbose=verbose,
            device=device,
            dtype=dtype,
        )
        self.class_weight = class_weight

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
        X, y = self._read_fit(X, y)
        check_classification_targets(y)
        self.classes_ = np.unique(y)
        if len(self.classes_) < 2:
            raise ValueError(
                f"XRFMClassifier needs at least 2 classes in y, got 1 class: {self.classes_[0]!r}"
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
        check_is_fitted(self, "tree_")
        x = self._tensor(self._read(X))
        with torch.no_grad():
            return self.tree_.predict_proba(x).double().cpu().numpy()

    def predict(self, X: Any) -> np.ndarray:
        """The most probable label of each row."""
        p = self.predict_proba(X)  # first: it raises NotFittedError before classes_ exists
        return self.classes_[p.argmax(1)]
