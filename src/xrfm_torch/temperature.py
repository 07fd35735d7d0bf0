"""Soft-routing temperature tuning on validation data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from xrfm_torch._checks import as_float_targets

if TYPE_CHECKING:
    from xrfm_torch.partition import PartitionTree
    from xrfm_torch.tree import xRFMTree

#: 0 (hard routing) plus 20 geometrically spaced values from 0.025 to 4.5 (the reference's grid).
DEFAULT_TEMPERATURE_GRID: list[float] = [0.0] + [
    float(t)
    for t in torch.logspace(torch.log10(torch.tensor(0.025)), torch.log10(torch.tensor(4.5)), 20)
]


@torch.no_grad()
def temperature_errors(
    model: xRFMTree, X_val: Tensor, y_val: Tensor, grid: Sequence[float]
) -> list[float]:
    """Validation MSE of ``model`` for each temperature in ``grid``.

    Each leaf is evaluated once on the validation rows where some temperature of the grid gives
    it weight (shape (n_val, L, c), zero elsewhere); each temperature then only recomputes the
    mixture weights. With weights truncated to ``max_soft_leaves`` per row this costs
    ``O(n_val * max_soft_leaves * leaf size)``, not ``O(n_val * L * leaf size)``: quadratic in
    ``n`` when the validation rows and the leaves both grow with it.

    Args:
        model: A fitted tree (its leaves are used as they are).
        X_val: Validation inputs, shape (n_val, d) (mapped for each tree here).
        y_val: Validation targets, shape (n_val,) or (n_val, c).
        grid: Temperatures (0 = hard routing).
    """
    y_val = as_float_targets(y_val, "y_val", n_rows=X_val.shape[0], dtype=X_val.dtype)
    trees = list(zip(model.partition_trees(), model.input_map(X_val)))  # (tree, its inputs)

    def weights(tree: PartitionTree, x: Tensor, temp: float) -> Tensor:  # (n_val, L)
        return tree.weights(x, temp, keep_mass=model.keep_mass, max_leaves=model.max_soft_leaves)

    leaf_preds = []
    for tree, x in trees:
        used = torch.zeros(x.shape[0], tree.n_leaves, dtype=torch.bool, device=x.device)
        for temp in grid:  # the weights are recomputed below: (n_val, L) per temperature is cheap
            used |= weights(tree, x, temp) > 0
        leaf_preds.append(tree.leaf_predictions(x, used))  # (n_val, L, c)
    errors = []
    for temp in grid:
        preds = [
            (weights(tree, x, temp)[:, :, None] * P).sum(1)
            for (tree, x), P in zip(trees, leaf_preds)
        ]
        pred = torch.stack(preds).mean(0)
        errors.append(float(((pred - y_val) ** 2).mean()))
    return errors


def tune_temperature(
    model: xRFMTree, X_val: Tensor, y_val: Tensor, grid: Sequence[float]
) -> tuple[float, list[float]]:
    """The grid temperature with the lowest validation MSE (ties go to the earlier entry).

    Returns:
        ``(best_temperature, errors)``.
    """
    errors = temperature_errors(model, X_val, y_val, grid)
    best = min(range(len(grid)), key=lambda i: errors[i])
    return float(grid[best]), errors
