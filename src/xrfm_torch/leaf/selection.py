"""Post-hoc kernel and ridge selection for a fitted leaf's ``M`` (pure functions over its buffers).

After the RFM iterations fix ``M`` (and ``t*``), :func:`select_kernel` re-solves the kernel ridge
regression for other exponents ``q``, bandwidths and ridges and keeps the lowest validation MSE
(a new exponent or bandwidth only when it wins by a margin, :func:`beats`).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from xrfm_torch.kernels import Kernel, transform
from xrfm_torch.kernels.linear import features_or_none, linear_weights
from xrfm_torch.leaf.config import LeafConfig, RidgeRule
from xrfm_torch.leaf.criteria import validation_errors, validation_loss
from xrfm_torch.leaf.solve_request import SolveRequest, solve_candidate
from xrfm_torch.numerics.host import read_scalars
from xrfm_torch.numerics.risk import gcv_ridge
from xrfm_torch.numerics.solvers import solve_krr
from xrfm_torch.numerics.warm_solves import pcg_krr

log = logging.getLogger(__name__)


@dataclass
class Candidate:
    """One solved leaf model: validation MSE, iteration, ``alpha`` (n, c), ``sqrt(M)`` and kernel.

    ``sq_err`` holds the per-row validation losses of the leaf's criterion (squared errors summed
    over outputs by default; :mod:`xrfm_torch.leaf.criteria`), shape (n_val,): ``err`` is the
    criterion's value, and :func:`beats` compares two candidates row by row.
    """

    err: float
    t: int
    alpha: Tensor
    sqrt_m: Tensor | None
    bandwidth: float
    q: float
    reg: float
    sq_err: Tensor


def beats(challenger: Candidate, incumbent: Candidate, margin: float) -> bool:
    """Whether ``challenger`` has the lower validation MSE by at least ``margin`` standard errors.

    With per-row differences ``d_i = e_i(incumbent) - e_i(challenger)`` of squared errors on the
    same validation rows, the challenger wins iff ``mean(d) > margin * std(d) / sqrt(n_val)`` (a
    paired one-sided test; ``margin = 0``: any improvement). A few outlying rows dominate an MSE
    with heavy-tailed targets, and a kernel chosen on them does not carry over to new rows; the
    paired standard error is large exactly then.
    """
    if not math.isfinite(challenger.err) or challenger.err >= incumbent.err:
        return False  # on the recorded MSE, by which the selection ranks candidates
    if margin <= 0.0:  # the recorded errors are the means of these per-row errors: decided
        return True
    return paired_win(challenger.sq_err, incumbent.sq_err, margin)


def paired_win(challenger: Tensor, incumbent: Tensor, margin: float) -> bool:
    """:func:`beats` on per-row squared validation errors of two models, shapes (n,).

    The challenger needs a finite and lower mean; then, for ``d = incumbent - challenger``,
    ``mean(d) > margin * std(d) / sqrt(n)`` (any lower mean when ``margin <= 0`` or ``n < 2``).
    """
    d = (incumbent - challenger).double()
    # the four statistics read back at once (one host-device synchronization on a GPU)
    spread = d.std() if d.shape[0] > 1 else d.new_zeros(())  # one row: no spread to test
    c_mean, i_mean, d_mean, d_std = read_scalars(
        challenger.mean(), incumbent.mean(), d.mean(), spread
    )
    if not math.isfinite(c_mean) or c_mean >= i_mean:
        return False
    if margin <= 0.0 or incumbent.shape[0] < 2:
        return True
    return bool(d_mean > margin * d_std / math.sqrt(d.shape[0]))


def ridge_rule(cfg: LeafConfig, n_val: int) -> RidgeRule:
    """The rule that picks the leaf's ridge: ``"auto"`` is GCV below ``cfg.gcv_below`` rows."""
    if cfg.ridge_rule == "auto":
        return "gcv" if n_val < cfg.gcv_below else "validation"
    return cfg.ridge_rule


def select_kernel(
    kernel: Kernel,
    X: Tensor,
    y: Tensor,
    X_val: Tensor,
    y_val: Tensor,
    best: Candidate,
    buffers: tuple[Tensor, Tensor, Tensor],
    cfg: LeafConfig,
    *,
    warm: tuple[float, int] | None = None,
    weights: tuple[Tensor | None, Tensor | None] = (None, None),
) -> tuple[Candidate, bool]:
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
        cfg: The leaf's settings: ``kernel_exponents`` (candidate ``q``; ``best.q`` always
            competes), ``bandwidth_factors`` (candidate multiples of ``best.bandwidth``),
            ``reg`` (the base ridge) and ``reg_factors`` (its candidate multiples, searched by
            :func:`search_reg`), ``kernel_margin`` (the grid's lowest-error (exponent,
            bandwidth) replaces ``best``'s only if it beats ``best`` by this many paired
            standard errors, :func:`beats`; the ridge walk then takes any improvement),
            ``ridge_rule`` (:func:`ridge_rule`: the walk, or the GCV minimizer over
            ``reg * [min, max]`` of the factors, :func:`~xrfm_torch.numerics.risk.gcv_ridge`,
            taken whatever its validation error), ``solve_dtype``, ``linear_mix`` and
            ``criterion`` (:mod:`xrfm_torch.leaf.criteria`).
        warm: ``(tol, max_iters)`` of :func:`xrfm_torch.numerics.warm_solves.pcg_krr`: a ridge step within a
            factor 10 of a ridge already factored for the same kernel is solved by CG from that
            factor (``K + lam' I`` vs ``K + lam I``: condition number at most 10). ``None``:
            factor every candidate.
        weights: ``(training weights (n,), validation weights (n_val,))``, each ``None`` for 1:
            weighted solves (ridge ``reg / w_i`` per row), weighted validation errors, and GCV on
            the system scaled by ``sqrt(w)`` (weighted GCV).

    Returns:
        ``(chosen candidate, whether the buffers still hold its kernel matrix in K and the
        Cholesky factor of its system in F)``, so that a final solve with more rows can continue
        that factorization (:func:`xrfm_torch.numerics.warm_solves.solve_bordered`).
    """
    R, K, F = buffers
    w, w_val = weights
    reg, reg_factors, solve_dtype = cfg.reg, cfg.reg_factors, cfg.solve_dtype
    linear_mix, criterion, rule = cfg.linear_mix, cfg.criterion, ridge_rule(cfg, X_val.shape[0])
    exponents, bandwidth_factors = cfg.kernel_exponents, cfg.bandwidth_factors
    base, q0 = best.bandwidth, best.q
    xs, xv = transform(X, best.sqrt_m), transform(X_val, best.sqrt_m)
    kernel.distance(xs, xs, out=R)  # (n, n), shared by every candidate
    # and the validation rows' distances (only their kernel values change between candidates),
    # where the kernel would predict them in one block anyway
    Rv = kernel.distance(xv, xs) if kernel.in_one_block(xv, xs) else None
    U = features_or_none(xs, linear_mix)  # (n, d + 1) or None
    Uv = features_or_none(xv, linear_mix)  # (n_val, d + 1) or None
    grid = kernel_grid(q0, base, kernel.p, exponents, bandwidth_factors)

    built: tuple[float, float] | None = None  # (q, bandwidth) of the values K holds for this M
    factored: tuple[float, float, float] | None = None  # (q, bandwidth, ridge) of F's factor

    def set_kernel(q: float, bandwidth: float) -> None:
        nonlocal built
        if built == (q, bandwidth):  # e.g. the ridge search right after its kernel's grid entry
            return
        kernel.q = q
        kernel.bandwidth.fill_(bandwidth)
        kernel.from_distance(R, out=K)  # solve_krr leaves K intact: reused across ridges
        # the stored value, rounded to the buffer's dtype on the host (no read back)
        built = (kernel.q, torch.tensor(bandwidth, dtype=kernel.bandwidth.dtype).item())

    def predicted(alpha: Tensor) -> Tensor:
        """The validation predictions of ``alpha`` with the kernel as it is now."""
        pred = kernel.predict(xv, xs, alpha) if Rv is None else kernel.from_distance(Rv) @ alpha
        return pred if U is None or Uv is None else pred + Uv @ linear_weights(U, alpha)

    def consider(lam: float, best: Candidate, force: bool = False) -> Candidate:
        nonlocal factored
        alpha = None
        near = factored is not None and factored[:2] == built and 0.1 <= lam / factored[2] <= 10
        if warm is not None and near:
            alpha = pcg_krr(K, y, lam, F, features=U, tol=warm[0], max_iters=warm[1], weights=w)
        if alpha is None:  # its check is read with the validation error (batched in lockstep)
            one_block = Rv is not None
            request = SolveRequest(
                kernel, K, xs, y, xv, y_val, lam, U, F, cfg, weights, predicted, one_block
            )
            alpha, err, sq, retry, holds = solve_candidate(request)
            factored = None if built is None or not holds else (*built, lam)
        else:
            err_t, sq = validation_loss(predicted(alpha), y_val, criterion, w_val)
            err, flag = read_scalars(err_t, torch.zeros(()))
            retry = bool(flag)
        if retry:  # the first attempt failed or was useless: solve_krr's retries (rare)
            alpha = solve_krr(
                K, y, lam, solve_dtype=solve_dtype, workspace=F, features=U, weights=w
            )
            err, sq = validation_errors(predicted(alpha), y_val, criterion, w_val)
        q = kernel.q
        bandwidth = built[1] if built is not None else float(kernel.bandwidth)
        log.debug(
            "leaf n=%d q %.3g bandwidth %.4g reg %.3g: val mse %.6g (best %.6g)",
            X.shape[0],
            q,
            bandwidth,
            lam,
            err,
            best.err,
        )
        cand = Candidate(err, best.t, alpha, best.sqrt_m, bandwidth, q, lam, sq)
        return cand if force or beats(cand, best, 0.0) else best

    def at(q: float, bandwidth: float, incumbent: Candidate) -> Candidate:
        set_kernel(q, bandwidth)
        return consider(reg, incumbent)

    best = search_grid(best, grid, at, cfg.kernel_margin)
    if reg_factors:
        set_kernel(best.q, best.bandwidth)
        if rule == "gcv":
            ladder = [reg * f for f in (1.0, *reg_factors)]
            if w is None:
                lam, _, _ = gcv_ridge(K, y, min(ladder), max(ladder), features=U)
            else:  # GCV of the system scaled by sqrt(w): a copy, K stays for the solves
                r = w.sqrt().to(K.dtype)
                Ur = None if U is None else U * r[:, None]
                Kr, yr = K * r[:, None] * r[None, :], y * r[:, None]
                lam, _, _ = gcv_ridge(Kr, yr, min(ladder), max(ladder), features=Ur)
                del Kr
            best = consider(lam, best, force=True)
        else:
            best = search_reg(best, consider, reg, reg_factors)
    kernel.bandwidth.fill_(best.bandwidth)
    kernel.q = best.q
    holds = built is not None and built == (best.q, best.bandwidth)
    return best, holds and factored == (best.q, best.bandwidth, best.reg)


def kernel_grid(
    q0: float,
    bandwidth: float,
    p: float,
    exponents: Sequence[float] | None,
    bandwidth_factors: Sequence[float] | None,
) -> list[tuple[float, float]]:
    """The ``(q, bandwidth)`` pairs the post-hoc grid tries besides the iterations' own.

    Every exponent up to the kernel's ``p`` times every bandwidth factor, in order, without
    ``(q0, bandwidth)`` itself.
    """
    qs = sorted({q0, *(q for q in exponents or () if q <= p)})
    factors = sorted({1.0, *(bandwidth_factors or ())})
    return [(q, bandwidth * f) for q in qs for f in factors if (q, f) != (q0, 1.0)]


def search_grid(
    start: Candidate,
    grid: Sequence[tuple[float, float]],
    at: Callable[[float, float, Candidate], Candidate],
    margin: float,
) -> Candidate:
    """The grid's lowest-error candidate if it beats ``start`` by ``margin``, else ``start``.

    ``at(q, bandwidth, incumbent)`` solves that kernel and returns the better of the new
    candidate and ``incumbent``. The winner must clearly beat the iterations' own kernel
    (comparing with that, not step by step, makes the choice order-free); the ridge walk after it
    needs no margin: its steps change every prediction a little and consistently (a margin there
    cost accuracy, docs/design.md), while a new exponent can win on a few rows.
    """
    best = start
    for q, bandwidth in grid:
        best = at(q, bandwidth, best)
    if best is not start and not beats(best, start, margin):
        log.debug("kernel choice not significant; keeping q %.3g", start.q)
        return start
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
