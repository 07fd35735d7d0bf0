"""The few operations PyTorch's deterministic mode refuses on CUDA, kept usable under it.

``torch.use_deterministic_algorithms(True)`` (what a user sets for reproducible GPU runs) makes a
floating-point ``cumsum``, a ``median``/``nanmedian`` along a dimension (they return indices) and a
weighted ``bincount`` and the negative log-likelihood inside ``cross_entropy`` raise a
``RuntimeError`` on CUDA tensors: PyTorch has no deterministic CUDA kernel for them. The fit uses
the first three on small tensors (soft-routing masses over leaves, a column's medians, class
counts, split sums), so under that mode these helpers compute them on the CPU and copy the result
back: the values of a CPU run, at the price of two transfers; the log-likelihood of a Platt fit
is taken by a ``gather`` instead, which has a deterministic CUDA kernel and gradient. In every
other case they are the plain torch calls. Every use in the package goes through here
(``tests/test_deterministic.py`` checks that a fit calls none of them directly).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["bincount", "cross_entropy", "cumsum", "nanmedian", "refused"]


def refused(x: Tensor) -> bool:
    """Whether deterministic mode is on and ``x`` lives on CUDA, where the ops below raise."""
    return x.device.type == "cuda" and torch.are_deterministic_algorithms_enabled()


def cumsum(x: Tensor, dim: int) -> Tensor:
    """``x.cumsum(dim)``; on the CPU under deterministic mode on CUDA (floating ``x``)."""
    if refused(x) and (x.is_floating_point() or x.is_complex()):
        return x.cpu().cumsum(dim).to(x.device)
    return x.cumsum(dim)


def nanmedian(x: Tensor, dim: int) -> Tensor:
    """The values of ``x.nanmedian(dim)`` (the lower median, NaN ignored); see :func:`cumsum`."""
    if refused(x):
        return x.cpu().nanmedian(dim).values.to(x.device)
    return x.nanmedian(dim).values


def bincount(x: Tensor, weights: Tensor | None = None, minlength: int = 0) -> Tensor:
    """``torch.bincount``; a weighted count on the CPU under deterministic mode on CUDA."""
    if weights is not None and refused(x):
        return torch.bincount(x.cpu(), weights.cpu(), minlength).to(x.device)
    return torch.bincount(x, weights, minlength)


def cross_entropy(logits: Tensor, labels: Tensor, reduction: str = "mean") -> Tensor:
    """``F.cross_entropy(logits (n, k), labels (n,), reduction)`` for ``"mean"`` or ``"none"``.

    Under deterministic mode on CUDA: ``-log_softmax(logits)[i, labels_i]`` by a ``gather``
    (differentiable, on the device), equal up to rounding.
    """
    if reduction not in ("mean", "none"):
        raise ValueError(f"reduction must be 'mean' or 'none', got {reduction!r}")
    if refused(logits):
        nll = -torch.log_softmax(logits, 1).gather(1, labels[:, None])[:, 0]
        return nll.mean() if reduction == "mean" else nll
    return torch.nn.functional.cross_entropy(logits, labels, reduction=reduction)
