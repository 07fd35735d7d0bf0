"""Fit one LeafRFM per leaf of a grown tree: in memory budget, spread over ranks, with progress.

:mod:`xrfm_torch.tree.grow` decides where rows go; this module fits the leaves on them.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from xrfm_torch.leaf import LeafRFM
from xrfm_torch.leaf.approx import approx_width
from xrfm_torch.leaf.data import FitData
from xrfm_torch.leaf.lockstep import fit_together
from xrfm_torch.numerics import deadline
from xrfm_torch.numerics.host import split_by_masks
from xrfm_torch.numerics.rng import own_generator
from xrfm_torch.tree.config import TreeConfig
from xrfm_torch.tree.grow import Progress, TreeLayout
from xrfm_torch.tree.memory import (
    approximate_to_fit,
    budget_bytes,
    check_leaf_memory,
    leaf_peak_bytes,
)
from xrfm_torch.tree.parallel import (
    LeafJob,
    agreed_limit,
    assign_by_cost,
    leaf_cost,
    leaf_seeds,
    run_leaf_jobs,
    world,
)
from xrfm_torch.tree.routing import hard_route

log = logging.getLogger(__name__)


def borrow_validation_rows(
    train_idx: Tensor,
    n_val: int,
    *,
    min_val_rows: int,
    max_borrow_fraction: float,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor]:
    """The reference's refill rule: move some of a leaf's training rows into its validation set.

    A leaf with fewer than ``min_val_rows`` validation rows moves
    ``min(min_val_rows - n_val, floor(max_borrow_fraction * n_train))`` random training rows into
    validation (at least 2 training rows always stay).

    Returns:
        ``(kept_train_idx, borrowed_idx)`` (``borrowed_idx`` may be empty).
    """
    n_train = train_idx.shape[0]
    want = min(min_val_rows - n_val, math.floor(max_borrow_fraction * n_train), n_train - 2)
    if n_val >= min_val_rows or want <= 0:
        return train_idx, train_idx[:0]
    perm = torch.randperm(n_train, generator=generator).to(train_idx.device)
    return train_idx[perm[want:]], train_idx[perm[:want]]


def fit_leaves(
    layout: TreeLayout,
    data: FitData,
    *,
    new_leaf: Callable[[], LeafRFM],
    config: TreeConfig,
    generator: torch.Generator | None,
    progress: Progress | None = None,
    tree_index: int = 0,
    start: Callable[[Tensor], Tensor | None] | None = None,
) -> tuple[list[LeafRFM], list[Tensor | None], list[int]]:
    """Fit one LeafRFM per leaf of ``layout`` on the rows routed to it.

    ``data``: the (mapped) training and validation rows and their weights, if any (every leaf
    row keeps its weight: training, validation, borrowed and final-solve rows alike), their
    values checked (:func:`~xrfm_torch.inputs.choice.encode_fit_data`): the leaves check none.
    Validation rows per leaf: with ``data.holdout`` (bool mask over ``X``: no user validation
    data), the leaf's held-out rows; otherwise the routed ``X_val`` rows. After a split, a leaf short of
    validation rows borrows training rows (:func:`borrow_validation_rows`).

    Overlap rows (training rows of a leaf that the thresholds route elsewhere) join only the final
    solve: ``M``, ``t*`` and the kernel are learned on the rows the leaf will predict for, so the
    overlap costs one larger solve per leaf instead of larger iterations.

    The rows of every leaf are settled first (the borrowing draws from ``generator`` in leaf
    order); then each leaf is fitted with its own generator, seeded from ``generator``, so the
    leaves can be fitted in any order or on other ranks (``distributed``,
    :mod:`xrfm_torch.tree.parallel`) and give the same model.

    Returns:
        The leaves; per leaf the training-row indices of its final solve, or ``None`` when the
        leaf already saw them all (that solve adds the overlap rows, the rows taken from training
        for validation (with ``refit_borrowed``) and the rows left out of an ``iter_rows``
        subsample, so a leaf never pays for two extra solves); per leaf the rank that fitted it.
    """
    generator = own_generator(generator)
    distributed, memory_budget = config.distributed, config.memory_budget
    X, y, holdout, w = data.X, data.y, data.holdout, data.w
    # (train, X_val, y_val, final rows, validation weights)
    plans: list[tuple[Tensor, Tensor, Tensor, Tensor, Tensor | None]] = []
    leaf_rows = layout.leaf_train
    if holdout is not None:  # (each split's size is read once for all leaves: split_by_masks)
        train_held = split_by_masks(leaf_rows, [~holdout[rows] for rows in leaf_rows])
    else:
        train_held = [(rows, rows[:0]) for rows in leaf_rows]
    trains = [tr for tr, _ in train_held]
    extras = [tr[:0] for tr in trains]
    if layout.overlap:
        # one routing of all rows; a leaf's own rows are the ones routed to it
        routed = hard_route(X, layout.vectors, layout.thresholds, layout.children)
        by_route = split_by_masks(trains, [routed[tr] == k for k, tr in enumerate(trains)])
        for k, (mine, other) in enumerate(by_route):
            # a child's own rows are at least half of it (overlap_fraction <= 0.4); fewer means
            # ties at a threshold (e.g. duplicated rows), where routing and the rank cut disagree
            if 2 * mine.shape[0] >= trains[k].shape[0]:
                trains[k], extras[k] = mine, other
    for rows, va, (_, held), tr, extra in zip(
        leaf_rows, layout.leaf_val, train_held, trains, extras
    ):
        if holdout is not None:
            Xv, yv, wv = X[held], y[held], data.weights(held)
        else:
            Xv, yv, wv = data.X_val[va], data.y_val[va], data.val_weights(va)
        if layout.n_splits > 0:
            tr, borrowed = borrow_validation_rows(
                tr,
                Xv.shape[0],
                min_val_rows=config.min_leaf_val,
                max_borrow_fraction=config.max_borrow_fraction,
                generator=generator,
            )
            if wv is not None or w is not None:  # every row keeps its weight (1: its set had none)
                own = X.new_ones(Xv.shape[0]) if wv is None else wv
                wv = torch.cat([own, X.new_ones(borrowed.shape[0]) if w is None else w[borrowed]])
            Xv, yv = torch.cat([Xv, X[borrowed]]), torch.cat([yv, y[borrowed]])
        plans.append((tr, Xv, yv, rows if config.refit_borrowed else torch.cat([tr, extra]), wv))
    seeds = leaf_seeds(generator, len(plans))
    leaves = [new_leaf().to(device=X.device, dtype=X.dtype) for _ in plans]
    # before any leaf is fitted: every planned leaf against the memory budget; one that would
    # exceed it is fitted approximately where that fits (tree/memory.py), else the fit stops
    limit = agreed_limit(budget_bytes(memory_budget, X.device), distributed)
    sizes = _fit_in_budget(
        leaves, [(p[0].shape[0], p[1].shape[0], p[3].shape[0]) for p in plans], X, limit
    )
    check_leaf_memory(sizes, X.dtype, X.device, limit, auto=memory_budget == "auto")
    done = [0]

    def job(k: int) -> LeafJob:
        tr, Xv, yv, final, wv = plans[k]
        wt = None if w is None else w[tr]

        def run(leaf: LeafRFM) -> None:
            deadline.check()  # an aborting time limit drops the fit before the next leaf
            g = torch.Generator().manual_seed(seeds[k])
            m0 = None if start is None else start(X[tr])
            if Xv.shape[0] == 0:
                leaf.fit(
                    X[tr],
                    y[tr],
                    sample_weight=wt,
                    generator=g,
                    final_solve=False,
                    start_sqrt_m=m0,
                    check_input=False,
                )
            else:
                final_rows: dict[str, Any] = {"final_solve": False}
                if holdout is None and leaf.config.iter_rows is None:
                    # the final solve's rows are known now and the temperature is tuned on the
                    # user's validation data either way, so the leaf adds them while its factor
                    # is at hand
                    joins = torch.ones(X.shape[0], dtype=torch.bool, device=X.device)
                    joins[tr] = False
                    # (tr is part of final: the rest is final's other rows, in their order)
                    ((more, _),) = split_by_masks(
                        [final], [joins[final]], [final.shape[0] - tr.shape[0]]
                    )
                    final_rows = {
                        "extra": (X[more], y[more]),
                        "extra_weight": None if w is None else w[more],
                    }
                leaf.fit(
                    X[tr],
                    y[tr],
                    Xv,
                    yv,
                    sample_weight=wt,
                    val_sample_weight=wv,
                    generator=g,
                    start_sqrt_m=m0,
                    check_input=False,
                    **final_rows,
                )
            done[0] += 1
            if progress is not None:
                progress(tree_index, done[0], len(plans))
            if log.isEnabledFor(logging.DEBUG):  # (its values are reads: waits on a GPU)
                log.debug(
                    "leaf %d: %d train / %d val rows, t*=%d, bandwidth %.4g",
                    k,
                    tr.shape[0],
                    Xv.shape[0],
                    int(leaf.best_iter_),
                    leaf.bandwidth,
                )

        return run

    costs = [
        leaf_cost(
            final.shape[0],
            leaf.config.iter_rows,
            leaf.config.n_iters,
            width=size[3],
            approx_iters=leaf.config.approx_iters,
        )
        for leaf, (_, _, _, final, _), size in zip(leaves, plans, sizes)
    ]
    owners = assign_by_cost(costs, world(distributed)[1])
    if world(distributed)[1] > 1:
        run_leaf_jobs(leaves, [job(k) for k in range(len(plans))], owners, distributed=distributed)
    else:  # in lockstep where batched steps pay (and inside a lockstep already running)
        fit_together(
            [functools.partial(job(k), leaf) for k, leaf in enumerate(leaves)],
            batched=config.steps_batched(X.device),
            held_bytes=_held_bytes(leaves, sizes, X),
            limit=limit,
        )
    refit = [
        final if leaf.support_.shape[0] < final.shape[0] else None
        for leaf, (_, _, _, final, _) in zip(leaves, plans)
    ]
    return leaves, refit, owners


def _held_bytes(
    leaves: list[LeafRFM], sizes: list[tuple[int, int, int, int | None]], X: Tensor
) -> int:
    """What the leaves hold at once in lockstep.

    Three (n, n) step buffers per exactly iterating leaf and the largest leaf's peak (its final
    solve).
    """
    exact = [s for leaf, s in zip(leaves, sizes) if s[3] is None or not leaf.config.approx_iters]
    held = sum(3 * s[0] ** 2 for s in exact) * X.element_size()
    return held + max((leaf_peak_bytes(*s[:3], X.dtype, s[3]) for s in sizes), default=0)


def _planned_size(
    leaf: LeafRFM, n_train: int, n_val: int, n_final: int, d: int
) -> tuple[int, int, int, int | None]:
    """``(iteration rows, validation rows, final rows, approximate width or None)`` of a leaf."""
    n_fit = min(n_train, leaf.config.iter_rows or n_train)
    width = None if leaf.keep_factor else approx_width(leaf.config, n_fit, n_final, d)
    return n_fit, n_val, n_final, width


def _fit_in_budget(
    leaves: list[LeafRFM], rows: list[tuple[int, int, int]], X: Tensor, limit: int | None
) -> list[tuple[int, int, int, int | None]]:
    """Approximate the leaves whose exact fit would exceed ``limit`` bytes, where that fits.

    ``rows``: per leaf ``(training, validation, final)`` rows. A leaf over the limit gets the
    settings of :func:`~xrfm_torch.tree.memory.approximate_to_fit` (one warning counts them);
    one that cannot fit even so is left for :func:`check_leaf_memory` to refuse.

    Returns:
        Per leaf, its planned size (:func:`_planned_size`) after the change.
    """
    d, sizes, changed = X.shape[1], [], []
    for k, (leaf, (n_train, n_val, n_final)) in enumerate(zip(leaves, rows)):
        size = _planned_size(leaf, n_train, n_val, n_final, d)
        over = limit is not None and leaf_peak_bytes(*size[:3], X.dtype, size[3]) > limit
        if over and limit is not None and not leaf.keep_factor:
            cfg = approximate_to_fit(leaf.config, *size[:3], d, X.dtype, limit)
            if cfg is not None:
                leaf.config = cfg
                size = _planned_size(leaf, n_train, n_val, n_final, d)
                changed.append((k, n_final, cfg))
        sizes.append(size)
    if changed and limit is not None:
        k, n, cfg = max(changed, key=lambda c: c[1])
        log.warning(
            "%d of %d leaves would exceed the memory budget (%.2f GiB) solved exactly; they "
            "iterate on a subsample and solve %s over it instead (largest: leaf %d, %d rows, "
            "iterations on %d); memory_budget and max_leaf_size change this",
            len(changed),
            len(leaves),
            limit / 2**30,
            cfg.approx,
            k,
            n,
            cfg.iter_rows,
        )
    return sizes
