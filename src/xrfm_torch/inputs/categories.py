"""Category columns: integer codes in, a bounded one-hot block out.

A categorical column holds codes ``0 .. L-1`` (the scikit-learn estimators and the data loaders
turn text into them; NaN is a missing cell). Each column becomes at most ``max_levels``
(:data:`MAX_LEVELS`) indicator columns: one per level when it has at most ``max_levels`` levels in
the training rows, otherwise one per level for the ``max_levels - 1`` most frequent ones and one
shared "other" column, so a column with thousands of levels costs ``max_levels`` columns, not
thousands. The indicators are
``1 / sqrt(2)``: two rows of different levels are at distance 1, the distance of one standard
deviation of a standardized numeric column. A missing cell, a level the training rows never had, or
the code -1 (a level the table encoder never saw, :mod:`xrfm_torch.data.tabular`) gets no
indicator (all zeros), in the training rows as in later ones.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from xrfm_torch.numerics.checks import check_int
from xrfm_torch.numerics.state import ResizableBuffers

#: The value of an indicator: two different levels are at distance 1.
ONE_HOT = 1.0 / math.sqrt(2.0)
#: Most indicator columns per categorical column. Identifier columns (a pig, a firm, a state of a
#: panel) carry the target through their levels, and a kernel sees a pooled level as no level.
MAX_LEVELS = 256


class OneHotColumns(ResizableBuffers):
    """One-hot blocks of some input columns (a subclass fits the levels and writes :meth:`blocks`).

    Shared by :class:`CategoryColumns` and the value levels
    (:class:`~xrfm_torch.inputs.levels.ValueLevels`).

    Args:
        max_levels: Most indicator columns per column (>= 2).

    Buffers:
        ``columns_`` (k,) the columns' indices; ``widths_`` (k,) the number of indicators of each.
    """

    columns_: Tensor
    widths_: Tensor

    def __init__(self, max_levels: int = 16) -> None:
        super().__init__()
        self.max_levels = check_int(max_levels, "max_levels", 2)
        self.register_buffer("columns_", torch.zeros(0, dtype=torch.long))
        self.register_buffer("widths_", torch.zeros(0, dtype=torch.long))

    @property
    def width(self) -> int:
        """Indicator columns in all."""
        return int(self.widths_.sum())

    def forward(self, x: Tensor) -> Tensor:
        """The one-hot blocks of ``x`` (n, d): shape (n, :attr:`width`)."""
        return self.blocks(x, self.columns_.tolist(), self.widths_.tolist())

    def blocks(self, x: Tensor, columns: Sequence[int], widths: Sequence[int]) -> Tensor:
        """:meth:`forward` with the structure given as Python ints (``columns_``, ``widths_``).

        Straight-line tensor code for any number of rows, so that ``torch.export`` can trace it
        (reading the buffers with ``tolist`` would make the graph depend on their values).
        """
        raise NotImplementedError

    def owners(self) -> Tensor:
        """The input column of each indicator, shape (:attr:`width`,)."""
        return torch.repeat_interleave(self.columns_, self.widths_)


class CategoryColumns(OneHotColumns):
    """One-hot blocks of the categorical columns of a row (codes ``0 .. L-1``, NaN missing).

    Args:
        max_levels: Most indicator columns per categorical column (>= 2).

    Buffers:
        ``columns_`` (k,) the categorical columns' indices; ``slots_`` (k, L) the indicator each
        code lights, -1 for none (a code the training rows never had); ``widths_`` (k,) the number
        of indicators of each column.
    """

    slots_: Tensor

    def __init__(self, max_levels: int = MAX_LEVELS) -> None:
        super().__init__(max_levels)
        self.register_buffer("slots_", torch.zeros(0, 0, dtype=torch.long))

    @torch.no_grad()
    def fit(self, X: Tensor, columns: Sequence[int]) -> CategoryColumns:
        """Learn each column's levels from the training rows ``X`` (n, d)."""
        d = X.shape[1]
        cols = sorted({int(c) for c in columns})
        for c in cols:
            if not 0 <= c < d:
                raise ValueError(f"categorical column {c} is out of range for {d} columns")
        slots, widths = [], []
        for c in cols:
            codes = X[:, c][~torch.isnan(X[:, c])]
            if bool((codes != codes.round()).any() or (codes < -1).any()):
                bad = codes[(codes != codes.round()) | (codes < -1)][0].item()
                raise ValueError(
                    f"categorical column {c} must hold integer codes >= 0, -1 (a level unknown "
                    f"to the encoder) or NaN, got {bad!r}"
                )
            # -1: a level the table encoder never saw (an eval_set row pooled into the training
            # rows of cross-fitted bags); like a missing cell it lights no indicator
            codes = codes[codes >= 0]
            counts = torch.bincount(codes.long(), minlength=1)
            seen = counts.nonzero().flatten()
            # the most frequent levels first (ties: the lower code), then "other" for the rest
            order = seen[torch.argsort(-counts[seen], stable=True)]
            keep = order if len(order) <= self.max_levels else order[: self.max_levels - 1]
            slot = torch.full((counts.shape[0],), -1, dtype=torch.long)
            slot[seen] = len(keep)  # "other" (only used when some levels were pooled)
            slot[keep] = torch.arange(len(keep))
            slots.append(slot)
            widths.append(len(keep) + int(len(order) > len(keep)))
        width = max((len(s) for s in slots), default=0)
        table = torch.full((len(cols), width), -1, dtype=torch.long)
        for i, slot in enumerate(slots):
            table[i, : len(slot)] = slot
        device = X.device
        self.columns_ = torch.tensor(cols, dtype=torch.long, device=device)
        self.slots_ = table.to(device)
        self.widths_ = torch.tensor(widths, dtype=torch.long, device=device)
        return self

    def blocks(self, x: Tensor, columns: Sequence[int], widths: Sequence[int]) -> Tensor:
        """Code ``k`` of column ``i`` lights the indicator ``slots_[i, k]`` (none for -1)."""
        parts = []
        for i, (c, width) in enumerate(zip(columns, widths)):
            codes = x[:, c]
            known = ~torch.isnan(codes) & (codes >= 0) & (codes < self.slots_.shape[1])
            idx = torch.where(known, codes, torch.zeros_like(codes)).long()
            slot = torch.where(known, self.slots_[i, idx], torch.full_like(idx, -1))
            onehot = (slot[:, None] == torch.arange(width, device=x.device)).to(x.dtype)
            parts.append(onehot * ONE_HOT)
        return torch.cat(parts, 1) if parts else x.new_zeros(x.shape[0], 0)
