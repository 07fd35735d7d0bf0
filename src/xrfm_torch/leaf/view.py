"""What the kinds of final solve and the Gaussian-process view read and write of a leaf.

A structural type (:class:`LeafView`), so that :mod:`xrfm_torch.leaf.kinds` and
:mod:`xrfm_torch.leaf.gp`, which :class:`~xrfm_torch.leaf.LeafRFM` imports, need not import the
leaf class back (the layering test forbids the cycle, type-checking imports included).
"""

from __future__ import annotations

from typing import Literal, Protocol

from torch import Tensor

from xrfm_torch.kernels import Kernel
from xrfm_torch.leaf.config import LeafConfig

LeafKind = Literal["exact", "nystrom", "centroids", "fourier", "mean"]


class FactorCache(Protocol):
    """The part of the leaf's GP view a solve uses: caching the factor it computed."""

    def keep(self, workspace: Tensor, n: int) -> None: ...
    def forget(self) -> None: ...


class LeafView(Protocol):
    """A leaf as its solve strategies and GP view see it (attributes of ``LeafRFM``)."""

    config: LeafConfig
    kernel: Kernel
    keep_factor: bool
    support_: Tensor
    alpha_: Tensor
    sqrt_m_: Tensor
    reg_: Tensor
    offset_: Tensor
    fourier_w_: Tensor
    fourier_b_: Tensor
    _fourier_seed: int

    @property
    def gp(self) -> FactorCache: ...
    @property
    def kind(self) -> LeafKind: ...
    @property
    def approximation(self) -> str | None: ...
    def _check_fitted(self) -> None: ...
    def _check_input(self, x: Tensor) -> None: ...
    def _set_kind(self, kind: LeafKind) -> None: ...
    def refit(
        self,
        X: Tensor,
        y: Tensor,
        sample_weight: Tensor | None = None,
        *,
        check_input: bool = True,
    ) -> object: ...
