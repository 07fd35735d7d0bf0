"""The kinds of a leaf's final solve, one small strategy each: how it solves, predicts, differentiates.

A fitted :class:`~xrfm_torch.leaf.LeafRFM` stores its kind (``kind_``, an index into
:data:`KINDS`), so a loaded leaf predicts the way it was fitted without guessing from which buffers
are empty. With ``S = sqrt_m_``, ``Z`` the support (the fitted rows, or centres) and ``U`` the
linear part's features (:mod:`xrfm_torch.kernels.linear`):

- ``"exact"``: ``f(x) = (K(S x, S Z) + U(S x) U(S Z)^T) alpha``, ``alpha`` from the KRR solve on
  the rows (:func:`~xrfm_torch.numerics.solvers.solve_krr`);
- ``"nystrom"`` / ``"centroids"``: the same predictor over centres, ``alpha`` their weights
  (:mod:`xrfm_torch.leaf.approx`);
- ``"fourier"``: ``f(x) = [phi(S x), U(S x)] alpha`` with random Fourier features ``phi``
  (frequencies ``fourier_w_``, phases ``fourier_b_``);
- ``"mean"``: the leaf's (weighted) training mean ``offset_`` (``alpha = 0``), the fallback
  where the mean beats the fitted model on the validation rows.

The strategies hold no state: each reads and writes the leaf's buffers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

import torch
from torch import Tensor

from xrfm_torch.kernels import chain_rule, transform
from xrfm_torch.kernels.linear import features_or_none, linear_grad, summed_predict
from xrfm_torch.leaf.approx import (
    centroid_weights,
    fourier_input_grads,
    fourier_predict,
    fourier_solve,
    kmeans_centres,
    nystrom_weights,
)
from xrfm_torch.numerics.solvers import krr_workspace, solve_krr

if TYPE_CHECKING:
    from xrfm_torch.leaf.model import LeafRFM

LeafKind = Literal["exact", "nystrom", "centroids", "fourier", "mean"]
#: The kinds in the order of their stored codes (``kind_``). Codes 0-3 are those of the
#: ``approx_`` buffer of state format 3 (0 exact, then ``LeafConfig.APPROXES`` in order).
KINDS: tuple[LeafKind, ...] = ("exact", "nystrom", "centroids", "fourier", "mean")


def weighted_mean(y: Tensor, w: Tensor | None) -> Tensor:
    """The (weighted) mean of the rows of ``y`` (n, c), shape (1, c)."""
    if w is None:
        return y.mean(0, keepdim=True)
    return (w.to(y.dtype) @ y)[None] / w.sum().to(y.dtype)


class KernelSolve:
    """Kernel predictor over the support: ``"exact"`` (rows) and the base of the others."""

    kind: LeafKind = "exact"

    def solve(self, leaf: LeafRFM, X: Tensor, y: Tensor, w: Tensor | None) -> None:
        """Solve ``alpha`` on the rows ``X`` (n, d), ``y`` (n, c) with the leaf's ``M`` and ridge."""
        cfg = leaf.config
        xs = transform(X, leaf.sqrt_m_)
        R = leaf.kernel.distance(xs, xs)  # (n, n); the kernel values overwrite it: one buffer
        K = leaf.kernel.from_distance(R, out=R)
        n, dtype = X.shape[0], cfg.solve_dtype or K.dtype
        workspace = krr_workspace(n, dtype, K.device) if leaf.keep_factor else None
        alpha = solve_krr(
            K,
            y,
            float(leaf.reg_),
            solve_dtype=cfg.solve_dtype,
            features=features_or_none(xs, cfg.linear_mix),
            workspace=workspace,
            weights=w,
        )
        leaf._set_kind(self.kind)
        leaf.alpha_ = alpha.contiguous()
        leaf.support_ = X.detach().clone()
        if workspace is not None:
            leaf.gp.keep(workspace, n)

    def predict(self, leaf: LeafRFM, x: Tensor) -> Tensor:
        """Predictions at inputs ``x`` (n, d), shape (n, c)."""
        s = leaf.sqrt_m_
        xs, zs = transform(x, s), transform(leaf.support_, s)
        return summed_predict(leaf.kernel, xs, zs, leaf.alpha_, leaf.config.linear_mix)

    def grads(self, leaf: LeafRFM, x: Tensor | None) -> Tensor:
        """Input gradients (n, c, d) at ``x``; ``None``: at the support, self-terms excluded."""
        s, z = leaf.sqrt_m_, leaf.support_
        exclude = x is None
        g = leaf.kernel.input_grads(z if x is None else x, z, leaf.alpha_, s, exclude_self=exclude)
        lin = linear_grad(transform(z, s), leaf.alpha_, leaf.config.linear_mix)
        return g if lin is None else g + chain_rule(lin, s)


class CentreSolve(KernelSolve):
    """``"nystrom"`` or ``"centroids"``: the kernel predictor over centres of the rows."""

    def __init__(self, kind: Literal["nystrom", "centroids"]) -> None:
        self.kind = kind

    def solve(self, leaf: LeafRFM, X: Tensor, y: Tensor, w: Tensor | None) -> None:
        cfg, s = leaf.config, leaf.sqrt_m_
        if cfg.approx_centres == "kmeans":  # Lloyd's iterations from the current support
            leaf.support_ = kmeans_centres(X, leaf.support_, s)
        xs, cs = transform(X, s), transform(leaf.support_, s)
        y2, c = y.reshape(X.shape[0], -1), cfg.linear_mix
        if self.kind == "nystrom":
            coef = nystrom_weights(leaf.kernel, xs, cs, y2, float(leaf.reg_), c, w)
        else:
            coef = centroid_weights(leaf.kernel, xs, cs, y2, c, w)
        leaf._set_kind(self.kind)
        leaf.alpha_ = coef.contiguous()


class FourierSolve(KernelSolve):
    """``"fourier"``: ridge regression on random Fourier features of the learned kernel."""

    kind: LeafKind = "fourier"

    def solve(self, leaf: LeafRFM, X: Tensor, y: Tensor, w: Tensor | None) -> None:
        cfg = leaf.config
        xs, y2 = transform(X, leaf.sqrt_m_), y.reshape(X.shape[0], -1)
        g = torch.Generator().manual_seed(leaf._fourier_seed)
        freq, b, coef = fourier_solve(
            leaf.kernel, xs, y2, float(leaf.reg_), cfg.linear_mix, cfg.fourier_features, g, w
        )
        leaf._set_kind(self.kind)
        leaf.fourier_w_, leaf.fourier_b_, leaf.alpha_ = freq, b, coef.contiguous()

    def predict(self, leaf: LeafRFM, x: Tensor) -> Tensor:
        w, b, c = leaf.fourier_w_, leaf.fourier_b_, leaf.config.linear_mix
        return fourier_predict(transform(x, leaf.sqrt_m_), w, b, leaf.alpha_, c)

    def grads(self, leaf: LeafRFM, x: Tensor | None) -> Tensor:
        # the support holds the centres, not training rows: no self-terms to exclude
        x = leaf.support_ if x is None else x
        w, b, c = leaf.fourier_w_, leaf.fourier_b_, leaf.config.linear_mix
        return fourier_input_grads(x, leaf.sqrt_m_, w, b, leaf.alpha_, c)


class MeanSolve(KernelSolve):
    """``"mean"``: the rows' (weighted) mean; the kernel predictor with ``alpha = 0`` plus it.

    Predicting through the (zero) kernel part keeps a constant leaf's output in the autograd
    graph of ``x``, like every other leaf's, so a tree of constant leaves still backpropagates.
    """

    kind: LeafKind = "mean"

    def solve(self, leaf: LeafRFM, X: Tensor, y: Tensor, w: Tensor | None) -> None:
        y = y.reshape(X.shape[0], -1)
        leaf.support_ = X.detach().clone()
        leaf.alpha_ = torch.zeros_like(y)
        mean = weighted_mean(y, w)[0].detach()
        leaf._set_kind(self.kind)
        leaf.offset_ = mean

    def predict(self, leaf: LeafRFM, x: Tensor) -> Tensor:
        return super().predict(leaf, x) + leaf.offset_.to(x.dtype)


#: The strategy of each kind.
SOLVES: dict[LeafKind, KernelSolve] = {
    "exact": KernelSolve(),
    "nystrom": CentreSolve("nystrom"),
    "centroids": CentreSolve("centroids"),
    "fourier": FourierSolve(),
    "mean": MeanSolve(),
}
