"""What an average of fitted models predicts: the shared part of bags and kernel blends.

:class:`~xrfm_torch.models.bagging.BaggedTree` (equal weights) and
:class:`~xrfm_torch.models.blend.KernelBlend` (weights chosen on honest outputs) differ in how
they fit their members, not in how they predict: both are a weighted mean of fitted models, and
:class:`Ensemble` holds that part once (predictions, the mixture's standard deviation,
intervals, gradients, AGOP, feature importance, sizes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, cast, overload

from torch import Tensor, nn

from xrfm_torch.numerics.agop import agop_from_grads
from xrfm_torch.tree.honest import HasHonestOutputs
from xrfm_torch.tree.interpret import ImportanceSource, input_grads
from xrfm_torch.tree.uncertainty import normal_quantile


class Ensemble(HasHonestOutputs, nn.Module):
    """Base class: a weighted mean of fitted models (:meth:`models` and :meth:`combine`).

    Subclasses define :meth:`models` (the fitted models, each with the ``xRFMTree`` prediction
    interface), :meth:`member_weights` (theirs, summing to 1), :meth:`combine` (the weighted
    mean), :attr:`is_fitted` and :attr:`task`.
    """

    def models(self) -> Sequence[Any]:
        """The fitted models, in order (bags, or a blend's members)."""
        raise NotImplementedError

    def member_weights(self) -> list[float]:
        """Each model's weight in the mean, in the order of :meth:`models`."""
        raise NotImplementedError

    def combine(self, parts: Sequence[Tensor]) -> Tensor:
        """The weighted mean of one tensor per member (all of one shape)."""
        raise NotImplementedError

    def weighted_members(self) -> list[tuple[float, Any]]:
        """``(weight, model)`` pairs of the fitted ensemble."""
        self._check_fitted()
        return list(zip(self.member_weights(), self.models()))

    @property
    def is_fitted(self) -> bool:
        """Whether every member is fitted."""
        raise NotImplementedError

    @property
    def task(self) -> str:
        """``"regression"`` or ``"classification"``."""
        raise NotImplementedError

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise RuntimeError(
                f"this {type(self).__name__} is not fitted yet; call .fit(X, y) first"
            )

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
        """Weighted mean of the members' predictions (class scores for classification).

        Differentiable, like each member's.

        Args:
            x: Inputs (n, d).
            temperature: Routing temperature for every member (default: each one's fitted one).
            return_std: Also the standard deviation of the weighted mixture of the members'
                predictive distributions: ``sqrt(sum_k w_k (s_k^2 + m_k^2) - m^2)``.

        Returns:
            (n, c), or ``(mean, std)``.
        """
        self._check_fitted()
        models = self.models()
        if not return_std:
            return self.combine([m(x, temperature) for m in models])
        pairs = [m(x, temperature, return_std=True) for m in models]
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

    def predict_interval(
        self, x: Tensor, coverage: float = 0.9, temperature: float | Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``mean -/+ z std`` of the mixture (normal quantile ``z``), each (n, c)."""
        z = normal_quantile(coverage)  # checks coverage before the prediction
        mean, std = self(x, temperature, return_std=True)
        return mean - z * std, mean + z * std

    # ---- interpretation ------------------------------------------------------------------------
    def input_grads(self, x: Tensor, temperature: float | Tensor | None = None) -> Tensor:
        """Input gradients of the averaged model, shape (n, c, d)."""
        self._check_fitted()
        return input_grads(lambda xg: self(xg, temperature), x)

    def get_grads(self, x: Tensor, temperature: float | Tensor | None = None) -> Tensor:
        """:meth:`input_grads` under the reference ``xrfm``'s name (the one alias kept)."""
        return self.input_grads(x, temperature)

    def single_trees(self) -> list[tuple[float, Any]]:
        """Every single tree of every member, with its weight in the predictions (summing to 1)."""
        return [(w * v, t) for w, m in self.weighted_members() for v, t in m.single_trees()]

    def agop(self, x: Tensor | None = None, *, diag: bool = False) -> Tensor:
        """AGOP of the averaged model at ``x``, or (default) the mean of the members' AGOPs."""
        self._check_fitted()
        if x is not None:
            return agop_from_grads(self.input_grads(x), diag=diag)
        return self.combine([m.agop(diag=diag) for m in self.models()])

    def feature_importance(self, source: ImportanceSource = "M") -> Tensor:
        """Weighted mean of the members' feature importances (sums to 1), shape (d,)."""
        self._check_fitted()
        return cast(Tensor, self.combine([m.feature_importance(source) for m in self.models()]))
