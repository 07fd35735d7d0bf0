"""RoutedTrees: what a fitted xRFMTree reads and predicts with (its fitting is in xrfm_tree.py).

The fitted state of one model: the partition trees with their leaves, the input map, the target
coding, the variance model and the routing temperature; and everything read from it: sizes,
predictions, probabilities, the AGOP and feature importance, the state-dict format.
:class:`~xrfm_torch.models.xrfm_tree.xRFMTree` adds the settings, the constructor and the fit.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from xrfm_torch.inputs.input_map import (
    InputMap,
    InputMapName,
)
from xrfm_torch.kernels import Kernel
from xrfm_torch.leaf import LeafRFM
from xrfm_torch.models.contract import Model
from xrfm_torch.models.state import check_format, format_state, upgrade_tree_state
from xrfm_torch.numerics.checks import (
    as_float_targets,
    as_real_dtype,
    as_tensor,
    check_finite,
)
from xrfm_torch.tree.config import TreeConfig
from xrfm_torch.tree.interpret import (
    ImportanceSource,
    feature_importance,
    leaves_by_map,
    mean_leaf_agop,
    tree_summary,
)
from xrfm_torch.tree.partition import PartitionTree, empty_trees
from xrfm_torch.tree.targets import TargetCoding, Task
from xrfm_torch.tree.temperature import search_temperature
from xrfm_torch.tree.uncertainty import (
    Uncertainty,
    VarianceModel,
    predictive_mean_std,
)

log = logging.getLogger(__name__)


class RoutedTrees(Model):
    """Base class of :class:`~xrfm_torch.models.xrfm_tree.xRFMTree`: the fitted model's reading side.

    Attributes:
        config: The settings (:class:`~xrfm_torch.tree.config.TreeConfig`).
        kernel: The leaves' kernel prototype.
        input_map: Column maps fitted on the training rows (:class:`InputMap`).
        targets: Target coding and calibration (:class:`TargetCoding`).
        variance: The predictive-variance model (``None`` with ``uncertainty="none"``).
        trees: The fitted :class:`PartitionTree` s, one or more per input map.
    """

    config: TreeConfig
    kernel: Kernel
    input_map: InputMap
    targets: TargetCoding
    _uncertainty: Uncertainty
    variance: VarianceModel | None
    trees: nn.ModuleList
    fitted_temperature_: Tensor
    raw_temperature: nn.Parameter  # with trainable routing only

    @property
    def task(self) -> Task:
        """``"regression"`` or ``"classification"`` (held by :attr:`targets`)."""
        return self.targets.task

    def _new_leaf(self) -> LeafRFM:
        """A fresh, unfitted leaf model with this tree's kernel and leaf settings."""
        return LeafRFM(self.kernel, self.config.leaf)

    # ---- introspection -------------------------------------------------------------------------
    @property
    def is_fitted(self) -> bool:
        """Whether the model holds fitted trees."""
        return len(self.trees) > 0 and all(leaf.is_fitted for leaf in self.leaves())

    def partition_trees(self) -> list[PartitionTree]:
        """The fitted trees (typed view of ``self.trees``)."""
        return [cast(PartitionTree, t) for t in self.trees]

    def leaves(self) -> list[LeafRFM]:
        """All leaf models of all trees, in tree then leaf order."""
        return [leaf for tree in self.partition_trees() for leaf in tree.leaf_list()]

    @property
    def n_leaves(self) -> int:
        """Total number of leaves over all trees."""
        return sum(t.n_leaves for t in self.partition_trees())

    @property
    def n_features_in_(self) -> int:
        """Number of input features seen in ``fit``."""
        self._check_fitted()
        return self.input_map.n_features

    @property
    def n_outputs_(self) -> int:
        """Number of outputs ``c``."""
        self._check_fitted()
        return int(self.leaves()[0].alpha_.shape[1])

    # One temperature, three names for its three roles: the setting ``temperature`` (None: tune
    # it), the value in use ``temperature_`` and, with trainable routing, the unconstrained
    # parameter ``raw_temperature`` (gpytorch's ``raw_`` convention); the fit's choice is kept in
    # the buffer ``fitted_temperature_``.
    @property
    def temperature_(self) -> Tensor:
        """The routing temperature in use: the fitted one, or ``softplus(raw_temperature)``."""
        if self.config.trainable_routing:
            return F.softplus(self.raw_temperature)
        return self.fitted_temperature_

    def _set_temperature(self, value: float) -> None:
        if self.config.trainable_routing and value <= 0:
            positive = [t for t in self.config.temperature_grid if t > 0]
            value = min(positive) if positive else 1.0
            log.info("trainable routing needs T > 0; starting from T = %.4g", value)
        self.fitted_temperature_.fill_(value)
        if self.config.trainable_routing:  # inverse softplus, so that softplus(raw) == value
            raw = torch.tensor(value).expm1().log()
            self.raw_temperature.data = raw.to(self.fitted_temperature_)

    # ---- interpretation ------------------------------------------------------------------------
    def leaf_ids(self, x: Tensor, tree: int = 0) -> Tensor:
        """Index of the leaf each row of ``x`` (n, d) is routed to by tree ``tree`` (hard), (n,)."""
        self._check_fitted()
        name = self.input_map.names[tree]
        return self.partition_trees()[tree].route(self.input_map.encode(x, name))

    def summary(self) -> dict[str, Any]:
        """The fitted trees as plain data (:func:`~xrfm_torch.tree.interpret.tree_summary`)."""
        self._check_fitted()
        return tree_summary(self)

    def _mean_agop(self, diag: bool) -> Tensor:
        return mean_leaf_agop(self._leaves_by_map(), diag=diag)

    def feature_importance(self, source: ImportanceSource = "M") -> Tensor:
        """Per-feature importance, normalized to sum to 1, shape (d,).

        Args:
            source: ``"M"``: leaf-size-weighted ``diag(M)`` (what the leaves learned to use);
                ``"agop"``: diagonal of :meth:`agop` (what the fitted predictors are sensitive to).
        """
        self._check_fitted()
        imp = feature_importance(self._leaves_by_map(), self.input_map.fold, source)
        return imp.to(self.fitted_temperature_.device)

    def _leaves_by_map(self) -> dict[InputMapName, list[LeafRFM]]:
        return leaves_by_map(self.partition_trees(), self.input_map.names)

    @torch.no_grad()
    def temperature_errors(
        self, X_val: Tensor, y_val: Tensor, grid: Sequence[float] | None = None
    ) -> list[float]:
        """Validation MSE of the leaves' codes for each routing temperature of ``grid``.

        The codes are the standardized targets (regression) or one-hot rows (classification:
        the Brier score), the criterion the fit tunes the temperature by.

        Args:
            X_val: Inputs, shape (n_val, d).
            y_val: Targets, shape (n_val,) or (n_val, c).
            grid: Temperatures (default: ``temperature_grid``; 0 = hard routing).
        """
        self._check_fitted()
        y_val = as_float_targets(y_val, "y_val", n_rows=X_val.shape[0], dtype=X_val.dtype)
        return search_temperature(
            self.partition_trees(),
            self.input_map(X_val),
            self.targets.encode(y_val, "y_val"),
            self.config.temperature_grid if grid is None else grid,
            keep_mass=self.config.keep_mass,
            max_leaves=self.config.max_soft_leaves,
            criterion=self.config.leaf.criterion,
        )[1]

    # ---- prediction (Model.forward: _mean, _mean_std) -----------------------------------------
    def _checked(self, x: Tensor) -> Tensor:
        x = as_tensor(x, "x", self.fitted_temperature_.device)  # numpy, as fit takes
        if x.ndim != 2 or x.shape[1] != self.n_features_in_:
            raise ValueError(
                f"expected input of shape (n, {self.n_features_in_}), got {tuple(x.shape)}"
            )
        # a differentiable cast to the dtype of the fitted buffers (outputs are in that dtype)
        x = as_real_dtype(x, self.input_map.dtype, "x")
        # infinities are errors; NaN only where the training rows had missing cells (input map)
        check_finite(x, "x", allow_nan=True)
        return x

    def _mean(self, x: Tensor, temperature: float | Tensor | None) -> Tensor:
        """The trees' mean prediction (regression targets, or class scores)."""
        x = self._checked(x)
        temp = self.temperature_ if temperature is None else temperature
        outs = [
            tree(xt, temp, keep_mass=self.config.keep_mass, max_leaves=self.config.max_soft_leaves)
            for tree, xt in zip(self.partition_trees(), self.input_map(x))
        ]
        out = outs[0] if len(outs) == 1 else torch.stack(outs).mean(0)
        return self.targets.decode(out)

    def _mean_std(self, x: Tensor, temperature: float | Tensor | None) -> tuple[Tensor, Tensor]:
        x = self._checked(x)
        temp = self.temperature_ if temperature is None else temperature
        if self.variance is None:
            raise ValueError(
                "return_std needs a model fitted with uncertainty='calibrated' or 'gp' "
                f"(this one has uncertainty={self.uncertainty!r})"
            )
        mean, std = predictive_mean_std(
            self.partition_trees(),
            self.input_map(x),
            temp,
            self.variance,
            keep_mass=self.config.keep_mass,
            max_leaves=self.config.max_soft_leaves,
        )
        return self.targets.decode(mean), std * self.targets.scaler.scale_

    def predict_proba(self, x: Tensor, temperature: float | Tensor | None = None) -> Tensor:
        """Class probabilities (n, K), rows summing to 1: clipped scores, or their fitted softmax."""
        return self.targets.probabilities(self(x, temperature))

    # ---- loading into a fresh module -----------------------------------------------------------
    def get_extra_state(self) -> dict[str, int]:
        """The state-dict format version (:mod:`xrfm_torch.models.state`)."""
        return format_state()

    def set_extra_state(self, state: dict[str, int]) -> None:
        check_format(state)

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        upgrade_tree_state(state_dict, prefix)
        # Rebuild the tree/leaf module structure from the keys; children then load themselves.
        trees = empty_trees(state_dict, prefix, self._new_leaf, self.config.trainable_routing)
        if trees is not None:
            self.trees = trees.to(self.fitted_temperature_.device)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )
