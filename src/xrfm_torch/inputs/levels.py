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
import torch.nn.functional as F
from torch import Tensor

from xrfm_torch.inputs.categories import ONE_HOT, OneHotColumns
from xrfm_torch.numerics.deterministic import nanmedian
from xrfm_torch.numerics.host import read_scalars

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
    return float(_gains(x[:, None], y)[0])


#: Entries of one batch of :func:`_gains`' per-column tables (columns x folds x rows x outputs):
#: the columns go in chunks of at most this many (2**25 float64 entries: 256 MiB per table).
GAIN_BLOCK = 2**25


def _gains(X: Tensor, y: Tensor) -> Tensor:
    """:func:`level_gain` of each column of ``X`` (n, k) (no NaN), as one (k,) float64 tensor.

    Written with masks instead of row selections, so that it runs without reading anything back
    to the host: each fold's bin edges are interpolated quantiles of the masked, sorted values
    (left duplicated where the values repeat: a duplicate edge only adds an empty bin, and a row
    in no training row's bin is predicted by the fold's mean either way). The folds run side by
    side, (FOLDS, n) at a time, and so do the columns (chunked by :data:`GAIN_BLOCK`): their
    sums go to one table of FOLDS blocks per column (a row's entry in its own fold's block
    predicts it), so a table's tested columns cost a few dozen operations together, not each
    (each is a launch on a GPU). A column's distinct values come from a sort instead of
    ``unique`` (whose output size the host must read): a row's value index is the number of
    value changes before it in sorted order, and the tables are as wide as the rows (a column
    has at most that many values). Counts by ``scatter_add_`` (exact: sums of 0/1), as a GPU's
    ``bincount`` reads its input's maximum.
    """
    n, k = X.shape
    y = y.reshape(n, -1).to(torch.float64)
    chunk = max(1, GAIN_BLOCK // (FOLDS * n * max(y.shape[1], 1)))
    if k > chunk:
        return torch.cat([_gains(X[:, i : i + chunk], y) for i in range(0, k, chunk)])
    c = y.shape[1]
    x = X.to(torch.float64).T.contiguous()  # (k, n)
    s, order = x.sort(dim=1)
    changes = F.pad(s[:, 1:] != s[:, :-1], (1, 0))  # a new value starts (not at the first row)
    ids = changes.long().cumsum(1)  # (k, n): value index of each sorted row
    inverse = torch.empty_like(ids).scatter_(1, order, ids)  # (k, n): each row's value index
    counts = torch.zeros_like(s).scatter_add_(1, ids, torch.ones_like(s))  # (k, n): rows a value
    values = torch.zeros_like(s).scatter_(1, ids, s)  # (k, n): the values, ascending
    spike = values.gather(1, counts.argmax(1, keepdim=True))  # (k, 1): the most frequent (smallest)
    folds = torch.arange(FOLDS, device=x.device)
    fold = torch.arange(n, device=x.device) % FOLDS
    w = (fold != folds[:, None]).to(y.dtype)  # (FOLDS, n): fold j's training rows
    probs = torch.linspace(0, 1, BINS + 1, dtype=x.dtype, device=x.device)[1:-1]
    n_bins = BINS + 1
    xk = x[:, None, :]  # (k, 1, n)
    edges = _quantiles(xk, (w > 0) & (xk != spike[:, :, None]), probs)  # (k, FOLDS, BINS - 1)
    ranks = torch.searchsorted(edges, xk.expand(k, FOLDS, n).contiguous(), right=True)
    b = torch.where(xk == spike[:, :, None], 0, 1 + ranks)  # (k, FOLDS, n)
    mean = (y * w[:, :, None]).sum(1) / w.sum(1, keepdim=True)  # (FOLDS, c)
    wy = (y * w[:, :, None]).reshape(1, -1, c).expand(k, -1, c)  # (k, FOLDS * n, c)
    w_flat = w.reshape(1, -1).expand(k, -1)

    def sums(at: Tensor, width: int) -> tuple[Tensor, Tensor]:
        """Per column, the training rows' counts (k, w) and target sums (k, w, c) by entry."""
        count = w.new_zeros(k, width).scatter_add_(1, at, w_flat)
        total = y.new_zeros(k, width, c).scatter_add_(1, at[..., None].expand(-1, -1, c), wy)
        return count, total

    count, total = sums((b + n_bins * folds[:, None]).reshape(k, -1), FOLDS * n_bins)
    v_count, v_total = sums((inverse[:, None, :] + n * folds[:, None]).reshape(k, -1), FOLDS * n)
    # each row held out by its own fold: that fold's entries
    own = fold * n_bins + b.gather(1, fold.expand(k, 1, n))[:, 0]  # (k, n)
    own_c = own[..., None].expand(-1, -1, c)
    bin_count = count.gather(1, own)[..., None]
    by_bin = torch.where(
        bin_count > 0, total.gather(1, own_c) / bin_count.clamp_min(1), mean[fold]
    )  # (k, n, c)
    own_v = fold * n + inverse
    by_value = (v_total.gather(1, own_v[..., None].expand(-1, -1, c)) + PRIOR_ROWS * by_bin) / (
        v_count.gather(1, own_v) + PRIOR_ROWS
    )[..., None]
    sst = ((y - y.mean(0)) ** 2).sum()
    gain = (((y - by_bin) ** 2).sum((1, 2)) - ((y - by_value) ** 2).sum((1, 2))) / sst
    return torch.where(sst > 0, gain, 0.0)


def _quantiles(v: Tensor, keep: Tensor, probs: Tensor) -> Tensor:
    """Quantiles at ``probs`` (q,) of the entries of ``v`` (n,) where ``keep`` (k, n), per row of ``keep``.

    Leading dimensions broadcast: ``v`` (..., 1, n) and ``keep`` (..., k, n) give (..., k, q).
    Linearly interpolated, as numpy and ``torch.quantile`` do; shape (k, q), all ``+inf`` in a
    row that keeps nothing. By a sort (``torch.quantile`` refuses inputs of more than 2**24
    elements) in which the entries not kept come last as ``+inf``, so the positions read are the
    kept entries' (no row selection).
    """
    s = torch.where(keep, v, torch.inf).sort(dim=-1).values
    last = (keep.sum(-1, keepdim=True) - 1).clamp_min(0).to(probs.dtype)
    pos = probs * last  # (k, q)
    lo = pos.floor().long()
    hi = pos.ceil().long()
    s_lo, s_hi = s.gather(-1, lo), s.gather(-1, hi)
    between = s_lo + (s_hi - s_lo) * (pos - lo.to(pos.dtype))
    return torch.where(hi > lo, between, s_lo)  # inf - inf is NaN: nothing kept gives +inf


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
    spiky, holes = torch.stack([spike >= SPIKE_SHARE * observed, torch.isnan(Xc).any(0)]).tolist()
    candidates = [(c, h) for c, ok, h in zip(cols, spiky, holes) if ok]
    # their levels (other values of LEVEL_ROWS rows or more), all columns at once, read together
    levels = _levels(X[:, [c for c, _ in candidates]]).tolist() if candidates else []
    tested = [(c, h) for (c, h), n_levels in zip(candidates, levels) if n_levels >= MIN_LEVELS]
    complete = [c for c, has_nan in tested if not has_nan]
    gains = dict(zip(complete, _gains(X[:, complete], y).unbind())) if complete else {}
    for c, has_nan in tested:
        if has_nan:  # its observed rows only (a row selection: one column at a time)
            seen = ~torch.isnan(X[:, c])
            gains[c] = _gains(X[seen, c][:, None], y[seen])[0]
    # the gains read back together: one host-device synchronization on a GPU
    kept = read_scalars(*(gains[c] for c, _ in tested))
    return [c for (c, _), g in zip(tested, kept) if g >= MIN_GAIN]


def _levels(X: Tensor) -> Tensor:
    """Per column of ``X`` (n, k), its values besides the most frequent one with LEVEL_ROWS rows.

    A (k,) long tensor (the columns chunked by :data:`GAIN_BLOCK`), computed without a read
    back: each row's value count is its run's length in the sorted column (two binary
    searches), a run is counted at its first row, and NaN (missing) sorts last as ``+inf`` and
    is left out. Observed values are finite.
    """
    n, k = X.shape
    chunk = max(1, GAIN_BLOCK // max(n, 1))
    if k > chunk:
        return torch.cat([_levels(X[:, i : i + chunk]) for i in range(0, k, chunk)])
    s = torch.where(torch.isnan(X), torch.inf, X).T.contiguous().sort(dim=1).values  # (k, n)
    left = torch.searchsorted(s, s)
    count = torch.searchsorted(s, s, right=True) - left
    observed = torch.isfinite(s)
    first = observed & (left == torch.arange(n, device=s.device))
    frequent = (first & (count >= LEVEL_ROWS)).sum(1)
    top = torch.where(observed, count, 0).amax(1)  # the most frequent value's rows
    return frequent - (top >= LEVEL_ROWS).long()


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
