"""Reading scalars back to the host: one read per device, not one per scalar.

On a GPU each read of a value (``float(t)``, ``bool(t)``, ``t.item()``) makes the host wait
until the device has finished everything queued before it; a fit that reads a few scalars per
solve spends its time waiting instead of queueing work. The fit's decisions (stop iterating,
keep a candidate) need those values on the host, but the scalars one decision needs can come
back together: :func:`read_scalars`.
"""

from __future__ import annotations

import torch
from torch import Tensor


def read_scalars(*values: Tensor) -> list[float]:
    """The values of 0-dim (or one-element) tensors as Python floats, in the given order.

    Tensors on the same device are stacked (in float64, which holds every float32, integer up to
    2**53 and bool exactly) and read back in one transfer: one host-device synchronization per
    device that holds any of them (none for tensors on the CPU). Tensors may live on different
    devices, e.g. a kernel's bandwidth buffer on the CPU beside a validation error on a GPU.

    Args:
        values: Tensors with one element each.

    Returns:
        Their values, ``float(values[i])`` for each ``i``.

    Raises:
        ValueError: A tensor holds more or fewer than one element.
    """
    for i, v in enumerate(values):
        if v.numel() != 1:
            raise ValueError(
                f"read_scalars takes one-element tensors; value {i} has shape {tuple(v.shape)}"
            )
    out: list[float] = [0.0] * len(values)
    by_device: dict[torch.device, list[int]] = {}
    for i, v in enumerate(values):
        by_device.setdefault(v.device, []).append(i)
    for idx in by_device.values():
        # stacked by dtype, then one conversion per dtype: each scalar costs no operation of
        # its own (on a GPU every operation is a launch; a decision reads a few scalars)
        by_dtype: dict[torch.dtype, list[int]] = {}
        for i in idx:
            by_dtype.setdefault(values[i].dtype, []).append(i)
        parts = [
            torch.stack([_scalar(values[i]) for i in group]).double() for group in by_dtype.values()
        ]
        read = (parts[0] if len(parts) == 1 else torch.cat(parts)).tolist()
        for i, x in zip((i for group in by_dtype.values() for i in group), read):
            out[i] = x
    return out


def _scalar(v: Tensor) -> Tensor:
    """``v`` as a 0-dim tensor outside autograd (no operation where it is one already)."""
    v = v.detach() if v.requires_grad else v
    return v if v.ndim == 0 else v.reshape(())


def launch_bound(device: torch.device) -> bool:
    """Whether a fit on ``device`` is bound by the host's cost per operation, not arithmetic.

    Off the CPU (a GPU): there each operation costs the host some 20 us to launch whatever its
    size, so fewer, larger operations pay (batched leaf steps, a leaf evaluated on all rows at
    once) even where they do more arithmetic. On the CPU arithmetic is the cost.
    """
    return device.type != "cpu"


def split_by_masks(
    index: list[Tensor], masks: list[Tensor], counts: list[int] | None = None
) -> list[tuple[Tensor, Tensor]]:
    """``(i[m], i[~m])`` for each index tensor ``i`` (k,) and boolean mask ``m`` (k,).

    Boolean indexing reads the number of selected entries back to the host: over many masks on a
    GPU, one wait each. Here the counts come back in one read (or are given as ``counts``), and
    each split is a stable sort of its mask: the same entries in the same order as boolean
    indexing.
    """
    if counts is None:
        counts = [int(c) for c in read_scalars(*(m.sum() for m in masks))] if masks else []
    out = []
    for i, m, k in zip(index, masks, counts, strict=True):
        order = torch.sort((~m).to(torch.uint8), stable=True).indices  # selected entries first
        out.append((i[order[:k]], i[order[k:]]))
    return out
