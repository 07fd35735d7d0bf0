"""Which input maps a model's trees see: probe the maps with small leaves, keep the simplest set.

Whether normal scores help depends strongly on the data: they spread the rows of a heavy-tailed
feature, but discrete features tied at one value, or a target that sums heavy-tailed inputs
and is decided by rows beyond the training range, lose by them. Where two maps are about as good,
their errors differ, and the average of a tree on each beats both. A small leaf (``PROBE_ROWS``
training rows, up to ``PROBE_ITERS`` AGOP updates, no post-hoc searches) shows these orderings, so
``"auto"`` fits one per map on the same rows, scores every set of at most ``max_maps`` maps by the
average of its leaves' validation predictions, and keeps the raw inputs unless a set wins by a
margin (docs/design.md, input maps).
"""

from __future__ import annotations

import itertools
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import replace
from typing import cast

import torch
from torch import Tensor

from xrfm_torch.inputs.input_map import (
    INPUT_MAPS,
    PROBED_MAPS,
    InputMap,
    InputMapName,
    InputTransform,
)
from xrfm_torch.kernels import Kernel
from xrfm_torch.leaf import LeafRFM
from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.leaf.criteria import Criterion, validation_loss
from xrfm_torch.leaf.data import FitData
from xrfm_torch.leaf.lockstep import fit_together
from xrfm_torch.leaf.selection import paired_win
from xrfm_torch.numerics import deadline
from xrfm_torch.numerics.checks import check_all_finite
from xrfm_torch.numerics.events import count

log = logging.getLogger(__name__)

PROBE_ROWS = 2000
PROBE_VAL_ROWS = 4000
PROBE_ITERS = 5
PROBE_PATIENCE = 2
#: Under a degrading deadline (a candidate that must end with a model), the most of the time
#: left when the probe starts that it may take; the rest is kept for the tree's leaves.
PROBE_TIME_SHARE = 0.5


def check_input_transform(value: str | Sequence[str]) -> InputTransform:
    """``"auto"``, a name from :data:`INPUT_MAPS`, or a non-empty sequence of distinct names."""
    if isinstance(value, str):
        if value == "auto" or value in INPUT_MAPS:
            return value  # type: ignore[return-value]
    else:
        names = tuple(value) if isinstance(value, Iterable) else ()
        if names and all(v in INPUT_MAPS for v in names) and len(set(names)) == len(names):
            return tuple(str(v) for v in names)  # type: ignore[misc]
    raise ValueError(
        f"input_transform must be 'auto', one of {INPUT_MAPS} or a list of distinct ones, "
        f"got {value!r}"
    )


def choose_maps(
    spec: InputTransform,
    imap: InputMap,
    data: FitData,
    *,
    kernel: Kernel,
    leaf: LeafConfig,
    max_maps: int,
    margin: float,
    generator: torch.Generator,
    batched: bool = False,
) -> list[InputMapName]:
    """The maps to grow trees on: ``spec`` itself, or for ``"auto"`` the probe's choice.

    ``imap`` must have its knots fitted unless ``spec`` is ``"identity"``. ``batched``: the
    probe's leaves in lockstep (:func:`probe_input_maps`).
    """
    if spec == "auto":
        return probe_input_maps(
            imap,
            data,
            kernel=kernel,
            leaf=leaf,
            max_maps=max_maps,
            margin=margin,
            generator=generator,
            batched=batched,
        )
    return [spec] if isinstance(spec, str) else list(spec)  # type: ignore[list-item]


def encode_fit_data(
    imap: InputMap, data: FitData, names: Sequence[InputMapName]
) -> dict[InputMapName, FitData]:
    """``data`` with training and validation inputs mapped by each of ``names``.

    The parts the maps share are computed once (:meth:`InputMap.encode_many`), and the values
    are checked once for every leaf fitted on them (:func:`check_mapped`).
    """
    X, X_val = imap.encode_many(data.X, names), imap.encode_many(data.X_val, names)
    check_mapped(X, X_val, data.y, data.y_val)
    return {name: replace(data, X=X[name], X_val=X_val[name]) for name in X}


def check_mapped(
    X: dict[InputMapName, Tensor], X_val: dict[InputMapName, Tensor], y: Tensor, y_val: Tensor
) -> None:
    """Check every map's inputs and the coded targets that leaves will be fitted on, at once.

    The leaves then skip their own checks (``LeafRFM.fit(check_input=False)``): one read for a
    tree's data instead of one per leaf (a wait each on a GPU). An input map turns missing cells
    into finite values, so a non-finite value here is named by its map.
    """
    check_all_finite(
        [
            *((x, f"X mapped by {name!r}", False) for name, x in X.items()),
            *((x, f"X_val mapped by {name!r}", False) for name, x in X_val.items()),
            (y, "coded y", False),
            (y_val, "coded y_val", False),
        ]
    )


def probe_input_maps(
    imap: InputMap,
    data: FitData,
    *,
    kernel: Kernel,
    leaf: LeafConfig,
    max_maps: int,
    margin: float,
    generator: torch.Generator,
    batched: bool = False,
) -> list[InputMapName]:
    """The simplest set of maps whose averaged probe predictions no richer set beats significantly.

    One probe leaf per map is fitted on the same seeded ``PROBE_ROWS`` training rows (never the
    held-out ones) and predicts the same ``PROBE_VAL_ROWS`` validation rows; a set of maps
    predicts the mean of its leaves' predictions. Going through the sets in order of size, then
    of :data:`~xrfm_torch.inputs.input_map.PROBED_MAPS` (identity, quantile, quantile+raw, identity
    and quantile, ...), a set replaces the one chosen so far only when its per-row losses
    beat that one's by ``margin`` paired standard errors
    (:func:`~xrfm_torch.leaf.selection.paired_win`). Each map of the set gets its own trees.

    Under a time limit the probe chooses among the maps probed when it stops: past the deadline,
    or, under a degrading one (a candidate that must end with a model), where its next map
    would end in the ``1 - PROBE_TIME_SHARE`` of the time left at its start that it keeps for
    the tree's leaves (their iterations are the model; without them a leaf is one solve).

    Args:
        imap: The input map with fitted knots.
        data: The fit's data (the probe never trains on held-out rows).
        kernel: The model's kernel prototype.
        leaf: The model's leaf settings (:func:`probe_config` makes them a small fixed budget).
        max_maps: Largest set of maps considered.
        margin: Paired standard errors a set must win by.
        generator: Only its seed is read: the probe draws from its own generator.
        batched: Fit the maps' leaves in lockstep, their RFM steps batched
            (:func:`~xrfm_torch.leaf.lockstep.fit_together`; the tree's ``batch_steps``).
    """
    # The probe draws from its own generator, seeded from the caller's without consuming it, so
    # the trees grown afterwards are the same as with the chosen maps set by hand.
    seed = generator.initial_seed()
    g = torch.Generator().manual_seed(seed)
    rows = torch.arange(data.X.shape[0], device=data.X.device)
    if data.holdout is not None:
        rows = rows[~data.holdout]
    rows = _subsample(rows, PROBE_ROWS, g)
    vrows = _subsample(torch.arange(data.X_val.shape[0], device=rows.device), PROBE_VAL_ROWS, g)
    X, y, w = data.X[rows], data.y[rows], data.weights(rows)
    X_val, y_val = data.X_val[vrows], data.y_val[vrows]
    w_val = data.val_weights(vrows)
    preds: dict[InputMapName, Tensor] = {}
    config = probe_config(leaf)
    # every map's inputs at once: the maps share their parts (standardized columns, ranks, ...)
    mapped, mapped_val = imap.encode_many(X, PROBED_MAPS), imap.encode_many(X_val, PROBED_MAPS)
    check_mapped(mapped, mapped_val, y, y_val)
    stopped: list[bool] = []
    # a candidate that must end with a model (a degrading deadline) keeps the share of its time
    # left that the probe may not take for the tree: its leaves' iterations are the model
    degrading = deadline.degrading()
    keep = (1 - PROBE_TIME_SHARE) * max(0.0, deadline.time_left()) if degrading else 0.0
    last = [0.0]  # the last probe leaf's seconds: the next one's estimate

    def probe(name: InputMapName) -> Callable[[], None]:
        def fit() -> None:
            # out of time (or of the probe's share): choose among the maps probed so far
            if stopped or (preds and deadline.should_stop(keep + last[0] if degrading else 0.0)):
                if not stopped:
                    count("input-map probes cut short at the time limit")
                    stopped.append(True)
                return
            began = time.perf_counter()
            Xm, Xm_val = mapped[name], mapped_val[name]
            leaf = LeafRFM(kernel, config)
            g_map = torch.Generator().manual_seed(seed)  # every map's leaf: the same draws
            leaf.fit(
                Xm,
                y,
                Xm_val,
                y_val,
                sample_weight=w,
                val_sample_weight=w_val,
                generator=g_map,
                check_input=False,  # (checked above)
            )
            with torch.no_grad():
                preds[name] = leaf(Xm_val)
            last[0] = time.perf_counter() - began

        return fit

    # the maps' leaves are independent fits: on a GPU their steps run batched
    fit_together([probe(name) for name in PROBED_MAPS], batched=batched)
    preds = {name: preds[name] for name in PROBED_MAPS if name in preds}  # in the maps' order
    return choose_map_set(preds, y_val, max_maps, margin, leaf.criterion, w_val)


def choose_map_set(
    preds: dict[InputMapName, Tensor],
    y_val: Tensor,
    max_maps: int,
    margin: float,
    criterion: Criterion = "mse",
    weights: Tensor | None = None,
) -> list[InputMapName]:
    """The rule of :func:`probe_input_maps` on each map's validation predictions (n_val, c).

    ``weights`` (n_val,): the validation rows' sample weights (weighted per-row losses).

    A set of maps predicts the mean of its members' predictions. Sets are visited by size, then in
    the order of ``preds`` (the first map alone is the start); a set replaces the one chosen so far
    when its per-row losses under ``criterion`` beat that one's by ``margin`` paired standard
    errors.
    """
    names = list(preds)
    sets = [s for k in range(1, max_maps + 1) for s in itertools.combinations(names, k)]

    def averaged(s: tuple[InputMapName, ...]) -> Tensor:
        return cast(Tensor, sum(preds[m] for m in s)) / len(s)

    # per-row losses only (their mean stays on the device: no read back per set)
    errors = {s: validation_loss(averaged(s), y_val, criterion, weights)[1] for s in sets}
    chosen = sets[0]
    for s in sets[1:]:
        if paired_win(errors[s], errors[chosen], margin):
            chosen = s
    if not log.isEnabledFor(logging.INFO):  # its figures are reads (waits on a GPU)
        return list(chosen)
    log.info(
        "input maps %s: the simplest set no richer one beats by %g paired standard errors "
        "(probe validation %s %s)",
        " & ".join(chosen),
        margin,
        criterion,
        ", ".join(
            f"{' & '.join(s)} {float(e.mean()) / (y_val.shape[1] if criterion == 'mse' else 1):.4g}"
            for s, e in errors.items()
        ),
    )
    return list(chosen)


def probe_config(config: LeafConfig) -> LeafConfig:
    """A small, fixed-budget version of the model's leaf (no post-hoc searches).

    Its iterations stop after ``PROBE_PATIENCE`` steps without a gain: the steps after that
    rarely changed a probe leaf's best iteration enough to change the choice (the same maps on
    all 29 dev tables at seeds 0-2 as with all ``PROBE_ITERS`` updates, at 10-40 % less probe
    time).
    """
    return config.replace(
        n_iters=PROBE_ITERS,
        patience=PROBE_PATIENCE,
        min_iters=0,
        iter_rows=None,
        kernel_exponents=None,
        bandwidth_factors=None,
        reg_factors=None,
    )


def _subsample(rows: Tensor, k: int, generator: torch.Generator | None) -> Tensor:
    if rows.shape[0] <= k:
        return rows
    pick = torch.randperm(rows.shape[0], generator=generator)[:k].to(rows.device)
    return rows[pick.sort().values]
