"""Interpretation of fitted trees: input gradients, AGOP, feature importance (size-weighted)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import torch
from torch import Tensor

from xrfm_torch.inputs.input_map import InputMapName
from xrfm_torch.leaf import LeafRFM
from xrfm_torch.tree.partition import PartitionTree

#: What a feature importance is read from: the learned ``M`` or the fitted predictors' AGOP.
ImportanceSource = Literal["M", "agop"]


def input_grads(f: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
    """``d f_c(x_i) / d x_i`` for every row and output by autograd, shape (n, c, d).

    Rows are independent, so one backward pass per output gives all rows' gradients. Under hard
    routing this is the routed leaf's gradient; under soft routing it includes the gate gradients.
    """
    with torch.enable_grad():
        xg = x.detach().requires_grad_(True)
        out = f(xg)  # (n, c)
        grads = [
            torch.autograd.grad(out[:, c].sum(), xg, retain_graph=c + 1 < out.shape[1])[0]
            for c in range(out.shape[1])
        ]
    return torch.stack(grads, dim=1)


def m_diagonal(M: Tensor) -> Tensor:
    """Diagonal of a feature matrix stored as a vector (d,) or a matrix (d, d)."""
    return M if M.ndim == 1 else M.diagonal()


def size_weighted(leaves: Sequence[LeafRFM], value: Callable[[LeafRFM], Tensor]) -> Tensor:
    """``sum_l n_l value(l) / sum_l n_l`` with ``n_l`` the leaf's support rows (float64, CPU)."""
    total: Tensor | None = None
    weight = 0
    for leaf in leaves:
        n = int(leaf.support_.shape[0])
        v = value(leaf).detach().double().cpu() * n
        total = v if total is None else total + v
        weight += n
    if total is None:
        raise ValueError("no leaves to average over")
    return total / weight


def leaves_by_map(
    trees: Sequence[PartitionTree], maps: Sequence[InputMapName]
) -> dict[InputMapName, list[LeafRFM]]:
    """The leaves grouped by the input map their tree sees (``maps[t]`` for tree ``t``)."""
    groups: dict[InputMapName, list[LeafRFM]] = {}
    for tree, name in zip(trees, maps):
        groups.setdefault(name, []).extend(tree.leaf_list())
    return groups


def mean_leaf_agop(groups: dict[InputMapName, list[LeafRFM]], *, diag: bool) -> Tensor:
    """Size-weighted mean of the leaves' AGOPs at their support rows (float64, CPU).

    The mean is over the columns the leaves see, so all trees must see the same map.
    """
    if len(groups) > 1:
        raise ValueError(
            f"the trees see different input maps {sorted(groups)}: their leaves' AGOPs are over "
            "different columns; use agop(x) (the AGOP in the inputs, by autograd) instead"
        )
    leaves = [leaf for group in groups.values() for leaf in group]
    return size_weighted(leaves, lambda leaf: leaf.agop(diag=diag))


def feature_importance(
    groups: dict[InputMapName, list[LeafRFM]],
    fold: Callable[[Tensor, InputMapName], Tensor],
    source: ImportanceSource,
) -> Tensor:
    """Size-weighted ``diag(M)`` (``"M"``) or the AGOP diagonal (``"agop"``), summing to 1, (d,).

    ``fold`` maps a map's per-column values back to the inputs (under ``"quantile+raw"`` a
    feature's two columns add up). Trees on different input maps (whose ``M`` differ in scale)
    each give importances summing to 1, averaged with their leaves' support rows as weights.
    Float64 on the CPU.
    """
    if source not in ("M", "agop"):
        raise ValueError(f"source must be 'M' or 'agop', got {source!r}")

    def value(leaf: LeafRFM) -> Tensor:
        return m_diagonal(leaf.M) if source == "M" else leaf.agop(diag=True)

    imp = torch.zeros((), dtype=torch.float64)
    for name, leaves in groups.items():
        part = fold(size_weighted(leaves, value), name)
        imp = imp + _normalized(part) * _rows(leaves)
    return _normalized(imp)


def _normalized(v: Tensor) -> Tensor:
    return v / v.sum().clamp_min(1e-300)


def _rows(leaves: Sequence[LeafRFM]) -> int:
    return sum(int(leaf.support_.shape[0]) for leaf in leaves)


def tree_summary(tree: Any) -> dict[str, Any]:
    """One fitted ``xRFMTree`` as plain data (``tree_summary.json``; ``xRFMTree.summary``).

    Its trees' input maps, depth, leaves, fit seconds, temperature, and per leaf its support size,
    ``t*``, bandwidth, ``M``'s shape and validation errors.
    """
    trees = tree.partition_trees()
    return {
        "n_trees": len(trees),
        "input_maps": tree.input_map.names,
        "n_leaves": tree.n_leaves,
        "depth": [t.depth for t in trees],
        "fit_seconds": tree.fit_seconds_,
        "temperature": float(tree.temperature_),
        "leaves": [
            {
                "tree": i,
                "leaf": j,
                "n_support": int(leaf.support_.shape[0]),
                "best_iter": int(leaf.best_iter_),
                "bandwidth": leaf.bandwidth,
                "diag_m": leaf.sqrt_m_.ndim == 1,
                "val_errors": [None if math.isnan(e) else e for e in leaf.val_errors_.tolist()],
            }
            for i, t in enumerate(trees)
            for j, leaf in enumerate(t.leaf_list())
        ],
    }
