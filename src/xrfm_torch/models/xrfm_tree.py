"""xRFMTree: the fitted model (a tree, or an averaged ensemble of trees, of LeafRFMs)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor, nn

from xrfm_torch.inputs.input_map import (
    InputMap,
    InputTransform,
    MissingValues,
)
from xrfm_torch.kernels import KERNELS, Kernel, make_kernel
from xrfm_torch.models.contract import Recipe
from xrfm_torch.models.fit_steps import fit_rows, honest_outputs, prepare_fit
from xrfm_torch.models.routed_trees import RoutedTrees
from xrfm_torch.numerics.config import to_config
from xrfm_torch.numerics.events import summarize_fallbacks
from xrfm_torch.numerics.rng import own_generator
from xrfm_torch.tree.config import SETTINGS, TreeConfig, tree_config
from xrfm_torch.tree.fit import fit_trees, refit_trees
from xrfm_torch.tree.grow import Progress
from xrfm_torch.tree.parallel import broadcast_module
from xrfm_torch.tree.plan import FitPlan
from xrfm_torch.tree.targets import Calibration, ClassCoding, TargetCoding, Task
from xrfm_torch.tree.uncertainty import (
    Uncertainty,
    VarianceModel,
    check_uncertainty,
)

log = logging.getLogger(__name__)

#: The kernel arguments :meth:`xRFMTree.with_kernel` keeps (where the new kernel class takes them).
KEPT_KERNEL_ARGS = ("bandwidth", "eps", "chunk_bytes")


class xRFMTree(RoutedTrees):  # noqa: N801 (the method's name)
    """Tree-partitioned Recursive Feature Machine, fitted in closed form.

    ``fit`` grows a supervised median-split tree (each split: top AGOP eigenvector of a small RFM on
    a row subsample) until leaves hold at most ``max_leaf_size`` rows, then fits a :class:`LeafRFM`
    (kernel ridge regression + ``n_iters`` AGOP updates, best iteration by validation error) in each
    leaf. ``forward`` routes rows hard (``temperature == 0``) or softly through every leaf.

    Its settings are one :class:`~xrfm_torch.tree.config.TreeConfig` (``config``), defaulted and
    documented there: ``leaf`` (every leaf's :class:`~xrfm_torch.leaf.config.LeafConfig`;
    ``tau = leaf.n_iters``), ``max_leaf_size`` (``L_max``), the split rule, overlap and trees, the
    routing temperature, validation borrowing, input maps, categorical columns, large and
    distributed fits, the memory budget, leaves in lockstep. Any of its fields may also be given
    as a keyword argument (``xRFMTree(max_leaf_size=500)``), which replaces that field of
    ``config``. The model holds them in :attr:`config` (read, and set, as its attributes too).

    Args:
        kernel: Kernel prototype (each leaf gets a copy), a name from ``KERNELS``, or a factory.
        config: The tree's settings (``None``: ``TreeConfig()``).
        task: ``"regression"`` (targets (n,) or (n, c), in any units; ``forward`` predicts in
            them) or ``"classification"`` (labels ``0 .. K-1``; the leaves fit one-hot codes,
            ``forward`` gives class scores (n, K) and :meth:`predict_proba` probabilities).
        class_coding: Classification codes (:mod:`xrfm_torch.tree.targets`): ``"one_hot"`` or
            ``"prevalence"`` (one-hot minus the training class prior; a leaf far from its rows
            predicts the prior). ``"prevalence"`` needs the squared-error (Brier) criterion.
        calibration: Classification probabilities (:mod:`xrfm_torch.leaf.criteria`), each
            clipped to [1e-3, 1 - 1e-3] and renormalized: ``"platt"`` (``softmax(a log max(s,
            0.01) + b)`` fitted on the validation rows), ``"clip"`` (the scores themselves),
            ``"softmax"`` (``softmax(a * scores)``) or ``"auto"`` (that softmax where it beats
            clipping on the validation rows by 2 paired standard errors).
        missing_values: ``"seen"``: NaN at prediction in a numeric column the training rows had
            no missing cells in is an error; ``"any"``: it is the column's training mean.
        uncertainty: Predictive variances (regression; :mod:`xrfm_torch.tree.uncertainty`):
            ``"none"``, ``"gp"`` (each leaf's Gaussian process with its marginal-likelihood
            scale) or ``"calibrated"`` (the log-variance from the leaves' GP variance, their
            leave-one-out noise model and the mean, fitted on validation rows). Enables
            ``forward(x, return_std=True)`` and :meth:`predict_interval`; the fit pays about one
            more factorization per leaf (two with held-out validation rows) and keeps each leaf's
            Cholesky factor in memory (not in the state dict).
        **settings: Fields of :class:`~xrfm_torch.tree.config.TreeConfig` that replace
            ``config``'s (``TypeError`` for a name that is none).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> X = torch.randn(600, 4, generator=g); y = X[:, 0] ** 2
        >>> from xrfm_torch import LeafConfig, TreeConfig
        >>> config = TreeConfig(leaf=LeafConfig(n_iters=2), max_leaf_size=200)
        >>> model = xRFMTree("laplace", config).fit(X, y, generator=g)
        >>> model.n_leaves >= 3, model(X[:5]).shape
        (True, torch.Size([5, 1]))
        >>> xRFMTree("laplace", config, max_leaf_size=300).config == config.replace(max_leaf_size=300)
        True
    """

    fitted_temperature_: Tensor

    def __init__(
        self,
        kernel: Kernel | str | Callable[[], Kernel] | None = None,
        config: TreeConfig | None = None,
        *,
        task: Task = "regression",
        class_coding: ClassCoding = "one_hot",
        calibration: Calibration = "platt",
        missing_values: MissingValues = "seen",
        uncertainty: Uncertainty = "none",
        **settings: Any,
    ) -> None:
        super().__init__()
        self.config = tree_config(config, settings)
        self.kernel = make_kernel(kernel)
        self.input_map = InputMap(missing_values=missing_values)
        self.targets = TargetCoding(task, class_coding, calibration)
        self.targets.check_criterion(self.config.leaf.criterion)
        self._uncertainty = check_uncertainty(uncertainty, task)
        self.variance = None if self._uncertainty == "none" else VarianceModel(self._uncertainty)
        self.trees = nn.ModuleList()
        self.register_buffer("fitted_temperature_", torch.tensor(0.0))
        if self.config.trainable_routing:
            self.raw_temperature = nn.Parameter(torch.tensor(0.0))
        self.fit_seconds_: float | None = None

    # the constructor's arguments that the model's modules hold, read back (get_config)
    @property
    def uncertainty(self) -> Uncertainty:
        """The predictive-variance model (``"none"``, ``"gp"``, ``"calibrated"``)."""
        return self._uncertainty

    @property
    def calibration(self) -> Calibration:
        """How class scores become probabilities (:meth:`TargetCoding.calibrate`)."""
        return self.targets.calibration

    @property
    def class_coding(self) -> ClassCoding:
        """How class labels are coded for the leaves (:mod:`xrfm_torch.tree.targets`)."""
        return self.targets.class_coding

    @property
    def missing_values(self) -> MissingValues:
        """Where NaN is accepted in numeric columns (held by :attr:`input_map`)."""
        return self.input_map.missing_values

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments as plain data (kernel, leaf and split rule as ``_target_`` dicts).

        ``xRFMTree.from_config(model.get_config())`` builds an equivalent unfitted model, into which
        ``model.state_dict()`` loads; Lightning checkpoints store this to rebuild the tree.
        """
        return to_config(self)

    def recipe(self) -> Recipe:
        """This tree alone: one tree, its own kernel, no bags (:class:`Recipe`)."""
        return Recipe(self, None, 1, {}, {})

    def with_kernel(self, name: str) -> xRFMTree:
        """An unfitted copy with the kernel ``name`` (a wrapper asks its prototype for variants).

        The other settings are this model's; of the kernel's own arguments the bandwidth, ``eps``
        and ``chunk_bytes`` are kept where the new kernel class takes them.
        """
        if name not in KERNELS:
            raise ValueError(f"unknown kernel {name!r}; choose from {sorted(KERNELS)}")
        cfg = self.get_config()
        kernel, old = to_config(KERNELS[name]()), cfg.get("kernel") or {}
        kernel.update({k: old[k] for k in KEPT_KERNEL_ARGS if k in old and k in kernel})
        return xRFMTree.from_config({**cfg, "kernel": kernel})

    def with_settings(self, **changes: Any) -> xRFMTree:
        """An unfitted copy with some constructor arguments changed (e.g. ``input_transform``)."""
        return xRFMTree.from_config({**self.get_config(), **changes})

    def _plan(self, n_rows: int, n_maps: int = 1) -> FitPlan:
        """The kernel and resolved settings of a fit on ``n_rows`` rows (:meth:`FitPlan.resolve`)."""
        keep_factor = self.uncertainty != "none"
        return FitPlan.resolve(self.kernel, self.config, self.task, n_rows, n_maps, keep_factor)

    def single_trees(self) -> list[tuple[float, xRFMTree]]:
        """``[(1.0, self)]``: the contract's single trees (an ensemble has several)."""
        return [(1.0, self)]

    # ---- fitting -------------------------------------------------------------------------------
    @torch.no_grad()
    @summarize_fallbacks(log)
    def fit(
        self,
        X: Tensor,
        y: Tensor,
        X_val: Tensor | None = None,
        y_val: Tensor | None = None,
        *,
        sample_weight: Tensor | None = None,
        val_sample_weight: Tensor | None = None,
        generator: torch.Generator | None = None,
        progress: Progress | None = None,
    ) -> xRFMTree:
        """Grow the tree(s), fit every leaf, tune the routing temperature.

        Sample weights reach every part of the fit that measures rows: each leaf's solves
        (weighted kernel ridge regression), its AGOP and the split models', the median cuts
        (weighted medians), and every choice made on validation rows (iterations, exponent,
        ridge, input maps, temperature, probability calibration), where ``val_sample_weight``
        (or, for held-out rows, their own weights) weight the errors. Only their ratios matter
        (each set is divided by its mean); rows of weight 0 are dropped. The input and target
        standardization, which only fix units, stay unweighted.

        Args:
            X: Training inputs, shape (n, d), floating, finite.
            y: Targets, shape (n,) or (n, c).
            X_val: Validation inputs, shape (n_val, d). If ``None``, a seeded ``val_fraction`` of
                the training rows is held out for leaf selection and temperature tuning, then added
                back to the leaves (``refit_borrowed``).
            y_val: Validation targets, shape (n_val,) or (n_val, c).
            sample_weight: Training row weights (n,): finite, non-negative, not all 0.
            val_sample_weight: Validation row weights (n_val,) (needs ``X_val``).
            generator: CPU random generator; the same seed gives the same model (default: a new
                one seeded with ``torch.initial_seed()``; the global generator is untouched).
            progress: Called as ``progress(tree_index, leaves_done, leaves_total)`` after each
                leaf fit (e.g. to drive a progress bar).

        Returns:
            ``self``.

        Numerical fallbacks (a leaf that predicts its mean, a solve that needed jitter) are
        logged at DEBUG and summed up in one INFO line at the end.
        """
        start = time.perf_counter()
        generator = own_generator(generator)
        data, raw_y_val, raw_w_val, maps = prepare_fit(
            self, X, y, X_val, y_val, sample_weight, val_sample_weight, generator
        )
        self.kernel.to(device=data.X.device, dtype=data.X.dtype)
        grown, temperature = fit_trees(
            data,
            maps,
            self.input_map,
            self._plan(data.X.shape[0], len(maps)),
            generator=generator,
            progress=progress,
            val_scores=True,
            posterior=self.variance is not None,
        )
        if self.variance is not None and grown.val_moments is not None:
            self.variance.fit(grown.val_moments, data.y_val)
            broadcast_module(self.variance, self.config.distributed)
        if grown.val_scores is not None:
            self._honest = honest_outputs(
                self, grown.val_scores, grown.val_score_rows, data, raw_y_val, raw_w_val
            )
        self.trees = nn.ModuleList(grown.trees)
        self.input_map.set_maps(grown.maps)
        self.fitted_temperature_ = torch.tensor(0.0, dtype=data.X.dtype, device=data.X.device)
        if temperature is not None:
            self._set_temperature(temperature)
        self.fit_seconds_ = time.perf_counter() - start
        log.info(
            "fitted %d tree(s), %d leaves in %.2fs",
            len(self.trees),
            self.n_leaves,
            self.fit_seconds_,
        )
        return self

    def choose_input_maps(
        self,
        X: Tensor,
        y: Tensor,
        X_val: Tensor | None = None,
        y_val: Tensor | None = None,
        *,
        sample_weight: Tensor | None = None,
        val_sample_weight: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> InputTransform:
        """The input maps a fit on these rows grows its trees on, without fitting them.

        With ``input_transform="auto"`` the probe's choice (:mod:`xrfm_torch.inputs.choice`),
        otherwise the setting itself. Runs on an unfitted copy (``self`` is unchanged). A wrapper
        (bags, a kernel blend) asks once and gives every member the answer as its
        ``input_transform``: the probe then runs once per model, not once per member.
        """
        probe = xRFMTree.from_config(self.get_config())
        args = (X, y, X_val, y_val, sample_weight, val_sample_weight, own_generator(generator))
        maps = prepare_fit(probe, *args)[3]
        return cast(InputTransform, maps[0] if len(maps) == 1 else tuple(maps))

    @torch.no_grad()
    def refit_leaves(
        self,
        X: Tensor,
        y: Tensor,
        X_val: Tensor | None = None,
        y_val: Tensor | None = None,
        *,
        sample_weight: Tensor | None = None,
        val_sample_weight: Tensor | None = None,
        generator: torch.Generator | None = None,
    ) -> xRFMTree:
        """Re-fit every leaf in closed form on new rows, keeping the routing (splits, temperature).

        For head use: the inputs are new encoder features and (trainable) routing parameters keep
        their identity. Rows are routed hard; a leaf that receives fewer than 4 rows keeps its model.

        Args:
            X: Inputs, shape (n, d).
            y: Targets, shape (n,) or (n, c).
            X_val: Validation inputs (default: a seeded ``val_fraction`` of ``X`` is held out).
            y_val: Validation targets.
            sample_weight: Row weights (n,), as in :meth:`fit`.
            val_sample_weight: Validation row weights (n_val,).
            generator: CPU random generator.
        """
        self._check_fitted()
        generator = own_generator(generator)
        data = fit_rows(
            self,
            X,
            y,
            X_val,
            y_val,
            sample_weight,
            val_sample_weight,
            generator,
            self.n_features_in_,
        )
        data = self.targets.encode_data(data)
        trees = self.partition_trees()
        # the input and target maps keep their statistics: the routing was learned on them
        new = refit_trees(
            trees,
            self.input_map.names,
            self.input_map,
            data,
            self._plan(data.X.shape[0]),
            generator,
        )
        for tree, leaves in zip(trees, new):
            for index, leaf in leaves.items():
                tree.leaves[index] = leaf
                if self.variance is not None:  # the variance model keeps its coefficients
                    leaf.fit_posterior()
        return self


def _setting(name: str) -> property:
    """``model.<name>``: the setting in :attr:`xRFMTree.config`; setting it replaces the config."""

    def get(self: xRFMTree) -> Any:
        return getattr(self.config, name)

    def put(self: xRFMTree, value: Any) -> None:
        self.config = self.config.replace(**{name: value})

    return property(get, put, doc=f"``config.{name}`` (:class:`TreeConfig`; settable).")


# Every TreeConfig field reads (and sets) as an attribute, as the constructor's arguments do in
# scikit-learn; get_config reads them so. Generated from the config's fields, not written out.
for _name in SETTINGS:
    setattr(xRFMTree, _name, _setting(_name))
