"""TreePartition: grow the supervised median-split tree and assign rows to leaves.

This module decides *where rows go*; :mod:`xrfm_torch.tree.leaf_fits` fits one LeafRFM per
leaf, and :mod:`xrfm_torch.tree.fit` runs both for a whole model (trees, temperature, refits).
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from xrfm_torch.kernels import Kernel
from xrfm_torch.numerics.host import split_by_masks
from xrfm_torch.tree.splits import Split, SplitRule, balanced_split

log = logging.getLogger(__name__)

#: ``progress(tree_index, leaves_done, leaves_total)`` after each leaf fit.
Progress = Callable[[int, int, int], None]


@dataclass
class TreeLayout:
    """Routing arrays of a grown tree and the row indices that reach each leaf.

    Attributes:
        vectors: Split directions, shape (J, d).
        thresholds: Thresholds, shape (J,).
        scales: Per-node temperature factors ``max(IQR(projections), 1e-6)``, shape (J,).
        children: Child table, shape (J, 2) (leaf ``l`` encoded as ``-(l + 1)``).
        leaf_train: Per leaf, indices into the training rows.
        leaf_val: Per leaf, indices into the validation rows (routed with the same rule).
        overlap: Whether ``leaf_train`` includes overlap rows (rows routed to another leaf).
    """

    vectors: Tensor
    thresholds: Tensor
    scales: Tensor
    children: Tensor
    leaf_train: list[Tensor] = field(default_factory=list)
    leaf_val: list[Tensor] = field(default_factory=list)
    overlap: bool = False

    @property
    def n_splits(self) -> int:
        """Number of internal nodes ``J``."""
        return int(self.thresholds.shape[0])


def _iqr(x: Tensor) -> Tensor:
    """``max(IQR(x), 1e-6)`` in ``x``'s dtype, 0-dim (kept on the device: no read per node)."""
    q = torch.quantile(x.float(), torch.tensor([0.25, 0.75], device=x.device))
    return (q[1] - q[0]).to(x.dtype).clamp_min(1e-6)


def _cut(proj: Tensor, split: Split, weights: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """Apply a split's threshold, falling back to the (weighted) median cut if a side is empty.

    The threshold comes back as a 0-dim float64 tensor (no read per node on a GPU).
    """
    if split.threshold is not None:
        go_left = proj <= split.threshold
        n_left = int(go_left.sum())
        if 0 < n_left < proj.shape[0]:
            idx = torch.arange(proj.shape[0], device=proj.device)
            thr = torch.tensor(float(split.threshold), dtype=torch.float64, device=proj.device)
            return idx[go_left], idx[~go_left], thr
    return balanced_split(proj, weights)


def _overlap(
    proj: Tensor, left: Tensor, right: Tensor, fraction: float, max_leaf_size: int
) -> tuple[Tensor, Tensor]:
    """Add to each side the other side's rows nearest the cut (see ``overlap_fraction``).

    Only at a node whose children are leaves: overlap at inner nodes would compound (each level
    1 + 2 * fraction times the rows), adding leaves and breaking the linear growth in n.
    """
    biggest = max(left.shape[0], right.shape[0])
    extra = min(math.floor(fraction * proj.shape[0]), max_leaf_size - biggest)
    if extra <= 0:
        return left, right
    # stable sorts: ties broken by position, so the same data give the same leaves
    near_left = left[torch.sort(proj[left], descending=True, stable=True).indices[:extra]]
    near_right = right[torch.sort(proj[right], stable=True).indices[:extra]]
    return torch.cat([left, near_right]), torch.cat([right, near_left])


def grow_tree(
    X: Tensor,
    y: Tensor,
    X_val: Tensor,
    y_val: Tensor,
    *,
    max_leaf_size: int,
    split_rule: SplitRule,
    kernel: Kernel,
    generator: torch.Generator | None,
    overlap_fraction: float = 0.0,
    weights: tuple[Tensor | None, Tensor | None] = (None, None),
) -> TreeLayout:
    """Recursively split until every node holds at most ``max_leaf_size`` training rows.

    Args:
        X: Training inputs, shape (n, d).
        y: Training targets, shape (n, c).
        X_val: Validation inputs, shape (n_val, d) (may have 0 rows).
        y_val: Validation targets, shape (n_val, c).
        max_leaf_size: ``L_max``.
        split_rule: Strategy choosing each node's direction (and possibly threshold).
        kernel: Kernel prototype handed to the split rule.
        generator: Random generator for split-model subsamples.
        overlap_fraction: At a node whose children are leaves, each child also gets the
            ``floor(overlap_fraction * n)`` training rows of the other side nearest the threshold
            (the reference's ``overlap_fraction``, which applies it at every node), capped so that
            leaves stay within ``max_leaf_size``: overlap adds rows near the last cut, never
            leaves or depth. Validation rows are routed without overlap.
        weights: ``(training row weights (n,), validation row weights (n_val,))``, each ``None``
            for 1: handed to the split rule (its ``weights`` keyword), and the median cut is the
            weighted median (:func:`~xrfm_torch.tree.splits.balanced_split`).

    Returns:
        The layout; leaves are numbered in depth-first, left-first order.
    """
    w, w_val = weights
    weighted = w is not None or w_val is not None
    if weighted and "weights" not in inspect.signature(split_rule).parameters:
        raise TypeError(
            f"split rule {type(split_rule).__name__} takes no 'weights' keyword, so it cannot "
            "split a weighted fit; add weights=(row weights, validation row weights) to it"
        )
    vectors: list[Tensor] = []
    thresholds: list[Tensor] = []
    scales: list[Tensor] = []
    children: list[list[int]] = []
    layout = TreeLayout(
        X.new_empty(0, X.shape[1]),
        X.new_empty(0),
        X.new_empty(0),
        torch.empty(0, 2, dtype=torch.long, device=X.device),
    )

    def grow(idx: Tensor, vidx: Tensor) -> int:
        if idx.shape[0] <= max_leaf_size:
            layout.leaf_train.append(idx)
            layout.leaf_val.append(vidx)
            return -len(layout.leaf_train)
        has_val = vidx.numel() > 0
        wi = None if w is None else w[idx]
        extra = {"weights": (wi, None if w_val is None or not has_val else w_val[vidx])}
        split = split_rule(
            X[idx],
            y[idx],
            X_val[vidx] if has_val else None,
            y_val[vidx] if has_val else None,
            kernel=kernel,
            generator=generator,
            **(extra if weighted else {}),
        )
        v = split.direction.to(dtype=X.dtype, device=X.device)
        proj = X[idx] @ v  # (n_node,)
        left, right, thr = _cut(proj, split, wi)
        left, right = _overlap(proj, left, right, overlap_fraction, max_leaf_size)
        node = len(thresholds)
        vectors.append(v)
        thresholds.append(thr)
        scales.append(_iqr(proj))
        children.append([0, 0])
        vproj = X_val[vidx] @ v
        log.debug(
            "node %d: n=%d -> %d | %d (threshold %.4g)", node, len(idx), len(left), len(right), thr
        )
        ((vleft, vright),) = split_by_masks([vidx], [vproj <= thr])  # (one read, not two)
        children[node][0] = grow(idx[left], vleft)
        children[node][1] = grow(idx[right], vright)
        return node

    grow(torch.arange(X.shape[0], device=X.device), torch.arange(X_val.shape[0], device=X.device))
    layout.overlap = overlap_fraction > 0 and bool(thresholds)
    if thresholds:
        layout.vectors = torch.stack(vectors)
        layout.thresholds = torch.stack(thresholds).to(X.dtype)
        layout.scales = torch.stack(scales)
        layout.children = torch.tensor(children, dtype=torch.long, device=X.device)
    return layout
