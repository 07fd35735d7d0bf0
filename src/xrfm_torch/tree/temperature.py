"""Soft-routing temperature tuning on validation data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import Tensor

from xrfm_torch.leaf.criteria import Criterion, validation_loss
from xrfm_torch.numerics.checks import as_float_targets
from xrfm_torch.numerics.host import read_scalars
from xrfm_torch.tree.partition import PartitionTree

#: 0 (hard routing) plus 20 geometrically spaced values from 0.025 to 4.5 (the reference's grid).
DEFAULT_TEMPERATURE_GRID: list[float] = [0.0] + [
    float(t)
    for t in torch.logspace(torch.log10(torch.tensor(0.025)), torch.log10(torch.tensor(4.5)), 20)
]


@torch.no_grad()
def temperature_predictions(
    trees: Sequence[PartitionTree],
    xs: Sequence[Tensor],
    grid: Sequence[float],
    *,
    keep_mass: float,
    max_leaves: int,
) -> list[Tensor]:
    """The averaged ``trees``' outputs (n_val, c) at each temperature in ``grid``.

    Each leaf is evaluated once on the validation rows where some temperature of the grid gives
    it weight (shape (n_val, L, c), zero elsewhere); each temperature then only recomputes the
    mixture weights. With weights truncated to ``max_soft_leaves`` per row this costs
    ``O(n_val * max_soft_leaves * leaf size)``, not ``O(n_val * L * leaf size)``: quadratic in
    ``n`` when the validation rows and the leaves both grow with it.

    Args:
        trees: Fitted trees (their leaves are used as they are), averaged.
        xs: The validation inputs as each tree sees them (its input map), shapes (n_val, d_t).
        grid: Temperatures (0 = hard routing).
        keep_mass: Soft routing keeps each row's top leaves covering this weight mass.
        max_leaves: Soft routing evaluates at most this many leaves per row.
    """
    pairs = list(zip(trees, xs))

    def weights(tree: PartitionTree, x: Tensor, temp: float) -> Tensor:  # (n_val, L)
        return tree.weights(x, temp, keep_mass=keep_mass, max_leaves=max_leaves)

    leaf_preds = []
    for tree, x in pairs:
        used = torch.zeros(x.shape[0], tree.n_leaves, dtype=torch.bool, device=x.device)
        for temp in grid:  # the weights are recomputed below: (n_val, L) per temperature is cheap
            used |= weights(tree, x, temp) > 0
        leaf_preds.append(tree.leaf_predictions(x, used))  # (n_val, L, c)
    return [
        torch.stack(
            [
                (weights(tree, x, temp)[:, :, None] * P).sum(1)
                for (tree, x), P in zip(pairs, leaf_preds)
            ]
        ).mean(0)
        for temp in grid
    ]


@torch.no_grad()
def search_temperature(
    trees: Sequence[PartitionTree],
    xs: Sequence[Tensor],
    y_val: Tensor,
    grid: Sequence[float],
    *,
    keep_mass: float,
    max_leaves: int,
    criterion: Criterion = "mse",
    weights: Tensor | None = None,
    patience: int | None = None,
) -> tuple[int, list[float], Tensor]:
    """The grid's best temperature for the averaged ``trees`` on validation data, tried in order.

    0 (hard routing) is tried first, then the positive temperatures from the lowest up, stopping
    once ``patience`` of them in a row have not improved on the best positive one (``None``: the
    whole grid). The validation error is close to unimodal in the temperature (it falls while
    soft routing smooths the leaves' boundaries, then rises as far leaves blur the prediction:
    on 69 curves of the dev tables, every one chose the full grid's temperature with a patience
    of 2); hard routing is tried on its own, as its error is not on that curve. The top of the
    grid is where a row reaches most leaves (all ``max_leaves`` of them), so stopping short of
    it saves most of the search. Each (row, leaf) pair is evaluated once, when a temperature
    first gives it weight.

    Args:
        trees: Fitted trees, averaged.
        xs: The validation inputs as each tree sees them (its input map), shapes (n_val, d_t).
        y_val: Validation targets (n_val,) or (n_val, c).
        grid: Candidate temperatures (0 = hard routing); ties go to the earlier entry.
        keep_mass: Soft routing keeps each row's top leaves covering this weight mass.
        max_leaves: Soft routing evaluates at most this many leaves per row.
        criterion: The validation criterion (:mod:`xrfm_torch.leaf.criteria`).
        weights: The validation rows' weights (n_val,), or ``None``.
        patience: Positive temperatures without improvement before the search stops.

    Returns:
        The best entry's index in ``grid``, each entry's error (NaN where not tried), and the
        averaged outputs (n_val, c) at the best entry.
    """
    pairs = list(zip(trees, xs))
    seen = [
        torch.zeros(x.shape[0], t.n_leaves, dtype=torch.bool, device=x.device) for t, x in pairs
    ]
    leaf_preds: list[Tensor | None] = [None] * len(pairs)
    errors = [float("nan")] * len(grid)
    best, best_out, best_positive, since = -1, None, float("inf"), 0
    for i in sorted(range(len(grid)), key=lambda j: (grid[j] > 0, grid[j], j)):
        outs = []
        for k, (tree, x) in enumerate(pairs):
            w = tree.weights(x, grid[i], keep_mass=keep_mass, max_leaves=max_leaves)
            new = (w > 0) & ~seen[k]
            if bool(new.any()):
                leaf_preds[k] = tree.leaf_predictions(x, new, out=leaf_preds[k])
                seen[k] |= new
            outs.append((w[:, :, None] * cast(Tensor, leaf_preds[k])).sum(1))
        out = torch.stack(outs).mean(0)
        errors[i] = prediction_errors([out], y_val, criterion, weights)[0]
        if best < 0 or errors[i] < errors[best] or (errors[i] == errors[best] and i < best):
            best, best_out = i, out
        if grid[i] > 0:
            if errors[i] < best_positive:
                best_positive, since = errors[i], 0
            else:
                since += 1
                if patience is not None and since >= patience:
                    break
    return best, errors, cast(Tensor, best_out)


def search_rows(n_val: int, max_rows: int | None) -> Tensor | None:
    """The validation rows the temperature search scores (CPU indices, or ``None``: all).

    All ``n_val`` rows when they are at most ``max_rows`` (or ``max_rows`` is ``None``), else
    ``max_rows`` rows evenly spaced over the validation rows' order (a systematic sample).

    The search is the one step of a fit whose cost grows with ``n_val`` times the leaves a row
    reaches at the grid's largest temperatures (all ``max_soft_leaves`` of them). The sample
    draws nothing from a generator: models fitted on the same rows (a blend's members, an
    anytime fit's candidates) score the same rows whatever their fits drew before, so their
    honest outputs, which are the search's outputs at the chosen temperature, stay comparable
    row by row. Spread over the order, it also covers validation rows given sorted (by time, or
    by target) from end to end.
    """
    if max_rows is None or n_val <= max_rows:
        return None
    return torch.linspace(0, n_val - 1, max_rows, dtype=torch.float64).round().long()


def prediction_errors(
    preds: Sequence[Tensor],
    y_val: Tensor,
    criterion: Criterion = "mse",
    weights: Tensor | None = None,
) -> list[float]:
    """The validation criterion's value of each prediction (n_val, c) against ``y_val``.

    ``weights`` (n_val,): the rows' sample weights (the weighted mean loss).
    """
    y_val = as_float_targets(y_val, "y_val", n_rows=preds[0].shape[0], dtype=preds[0].dtype)
    if criterion == "mse" and weights is None:  # all entries at once (same value, one pass)
        values = [((pred - y_val) ** 2).mean() for pred in preds]
    else:
        values = [validation_loss(pred, y_val, criterion, weights)[0] for pred in preds]
    return read_scalars(*values)  # read back together: one synchronization on a GPU


def temperature_errors(
    trees: Sequence[PartitionTree],
    xs: Sequence[Tensor],
    y_val: Tensor,
    grid: Sequence[float],
    *,
    keep_mass: float,
    max_leaves: int,
    criterion: Criterion = "mse",
) -> list[float]:
    """Validation error of the averaged ``trees`` for each temperature in ``grid``.

    :func:`search_temperature` over the whole grid (``y_val``: (n_val,) or (n_val, c);
    ``criterion``: :mod:`xrfm_torch.leaf.criteria`).
    """
    return search_temperature(
        trees, xs, y_val, grid, keep_mass=keep_mass, max_leaves=max_leaves, criterion=criterion
    )[1]
