"""Bandwidth adaptation: a multiple of the median pairwise distance in the current M-space."""

from __future__ import annotations

import torch
from torch import Tensor

from xrfm_torch.kernels.distance import pairwise_distance


def median_pairwise_distance(
    x: Tensor, p: float = 2.0, *, max_rows: int = 2000, generator: torch.Generator | None = None
) -> float:
    """Median of ``||x_i - x_j||_p`` over distinct pairs ``i < j`` of a row subsample.

    Args:
        x: (Transformed) inputs, shape (n, d), n >= 2.
        p: Norm exponent.
        max_rows: Subsample at most this many rows (seeded by ``generator``).
        generator: Random generator for the subsample.

    Returns:
        The median distance (0.0 if every row is identical).
    """
    n = x.shape[0]
    if n < 2:
        raise ValueError(f"need at least 2 rows for a pairwise distance, got {n}")
    if n > max_rows:
        idx = torch.randperm(n, generator=generator, device="cpu")[:max_rows].to(x.device)
        x = x[idx]
    r = pairwise_distance(x, x, p)
    iu = torch.triu_indices(x.shape[0], x.shape[0], offset=1, device=x.device)
    return float(r[iu[0], iu[1]].median())
