"""Value levels: a one-hot block of the frequent values of numeric columns whose values act as codes.

Some numeric columns are mostly one value (zero) and otherwise a few hundred amounts whose
outcome differs amount by amount: adult's capital-loss has 1887, 1902 and 1977 dollars at a
high income rate and 1590, 1602 and 1740 at a low one. A tree splits on such values exactly; a
kernel on the standardized number (or its normal score) sees neighbouring amounts as near and
smooths them together. Where the training rows show that the exact value carries the target
beyond a smooth function of it (:func:`level_gain`), the trees also see a one-hot block of the
column's most frequent values (:class:`ValueLevels`), beside the number, as the category columns
get theirs (:mod:`xrfm_torch.inputs.categories`, same indicator value and "other" slot).

Only zero-inflated columns are tested (at least :data:`SPIKE_SHARE` of the observed values at one
value, and at least :data:`MIN_LEVELS` other values held by :data:`LEVEL_ROWS` rows each): on a
continuous column with rich structure (a longitude) per-value means also beat coarse bins, but
its 15 most frequent values hold a few percent of the rows and their block would say nothing
(docs/design.md, value levels).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from xrfm_torch.inputs.categories import ONE_HOT, OneHotColumns
from xrfm_torch.numerics.deterministic import nanmedian

#: A column is tested when at least this share of its observed training values is one value ...
SPIKE_SHARE = 0.5
#: ... and at least this many other values ...
MIN_LEVELS = 20
#: ... have at least this many rows each.
LEVEL_ROWS = 10
#: The block is added when per-value means explain at least this share of the target variance
#: beyond :data:`BINS` value bins, out of fold (:func:`level_gain`). On the 21 dev tables'
#: tested columns (seed 0) adult's capital-gain and capital-loss scored 0.020 and 0.015 and
#: every other (pol, cpu_act, house_sales) at most 0.004.
MIN_GAIN = 0.01
#: Equal-frequency bins of the values other than the spike: the smooth alternative.
BINS = 16
#: Rows of prior weight pulling a value's mean towards its bin's (few rows: the bin decides).
PRIOR_ROWS = 10.0
#: Folds of the out-of-fold comparison (row ``i`` is in fold ``i mod FOLDS``).
FOLDS = 5


@torch.no_grad()
def level_gain(x: Tensor, y: Tensor) -> float:
    r"""Share of the variance of ``y`` that per-value means explain beyond value bins, out of fold.

    With ``s`` the most frequent value of ``x``, a row's bin is ``s`` itself or one of
    :data:`BINS` equal-frequency bins of the other values (edges from the training folds). For
    each of :data:`FOLDS` folds, the rows of the other folds give each bin's mean ``b`` and each
    value's shrunk mean ``(sum_v + P b) / (n_v + P)`` (``P`` = :data:`PRIOR_ROWS`); the held-out
    rows are predicted by both. The gain is ``(SSE_bins - SSE_values) / SST`` summed over the
    target columns, ``SST`` about the overall mean: 0 where the exact value adds nothing to its
    neighbourhood, negative where per-value means only add noise.

    Args:
        x: Observed values of one column, shape (n,) (no NaN).
        y: Targets, shape (n, c) (classification: class codes; regression: standardized).

    Returns:
        The gain, a float (0 where ``y`` is constant).
    """
    n = x.shape[0]
    y = y.reshape(n, -1).to(torch.float64)
    x = x.to(torch.float64)
    values, inverse, counts = torch.unique(x, return_inverse=True, return_counts=True)
    spike = values[counts.argmax()]
    fold = torch.arange(n, device=x.device) % FOLDS
    by_bin, by_value = torch.empty_like(y), torch.empty_like(y)
    probs = torch.linspace(0, 1, BINS + 1, dtype=x.dtype, device=x.device)[1:-1]
    for j in range(FOLDS):
        train, held = fold != j, fold == j
        rest = x[train & (x != spike)]
        edges = _quantiles(rest, probs).unique() if rest.numel() else x.new_zeros(0)
        b = torch.where(x == spike, 0, 1 + torch.searchsorted(edges, x.contiguous(), right=True))
        n_bins = int(edges.numel()) + 2
        mean = y[train].mean(0)
        count = torch.bincount(b[train], minlength=n_bins).to(y.dtype)[:, None]
        total = y.new_zeros(n_bins, y.shape[1]).index_add_(0, b[train], y[train])
        smooth = torch.where(count > 0, total / count.clamp_min(1), mean)[b]  # (n, c)
        v_count = torch.bincount(inverse[train], minlength=values.numel()).to(y.dtype)
        v_total = y.new_zeros(values.numel(), y.shape[1]).index_add_(0, inverse[train], y[train])
        shrunk = (v_total[inverse] + PRIOR_ROWS * smooth) / (v_count[inverse] + PRIOR_ROWS)[:, None]
        by_bin[held], by_value[held] = smooth[held], shrunk[held]
    sst = float(((y - y.mean(0)) ** 2).sum())
    if sst <= 0:
        return 0.0
    return (float(((y - by_bin) ** 2).sum()) - float(((y - by_value) ** 2).sum())) / sst


def _quantiles(v: Tensor, probs: Tensor) -> Tensor:
    """Quantiles of ``v`` (m,) at ``probs``, interpolated linearly (as numpy and ``torch.quantile``).

    By a sort, since ``torch.quantile`` refuses inputs of more than 2**24 elements.
    """
    s = v.sort().values
    pos = probs * (s.numel() - 1)
    lo = pos.floor().long()
    hi = pos.ceil().long()
    return s[lo] + (s[hi] - s[lo]) * (pos - lo.to(pos.dtype))


@torch.no_grad()
def level_columns(X: Tensor, y: Tensor, columns: Sequence[int]) -> list[int]:
    """The columns among ``columns`` of ``X`` (n, d) whose values act as codes for ``y`` (n, c).

    A column qualifies when it is zero-inflated with repeated other values (module docstring)
    and its :func:`level_gain` on the rows where it is observed is at least :data:`MIN_GAIN`.
    """
    cols = [int(c) for c in columns]
    if not cols:
        return []
    # the spike over all columns at once: a value held by half the observed rows sits at the
    # lower or the upper median (its run of sorted positions covers one of the two), so the
    # larger of their counts is at least half exactly when some value's is (an all-NaN column:
    # none), and only those columns are sorted
    Xc = X[:, cols]
    observed = (~torch.isnan(Xc)).sum(0).clamp_min(1)
    lower, upper = nanmedian(Xc, 0), -nanmedian(-Xc, 0)
    spike = torch.maximum((Xc == lower).sum(0), (Xc == upper).sum(0))
    out = []
    for c in (c for c, ok in zip(cols, (spike >= SPIKE_SHARE * observed).tolist()) if ok):
        col = X[:, c]
        seen = ~torch.isnan(col)
        x = col[seen]
        counts = torch.unique(x, return_counts=True)[1].sort(descending=True).values
        if int((counts[1:] >= LEVEL_ROWS).sum()) < MIN_LEVELS:  # counts[0]: the spike
            continue
        gain = level_gain(x, y[seen])
        if gain >= MIN_GAIN:
            out.append(int(c))
    return out


class ValueLevels(OneHotColumns):
    """One-hot blocks of the most frequent values of chosen numeric columns.

    Each column gets one indicator per kept value (its ``max_levels - 1`` most frequent training
    values, ties to the smaller value) and an "other" indicator for any other observed value; a
    missing cell lights none. Indicators are :data:`~xrfm_torch.inputs.categories.ONE_HOT`.

    Args:
        max_levels: Indicator columns per column, "other" included (>= 2).

    Buffers:
        ``columns_`` (k,) the columns' indices; ``values_`` (k, max_levels - 1) the kept values
        (NaN padding); ``widths_`` (k,) the indicators of each column (kept values + 1).
    """

    values_: Tensor

    def __init__(self, max_levels: int = 16) -> None:
        super().__init__(max_levels)
        self.register_buffer("values_", torch.zeros(0, self.max_levels - 1))

    @torch.no_grad()
    def fit(self, X: Tensor, columns: Sequence[int]) -> ValueLevels:
        """Keep the most frequent training values of ``X``'s (n, d) ``columns``."""
        cols = sorted({int(c) for c in columns})
        keep = self.max_levels - 1
        table = torch.full((len(cols), keep), torch.nan, dtype=X.dtype, device=X.device)
        widths = []
        for i, c in enumerate(cols):
            x = X[:, c][~torch.isnan(X[:, c])]
            values, counts = torch.unique(x, return_counts=True)  # ascending values
            order = torch.argsort(-counts, stable=True)[:keep]  # frequent first, ties: smaller
            table[i, : order.numel()] = values[order]
            widths.append(int(order.numel()) + 1)
        self.columns_ = torch.tensor(cols, dtype=torch.long, device=X.device)
        self.values_ = table
        self.widths_ = torch.tensor(widths, dtype=torch.long, device=X.device)
        return self

    def blocks(self, x: Tensor, columns: Sequence[int], widths: Sequence[int]) -> Tensor:
        """A kept value lights its indicator, any other observed value "other", NaN none."""
        parts = []
        for i, (c, width) in enumerate(zip(columns, widths)):
            v = x[:, c : c + 1]
            hit = v == self.values_[i, : width - 1].to(x.dtype)  # (n, kept); NaN hits nothing
            other = ~hit.any(1, keepdim=True) & ~torch.isnan(v)
            parts.append(torch.cat([hit, other], 1).to(x.dtype) * ONE_HOT)
        return torch.cat(parts, 1) if parts else x.new_zeros(x.shape[0], 0)
