"""Models made of other models: the held models, their settings, and loading them, written once.

:class:`Holder` is the base of :class:`~xrfm_torch.models.ensemble.Ensemble` (a weighted mean of
its held models: bags, kernel blends) and of :class:`~xrfm_torch.models.anytime.Anytime` (the one
candidate it chose). It keeps the settings the held models are built from (an unfitted
*prototype*, outside the module tree), holds the fitted models under one name (``members``),
and loads a saved state into a fresh holder in one way: the holder says which empty models the
state needs (:meth:`Holder._empty_members`), builds them, and each loads its own keys.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, cast

from torch import nn

from xrfm_torch.models.contract import Model


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


def member_indices(state_dict: dict[str, Any], prefix: str) -> set[int]:
    """The indices ``i`` of the saved models ``{prefix}members.{i}.*`` of a state."""
    head = prefix + "members."
    return {int(k.removeprefix(head).split(".")[0]) for k in state_dict if k.startswith(head)}
