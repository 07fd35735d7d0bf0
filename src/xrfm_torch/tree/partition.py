"""One fitted partition tree: routing arrays in buffers plus one LeafRFM per leaf."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any, cast

import torch
from torch import Tensor, nn

from xrfm_torch.leaf import LeafRFM
from xrfm_torch.numerics.state import ResizableBuffers
from xrfm_torch.tree.routing import (
    hard_route,
    is_zero,
    path_signs,
    soft_log_weights,
    soft_weights,
    tree_depth,
    truncate_weights,
)


class PartitionTree(ResizableBuffers):
    """A tree in struct-of-arrays form (after scikit-learn's ``Tree``) with its leaf models.

    Args:
        leaves: Fitted (or, for state-dict loading, empty) leaf models, in leaf-id order.
        trainable: Register ``split_vectors_`` and ``thresholds_`` as ``nn.Parameter`` (head use);
            otherwise they are buffers. Leaf coefficients are always buffers.

    Buffers:
        ``split_vectors_`` (J, d), ``thresholds_`` (J,), ``temp_scale_`` (J,) per-node temperature
        factor (IQR of the node's projections), ``children_`` (J, 2) long (leaf ``l`` as ``-(l+1)``),
        ``path_sign_`` (L, J) int8.
    """

    split_vectors_: Tensor
    thresholds_: Tensor
    temp_scale_: Tensor
    children_: Tensor
    path_sign_: Tensor

    def __init__(self, leaves: list[LeafRFM], *, trainable: bool = False) -> None:
        super().__init__()
        self.leaves = nn.ModuleList(leaves)
        self.trainable = bool(trainable)
        if self.trainable:
            self.split_vectors_ = nn.Parameter(torch.empty(0, 0))
            self.thresholds_ = nn.Parameter(torch.empty(0))
        else:
            self.register_buffer("split_vectors_", torch.empty(0, 0))
            self.register_buffer("thresholds_", torch.empty(0))
        self.register_buffer("temp_scale_", torch.empty(0))
        self.register_buffer("children_", torch.empty(0, 2, dtype=torch.long))
        self.register_buffer("path_sign_", torch.empty(len(leaves), 0, dtype=torch.int8))

    def set_structure(
        self, vectors: Tensor, thresholds: Tensor, scales: Tensor, children: Tensor
    ) -> None:
        """Store the routing arrays (and derive the path-sign table)."""
        if self.trainable:  # keep the Parameter objects (optimizers may already hold them)
            self.split_vectors_.data = vectors
            self.thresholds_.data = thresholds
        else:
            self.split_vectors_ = vectors
            self.thresholds_ = thresholds
        self.temp_scale_ = scales
        self.children_ = children
        self.path_sign_ = path_signs(children.cpu(), len(self.leaves)).to(vectors.device)

    def leaf_list(self) -> list[LeafRFM]:
        """The leaf models (typed view of ``self.leaves``)."""
        return [cast(LeafRFM, leaf) for leaf in self.leaves]

    @property
    def n_leaves(self) -> int:
        """Number of leaves ``L``."""
        return len(self.leaves)

    @property
    def depth(self) -> int:
        """Longest root-to-leaf path (0 for a single leaf)."""
        return tree_depth(self.children_)

    def route(self, x: Tensor) -> Tensor:
        """Hard leaf ids, shape (n,)."""
        return hard_route(x, self.split_vectors_, self.thresholds_, self.children_)

    def weights(
        self,
        x: Tensor,
        temperature: Tensor | float,
        *,
        keep_mass: float = 1.0,
        max_leaves: int | None = None,
    ) -> Tensor:
        """Leaf mixture weights, shape (n, L) (one-hot when ``temperature == 0``)."""
        return soft_weights(
            x,
            self.split_vectors_,
            self.thresholds_,
            self.temp_scale_,
            self.path_sign_,
            self.children_,
            temperature,
            keep_mass=keep_mass,
            max_leaves=max_leaves,
        )

    def weights_at(
        self,
        x: Tensor,
        temperatures: Tensor,
        *,
        keep_mass: float = 1.0,
        max_leaves: int | None = None,
    ) -> Tensor:
        """:meth:`weights` at several positive temperatures (T,) at once, shape (T, n, L).

        One pass for all of them (a temperature search on a GPU: a few launches, not a few per
        temperature). A tree with one leaf gives each row weight 1.
        """
        if self.split_vectors_.shape[0] == 0:
            return x.new_ones(temperatures.shape[0], x.shape[0], 1)
        t = temperatures.to(x)[:, None, None]  # (T, 1, 1): z becomes (T, n, J)
        logp = soft_log_weights(
            x, self.split_vectors_, self.thresholds_, self.temp_scale_, self.path_sign_, t
        )
        return truncate_weights(torch.softmax(logp, dim=-1), keep_mass, max_leaves)

    def predict_hard(self, x: Tensor) -> Tensor:
        """Route each row to one leaf; rows are grouped by leaf so each leaf runs once. (n, c)."""
        if self.n_leaves == 1:
            return self.leaves[0](x)
        ids = self.route(x)
        order = torch.argsort(ids, stable=True)
        counts = torch.bincount(ids, minlength=self.n_leaves).tolist()
        parts = []
        start = 0
        for leaf_id, cnt in enumerate(counts):
            if cnt:
                parts.append(self.leaves[leaf_id](x[order[start : start + cnt]]))
            start += cnt
        preds = torch.cat(parts)  # rows in leaf order
        inverse = torch.empty_like(order)
        inverse[order] = torch.arange(order.numel(), device=order.device)
        return preds[inverse]

    def _on_rows(self, x: Tensor, mask: Tensor) -> Iterator[tuple[int, Tensor, Tensor]]:
        """``(leaf id, rows, leaf(x[rows]))`` for each leaf with rows in ``mask[:, leaf id]``, (n, L)."""
        for leaf_id, leaf in enumerate(self.leaves):
            rows = mask[:, leaf_id].nonzero().squeeze(1)
            if rows.numel():
                yield leaf_id, rows, leaf(x[rows])

    def predict_weighted(self, x: Tensor, w: Tensor) -> Tensor:
        """``sum_l w[:, l] * leaf_l(x)``, evaluating each leaf only on rows where its weight > 0."""
        out: Tensor | None = None
        for leaf_id, rows, pred in self._on_rows(x, w > 0):
            contrib = w[rows, leaf_id, None] * pred
            if out is None:
                out = torch.zeros(x.shape[0], contrib.shape[1], dtype=x.dtype, device=x.device)
            out = out.index_add(0, rows, contrib)
        if out is None:
            raise RuntimeError("no leaf received any weight")
        return out

    def leaf_predictions(
        self, x: Tensor, mask: Tensor | None = None, out: Tensor | None = None
    ) -> Tensor:
        """Each leaf's prediction at each row, shape (n, L, c) (for temperature tuning).

        Args:
            x: Inputs, shape (n, d).
            mask: Optional (n, L) bool: leaf ``l`` runs only on the rows with ``mask[:, l]`` and
                the other entries are 0. With soft weights truncated to a few leaves per row this
                keeps the cost linear in the number of leaves instead of ``n * L * leaf size``.
            out: Optional (n, L, c) to write the masked entries into (the others are kept), so
                that a search over temperatures evaluates each (row, leaf) pair once.
        """
        if mask is None:
            return torch.stack([leaf(x) for leaf in self.leaves], dim=1)
        for leaf_id, rows, pred in self._on_rows(x, mask):
            if out is None:
                out = x.new_zeros(x.shape[0], self.n_leaves, pred.shape[1])
            out[rows, leaf_id] = pred
        if out is None:
            raise ValueError("mask selects no (row, leaf) pair")
        return out

    def forward(
        self,
        x: Tensor,
        temperature: Tensor | float = 0.0,
        *,
        keep_mass: float = 1.0,
        max_leaves: int | None = None,
    ) -> Tensor:
        """Hard (``temperature == 0``) or soft-routed predictions, shape (n, c)."""
        if is_zero(temperature) or self.n_leaves == 1:
            return self.predict_hard(x)
        w = self.weights(x, temperature, keep_mass=keep_mass, max_leaves=max_leaves)
        return self.predict_weighted(x, w)


_LEAF_KEY = re.compile(r"^trees\.(\d+)\.leaves\.(\d+)\.alpha_$")


def leaves_per_tree(state_dict: dict[str, Any], prefix: str) -> dict[int, int]:
    """``{tree index: number of leaves}`` found in an ``xRFMTree`` state dict (keys under ``prefix``)."""
    counts: dict[int, int] = {}
    for key in state_dict:
        m = _LEAF_KEY.match(key[len(prefix) :]) if key.startswith(prefix) else None
        if m:
            t, leaf = int(m.group(1)), int(m.group(2))
            counts[t] = max(counts.get(t, 0), leaf + 1)
    return counts


def empty_trees(
    state_dict: dict[str, Any], prefix: str, new_leaf: Callable[[], LeafRFM], trainable: bool
) -> nn.ModuleList | None:
    """Unfitted trees with as many leaves as the state dict holds (``None`` if it holds none).

    ``xRFMTree`` builds them before loading, so that a fresh model takes a fitted one's state.
    """
    counts = leaves_per_tree(state_dict, prefix)
    if not counts:
        return None
    return nn.ModuleList(
        PartitionTree([new_leaf() for _ in range(counts[t])], trainable=trainable)
        for t in sorted(counts)
    )
