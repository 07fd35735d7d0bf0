"""Closed-form fitting of an :class:`~xrfm_torch.tree.xRFMTree` (its ``fit`` and ``refit_leaves``).

Kept apart from the module definition so that ``tree.py`` holds what a fitted model *is* (buffers,
routing, prediction, interpretation) and this file how it is *obtained*: grow each tree
(:func:`~xrfm_torch.builder.grow_tree`), fit its leaves (:func:`~xrfm_torch.builder.fit_leaves`),
tune the routing temperature, and re-solve leaves on the rows they borrowed or that were held out.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from xrfm_torch.builder import TreeLayout, fit_leaves, grow_tree
from xrfm_torch.input_choice import choose_maps, encode_fit_data
from xrfm_torch.leaf import LeafRFM
from xrfm_torch.partition import PartitionTree
from xrfm_torch.temperature import tune_temperature
from xrfm_torch.validation import FitData, fit_data

if TYPE_CHECKING:
    from xrfm_torch.tree import xRFMTree

log = logging.getLogger(__name__)

Progress = Callable[[int, int, int], None]


def fit_model(
    model: xRFMTree,
    X: Tensor,
    y: Tensor,
    X_val: Tensor | None,
    y_val: Tensor | None,
    generator: torch.Generator | None,
    progress: Progress | None,
) -> None:
    """Grow ``model.n_trees`` trees per input map, fit their leaves, tune the temperature (``fit``)."""
    data = fit_data(X, y, X_val, y_val, val_fraction=model.val_fraction, generator=generator)
    raw_X_val = data.X_val  # the temperature search maps it itself, like forward
    maps = choose_maps(model, data, generator)
    model.kernel.to(device=data.X.device, dtype=data.X.dtype)
    trees: list[PartitionTree] = []
    tree_maps: list[str] = []
    tree_data: list[FitData] = []
    refit_rows: list[list[Tensor | None]] = []
    leaf_size = model.max_leaf_size  # a set's trees are cheaper members: smaller leaves
    if len(maps) > 1:
        leaf_size = max(4, round(model.set_leaf_fraction * leaf_size))
    start = _rng_state(generator)
    for i, name in enumerate(maps):
        if i > 0:  # each map's trees draw what a model on that map alone would: a set of maps
            _set_rng_state(generator, start)  # is the mean of the single-map models
        mapped = encode_fit_data(model.input_map, data, name)  # what this map's trees see
        for t in range(model.n_trees):
            tree, rows = _fit_one(model, mapped, leaf_size, generator, progress, len(trees))
            trees.append(tree)
            tree_maps.append(name)
            tree_data.append(mapped)
            refit_rows.append(rows)
            if tree.n_leaves == 1 and model.n_trees > 1:
                log.info("tree %d has no split; more trees on %r would be identical", t, name)
                break
    model.trees = nn.ModuleList(trees)
    model.input_map.set_maps(tree_maps)
    model.temperature_ = torch.tensor(0.0, dtype=data.X.dtype, device=data.X.device)
    y_val, holdout = data.y_val, data.holdout

    def refit() -> None:
        for tree, mapped, tree_rows in zip(trees, tree_data, refit_rows):
            for leaf, idx in zip(tree.leaf_list(), tree_rows):
                if idx is not None:
                    leaf.refit(mapped.X[idx], mapped.y[idx])

    # With user validation data, the final (refit) leaves are tuned on it. Held-out training
    # rows join the leaf fits, so then the temperature is tuned before the refit.
    if holdout is None:
        refit()
    if model.temperature is not None:
        model._set_temperature(model.temperature)
    elif any(tree.n_leaves > 1 for tree in trees):
        best_t, errs = tune_temperature(model, raw_X_val, y_val, model.temperature_grid)
        model._set_temperature(best_t)
        log.info("tuned temperature %.4g (val mse %s)", best_t, ", ".join(f"{e:.4g}" for e in errs))
    if holdout is not None:
        refit()


def refit_model_leaves(
    model: xRFMTree,
    X: Tensor,
    y: Tensor,
    X_val: Tensor | None,
    y_val: Tensor | None,
    generator: torch.Generator | None,
) -> None:
    """Re-fit every leaf on new rows, keeping the routing (see ``xRFMTree.refit_leaves``)."""
    data = fit_data(
        X,
        y,
        X_val,
        y_val,
        val_fraction=model.val_fraction,
        generator=generator,
        n_features=model.n_features_in_,
    )
    # The input map keeps its fitted knots: the routing was learned on them.
    names = model.input_map.names
    by_map = {name: encode_fit_data(model.input_map, data, name) for name in set(names)}
    start = _rng_state(generator)
    for t, (tree, name) in enumerate(zip(model.partition_trees(), names)):
        if t > 0 and name != names[t - 1]:  # a map's trees start from the same draws, as in fit
            _set_rng_state(generator, start)
        mapped = by_map[name]
        X, y = mapped.X, mapped.y
        ids, vids = tree.route(X), tree.route(mapped.X_val)
        keep = [lf for lf in range(tree.n_leaves) if int((ids == lf).sum()) >= 4]
        layout = TreeLayout(
            tree.split_vectors_.detach(),
            tree.thresholds_.detach(),
            tree.temp_scale_,
            tree.children_,
            leaf_train=[(ids == lf).nonzero().squeeze(1) for lf in keep],
            leaf_val=[(vids == lf).nonzero().squeeze(1) for lf in keep],
        )
        leaves, refit = _fit_leaves(model, layout, mapped, generator)
        for lf, leaf, rows in zip(keep, leaves, refit):
            if rows is not None:
                leaf.refit(X[rows], y[rows])
            tree.leaves[lf] = leaf


def _fit_one(
    model: xRFMTree,
    data: FitData,
    max_leaf_size: int,
    generator: torch.Generator | None,
    progress: Progress | None,
    tree_index: int,
) -> tuple[PartitionTree, list[Tensor | None]]:
    """Grow one tree (leaves of at most ``max_leaf_size`` rows) and fit its leaves.

    With a hold-out (no user validation data) the tree is grown on all training rows and each
    leaf validates on its held-out share, so a leaf's rows never exceed ``max_leaf_size``, even
    after the refit. Returns, per leaf, the training-row indices of its final refit (or ``None``).
    """
    held = data.holdout is not None
    layout = grow_tree(
        data.X,
        data.y,
        data.X_val[:0] if held else data.X_val,
        data.y_val[:0] if held else data.y_val,
        max_leaf_size=max_leaf_size,
        split_rule=model.split_rule,
        kernel=model.kernel,
        generator=generator,
        overlap_fraction=model.overlap_fraction,
    )
    leaves, refit = _fit_leaves(model, layout, data, generator, progress, tree_index)
    tree = PartitionTree(leaves, trainable=model.trainable_routing)
    tree.set_structure(layout.vectors, layout.thresholds, layout.scales, layout.children)
    return tree, refit


def _fit_leaves(
    model: xRFMTree,
    layout: TreeLayout,
    data: FitData,
    generator: torch.Generator | None,
    progress: Progress | None = None,
    tree_index: int = 0,
) -> tuple[list[LeafRFM], list[Tensor | None]]:
    return fit_leaves(
        layout,
        data.X,
        data.y,
        data.X_val,
        data.y_val,
        data.holdout,
        new_leaf=model.new_leaf,
        min_leaf_val=model.min_leaf_val,
        max_borrow_fraction=model.max_borrow_fraction,
        refit_borrowed=model.refit_borrowed,
        generator=generator,
        progress=progress,
        tree_index=tree_index,
    )


def _rng_state(generator: torch.Generator | None) -> Tensor:
    return torch.random.get_rng_state() if generator is None else generator.get_state()


def _set_rng_state(generator: torch.Generator | None, state: Tensor) -> None:
    if generator is None:
        torch.random.set_rng_state(state)
    else:
        generator.set_state(state)
