"""RFM iterations and post-hoc searches on an approximate solve over all of a leaf's rows.

With ``LeafConfig(approx_iters=True)`` a leaf whose final solve is approximate
(:mod:`xrfm_torch.leaf.approx`) learns ``M`` from all ``n`` of its rows through that same
approximation, instead of exactly from its ``b = iter_rows`` subsample. Each step solves

- ``"nystrom"``: ``(Phi^T Phi + reg K_CC) w = Phi^T y`` over the ``b`` subsample rows as centres,
  predictor ``f(x) = k_tot(x, C) w``;
- ``"centroids"``: ``w = Phi^+ y`` over the same centres (no ridge: the ridge walk is skipped);
- ``"fourier"``: ``(F^T F + reg I) w = F^T y`` on ``D`` random Fourier features of the current
  kernel (drawn from the leaf's seed, so every step and the final solve share them for a given
  exponent and bandwidth), predictor ``f(x) = [phi(S x), U(S x)] w``;

scores the validation rows and takes the AGOP of ``f``'s input gradients at all ``n`` rows
(``O(n b d)`` or ``O(n D d)``): the loop, its stopping rules and the diagonal/full choice are the
exact iterations' (:func:`xrfm_torch.leaf.iteration.iterate`). The exponent grid and the ridge
walk then re-solve the approximation (:func:`xrfm_torch.leaf.selection.search_reg`, same margins).
A step costs ``O(n b^2)`` (``b = iter_rows`` centres) against ``O(b^3)`` for an exact step on the
subsample, so the approximation pays when ``M`` learned from all rows is worth ``n / b`` times the
time (docs/benchmarks.md measures it).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable

import torch
from torch import Tensor

from xrfm_torch.kernels import Kernel, chain_rule, transform
from xrfm_torch.kernels.linear import linear_grad, summed_predict
from xrfm_torch.leaf.approx import (
    centroid_weights,
    fourier_input_grads,
    fourier_predict,
    fourier_solve,
    nystrom_weights,
)
from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.leaf.criteria import validation_errors
from xrfm_torch.leaf.iteration import iterate
from xrfm_torch.leaf.selection import Candidate, beats, kernel_grid, search_grid, search_reg
from xrfm_torch.leaf.step import failed_candidate
from xrfm_torch.numerics.agop import agop_or_none
from xrfm_torch.numerics.events import count

log = logging.getLogger(__name__)

#: ``fit(sqrt_m, reg, grads) -> (coefficients, validation predictions (n_val, c), input gradients
#: at the rows (n, c, d) or None)`` for the kernel's current exponent and bandwidth.
ApproxFit = Callable[[Tensor | None, float, bool], tuple[Tensor, Tensor, Tensor | None]]


def approx_fitter(
    kernel: Kernel,
    cfg: LeafConfig,
    X: Tensor,
    y: Tensor,
    X_val: Tensor,
    centres: Tensor,
    fourier_seed: int,
    weights: Tensor | None = None,
) -> ApproxFit:
    """``fit(sqrt_m, reg, grads) -> (coefficients, validation predictions, gradients or None)``.

    One approximate solve (``cfg.approx``) on all rows ``X`` (n, d) with the kernel's current
    exponent and bandwidth; gradients of the fitted ``f`` with respect to the original inputs at
    the rows, (n, c, d), when ``grads``. ``weights`` (n,): the rows' sample weights of the
    (weighted least-squares) solves.
    """
    c = cfg.linear_mix

    def fit(sqrt_m: Tensor | None, reg: float, grads: bool) -> tuple[Tensor, Tensor, Tensor | None]:
        xs, xv = transform(X, sqrt_m), transform(X_val, sqrt_m)
        g: Tensor | None = None
        if cfg.approx == "fourier":
            gen = torch.Generator().manual_seed(fourier_seed)
            w, b, coef = fourier_solve(kernel, xs, y, reg, c, cfg.fourier_features, gen, weights)
            pred = fourier_predict(xv, w, b, coef, c)
            if grads:
                g = fourier_input_grads(X, sqrt_m, w, b, coef, c)
            return coef, pred, g
        cs = transform(centres, sqrt_m)
        if cfg.approx == "nystrom":
            coef = nystrom_weights(kernel, xs, cs, y, reg, c, weights)
        else:
            coef = centroid_weights(kernel, xs, cs, y, c, weights)
        pred = summed_predict(kernel, xv, cs, coef, c)
        if grads:
            g = kernel.input_grads(X, centres, coef, sqrt_m)
            lin = linear_grad(cs, coef, c)
            if lin is not None:
                g = g + chain_rule(lin, sqrt_m)
        return coef, pred, g

    return fit


@torch.no_grad()
def run_approx_iterations(
    kernel: Kernel,
    cfg: LeafConfig,
    X: Tensor,
    y: Tensor,
    X_val: Tensor,
    y_val: Tensor,
    centres: Tensor,
    fourier_seed: int,
    weights: tuple[Tensor | None, Tensor | None] = (None, None),
) -> tuple[Candidate, Tensor, bool]:
    """:func:`~xrfm_torch.leaf.iteration.run_iterations` on ``cfg.approx`` over all rows.

    ``X`` (n, d) are all of the leaf's fitted rows; ``centres`` (b, d) those of Nyström and
    centroids (the iteration subsample). ``weights``: (the rows' (n,), the validation rows'
    (n_val,)) sample weights, each ``None`` for 1: weighted solves, AGOP and validation errors.

    Returns:
        ``(best candidate, validation error per iteration, whether M is diagonal)``; the
        candidate's ``alpha`` holds the approximation's coefficients, and the kernel is left at
        its exponent and bandwidth.
    """
    w, w_val = weights
    fit = approx_fitter(kernel, cfg, X, y, X_val, centres, fourier_seed, w)
    n = X.shape[0]

    def candidate(
        sqrt_m: Tensor | None, reg: float, grads: bool
    ) -> tuple[Candidate, Tensor | None]:
        if sqrt_m is not None and not bool(sqrt_m.isfinite().all()):
            return failed_candidate(X, y, X_val, sqrt_m, kernel, reg), None
        try:
            coef, pred, g = fit(sqrt_m, reg, grads)
        except RuntimeError as failure:  # an indefinite system: this step failed
            count("leaves stopped on a failed approximate solve")
            log.debug("leaf n=%d: approximate solve failed (%s); stopping", n, failure)
            return failed_candidate(X, y, X_val, sqrt_m, kernel, reg), None
        err, sq = validation_errors(pred, y_val, cfg.criterion, w_val)
        bw = float(kernel.bandwidth)
        return Candidate(err, -1, coef, sqrt_m, bw, kernel.q, reg, sq), g

    def step(sqrt_m: Tensor | None, agop: bool, diag: bool) -> tuple[Candidate, Tensor | None]:
        cand, g = candidate(sqrt_m, cfg.reg, agop)
        if g is None or not math.isfinite(cand.err):
            return cand, None
        return cand, agop_or_none(g, diag, n, w)

    best, errors, mode = iterate(step, cfg, n)
    best = _select(kernel, cfg, best, candidate)
    kernel.q = best.q
    kernel.bandwidth.fill_(best.bandwidth)
    return best, errors.to(X.device), mode if mode is not None else True


def _select(
    kernel: Kernel,
    cfg: LeafConfig,
    best: Candidate,
    candidate: Callable[[Tensor | None, float, bool], tuple[Candidate, Tensor | None]],
) -> Candidate:
    """Exponent and bandwidth grid (a change must win by ``kernel_margin``), then the ridge walk."""

    def at(q: float, bandwidth: float, incumbent: Candidate) -> Candidate:
        kernel.q = q
        kernel.bandwidth.fill_(bandwidth)
        cand, _ = candidate(incumbent.sqrt_m, cfg.reg, False)
        cand.t = incumbent.t
        return cand if beats(cand, incumbent, 0.0) else incumbent

    grid = kernel_grid(
        best.q, best.bandwidth, kernel.p, cfg.kernel_exponents, cfg.bandwidth_factors
    )
    best = search_grid(best, grid, at, cfg.kernel_margin)
    if cfg.reg_factors and cfg.approx != "centroids":  # the pseudoinverse has no ridge
        kernel.q = best.q
        kernel.bandwidth.fill_(best.bandwidth)

        def consider(lam: float, incumbent: Candidate) -> Candidate:
            cand, _ = candidate(incumbent.sqrt_m, lam, False)
            cand.t = incumbent.t
            return cand if beats(cand, incumbent, 0.0) else incumbent

        best = search_reg(best, consider, cfg.reg, cfg.reg_factors)
    return best
