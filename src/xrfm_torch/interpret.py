"""Interpretation of a fitted tree: input gradients, AGOP, feature importance (size-weighted)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

from xrfm_torch.agop import agop_from_grads
from xrfm_torch.leaf import LeafRFM

if TYPE_CHECKING:
    from xrfm_torch.tree import xRFMTree


def input_grads(model: xRFMTree, x: Tensor, temperature: float | Tensor | None = None) -> Tensor:
    """``d f_c(x_i) / d x_i`` for every row and output by autograd, shape (n, c, d).

    Rows are independent, so one backward pass per output gives all rows' gradients. Under hard
    routing this is the routed leaf's gradient; under soft routing it includes the gate gradients.
    """
    with torch.enable_grad():
        xg = x.detach().requires_grad_(True)
        out = model(xg, temperature)  # (n, c)
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


def model_agop(model: xRFMTree, x: Tensor | None, *, diag: bool) -> Tensor:
    """The tree's AGOP at ``x`` (routing included) or the size-weighted mean of the leaves' AGOPs."""
    if x is not None:
        return agop_from_grads(input_grads(model, x), diag=diag)
    return size_weighted(model.leaves(), lambda leaf: leaf.agop(diag=diag))


def feature_importance(model: xRFMTree, source: str) -> Tensor:
    """Size-weighted ``diag(M)`` (``"M"``) or the AGOP diagonal (``"agop"``), summing to 1, (d,)."""
    if source == "M":
        imp = size_weighted(model.leaves(), lambda leaf: m_diagonal(leaf.M))
    elif source == "agop":
        imp = model_agop(model, None, diag=True)
    else:
        raise ValueError(f"source must be 'M' or 'agop', got {source!r}")
    imp = model.input_map.fold(imp.detach().double())  # a feature's columns add up
    return (imp / imp.sum().clamp_min(1e-300)).to(model.temperature_.device)
