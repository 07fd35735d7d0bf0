"""Interpretation helpers: input gradients of a whole tree and leaf-size-weighted averages."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch
from torch import Tensor

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
