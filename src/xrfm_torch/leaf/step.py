"""One RFM step of one leaf: a kernel ridge regression fit in the M-space of ``sqrt(M)``.

:func:`rfm_step` solves, measures the validation error and (optionally) takes the AGOP of the
fitted predictor while the kernel matrix is at hand; :func:`failed_candidate` is the step that
could not be made. The iterations (:mod:`xrfm_torch.leaf.iteration`) drive these steps one by
one; a lockstep batches them (:mod:`xrfm_torch.leaf.batched_step`, whose results match these).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from xrfm_torch.kernels import Kernel, chain_rule, linear, transform
from xrfm_torch.kernels.bandwidth import median_pairwise_distance
from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.leaf.criteria import validation_loss
from xrfm_torch.leaf.selection import Candidate
from xrfm_torch.numerics.agop import RootedAgop, agop_from_grads, usable_agop
from xrfm_torch.numerics.checks import all_finite
from xrfm_torch.numerics.host import read_scalars
from xrfm_torch.numerics.solvers import KRRSolveError, first_krr_solve, solve_krr
from xrfm_torch.numerics.warm_solves import pcg_krr


def failed_candidate(
    X: Tensor, y: Tensor, X_val: Tensor, sqrt_m: Tensor | None, kernel: Kernel, reg: float
) -> Candidate:
    """A step whose ``M`` is not finite or whose system cannot be factored: error NaN.

    The iterations then stop and keep the best finished iteration (a warning is logged).
    """
    nan = float("nan")
    alpha = y.new_full((X.shape[0], y.shape[1]), nan)
    bandwidth, rows = float(kernel.bandwidth), X_val.new_full((X_val.shape[0],), nan)
    return Candidate(nan, -1, alpha, sqrt_m, bandwidth, kernel.q, reg, rows)


def rfm_step(
    kernel: Kernel,
    X: Tensor,
    y: Tensor,
    X_val: Tensor,
    y_val: Tensor,
    sqrt_m: Tensor | None,
    buffers: tuple[Tensor, Tensor, Tensor],
    cfg: LeafConfig,
    *,
    agop: bool,
    diag: bool,
    generator: torch.Generator | None,
    warm: tuple[float, int] | None = None,
    weights: tuple[Tensor | None, Tensor | None] = (None, None),
) -> tuple[Candidate, Tensor | RootedAgop | None, bool]:
    """One KRR fit in the M-space of ``sqrt_m`` (+ the AGOP of its predictor, while K is at hand).

    Solves ``(K(S X, S X) + c U U^T + reg W^{-1}) alpha = y`` with ``S = sqrt_m`` (``None``:
    identity), the linear part ``U`` of weight ``c = linear_mix`` and ``W`` the training rows'
    weights, and measures the (weighted) validation error. With ``agop``, also returns the
    weighted mean ``G`` of ``J(x_i)^T J(x_i)`` of the fitted predictor at the training rows
    (self-terms excluded), (d,) if ``diag`` else (d, d), or ``None`` when it is degenerate.

    Args:
        kernel: The leaf's kernel (its bandwidth is reset here under ``adaptive_bandwidth``).
        X: Training inputs, shape (n, d).
        y: Targets, shape (n, c).
        X_val: Validation inputs, shape (n_val, d).
        y_val: Validation targets, shape (n_val, c).
        sqrt_m: ``sqrt(M)``, shape (d,) or (d, d), or ``None``.
        buffers: ``(R, K, F)``: (n, n) distance and kernel buffers and the solver workspace,
            reused by every step (a fresh allocation of this size costs as much as an exp pass).
        cfg: The leaf's settings: ``reg``, ``linear_mix`` (weight of the constant + linear part,
            :mod:`xrfm_torch.kernels.linear`), ``solve_dtype``, ``adaptive_bandwidth`` (if set,
            the bandwidth becomes this multiple of the median pairwise distance in the M-space
            first) and ``criterion`` (the validation criterion, :mod:`xrfm_torch.leaf.criteria`).
        agop: Whether to compute the AGOP.
        diag: Whether the AGOP is wanted as its diagonal.
        generator: For the median subsample.
        warm: ``(tol, max_iters)``: first try conjugate gradients preconditioned by the Cholesky
            factor that the workspace ``F`` still holds from an earlier step
            (:func:`xrfm_torch.numerics.warm_solves.pcg_krr`); factor afresh only if they give up.
            ``None``: factor afresh.
        weights: ``(training weights (n,), validation weights (n_val,))``, each ``None`` for 1.

    Returns:
        ``(candidate, G or None, whether F now holds this step's factor)``; the candidate's ``t``
        is left at -1 for the caller to set.
    """
    R, K, F = buffers
    row_w, w_val = weights
    reg, linear_mix, criterion = cfg.reg, cfg.linear_mix, cfg.criterion
    solve_dtype, adaptive_bandwidth = cfg.solve_dtype, cfg.adaptive_bandwidth
    # a non-finite sqrt(M) fails the step; its flag is read with the step's other scalars (a
    # solve on it fails or gives a non-finite error, and the flag decides either way)
    usable = None if sqrt_m is None else all_finite(sqrt_m)
    xs = transform(X, sqrt_m)
    if adaptive_bandwidth is not None:
        med = median_pairwise_distance(xs, kernel.p, generator=generator)
        if med > 1e-14:
            kernel.bandwidth.fill_(adaptive_bandwidth * med)
    kernel.distance(xs, xs, out=R)  # (n, n)
    kernel.from_distance(R, out=K)  # (n, n)
    U = linear.features_or_none(xs, linear_mix)
    alpha, unsure = None, None
    if warm is not None:
        alpha = pcg_krr(K, y, reg, F, features=U, tol=warm[0], max_iters=warm[1], weights=row_w)
    factored = alpha is None
    if alpha is None:  # its check is read with the step's other scalars
        alpha, unsure = first_krr_solve(
            K, y, reg, solve_dtype=solve_dtype, workspace=F, features=U, weights=row_w
        )

    def scored(alpha: Tensor) -> tuple[list[float], Tensor, Tensor | None]:
        """The step's scalars, read together; its per-row validation losses and its AGOP.

        The scalars: validation error, bandwidth, whether M is finite, the AGOP's largest
        entry, whether the first solve needs the full one.
        """
        xv = transform(X_val, sqrt_m)
        pred = kernel.predict(xv, xs, alpha)
        # the linear part's weights U^T alpha, once for the prediction and the gradient
        v = None if U is None else linear.linear_weights(U, alpha)
        if v is not None:
            pred = pred + linear.linear_features(xv, linear_mix) @ v
        err_t, sq = validation_loss(pred, y_val, criterion, w_val)
        G = None
        if agop:  # computed before the error is known (wasted only on a failed step)
            lin = None if v is None else linear.weights_grad(v, linear_mix)  # (1, c, d) w.r.t. S x
            # reuse the Gram matrix: gradient weights overwrite the distances
            w = kernel.grad_weights(R, K, out=R)
            gs = kernel.transformed_grads(xs, xs, alpha, w=w, row_offset=0)
            G = agop_from_grads(
                chain_rule(gs if lin is None else gs + lin, sqrt_m), diag=diag, weights=row_w
            )
        none = torch.zeros(())  # on the host: a value that does not apply costs no read
        values = read_scalars(
            err_t,
            kernel.bandwidth,
            none + 1 if usable is None else usable,
            none if G is None else G.max(),
            none if unsure is None else unsure,
        )
        return values, sq, G

    (err, bandwidth, finite_m, top, retry), sq, G = scored(alpha)
    if not finite_m:
        return failed_candidate(X, y, X_val, sqrt_m, kernel, reg), None, False
    if retry:  # the first attempt failed or was useless: solve_krr's retries (rare)
        try:
            alpha = solve_krr(
                K, y, reg, solve_dtype=solve_dtype, workspace=F, features=U, weights=row_w
            )
        except KRRSolveError:
            if sqrt_m is None:  # the plain kernel machine: nothing to fall back to
                raise
            return failed_candidate(X, y, X_val, sqrt_m, kernel, reg), None, False
        if agop:  # the gradient weights overwrote the distances: make them again
            kernel.distance(xs, xs, out=R)
        unsure = None
        (err, bandwidth, finite_m, top, _), sq, G = scored(alpha)
    cand = Candidate(err, -1, alpha, sqrt_m, bandwidth, kernel.q, reg, sq)
    if G is None or not math.isfinite(err):
        return cand, None, factored
    return cand, usable_agop(G, top, X.shape[0]), factored
