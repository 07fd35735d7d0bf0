"""What one fit of a set of trees uses (:class:`FitPlan`) and the rules that resolve it.

The sizes that depend on the data (a large fit's subsamples and overlap, trees per map, a set's
leaf size) are resolved here once per fit; :func:`leaf_plan` and :func:`start_matrix` let later
trees and bags follow a fitted tree's choices. :mod:`xrfm_torch.tree.fit` runs the plan. The one
size rule not here, how many input maps ``"auto"`` may average
(:meth:`~xrfm_torch.tree.config.TreeConfig.input_maps_limit`), decides ``n_maps`` before a plan
exists.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from xrfm_torch.kernels import Kernel
from xrfm_torch.leaf import LeafRFM
from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.leaf.data import FitData
from xrfm_torch.numerics.checks import all_finite
from xrfm_torch.tree.config import OVERLAP_FRACTION, TreeConfig, row_share
from xrfm_torch.tree.grow import Progress, TreeLayout
from xrfm_torch.tree.leaf_fits import fit_leaves
from xrfm_torch.tree.partition import PartitionTree
from xrfm_torch.tree.splits import with_sample_at_most
from xrfm_torch.tree.targets import Task

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class FitPlan:
    """What one fit of a set of trees uses: the kernel, the settings, the leaves' factors.

    Attributes:
        kernel: Kernel prototype (each leaf copies it).
        config: The tree's settings with this fit's sizes resolved: ``max_leaf_size`` (smaller
            for the trees of a set of maps), ``n_trees`` and ``overlap_fraction`` (never
            ``None``), ``leaf`` (with the ``iter_rows`` of a large fit) and ``split_rule`` (its
            sample capped in a large fit).
        keep_factor: Leaves keep their final solve's Cholesky factor for their posterior.
        start_tree: A fitted tree (or none) whose leaves' ``M`` this plan's leaves start their
            iterations from (:func:`start_matrix`): a map's first tree, for its later trees.
    """

    kernel: Kernel
    config: TreeConfig
    keep_factor: bool = False
    start_tree: PartitionTree | None = None

    @classmethod
    def resolve(
        cls,
        kernel: Kernel,
        config: TreeConfig,
        task: Task,
        n_rows: int,
        n_maps: int = 1,
        keep_factor: bool = False,
    ) -> FitPlan:
        """The plan of a fit on ``n_rows`` training rows and ``n_maps`` input maps.

        Resolves the rules: a large fit's leaves iterate on ``large_fit_iter_rows``-row
        subsamples (unless the leaf sets ``iter_rows``), its split models fit on at most as
        many rows (``AGOPSplit.sample_size``) and ``overlap_fraction=None`` is 0 (else
        ``OVERLAP_FRACTION``); ``n_trees=None`` is 2 trees per map for
        classification and 1 for regression or a large fit (a ``BaggedTree`` sets 1 in its bags
        itself); a set's trees are cheaper members with leaves of ``set_leaf_fraction *
        max_leaf_size`` rows.
        """
        large = config.is_large(n_rows)
        leaf, rule = config.leaf, config.split_rule
        if large:
            log.info(
                "large fit (%d rows > large_fit_rows=%s): leaves iterate and split models fit "
                "on %d-row subsamples",
                n_rows,
                config.large_fit_rows,
                config.large_fit_iter_rows,
            )
            if leaf.iter_rows is None:
                leaf = leaf.replace(iter_rows=config.large_fit_iter_rows)
            # split models on as many rows as the leaves iterate on: the same accuracy, a sixth
            rule = with_sample_at_most(rule, config.large_fit_iter_rows)
        overlap = config.overlap_fraction
        if overlap is None:
            overlap = 0.0 if large else OVERLAP_FRACTION
        n_trees = config.n_trees
        if n_trees is None:
            n_trees = 2 if task == "classification" and not large else 1
        leaf_size = config.max_leaf_size
        if n_maps > 1:
            leaf_size = row_share(leaf_size, config.set_leaf_fraction)
        resolved = config.replace(
            leaf=leaf,
            n_trees=n_trees,
            max_leaf_size=leaf_size,
            split_rule=rule,
            overlap_fraction=overlap,
        )
        return cls(kernel, resolved, keep_factor=keep_factor)

    def following(self, tree: PartitionTree) -> FitPlan | None:
        """The plan of a map's later trees: start from ``tree``'s leaves and follow their plan.

        ``tree`` is the map's first tree; the later trees' leaves start from the ``M`` of its
        leaves (:func:`start_matrix`) and iterate by :func:`leaf_plan`. ``None`` when no leaf
        of ``tree`` iterated. Only for fits on the rows ``tree`` trained on, validated on the
        same rows (a map's later trees): a start learned with a fit's validation rows among its
        training rows makes that fit's validation errors, and so its stopping and its honest
        outputs, optimistic (why later bags do not start from the first bag,
        :func:`~xrfm_torch.models.bag_plan.first_bag_plan`).
        """
        leaf = leaf_plan(tree.leaf_list(), self.config.leaf, float(self.kernel.q))
        if leaf is None:
            return None
        return replace(self, config=self.config.replace(leaf=leaf), start_tree=tree)

    def new_leaf(self) -> LeafRFM:
        """A fresh, unfitted leaf."""
        leaf = LeafRFM(self.kernel, self.config.leaf)
        leaf.keep_factor = self.keep_factor
        return leaf

    def fit(
        self,
        layout: TreeLayout,
        data: FitData,
        generator: torch.Generator,
        progress: Progress | None = None,
        tree_index: int = 0,
    ) -> tuple[list[LeafRFM], list[Tensor | None], list[int]]:
        """Fit one leaf per leaf of ``layout``: leaves, pending final-solve rows, owner ranks."""
        return fit_leaves(
            layout,
            data,
            new_leaf=self.new_leaf,
            config=self.config,
            generator=generator,
            progress=progress,
            tree_index=tree_index,
            start=self._start(),
        )

    def _start(self) -> Callable[[Tensor], Tensor | None] | None:
        tree, diag = self.start_tree, self.config.leaf.diag
        if tree is None:
            return None
        return lambda x: start_matrix(tree, x, None if diag == "auto" else bool(diag))


def leaf_plan(leaves: Sequence[LeafRFM], cfg: LeafConfig, own_q: float) -> LeafConfig | None:
    """The leaf settings of fits that follow the choices of fitted ``leaves``.

    With ``t*`` each leaf's kept iteration, the plan iterates up to ``max t*`` (still stopping
    early by validation, and keeping its best iteration). It fixes the feature matrix's shape to
    the leaves' majority (diagonal on a tie) and offers beside the kernel's own exponent
    ``own_q`` only those some leaf chose (each leaf still picks by the configured margin: leaves
    of one tree want different exponents). Each leaf still walks its own ridge, for the same
    reason. The leaves explored with the warm-up and the full patience, so a follower drops the
    warm-up (``min_iters=0``) and stops after 2 steps without a gain (``patience`` at most 2): a
    map's later trees, which start from its first tree's ``M`` (:func:`start_matrix`), and later
    bags, which start from the identity. ``None`` when no leaf iterated.
    """
    kept = [(leaf, int(leaf.best_iter_)) for leaf in leaves]
    kept = [(leaf, t) for leaf, t in kept if t >= 0]
    if not kept:
        return None
    shaped = [leaf.sqrt_m_.ndim == 1 for leaf, _ in kept if leaf.sqrt_m_.numel()]
    diag = 2 * sum(shaped) >= len(shaped) if shaped else cfg.diag
    chosen = sorted({float(leaf.kernel.q) for leaf, _ in kept} - {own_q})
    return cfg.replace(
        n_iters=min(cfg.n_iters, max(t for _, t in kept)),
        diag=diag,
        kernel_exponents=tuple(chosen) or None,
        min_iters=0,
        patience=None if cfg.patience is None else min(cfg.patience, 2),
    )


def start_matrix(tree: PartitionTree, x: Tensor, diag: bool | None) -> Tensor | None:
    """``sqrt(M)`` of the leaf of ``tree`` that most rows of ``x`` (m, d) route to.

    In the layout ``diag`` asks for (``None``: the leaf's own): a full ``sqrt(M) = S`` gives
    ``sqrt(diag(S S))``, a diagonal one its diagonal matrix. ``None`` (the identity) when that
    leaf kept ``t* = 0`` or has no ``M``, or ``tree`` encodes its inputs with another width.
    """
    leaves = tree.leaf_list()
    if leaves[0].support_.shape[-1] != x.shape[1]:  # another encoding (e.g. levels a bag lacks)
        return None
    leaf = leaves[int(torch.bincount(tree.route(x), minlength=len(leaves)).argmax())]
    s = leaf.sqrt_m_
    if int(leaf.best_iter_) < 1 or s.numel() == 0 or not bool(all_finite(s)):
        return None
    if diag is None or diag == (s.ndim == 1):
        return s.clone()
    return torch.diag(s) if s.ndim == 1 else leaf.M.diagonal().clamp(min=0).sqrt()
