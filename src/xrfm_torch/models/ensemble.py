"""What an average of fitted models predicts: the shared part of bags and kernel blends.

:class:`~xrfm_torch.models.bagging.BaggedTree` (equal weights) and
:class:`~xrfm_torch.models.blend.KernelBlend` (weights chosen on honest outputs) differ in how
they fit their members, not in how they predict: both are a weighted mean of fitted models, and
:class:`Ensemble` holds that part once (predictions, the mixture's standard deviation,
intervals, gradients, AGOP, feature importance, sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, cast

from torch import Tensor

from xrfm_torch.models.contract import Model
from xrfm_torch.models.holder import Holder
from xrfm_torch.tree.interpret import ImportanceSource

if TYPE_CHECKING:
    from xrfm_torch.models.xrfm_tree import xRFMTree


class Ensemble(Holder):
    """Base class: a weighted mean of fitted models (:meth:`models` and :meth:`combine`).

    Subclasses define :meth:`member_weights` (the weights of :meth:`models`, summing to 1),
    :meth:`combine` (the weighted mean) and :attr:`is_fitted`, and hold their members' settings
    and models as a :class:`~xrfm_torch.models.holder.Holder` does.
    """

    def member_weights(self) -> list[float]:
        """Each model's weight in the mean, in the order of :meth:`models`."""
        raise NotImplementedError

    def combine(self, parts: Sequence[Tensor]) -> Tensor:
        """The weighted mean of one tensor per member (all of one shape)."""
        raise NotImplementedError

    def weighted_members(self) -> list[tuple[float, Model]]:
        """``(weight, model)`` pairs of the fitted ensemble."""
        self._check_fitted()
        return list(zip(self.member_weights(), self.models()))

    @property
    def n_leaves(self) -> int:
        """Leaves over all members."""
        return sum(m.n_leaves for m in self.models())

    @property
    def n_features_in_(self) -> int:
        """Input columns."""
        self._check_fitted()
        return int(self.models()[0].n_features_in_)

    @property
    def n_outputs_(self) -> int:
        """Output columns (targets, or classes)."""
        self._check_fitted()
        return int(self.models()[0].n_outputs_)

    # ---- prediction (Model.forward: _mean, _mean_std) -----------------------------------------
    def _mean(self, x: Tensor, temperature: float | Tensor | None) -> Tensor:
        """Weighted mean of the members' predictions (class scores for classification)."""
        return self.combine([m(x, temperature) for m in self.models()])

    def _mean_std(self, x: Tensor, temperature: float | Tensor | None) -> tuple[Tensor, Tensor]:
        """The mixture's mean and ``sqrt(sum_k w_k (s_k^2 + m_k^2) - m^2)``."""
        pairs = [m(x, temperature, return_std=True) for m in self.models()]
        mean = self.combine([m for m, _ in pairs])
        second = self.combine([s.square() + m.square() for m, s in pairs])
        return mean, (second - mean.square()).clamp_min(0.0).sqrt()

    def predict_proba(self, x: Tensor, temperature: float | Tensor | None = None) -> Tensor:
        """Weighted mean of the members' class probabilities (n, K)."""
        self._check_fitted()
        if self.task != "classification":
            raise ValueError("predict_proba needs task='classification'")
        p = self.combine([m.predict_proba(x, temperature) for m in self.models()])
        return p / p.sum(1, keepdim=True)  # a weighted mean drifts from 1 by rounding

    def single_trees(self) -> list[tuple[float, xRFMTree]]:
        """Every single tree of every member, with its weight in the predictions (summing to 1)."""
        return [(w * v, t) for w, m in self.weighted_members() for v, t in m.single_trees()]

    def _mean_agop(self, diag: bool) -> Tensor:
        return self.combine([m.agop(diag=diag) for m in self.models()])

    def feature_importance(self, source: ImportanceSource = "M") -> Tensor:
        """Weighted mean of the members' feature importances (sums to 1), shape (d,)."""
        self._check_fitted()
        return cast(Tensor, self.combine([m.feature_importance(source) for m in self.models()]))
