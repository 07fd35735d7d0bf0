"""The RFM iterations of one leaf: solve, validate, AGOP, repeat (the body of ``LeafRFM.fit``).

:func:`run_iterations` drives the steps (:func:`xrfm_torch.leaf.step.rfm_step`, or a lockstep's
batched ones) for ``t = 0 .. tau`` with the leaf's stopping rules and hands the best one to the
post-hoc selection (:func:`xrfm_torch.leaf.selection.select_kernel`). Kept apart from ``model.py`` so
that the module holds what a fitted leaf *is* (buffers, prediction, gradients) and this one how its
``M`` is learned.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable

import torch
from torch import Tensor

from xrfm_torch.kernels import Kernel
from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.leaf.selection import Candidate, select_kernel
from xrfm_torch.leaf.step import rfm_step
from xrfm_torch.numerics import context, deadline
from xrfm_torch.numerics.agop import RootedAgop, next_root
from xrfm_torch.numerics.events import count
from xrfm_torch.numerics.progress import report_iteration
from xrfm_torch.numerics.solvers import krr_workspace

log = logging.getLogger(__name__)

#: A warm (CG) solve of ``n`` rows may take up to ``n // PCG_ROWS_PER_ITER`` iterations (none below
#: 5): a CG step (a product with K and two triangular solves) costs about ``150 / n`` of a
#: Cholesky factorization, so the budget stays at about half the factorization it replaces
#: (docs/design.md, warm solves).
PCG_ROWS_PER_ITER = 300

#: The same rule off the CPU (a GPU). There a triangular solve with one right-hand side is
#: latency-bound while the factorization runs at matrix-unit speed: a CG step cost 1/4.5 of a
#: factorization at 4000 rows, 1/8 at 8000 and 1/50 at 32 000 (an H200, ``python -m bench.gpu
#: --solver-sizes``), i.e. 1300-2000 rows per step. So 2000: warm solves from 10 000 rows on.
PCG_ROWS_PER_ITER_DEVICE = 2000


#: A leaf's iterations stop trying warm solves once this many tries in a row gave up. Per leaf,
#: the tries ran like 000, 0000, 000000 in most classification leaves (1 = converged) and like
#: 0101101101 in regression (a factor one step old suffices, two steps old not); a give-up costs
#: about 0.4 of the factorization after it and a success saves 0.3-0.5 of one (2 CPU threads,
#: 3000-9000 rows), so a second give-up in a row is where the tries stop paying. A leaf whose
#: ``M`` settles late (0001) loses its late successes; skipping some steps and trying again
#: kept those but saved nothing on diamonds (154.6 s against 155.5; stopping: 143.3).
WARM_GIVE_UPS = 2


def warm_budget(n: int, device: torch.device) -> int:
    """Most CG iterations a warm solve of an ``n``-row system on ``device`` may take (0: none)."""
    per_iter = PCG_ROWS_PER_ITER if device.type == "cpu" else PCG_ROWS_PER_ITER_DEVICE
    iters = n // per_iter
    return iters if iters >= 5 else 0


#: What runs one RFM step, with :func:`rfm_step`'s signature and result ``(candidate, G or None,
#: whether the workspace holds the step's factor)``: ``rfm_step`` itself, or a lockstep fit's
#: batching (:class:`xrfm_torch.leaf.lockstep.Lockstep`).
StepRunner = Callable[..., "tuple[Candidate, Tensor | RootedAgop | None, bool]"]


@torch.no_grad()
def run_iterations(
    kernel: Kernel,
    cfg: LeafConfig,
    X: Tensor,
    y: Tensor,
    X_val: Tensor,
    y_val: Tensor,
    generator: torch.Generator | None,
    weights: tuple[Tensor | None, Tensor | None] = (None, None),
    start: Tensor | None = None,
) -> tuple[Candidate, Tensor, bool, tuple[Tensor, Tensor] | None]:
    """Fit ``t = 0 .. tau`` with ``M_{t+1} = G_t / (eps + max G_t)`` and keep the best validation MSE.

    The settings drive the loop: ``n_iters`` (``tau``), ``diag`` (``"auto"`` fits both the
    diagonal and the full ``M`` from ``G_0`` at ``t = 1`` and continues with the better),
    ``early_stop_multiplier``, ``patience`` / ``tol`` / ``min_iters``, then the post-hoc exponent,
    bandwidth and ridge selection. The kernel starts from its own exponent and bandwidth and is
    left at the chosen ones.

    Args:
        kernel: The leaf's kernel (its exponent and bandwidth are set to the chosen ones).
        cfg: The leaf's settings.
        X: Training inputs, shape (n, d).
        y: Targets, shape (n, c).
        X_val: Validation inputs, shape (n_val, d).
        y_val: Validation targets, shape (n_val, c).
        generator: For the adaptive-bandwidth subsamples.
        weights: ``(training weights (n,), validation weights (n_val,))``, each ``None`` for 1:
            every solve, AGOP and validation error is weighted (:func:`rfm_step`).
        start: ``sqrt(M)`` of ``t = 0``, (d,) or (d, d), which also fixes the layout (``None``:
            the identity, the layout by ``diag``).

    Returns:
        ``(best candidate, validation MSE per iteration (tau + 1,) with NaN where not run,
        whether M is diagonal, (K, F) or None)``: the last are the (n, n) kernel matrix of the
        chosen model and the workspace holding the Cholesky factor of its system, when the
        post-hoc search left them so (a final solve with more rows continues from them).
    """
    n = X.shape[0]
    buffers = (
        X.new_empty(n, n),
        X.new_empty(n, n),
        krr_workspace(n, cfg.solve_dtype or X.dtype, X.device),
    )

    # Once M settles, the kernel matrix changes little between iterations: a step in the same
    # layout (diagonal or full) as the learned-M step whose Cholesky factor the workspace holds
    # refines from that factor by CG instead of factoring again. Not from t = 0's identity M.
    cg_iters = warm_budget(n, X.device)
    warm = (cfg.pcg_tol, cg_iters) if cfg.pcg_tol is not None and cg_iters > 0 else None
    factor_diag: bool | None = None  # layout of the step whose factor F holds (None: no such step)
    gave_up = 0  # warm tries in a row that gave up (WARM_GIVE_UPS of them end the tries)

    def solve(
        sqrt_m: Tensor | None, agop: bool, diag: bool, warm_now: tuple[float, int] | None
    ) -> tuple[Candidate, Tensor | RootedAgop | None, bool]:
        return (context.current().step_runner or rfm_step)(
            kernel,
            X,
            y,
            X_val,
            y_val,
            sqrt_m,
            buffers,
            cfg,
            agop=agop,
            diag=diag,
            generator=generator,
            warm=warm_now,
            weights=weights,
        )

    def account(sqrt_m: Tensor | None, diag: bool, tried: bool, factored: bool) -> None:
        nonlocal factor_diag, gave_up
        if tried:
            gave_up = gave_up + 1 if factored else 0
        if factored:
            factor_diag = None if sqrt_m is None else diag

    def step(
        sqrt_m: Tensor | None, agop: bool, diag: bool
    ) -> tuple[Candidate, Tensor | RootedAgop | None]:
        tried = warm is not None and factor_diag is diag and gave_up < WARM_GIVE_UPS
        cand, G, factored = solve(sqrt_m, agop, diag, warm if tried else None)
        account(sqrt_m, diag, tried, factored)
        return cand, G

    def together(calls: list[StepCall]) -> list[tuple[Candidate, Tensor | RootedAgop | None]]:
        """``"auto"``'s diagonal and full ``t = 1`` steps: in a lockstep, in one round.

        Both are made from ``G_0``; asked for from two jobs of the lockstep, they batch together
        (one round, not two); the factor bookkeeping then runs in the calls' order. No warm
        tries (t = 0's identity ``M`` leaves no factor to use), and not where a step sets the
        shared kernel's bandwidth (``adaptive_bandwidth``).
        """
        in_one_round = context.current().round_runner
        if in_one_round is None or cfg.adaptive_bandwidth is not None:
            return [step(*call) for call in calls]
        outs = in_one_round([functools.partial(solve, *call, None) for call in calls])
        for (sqrt_m, _, diag), (_, _, factored) in zip(calls, outs):
            account(sqrt_m, diag, False, factored)
        return [(cand, G) for cand, G, _ in outs]

    started = time.perf_counter()
    best, errors, mode = iterate(step, cfg, n, start, together=together)
    factored = None
    seconds = time.perf_counter() - started
    if (cfg.bandwidth_factors or cfg.kernel_exponents or cfg.reg_factors) and not (
        # (the cost's estimate reads the errors: only under a deadline)
        deadline.should_stop(lambda: search_cost(cfg, seconds, errors))
    ):
        best, holds = select_kernel(
            kernel,
            X,
            y,
            X_val,
            y_val,
            best,
            buffers,
            cfg,
            warm=warm,
            weights=weights,
        )
        factored = (buffers[1], buffers[2]) if holds else None
    return best, errors.to(X.device), mode if mode is not None else True, factored


def search_cost(cfg: LeafConfig, iter_seconds: float, errors: Tensor) -> float:
    """The post-hoc search's seconds, estimated from the iterations' (one solve per candidate)."""
    steps = max(1, int(errors.isfinite().sum()))
    grid = len(cfg.kernel_exponents or (1,)) * len(cfg.bandwidth_factors or (1,))
    return (grid + len(cfg.reg_factors or ())) * iter_seconds / steps


#: One RFM step: ``step(sqrt_m or None, whether to compute the AGOP, diagonal AGOP)`` returns the
#: solved candidate and its AGOP ``G`` (``None`` when not asked for or degenerate).
Step = Callable[[Tensor | None, bool, bool], tuple[Candidate, Tensor | RootedAgop | None]]
#: A step's arguments ``(sqrt_m or None, agop, diag)``.
StepCall = tuple[Tensor | None, bool, bool]
#: Runs independent steps (their results in the calls' order), e.g. in one lockstep round.
Together = Callable[[list[StepCall]], list[tuple[Candidate, Tensor | RootedAgop | None]]]


def iterate(
    step: Step,
    cfg: LeafConfig,
    n: int,
    start: Tensor | None = None,
    together: Together | None = None,
) -> tuple[Candidate, Tensor, bool | None]:
    """The RFM loop over ``t = 0 .. tau`` with the leaf's stopping rules, for any solve ``step``.

    ``M_{t+1} = G_t / (eps + max G_t)`` (plus ``agop_ridge``), ``diag="auto"`` fits both layouts
    at ``t = 1`` and continues with the better; stops on ``early_stop_multiplier``, ``patience``
    (from ``min_iters``), a failed step, or a time limit that the next step would pass
    (:mod:`xrfm_torch.numerics.deadline`). ``t = 0`` solves with ``start`` (``None``: the
    identity); a given start fixes the layout to its own. Shared by the exact iterations
    (:func:`run_iterations`) and the approximate ones (:mod:`xrfm_torch.leaf.approx_iteration`).
    ``together`` runs ``"auto"``'s two ``t = 1`` steps (default: one after the other).

    Returns:
        ``(best candidate, validation error per iteration (tau + 1,) float64 with NaN where not
        run, whether M is diagonal or None if never decided)``.
    """
    tau = cfg.n_iters
    errors = torch.full((tau + 1,), float("nan"), dtype=torch.float64)
    # "auto" decides diag vs full at t = 1 (both are fitted from the full G_0; the one with the
    # lower validation error continues), so it costs one extra solve, not twice the iterations.
    mode: bool | None = None if cfg.diag == "auto" else bool(cfg.diag)
    if start is not None:  # a warm start fixes the layout: its own
        mode = start.ndim == 1
    best: Candidate | None = None
    t_gain = 0  # last iteration that improved the best error by more than tol
    G: Tensor | RootedAgop | None = None
    step_seconds = 0.0  # the last step's cost: the next one's estimate under a time limit
    for t in range(tau + 1):
        agop = t < tau
        n_steps = 2 if mode is None and t > 0 else 1
        if t > 0 and deadline.should_stop(n_steps * step_seconds):
            count("leaves stopped iterating at the time limit")
            break
        started = time.perf_counter()
        if t == 0:
            cands = [step(start, agop, mode is True)]
        elif G is None:
            break
        elif mode is None:
            pair: list[StepCall] = [
                (next_root(G, dg, cfg.eps, cfg.agop_ridge), agop, dg) for dg in (True, False)
            ]
            cands = together(pair) if together is not None else [step(*c) for c in pair]
        else:
            cands = [step(next_root(G, mode, cfg.eps, cfg.agop_ridge), agop, mode)]
        for c, _ in cands:
            c.t = t
            if math.isfinite(c.err) and (best is None or c.err < best.err):
                if best is None or c.err < (1.0 - cfg.tol) * best.err:
                    t_gain = t
                best = c
        cand, G = min(cands, key=lambda cg: cg[0].err if math.isfinite(cg[0].err) else math.inf)
        step_seconds = (time.perf_counter() - started) / len(cands)
        if mode is None and t > 0:
            mode = cand.sqrt_m is not None and cand.sqrt_m.ndim == 1
            log.debug("leaf n=%d: auto chose %s M", n, "diagonal" if mode else "full")
        errors[t] = cand.err
        log.debug("leaf n=%d iter %d: val mse %.6g", n, t, cand.err)
        report_iteration(t, tau)
        if not math.isfinite(cand.err):
            count("leaves stopped on a non-finite validation error")
            log.debug("leaf n=%d iter %d: non-finite validation error; stopping", n, t)
            break
        mult = cfg.early_stop_multiplier
        if best is not None and mult is not None and cand.err > best.err * float(mult):
            break
        if cfg.patience is not None and t >= cfg.min_iters and t - t_gain >= cfg.patience:
            log.debug("leaf n=%d: no new best for %d iterations; stopping", n, cfg.patience)
            break
    if best is None:
        raise RuntimeError(
            f"LeafRFM produced no finite validation error (errors: {errors.tolist()})"
        )
    return best, errors, mode
