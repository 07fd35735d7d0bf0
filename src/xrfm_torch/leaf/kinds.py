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

import logging
from typing import Literal

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
from xrfm_torch.leaf.criteria import Criterion, validation_loss
from xrfm_torch.leaf.selection import Candidate, paired_win
from xrfm_torch.leaf.view import LeafKind, LeafView
from xrfm_torch.numerics.events import count
from xrfm_torch.numerics.solvers import krr_workspace, solve_krr
from xrfm_torch.numerics.warm_solves import solve_bordered

log = logging.getLogger(__name__)

#: The kinds in the order of their stored codes (``kind_``). Codes 0-3 are those of the
#: ``approx_`` buffer of state format 3 (0 exact, then ``LeafConfig.APPROXES`` in order).
KINDS: tuple[LeafKind, ...] = ("exact", "nystrom", "centroids", "fourier", "mean")


#: A leaf predicts its training mean when that beats its fitted model on the validation rows by
#: this many paired standard errors (the margin of the other validation choices).
MEAN_FALLBACK_MARGIN = 2.0


def weighted_mean(y: Tensor, w: Tensor | None) -> Tensor:
    """The (weighted) mean of the rows of ``y`` (n, c), shape (1, c)."""
    if w is None:
        return y.mean(0, keepdim=True)
    return (w.to(y.dtype) @ y)[None] / w.sum().to(y.dtype)


class KernelSolve:
    """Kernel predictor over the support: ``"exact"`` (rows) and the base of the others."""

    kind: LeafKind = "exact"

    def solve(self, leaf: LeafView, X: Tensor, y: Tensor, w: Tensor | None) -> None:
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

    def predict(self, leaf: LeafView, x: Tensor) -> Tensor:
        """Predictions at inputs ``x`` (n, d), shape (n, c)."""
        s = leaf.sqrt_m_
        xs, zs = transform(x, s), transform(leaf.support_, s)
        return summed_predict(leaf.kernel, xs, zs, leaf.alpha_, leaf.config.linear_mix)

    def grads(self, leaf: LeafView, x: Tensor | None) -> Tensor:
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

    def solve(self, leaf: LeafView, X: Tensor, y: Tensor, w: Tensor | None) -> None:
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

    def solve(self, leaf: LeafView, X: Tensor, y: Tensor, w: Tensor | None) -> None:
        cfg = leaf.config
        xs, y2 = transform(X, leaf.sqrt_m_), y.reshape(X.shape[0], -1)
        g = torch.Generator().manual_seed(leaf._fourier_seed)
        freq, b, coef = fourier_solve(
            leaf.kernel, xs, y2, float(leaf.reg_), cfg.linear_mix, cfg.fourier_features, g, w
        )
        leaf._set_kind(self.kind)
        leaf.fourier_w_, leaf.fourier_b_, leaf.alpha_ = freq, b, coef.contiguous()

    def predict(self, leaf: LeafView, x: Tensor) -> Tensor:
        w, b, c = leaf.fourier_w_, leaf.fourier_b_, leaf.config.linear_mix
        return fourier_predict(transform(x, leaf.sqrt_m_), w, b, leaf.alpha_, c)

    def grads(self, leaf: LeafView, x: Tensor | None) -> Tensor:
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

    def solve(self, leaf: LeafView, X: Tensor, y: Tensor, w: Tensor | None) -> None:
        y = y.reshape(X.shape[0], -1)
        leaf.support_ = X.detach().clone()
        leaf.alpha_ = torch.zeros_like(y)
        mean = weighted_mean(y, w)[0].detach()
        leaf._set_kind(self.kind)
        leaf.offset_ = mean

    def predict(self, leaf: LeafView, x: Tensor) -> Tensor:
        return super().predict(leaf, x) + leaf.offset_.to(x.dtype)


#: The strategy of each kind.
SOLVES: dict[LeafKind, KernelSolve] = {
    "exact": KernelSolve(),
    "nystrom": CentreSolve("nystrom"),
    "centroids": CentreSolve("centroids"),
    "fourier": FourierSolve(),
    "mean": MeanSolve(),
}


def mean_beats(
    best: Candidate,
    y: Tensor,
    y_val: Tensor,
    w: Tensor | None,
    w_val: Tensor | None,
    criterion: Criterion,
) -> bool:
    """Whether the (weighted) training mean beats the chosen model on the validation rows.

    By ``MEAN_FALLBACK_MARGIN`` paired standard errors (:func:`paired_win`), so that a few
    validation rows cannot turn a working leaf into a constant by chance.
    """
    if y_val.shape[0] < 2:
        return False
    y = y.reshape(y.shape[0], -1)
    mean = weighted_mean(y, w).expand(y_val.shape[0], -1)
    err, rows = validation_loss(mean, y_val, criterion, w_val)  # read back only when it wins
    if not paired_win(rows, best.sq_err, MEAN_FALLBACK_MARGIN):
        return False
    count("leaves predict their training mean")
    log.debug(
        "leaf with %d rows: validation %s %.4g of the fitted model is worse than %.4g of "
        "its mean; predicting the mean",
        y.shape[0],
        criterion,
        best.err,
        float(err),
    )
    return True


@torch.no_grad()
def extend_solve(
    leaf: LeafView,
    X: Tensor,
    y: Tensor,
    X_b: Tensor,
    y_b: Tensor,
    factored: tuple[Tensor, Tensor] | None,
    w: Tensor | None = None,
    w_b: Tensor | None = None,
) -> None:
    """Final solve on ``X`` then ``X_b``: continue the chosen model's factor when at hand.

    ``factored`` is ``(K_ss, F)`` of the chosen model's solve on ``X``; the extra rows ``X_b``
    (the tree's overlap and borrowed rows) join it by the bordered solve
    (:func:`~xrfm_torch.numerics.warm_solves.solve_bordered`, ``O(n^2 b)``). Without it, or where
    the bordered solve fails, the leaf solves on all rows afresh (``leaf.refit``).
    """
    X_all, y_all = torch.cat([X, X_b]), torch.cat([y, y_b])
    w_all = None if w is None or w_b is None else torch.cat([w, w_b])
    if leaf.kind == "mean":
        SOLVES["mean"].solve(leaf, X_all, y_all, w_all)
        return
    alpha, out = None, None
    if factored is not None:
        K_ss, F = factored
        s, kernel = leaf.sqrt_m_, leaf.kernel
        xs, xb = transform(X, s), transform(X_b, s)
        K_sb = kernel.from_distance(kernel.distance(xs, xb))  # (n, b)
        K_bb = kernel.from_distance(kernel.distance(xb, xb))  # (b, b)
        U = features_or_none(torch.cat([xs, xb]), leaf.config.linear_mix)
        n = X_all.shape[0]
        out = F.new_empty(n, n) if leaf.keep_factor else None
        alpha = solve_bordered(
            F, K_ss, K_sb, K_bb, y_all, float(leaf.reg_), features=U, factor_out=out, weights=w_all
        )
    if alpha is None:
        leaf.refit(X_all, y_all, w_all, check_input=False)  # the fit's rows, checked there
        return
    leaf.alpha_ = alpha.contiguous()
    leaf.support_ = X_all.detach().clone()
    leaf.gp.forget()
    if out is not None:
        leaf.gp.keep(out, X_all.shape[0])


@torch.no_grad()
def compress_leaf(leaf: LeafView, max_support: int, generator: torch.Generator) -> bool:
    """A lighter exact leaf: ``max_support`` centres that predict as its support rows did.

    An exact leaf of more than ``max_support`` support rows ``Z`` becomes a ``"centroids"`` leaf
    over ``b = max_support`` k-means centres ``C`` of them (in the learned space, from a seeded
    subset) with weights ``w = Phi^+ f`` (:func:`~xrfm_torch.leaf.approx.centroid_weights`):
    ``f`` (n, c) the exact predictions at ``Z`` and ``Phi = k_tot(S Z, S C)`` (n, b), so the new
    predictor is the least-squares fit of the old one at its rows. ``M``, the bandwidth and the
    exponent stay. A prediction then costs ``b`` kernel values per row instead of ``n``.

    Returns:
        Whether the leaf changed (other kinds and small leaves are left as they are).
    """
    n = leaf.support_.shape[0]
    if leaf.kind != "exact" or n <= max_support:
        return False
    Z, s = leaf.support_, leaf.sqrt_m_
    f = SOLVES["exact"].predict(leaf, Z)  # (n, c)
    pick = torch.randperm(n, generator=generator)[:max_support].to(Z.device)
    C = kmeans_centres(Z, Z[pick], s)
    coef = centroid_weights(
        leaf.kernel, transform(Z, s), transform(C, s), f, leaf.config.linear_mix
    )
    leaf._set_kind("centroids")
    leaf.support_ = C.contiguous()
    leaf.alpha_ = coef.to(Z.dtype).contiguous()
    return True
