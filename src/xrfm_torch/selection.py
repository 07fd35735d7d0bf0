"""Post-hoc kernel and ridge selection for a fitted leaf's ``M`` (pure functions over its buffers).

After the RFM iterations fix ``M`` (and ``t*``), :func:`select_kernel` re-solves the kernel ridge
regression for other exponents ``q``, bandwidths and ridges and keeps the lowest validation MSE.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from xrfm_torch.kernels import Kernel, transform
from xrfm_torch.solvers import solve_krr

log = logging.getLogger(__name__)


@dataclass
class Candidate:
    """One solved leaf model: validation MSE, iteration, ``alpha`` (n, c), ``sqrt(M)`` and kernel."""

    err: float
    t: int
    alpha: Tensor
    sqrt_m: Tensor | None
    bandwidth: float
    q: float
    reg: float


def select_kernel(
    kernel: Kernel,
    X: Tensor,
    y: Tensor,
    X_val: Tensor,
    y_val: Tensor,
    best: Candidate,
    buffers: tuple[Tensor, Tensor, Tensor],
    *,
    exponents: Sequence[float] | None,
    bandwidth_factors: Sequence[float] | None,
    reg: float,
    reg_factors: Sequence[float] | None,
    solve_dtype: torch.dtype | None,
) -> Candidate:
    """Re-solve ``best``'s ``M`` for each (exponent, bandwidth factor), then search the ridge.

    The ridge comes second (coordinate search, :func:`search_reg`) for the chosen kernel, whose
    ``K`` is built once for all ridge candidates. Exponents above the kernel's ``p`` are skipped.
    ``kernel`` is left at the chosen ``q`` and bandwidth.

    Args:
        kernel: The leaf's kernel (modified in place).
        X: Training inputs, shape (n, d).
        y: Training targets, shape (n, c).
        X_val: Validation inputs, shape (n_val, d).
        y_val: Validation targets, shape (n_val, c).
        best: The iterations' choice (its ``err`` is the bar to beat).
        buffers: ``(R, K, F)``: (n, n) distance and kernel buffers and the solver workspace.
        exponents: Candidate ``q`` (``best.q`` always competes).
        bandwidth_factors: Candidate multiples of ``best.bandwidth``.
        reg: Base ridge.
        reg_factors: Candidate multiples of ``reg`` (searched by :func:`search_reg`).
        solve_dtype: Dtype of the Cholesky solves.
    """
    R, K, F = buffers
    base, q0 = best.bandwidth, best.q
    xs, xv = transform(X, best.sqrt_m), transform(X_val, best.sqrt_m)
    kernel.distance(xs, xs, out=R)  # (n, n), shared by every candidate
    qs = {q0, *(q for q in exponents or () if q <= kernel.p)}
    factors = sorted({1.0, *(bandwidth_factors or ())})
    grid = [(q, base * f) for q in sorted(qs) for f in factors if (q, f) != (q0, 1.0)]

    built: tuple[float, float] | None = None  # (q, bandwidth) of the values K holds for this M

    def set_kernel(q: float, bandwidth: float) -> None:
        nonlocal built
        if built == (q, bandwidth):  # e.g. the ridge search right after its kernel's grid entry
            return
        kernel.q = q
        kernel.bandwidth.fill_(bandwidth)
        kernel.from_distance(R, out=K)  # solve_krr leaves K intact: reused across ridges
        built = (kernel.q, float(kernel.bandwidth))

    def consider(lam: float, best: Candidate) -> Candidate:
        alpha = solve_krr(K, y, lam, solve_dtype=solve_dtype, workspace=F)
        err = float(((kernel.predict(xv, xs, alpha) - y_val) ** 2).mean())
        q, bandwidth = kernel.q, float(kernel.bandwidth)
        log.debug(
            "leaf n=%d q %.3g bandwidth %.4g reg %.3g: val mse %.6g (best %.6g)",
            X.shape[0],
            q,
            bandwidth,
            lam,
            err,
            best.err,
        )
        if math.isfinite(err) and err < best.err:
            return Candidate(err, best.t, alpha, best.sqrt_m, bandwidth, q, lam)
        return best

    for q, bandwidth in grid:
        set_kernel(q, bandwidth)
        best = consider(reg, best)
    if reg_factors:
        set_kernel(best.q, best.bandwidth)
        best = search_reg(best, consider, reg, reg_factors)
    kernel.bandwidth.fill_(best.bandwidth)
    kernel.q = best.q
    return best


def search_reg(
    best: Candidate,
    consider: Callable[[float, Candidate], Candidate],
    reg: float,
    reg_factors: Sequence[float],
) -> Candidate:
    """Walk the ladder ``reg * sorted({1, *reg_factors})`` away from ``reg`` while the error falls.

    First upwards, and downwards only if the first step up did not help: the validation error is
    usually unimodal in the ridge, so a leaf pays one or two solves, not one per factor.
    ``consider(lam, best)`` solves at ridge ``lam`` and returns the better candidate (``best``
    itself when the new one is not better).
    """
    ladder = sorted({1.0, *reg_factors})
    start = ladder.index(1.0)
    for step in (1, -1):
        i, moved = start + step, False
        while 0 <= i < len(ladder):
            candidate = consider(reg * ladder[i], best)
            if candidate is best:
                break
            best, moved, i = candidate, True, i + step
        if moved:
            break
    return best
