"""Leaves fitted across processes with ``torch.distributed`` (gloo on CPU, NCCL on GPU).

A tree's leaves are independent closed-form fits, so they parallelize without any change to the
algorithm: every rank holds the same data, grows the same tree top (the growth is deterministic
for a given seed), fits the leaves assigned to it, and then every rank loads every other rank's
leaves from their state dicts. All ranks thus end with the same model, equal to the one a single
process fits (each leaf draws from its own generator, seeded before any leaf is fitted, so it
does not matter which rank fits it or in which order).

Leaves go to ranks by cost, largest first, each to the least loaded rank (the longest-processing-
time rule, within 4/3 of the best assignment). A leaf's cost is that of its dense solves, about
``(iterations + 1) * rows_iter^3 + rows_final^3``.

No process group, or a group of one: everything runs in this process.
"""

from __future__ import annotations

import heapq
import logging
from collections.abc import Callable, Sequence
from typing import TypeVar

import torch
import torch.distributed as dist
from torch import Tensor

from xrfm_torch.leaf import LeafRFM

log = logging.getLogger(__name__)

#: Work done on one leaf in place (fit, final solve, posterior).
LeafJob = Callable[[LeafRFM], object]

#: A module whose state a job computes (a leaf, or a whole tree for bagging).
M = TypeVar("M", bound=torch.nn.Module)


def world(distributed: bool = True) -> tuple[int, int]:
    """``(rank, world size)`` of the default process group; ``(0, 1)`` without one.

    ``distributed=False`` (a fit that does not spread its leaves) is ``(0, 1)`` as well.
    """
    if distributed and dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def assign_by_cost(costs: Sequence[float], n_ranks: int) -> list[int]:
    """Owner rank per job: largest job first, each to the rank with the least work so far.

    Ties go to the lower rank, so every rank computes the same assignment.

    Args:
        costs: Estimated cost per job (any non-negative unit).
        n_ranks: Number of ranks (>= 1).

    Returns:
        ``owners[k]`` in ``[0, n_ranks)`` for each job ``k``.
    """
    if n_ranks < 1:
        raise ValueError(f"n_ranks must be >= 1, got {n_ranks}")
    owners = [0] * len(costs)
    load = [(0.0, r) for r in range(n_ranks)]  # (work so far, rank): a min-heap
    for k in sorted(range(len(costs)), key=lambda k: (-costs[k], k)):
        work, rank = heapq.heappop(load)
        owners[k] = rank
        heapq.heappush(load, (work + float(costs[k]), rank))
    return owners


def leaf_cost(
    rows: int,
    iter_rows: int | None,
    n_iters: int,
    width: int | None = None,
    approx_iters: bool = False,
) -> float:
    """Solve cost of a leaf: ``(n_iters + 1)`` solves on its iteration rows, one on all.

    An exact solve of ``m`` rows costs ``m^3``; an approximate one of ``width`` centres or
    features on ``rows`` rows ``rows * width^2`` (the final solve, and with ``approx_iters``
    every iteration).
    """
    m = rows if iter_rows is None else min(rows, iter_rows)
    if width is None:
        return float(n_iters + 1) * m**3 + float(rows) ** 3
    step = float(rows) * width**2
    return (float(n_iters + 1) * step if approx_iters else float(n_iters + 1) * m**3) + step


def run_leaf_jobs(
    leaves: Sequence[M],
    jobs: Sequence[Callable[[M], object] | None],
    owners: Sequence[int],
    *,
    distributed: bool,
) -> None:
    """Run ``jobs[k](leaves[k])`` for every job, spread over the ranks when ``distributed``.

    Afterwards every rank's ``leaves[k]`` holds the state its owner computed (loaded from the
    owner's state dict; a non-persistent cached factor stays with the owner). A job that fails
    on one rank fails the call on every rank (after the exchange, so none waits forever).

    Args:
        leaves: The leaves (the same list, in the same order, on every rank).
        jobs: Per leaf, the work to do in place, or ``None`` for none.
        owners: Per leaf, the rank that does its job (:func:`assign_by_cost`).
        distributed: Spread over the default process group (if one of several ranks exists).

    Raises:
        RuntimeError: On every rank, naming the rank whose job failed and its error.
    """
    rank, size = world(distributed)
    if size == 1:
        for leaf, job in zip(leaves, jobs):
            if job is not None:
                job(leaf)
        return
    mine: dict[int, dict[str, object]] = {}
    failure: Exception | None = None
    try:
        for k, (leaf, job, owner) in enumerate(zip(leaves, jobs, owners)):
            if job is not None and owner == rank:
                job(leaf)
                mine[k] = _cpu_state(leaf)
    except Exception as err:  # every rank must reach the exchange, or the others wait forever
        failure = err
    report = f"{type(failure).__name__}: {failure}" if failure is not None else None
    gathered: list[tuple[str | None, dict[int, dict[str, object]]] | None] = [None] * size
    dist.all_gather_object(gathered, (report, mine))
    failed = [(r, g[0]) for r, g in enumerate(gathered) if g is not None and g[0] is not None]
    if failed:
        r, message = failed[0]
        raise RuntimeError(f"distributed leaf fit failed on rank {r}: {message}") from failure
    for r, got in enumerate(gathered):
        if r == rank or got is None:
            continue
        for k, state in got[1].items():
            leaves[k].load_state_dict(state)
    log.debug("rank %d: fitted %d of %d leaf jobs", rank, len(mine), len(leaves))


def _cpu_state(module: torch.nn.Module) -> dict[str, object]:
    """``module.state_dict()`` with CPU tensors (other ranks may own other GPUs).

    Extra states (plain data) are kept as they are.
    """
    return {
        name: t.detach().cpu() if isinstance(t, Tensor) else t
        for name, t in module.state_dict().items()
    }


def check_same_data(distributed: bool, *tensors: Tensor) -> None:
    """Refuse a distributed fit whose ranks were given different data.

    Every rank must call ``fit`` with the same rows (each grows the same tree top and fits only
    its share of the leaves); a sharded dataset would give each rank a different tree. Compares
    shapes and a float64 checksum across ranks.

    Raises:
        ValueError: Naming the ranks whose data differ.
    """
    size = world(distributed)[1]
    if size == 1:
        return
    summary = []
    for t in tensors:
        finite = t.detach().double().nan_to_num(0.0, 0.0, 0.0)
        summary.append((tuple(t.shape), float(finite.sum()), float(finite.abs().sum())))
    gathered: list[object] = [None] * size
    dist.all_gather_object(gathered, summary)
    differ = [r for r in range(size) if gathered[r] != gathered[0]]
    if differ:
        raise ValueError(
            f"distributed fit: ranks {differ} were given data different from rank 0's "
            f"(shapes and checksums {gathered[differ[0]]} vs {gathered[0]}); every rank must "
            "call fit with the same rows (do not shard them)"
        )


def agreed_limit(limit: int | None, distributed: bool) -> int | None:
    """The smallest memory limit of any rank (``None`` where no rank has one).

    Ranks may see different free memory (``memory_budget="auto"``) or be given different
    budgets; planning every leaf against the same, strictest limit keeps their plans (which leaves
    are approximated, whether the fit stops) identical, so no rank fits a different model or waits
    for one that stopped.
    """
    size = world(distributed)[1]
    if size == 1:
        return limit
    gathered: list[int | None] = [None] * size
    dist.all_gather_object(gathered, limit)
    known = [g for g in gathered if g is not None]
    return min(known) if known else None


def leaf_seeds(generator: torch.Generator, n: int) -> list[int]:
    """One seed per leaf, drawn before any leaf is fitted (so fitting order does not matter)."""
    return [int(s) for s in torch.randint(0, 2**62, (n,), generator=generator)]


def broadcast_module(module: torch.nn.Module, distributed: bool) -> None:
    """Give every rank rank 0's state of ``module`` (a small fitted part of the model).

    For results that depend on a leaf's cached factor, which only its owner holds (the others
    recompute it, equal up to float rounding): the variance model fitted on validation moments.
    """
    if world(distributed)[1] == 1:
        return
    state = [_cpu_state(module)]
    dist.broadcast_object_list(state, src=0)
    module.load_state_dict(state[0])
