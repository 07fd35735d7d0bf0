"""Closed-form fitting of a set of trees: grow each, fit its leaves, tune the routing temperature.

Pure functions over the parts they need (data, input encoding, settings, generator); they return
the fitted trees, leaves and temperature, and :class:`~xrfm_torch.models.xrfm_tree.xRFMTree` assigns
them.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
from torch import Tensor

from xrfm_torch.inputs.choice import encode_fit_data
from xrfm_torch.inputs.input_map import InputMap, InputMapName
from xrfm_torch.leaf import LeafRFM
from xrfm_torch.leaf.data import FitData
from xrfm_torch.leaf.lockstep import fit_together
from xrfm_torch.numerics import deadline
from xrfm_torch.numerics.events import count
from xrfm_torch.tree.grow import Progress, TreeLayout, grow_tree
from xrfm_torch.tree.parallel import LeafJob, run_leaf_jobs, world
from xrfm_torch.tree.partition import PartitionTree
from xrfm_torch.tree.plan import FitPlan
from xrfm_torch.tree.temperature import search_rows, search_temperature, temperature_predictions
from xrfm_torch.tree.uncertainty import Moments, model_moments

log = logging.getLogger(__name__)


@dataclass
class GrownTrees:
    """Trees with fitted leaves, their input maps, and the final solves still to run.

    Attributes:
        trees: The trees, ``n_trees`` per map, in map order.
        maps: The input map of each tree.
        data: The (mapped) data each tree was fitted on.
        pending: Per tree, per leaf, the training rows of its final solve (``None``: done).
        owners: Per tree, per leaf, the rank that fits it (and runs its later solves, where its
            cached factor is).
        distributed: Whether the leaves' work is spread over the process group.
        val_scores: The averaged trees' outputs on the validation rows at the chosen temperature,
            taken before held-out rows join the leaves (when asked for; probability calibration).
        val_score_rows: The validation rows ``val_scores`` covers (``None``: all of them); a
            temperature search on a subsample (``temperature_rows``) keeps its outputs there.
        val_moments: The mixed leaf Gaussians on the validation rows at the chosen temperature,
            taken before held-out rows join the leaves (when asked for; variance calibration).
    """

    trees: list[PartitionTree]
    maps: list[InputMapName]
    data: list[FitData]
    pending: list[list[Tensor | None]]
    owners: list[list[int]]
    distributed: bool = False
    val_scores: Tensor | None = None
    val_score_rows: Tensor | None = None
    val_moments: Moments | None = None

    def extend(self, more: GrownTrees) -> None:
        """Append ``more``'s trees (with their maps, data and pending solves)."""
        self.trees += more.trees
        self.maps += more.maps
        self.data += more.data
        self.pending += more.pending
        self.owners += more.owners

    def fit_posteriors(self) -> None:
        """Give every leaf its Gaussian-process view (:meth:`LeafRFM.fit_posterior`)."""
        for tree, owners in zip(self.trees, self.owners):
            leaves = tree.leaf_list()
            jobs = [LeafRFM.fit_posterior] * len(leaves)
            run_leaf_jobs(leaves, jobs, owners, distributed=self.distributed)

    def refit(self) -> None:
        """Run the pending final solves (each leaf re-solved on its rows, same ``M`` and kernel)."""
        for tree, data, rows, owners in zip(self.trees, self.data, self.pending, self.owners):
            jobs = [_refit_job(data, idx) for idx in rows]
            run_leaf_jobs(tree.leaf_list(), jobs, owners, distributed=self.distributed)


def _refit_job(data: FitData, idx: Tensor | None) -> LeafJob | None:
    """The final solve of one leaf on ``data``'s rows ``idx`` (``None``: nothing to do).

    The rows' values were checked by the leaf fits that trained or validated on them.
    """
    if idx is None:
        return None
    return lambda leaf: leaf.refit(data.X[idx], data.y[idx], data.weights(idx), check_input=False)


def fit_trees(
    data: FitData,
    maps: Sequence[InputMapName],
    imap: InputMap,
    plan: FitPlan,
    *,
    generator: torch.Generator,
    progress: Progress | None = None,
    val_scores: bool = False,
    posterior: bool = False,
) -> tuple[GrownTrees, float | None]:
    """Grow the trees, fit their leaves, run the final solves, choose the routing temperature.

    Each map's trees start from the generator state the call started with, so a set of maps is
    exactly the mean of the single-map models fitted with the same seed. With user validation data
    the temperature is tuned on the final leaves; with held-out training rows (which join the final
    solves) it is tuned before them.

    Args:
        data: Validated training data (raw inputs).
        maps: Input maps to grow trees on.
        imap: Encodes the inputs for a map (knots fitted).
        plan: Kernel and settings: the split rule, ``max_leaf_size``, ``n_trees`` per map (they
            differ through the split-model subsamples), ``overlap_fraction``,
            ``trainable_routing``, and the routing: a fixed ``temperature``, or ``None`` to tune
            one over ``temperature_grid`` by the validation criterion (ties go to the earlier
            entry) where some tree has a split, with ``keep_mass`` and ``max_soft_leaves``.
        generator: CPU random generator; each map's trees start from its state at the call.
        progress: Called as ``progress(tree, leaves_done, leaves_total)`` after each leaf fit.
        val_scores: Keep the model's validation outputs (``GrownTrees.val_scores``).
        posterior: Fit the leaves' posteriors and keep the validation moments
            (``GrownTrees.val_moments``); held-out rows join the leaves after that, and the final
            leaves fit theirs again.

    Returns:
        The fitted trees, and the temperature (``None``: not given, and nothing to tune).
    """
    cfg = plan.config
    temperature, grid = cfg.temperature, cfg.temperature_grid
    keep_mass, max_soft_leaves = cfg.keep_mass, cfg.max_soft_leaves
    n_trees = cast(int, cfg.n_trees)
    grown = GrownTrees([], [], [], [], [], distributed=cfg.distributed)
    start = generator.get_state()
    batched = cfg.steps_batched(data.X.device) and world(cfg.distributed)[1] == 1
    per_map: dict[int, GrownTrees] = {}
    ends: dict[int, Tensor] = {}  # each map's generator state after its trees

    by_map = encode_fit_data(imap, data, maps)  # what each map's trees see

    def map_trees(i: int, name: InputMapName) -> None:
        """Map ``i``'s trees, from the generator state the call started with."""
        g = torch.Generator()
        g.set_state(start)
        mine = GrownTrees([], [], [], [], [], distributed=cfg.distributed)
        mapped = by_map[name]
        tree_plan = plan  # the map's later trees follow its first tree (FitPlan.following)
        # the trees before (in lockstep, where the maps run together: i * n_trees)
        done = i * n_trees if batched else sum(len(m.trees) for m in per_map.values())
        for t in range(n_trees):
            held = mapped.holdout is not None
            # with a hold-out, the tree is grown on all training rows and each leaf validates on
            # its held-out share, so no leaf exceeds max_leaf_size even after its final solve
            layout = grow_tree(
                mapped.X,
                mapped.y,
                mapped.X_val[:0] if held else mapped.X_val,
                mapped.y_val[:0] if held else mapped.y_val,
                max_leaf_size=cfg.max_leaf_size,
                split_rule=cfg.split_rule,
                kernel=plan.kernel,
                generator=g,
                overlap_fraction=cast(float, cfg.overlap_fraction),  # resolved by the plan
                weights=(mapped.w, None if held else mapped.w_val),
            )
            leaves, pending, owners = tree_plan.fit(layout, mapped, g, progress, done + t)
            tree = PartitionTree(leaves, trainable=cfg.trainable_routing)
            tree.set_structure(layout.vectors, layout.thresholds, layout.scales, layout.children)
            if t == 0 and n_trees > 1 and cfg.shared_plan:
                tree_plan = plan.following(tree) or plan
            mine.trees.append(tree)
            mine.maps.append(name)
            mine.data.append(mapped)
            mine.pending.append(pending)
            mine.owners.append(owners)
            if tree.n_leaves == 1 and n_trees > 1:
                log.info("tree %d has no split; more trees on %r would be identical", t, name)
                break
        per_map[i], ends[i] = mine, g.get_state()

    # the maps' trees are independent fits: in lockstep on a GPU, their leaves' steps batched
    jobs = [functools.partial(map_trees, i, name) for i, name in enumerate(maps)]
    fit_together(jobs, batched=batched)
    for i in range(len(maps)):
        grown.extend(per_map[i])
    generator.set_state(ends[len(maps) - 1])  # as if the maps had run one after another
    if data.holdout is None:
        grown.refit()
    xs = [mapped.X_val for mapped in grown.data]  # each tree's map, encoded once per map
    scores, scored_rows = None, None  # the validation outputs kept, and their rows (None: all)
    if temperature is None and deadline.should_stop():  # out of time: hard routing, untuned
        count("trees routed hard at the time limit (no temperature search)")
        temperature = 0.0
    if temperature is None and any(tree.n_leaves > 1 for tree in grown.trees):
        rows = search_rows(data.y_val.shape[0], cfg.temperature_rows)
        at = (lambda t: t) if rows is None else (lambda t: t[rows.to(t.device)])
        best, errs, out = search_temperature(
            grown.trees,
            [at(x) for x in xs],
            at(data.y_val),
            grid,
            keep_mass=keep_mass,
            max_leaves=max_soft_leaves,
            criterion=cfg.leaf.criterion,
            weights=None if data.w_val is None else at(data.w_val),
            patience=cfg.temperature_patience,
        )
        temperature = float(grid[best])
        # a large fit's honest outputs are those of the searched rows: scoring all its validation
        # rows again at the chosen temperature took 7.6 s of a 400k-row fit's 92 s
        scores, scored_rows = out, rows
        log.info(
            "tuned temperature %.4g (val %s on %d rows: %s)",
            temperature,
            cfg.leaf.criterion,
            out.shape[0],
            ", ".join("-" if math.isnan(e) else f"{e:.4g}" for e in errs),
        )
    if val_scores and scores is None:  # not searched: the given temperature's, on all rows
        scores = temperature_predictions(
            grown.trees, xs, [temperature or 0.0], keep_mass=keep_mass, max_leaves=max_soft_leaves
        )[0]
    if val_scores:
        grown.val_scores, grown.val_score_rows = scores, scored_rows
    if posterior:
        grown.fit_posteriors()
        grown.val_moments = model_moments(
            grown.trees, xs, temperature or 0.0, keep_mass=keep_mass, max_leaves=max_soft_leaves
        )
    if data.holdout is not None:
        grown.refit()
        if posterior:
            grown.fit_posteriors()
    if posterior and world(cfg.distributed)[1] > 1:
        # only a leaf's owner holds the factor of its solve; without it every rank recomputes
        # the same factors on first use (as a loaded model does), so all ranks predict alike
        for tree in grown.trees:
            for leaf in tree.leaf_list():
                leaf.gp.drop_factor()
    return grown, temperature


def refit_trees(
    trees: Sequence[PartitionTree],
    maps: Sequence[InputMapName],
    imap: InputMap,
    data: FitData,
    plan: FitPlan,
    generator: torch.Generator,
) -> list[dict[int, LeafRFM]]:
    """New leaves for fitted trees on new rows, routed by the trees as they are.

    Rows are routed hard; a leaf that receives fewer than 4 rows keeps its model. A map's trees
    start from the same generator state, as in :func:`fit_trees`.

    Returns:
        Per tree, ``{leaf index: new fitted leaf}`` (the caller puts them into the trees).
    """
    by_map = encode_fit_data(imap, data, maps)
    start = generator.get_state()
    out: list[dict[int, LeafRFM]] = []
    for t, (tree, name) in enumerate(zip(trees, maps)):
        if t > 0 and name != maps[t - 1]:
            generator.set_state(start)
        mapped = by_map[name]
        ids, vids = tree.route(mapped.X), tree.route(mapped.X_val)
        keep = [lf for lf in range(tree.n_leaves) if int((ids == lf).sum()) >= 4]
        layout = TreeLayout(
            tree.split_vectors_.detach(),
            tree.thresholds_.detach(),
            tree.temp_scale_,
            tree.children_,
            leaf_train=[(ids == lf).nonzero().squeeze(1) for lf in keep],
            leaf_val=[(vids == lf).nonzero().squeeze(1) for lf in keep],
        )
        leaves, pending, owners = plan.fit(layout, mapped, generator)
        jobs = [_refit_job(mapped, rows) for rows in pending]
        run_leaf_jobs(leaves, jobs, owners, distributed=plan.config.distributed)
        out.append(dict(zip(keep, leaves)))
    return out
