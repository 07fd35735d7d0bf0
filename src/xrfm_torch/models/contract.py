"""The contract every model keeps, and the behaviour they share, written once.

:class:`Model` is the base class of :class:`~xrfm_torch.models.xrfm_tree.xRFMTree` (one model)
and of :class:`~xrfm_torch.models.ensemble.Ensemble` (bags, kernel blends, any registered kind):
what callers may rely on whatever :func:`~xrfm_torch.models.factory.build_model` or
:func:`~xrfm_torch.models.factory.model_from_config` returned. The common ``fit`` signature,
predictions (``forward``, ``predict_proba``, ``predict_interval``), gradients and the AGOP,
feature importance, the honest (out-of-fold or validation) outputs of the last fit, the weighted
single trees, the summary, the config round trip and, as an ``nn.Module``, the state dict.

A subclass says how it fits, how it predicts (:meth:`Model._mean`, and :meth:`Model._mean_std`
with predictive variances) and what its AGOP averaged over the model is
(:meth:`Model._mean_agop`); the base turns that into ``forward``, intervals, input gradients, the
AGOP at given rows and ``from_config``. ``tests/test_contract.py`` checks that each model class
implements every member with the same parameters, so the kinds cannot drift apart.
"""

from __future__ import annotations

import logging
from typing import Any, Literal, NamedTuple, TypeVar, overload

import torch
from torch import Tensor, nn

from xrfm_torch.leaf.kinds import compress_leaf
from xrfm_torch.numerics.agop import agop_from_grads
from xrfm_torch.numerics.checks import check_int
from xrfm_torch.numerics.config import from_config
from xrfm_torch.numerics.rng import own_generator
from xrfm_torch.tree.grow import Progress
from xrfm_torch.tree.honest import HasHonestOutputs, HonestOutputs
from xrfm_torch.tree.interpret import ImportanceSource, input_grads
from xrfm_torch.tree.uncertainty import normal_quantile

log = logging.getLogger(__name__)

M = TypeVar("M", bound="Model")


class Recipe(NamedTuple):
    """How a model is made of one tree: bags of it, kernels of it (what a time-limited fit varies).

    Attributes:
        tree: The unfitted ``xRFMTree`` every single tree of the model is built from.
        kernels: The blended kernels, or ``None`` (the tree's kernel alone).
        n_bags: Cross-fitted bags (1: single trees).
        bag: The bags' other constructor arguments (``shared_plan``, ``size_fraction``).
        blend: The blend's other constructor arguments (``weight_steps``, ``race_margin``).
    """

    tree: Any
    kernels: list[str] | None
    n_bags: int
    bag: dict[str, Any]
    blend: dict[str, Any]


class Model(HasHonestOutputs, nn.Module):
    """A fitted (or to-be-fitted) xRFM model of any kind (see the module docstring).

    Attributes:
        distributed: Whether ``fit`` spreads its work over the default process group's ranks.
        fit_seconds_: Seconds the last ``fit`` took (``None`` before one).
        probe_seconds_: Seconds of the last ``fit`` its own input-map choice took (0 for a
            model that chooses none: an anytime fit's cost estimates leave it out of a rung
            that reuses the choice).
    """

    distributed: bool
    fit_seconds_: float | None
    probe_seconds_: float = 0.0

    # ---- what each kind defines ----------------------------------------------------------------
    @property
    def task(self) -> str:
        """``"regression"`` or ``"classification"``."""
        raise NotImplementedError

    @property
    def is_fitted(self) -> bool:
        """Whether ``fit`` has run (or a fitted state was loaded)."""
        raise NotImplementedError

    @property
    def uncertainty(self) -> str:
        """The predictive-variance model: ``"none"``, ``"gp"`` or ``"calibrated"``."""
        raise NotImplementedError

    @property
    def n_leaves(self) -> int:
        """Leaves over every tree the model holds."""
        raise NotImplementedError

    @property
    def n_features_in_(self) -> int:
        """Input columns."""
        raise NotImplementedError

    @property
    def n_outputs_(self) -> int:
        """Output columns (targets, or classes)."""
        raise NotImplementedError

    def fit(
        self: M,
        X: Tensor,
        y: Tensor,
        X_val: Tensor | None = None,
        y_val: Tensor | None = None,
        *,
        sample_weight: Tensor | None = None,
        val_sample_weight: Tensor | None = None,
        generator: torch.Generator | None = None,
        progress: Progress | None = None,
    ) -> M:
        """Fit in closed form; returns the model."""
        raise NotImplementedError

    def predict_proba(self, x: Tensor, temperature: float | Tensor | None = None) -> Tensor:
        """Class probabilities (n, K), rows summing to 1."""
        raise NotImplementedError

    def feature_importance(self, source: ImportanceSource = "M") -> Tensor:
        """Per-feature importance (d,), summing to 1."""
        raise NotImplementedError

    def single_trees(self) -> list[tuple[float, Any]]:
        """Its single trees (``xRFMTree`` s) with their weights in its predictions (summing to 1).

        Typed ``Any`` here (the contract sits below ``xRFMTree``, which imports it); each kind
        returns ``list[tuple[float, xRFMTree]]``.
        """
        raise NotImplementedError

    def summary(self) -> dict[str, Any]:
        """The fitted model as plain data (``tree_summary.json``)."""
        raise NotImplementedError

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments as plain data (``_target_`` dicts for nested objects)."""
        raise NotImplementedError

    # ---- what a model made of models asks of its parts (the base's answers) --------------------
    def recipe(self) -> Recipe | None:
        """How this model is made of one tree (:class:`Recipe`), for a fit that varies it.

        ``None`` (the base's answer): it is not made of one tree's bags and kernels.
        """
        return None

    @property
    def fit_time_limit(self) -> float | None:
        """Seconds its own ``fit`` is limited to (``None``: no limit of its own)."""
        return None

    def begin_fit(
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
    ) -> Model:
        """The first stage of a fit that pauses after a first look (the base: the whole fit).

        Between it and :meth:`finish_fit`, :meth:`first_fold_outputs` may give outputs on rows
        the fit so far did not train on, on which a caller (a kernel blend's race) judges
        whether to finish. Arguments as :meth:`fit`.
        """
        return self.fit(X, y, X_val, y_val, sample_weight=sample_weight,
                        val_sample_weight=val_sample_weight, generator=generator,
                        progress=progress)  # fmt: skip

    def first_fold_outputs(self) -> HonestOutputs | None:
        """After :meth:`begin_fit`: outputs on rows the first stage did not train on, or ``None``."""
        return None

    def finish_fit(self) -> Model:
        """The rest of a fit :meth:`begin_fit` began (the base: nothing left)."""
        return self

    # ---- what the base derives -----------------------------------------------------------------

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise RuntimeError(f"this {type(self).__name__} is not fitted; call .fit(X, y) first")

    @classmethod
    def from_config(cls: type[M], cfg: dict[str, Any]) -> M:
        """Build an unfitted model from its ``get_config()`` output.

        Only allowed classes are built (registered models and their parts,
        :func:`~xrfm_torch.numerics.config.allowed`, checked at every depth before anything is
        imported): a config from a file cannot run code.

        Raises:
            ValueError: ``cfg`` names a ``_target_`` outside that list.
            TypeError: ``cfg`` builds something other than this class.
        """
        model = from_config(cfg)
        if not isinstance(model, cls):
            raise TypeError(f"the config builds a {type(model).__name__}, not a {cls.__name__}")
        return model

    # ---- prediction ----------------------------------------------------------------------------
    @overload
    def forward(
        self,
        x: Tensor,
        temperature: float | Tensor | None = None,
        *,
        return_std: Literal[False] = False,
    ) -> Tensor: ...
    @overload
    def forward(
        self, x: Tensor, temperature: float | Tensor | None = None, *, return_std: Literal[True]
    ) -> tuple[Tensor, Tensor]: ...
    def forward(
        self, x: Tensor, temperature: float | Tensor | None = None, *, return_std: bool = False
    ) -> Tensor | tuple[Tensor, Tensor]:
        """Predict: regression targets in their units, or class scores (:meth:`predict_proba`).

        Differentiable with respect to ``x`` (and trainable routing parameters).

        Args:
            x: Inputs, shape (n, d), on the model's device; any real dtype (cast to the model's).
            temperature: Routing temperature of every tree (default: each one's fitted one;
                0 = hard routing).
            return_std: Also the predictive standard deviation (models fitted with
                ``uncertainty`` other than ``"none"``), in the targets' units; for an ensemble
                that of the weighted mixture of its members' predictive distributions.

        Returns:
            Predictions, shape (n, c); with ``return_std``, ``(mean, std)``, both (n, c).
        """
        self._check_fitted()
        if return_std:
            return self._mean_std(x, temperature)
        return self._mean(x, temperature)

    def _mean(self, x: Tensor, temperature: float | Tensor | None) -> Tensor:
        raise NotImplementedError

    def _mean_std(self, x: Tensor, temperature: float | Tensor | None) -> tuple[Tensor, Tensor]:
        raise NotImplementedError

    def predict_interval(
        self, x: Tensor, coverage: float = 0.9, temperature: float | Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """Central predictive interval ``mean -/+ z std`` with ``z`` the normal quantile.

        Args:
            x: Inputs, shape (n, d).
            coverage: Probability mass inside the interval, in (0, 1).
            temperature: Override the fitted routing temperature.

        Returns:
            ``(lower, upper)``, each (n, c), in the targets' units.
        """
        z = normal_quantile(coverage)  # checks coverage before the prediction
        mean, std = self(x, temperature, return_std=True)
        return mean - z * std, mean + z * std

    # ---- interpretation ------------------------------------------------------------------------
    def input_grads(self, x: Tensor, temperature: float | Tensor | None = None) -> Tensor:
        """Input gradients of the whole model (routing included), shape (n, c, d)."""
        self._check_fitted()
        return input_grads(lambda xg: self(xg, temperature), x)

    def get_grads(self, x: Tensor, temperature: float | Tensor | None = None) -> Tensor:
        """:meth:`input_grads` under the reference ``xrfm``'s name (the one alias kept)."""
        return self.input_grads(x, temperature)

    def agop(self, x: Tensor | None = None, *, diag: bool = False) -> Tensor:
        """The model's AGOP, at ``x`` or (default) averaged over the model.

        At ``x``: mean of ``grad grad^T`` over rows and outputs (routing and input map included),
        with respect to the inputs. Default: a tree's leaf-size-weighted average of its leaves'
        AGOPs at their support points, over the columns the leaves see (d, or 2d with
        ``"quantile+raw"``); an ensemble's weighted mean of its members'.

        Returns:
            Shape (d, d), or (d,) when ``diag`` (d' for the leaf average).
        """
        self._check_fitted()
        if x is not None:
            return agop_from_grads(self.input_grads(x), diag=diag)
        return self._mean_agop(diag)

    def _mean_agop(self, diag: bool) -> Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def compress(
        self: M, max_support: int = 1000, *, generator: torch.Generator | None = None
    ) -> M:
        """A lighter predictor, in place: each large exact leaf predicts from ``max_support`` centres.

        Every exact leaf of every single tree with more than ``max_support`` support rows
        becomes a leaf over that many k-means centres of them whose weights reproduce its
        predictions at those rows by least squares
        (:func:`~xrfm_torch.leaf.kinds.compress_leaf`). A prediction then costs at most
        ``max_support`` kernel values per row and leaf instead of up to ``max_leaf_size``, and
        the saved model shrinks alike; predictions move a little (docs/benchmarks.md,
        "Prediction cost"). ``M``, routing and calibration stay.

        Args:
            max_support: Centres per compressed leaf (>= 1).
            generator: Draws the k-means starting centres (same seed, same model).

        Returns:
            ``self``.

        Raises:
            ValueError: The model has predictive variances (the leaves' Gaussian processes
                need their rows), or ``max_support`` < 1.
            RuntimeError: The model is not fitted.
        """
        self._check_fitted()
        if self.uncertainty != "none":
            raise ValueError(
                f"compress needs uncertainty='none' (got {self.uncertainty!r}): a leaf's "
                "predictive variance needs its support rows"
            )
        max_support = check_int(max_support, "max_support", 1)
        g = own_generator(generator)
        changed = sum(
            compress_leaf(leaf, max_support, g)
            for _, tree in self.single_trees()
            for leaf in tree.leaves()
        )
        log.info("compressed %d leaves to %d centres each", changed, max_support)
        return self


def is_ensemble(model: Model) -> bool:
    """Whether a fitted ``model`` is made of other trees (bags, blends), not one tree itself."""
    return any(tree is not model for _, tree in model.single_trees())
