"""Models made of other models: the held models, their settings, and loading them, written once.

:class:`Holder` is the base of :class:`~xrfm_torch.models.ensemble.Ensemble` (a weighted mean of
its held models: bags, kernel blends) and of :class:`Selector` (one chosen model answers:
:class:`~xrfm_torch.models.anytime.Anytime`, the candidate it chose). It keeps the settings the
held models are built from (an unfitted *prototype*, outside the module tree), holds the fitted
models under one name (``members``), and loads a saved state into a fresh holder in one way:
the holder says which empty models the state needs (:meth:`Holder._empty_members`), builds
them, and each loads its own keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from torch import Tensor, nn

from xrfm_torch.models.contract import Model
from xrfm_torch.tree.interpret import ImportanceSource


class Holder(Model):
    """Base class: a model whose fitted state is other models, held in ``members``.

    Subclasses hold their settings with :meth:`_hold_prototype` (``task`` and ``uncertainty``
    are the prototype's), keep their fitted models in ``members`` (an ``nn.ModuleList``) and say
    in :meth:`_empty_members` which unfitted models a saved state holds.
    """

    prototype: Model  # the held models' settings (_hold_prototype)
    members: nn.ModuleList

    @property
    def task(self) -> str:
        """``"regression"`` or ``"classification"`` (the prototype's)."""
        return self.prototype.task

    @property
    def uncertainty(self) -> str:
        """The held models' predictive-variance model (the prototype's)."""
        return self.prototype.uncertainty

    def _hold_prototype(self, model: Model) -> None:
        """Keep an unfitted copy of ``model``'s settings: the holder builds its models from it.

        Held outside the module tree (not a submodule), so it is no part of the state dict, and
        later changes to the caller's ``model`` do not reach the holder.
        """
        self.__dict__["prototype"] = type(model).from_config(model.get_config())

    def models(self) -> Sequence[Model]:
        """The fitted models, in order."""
        return [cast(Model, m) for m in self.members]

    # ---- loading into a fresh module -----------------------------------------------------------
    def _empty_members(self, state_dict: dict[str, Any], prefix: str) -> list[Model] | None:
        """The unfitted models a saved state under ``prefix`` holds, or ``None`` (keep ours).

        Each subclass reads what it saved for this (a blend its member kernels, bags their
        count, an anytime fit its choice); it may also reset buffers whose shape the state sets.

        Raises:
            ValueError: The state names models this holder cannot build.
        """
        raise NotImplementedError

    def _upgrade_state(self, state_dict: dict[str, Any], prefix: str) -> None:
        """Bring an older layout of this holder's own keys to the current one, in place."""

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
        # build the empty models the state names; torch then loads each one's own keys into it
        self._upgrade_state(state_dict, prefix)
        empty = self._empty_members(state_dict, prefix)
        if empty is not None:
            self.members = nn.ModuleList(empty)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


class Selector(Holder):
    """Base class: a holder of one chosen model (``members[0]``), which answers for it.

    Predictions, probabilities, AGOP, feature importance, leaves and single trees are the chosen
    model's; a subclass says how it chooses (:class:`~xrfm_torch.models.anytime.Anytime`: the
    best candidate fitted within a time limit).
    """

    @property
    def is_fitted(self) -> bool:
        """Whether a fitted model is held."""
        return len(self.members) == 1 and cast(Model, self.members[0]).is_fitted

    def chosen(self) -> Model:
        """The chosen model, fitted.

        Raises:
            RuntimeError: Nothing is fitted yet.
        """
        self._check_fitted()
        return cast(Model, self.members[0])

    @property
    def n_leaves(self) -> int:
        """The chosen model's leaves (0 before a fit)."""
        return self.chosen().n_leaves if self.is_fitted else 0

    @property
    def n_features_in_(self) -> int:
        """Input columns."""
        return self.chosen().n_features_in_

    @property
    def n_outputs_(self) -> int:
        """Output columns (targets, or classes)."""
        return self.chosen().n_outputs_

    def _mean(self, x: Tensor, temperature: float | Tensor | None) -> Tensor:
        return cast(Tensor, self.chosen()(x, temperature))

    def _mean_std(self, x: Tensor, temperature: float | Tensor | None) -> tuple[Tensor, Tensor]:
        return cast(tuple[Tensor, Tensor], self.chosen()(x, temperature, return_std=True))

    def _mean_agop(self, diag: bool) -> Tensor:
        return self.chosen().agop(diag=diag)

    def predict_proba(self, x: Tensor, temperature: float | Tensor | None = None) -> Tensor:
        """The chosen model's class probabilities (n, K)."""
        return self.chosen().predict_proba(x, temperature)

    def feature_importance(self, source: ImportanceSource = "M") -> Tensor:
        """The chosen model's feature importance (d,)."""
        return self.chosen().feature_importance(source)

    def single_trees(self) -> list[tuple[float, Any]]:
        """The chosen model's single trees with their weights."""
        return self.chosen().single_trees()


def member_indices(state_dict: dict[str, Any], prefix: str) -> set[int]:
    """The indices ``i`` of the saved models ``{prefix}members.{i}.*`` of a state."""
    head = prefix + "members."
    return {int(k.removeprefix(head).split(".")[0]) for k in state_dict if k.startswith(head)}
