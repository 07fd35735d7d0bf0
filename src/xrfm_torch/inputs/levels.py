"""Value levels: a one-hot block of the frequent values of numeric columns whose values act as codes.

Some numeric columns are mostly one value (zero) and otherwise a few hundred amounts whose
outcome differs amount by amount: adult's capital-loss has 1887, 1902 and 1977 dollars at a
high income rate and 1590, 1602 and 1740 at a low one. A tree splits on such values exactly; a
kernel on the standardized number (or its normal score) sees neighbouring amounts as near and
smooths them together. Where the training rows show that the exact value carries the target
beyond a smooth function of it (:func:`level_gain`), the trees also see a one-hot block of the
column's most frequent values (:class:`ValueLevels`), beside the number, as the category columns
get theirs (:mod:`xrfm_torch.inputs.categories`, same indicator value and "other" slot).

Two kinds of column are tested. Zero-inflated ones (at least :data:`SPIKE_SHARE` of the observed
values at one value, and at least :data:`MIN_LEVELS` other values held by :data:`LEVEL_ROWS` rows
each) against value bins: on a continuous column with rich structure (a longitude) per-value
means also beat coarse bins, but its 15 most frequent values hold a few percent of the rows and
their block would say nothing. Columns of :data:`MIN_CODES` to :data:`MAX_CODES` values without a
spike (identifiers, subject or plot numbers, years) against their neighbouring values
(:func:`code_gain`); they keep a block of all their values (docs/design.md, value levels).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

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
#: A column without a spike is tested as codes when it has at least this many distinct values ...
MIN_CODES = 5
#: ... at most this many (its block then holds every value) ...
MAX_CODES = 255
#: ... and at least this many observed rows per value on average.
CODE_ROWS = 5
#: A code column's values explain at least this share of the target variance out of fold, and
#: its values' neighbours at most a quarter of that (:func:`code_gain`).
MIN_CODE_R2 = 0.1
#: Indicators of a zero-inflated column's block ("other" included); a code column's holds all.
SPIKE_WIDTH = 16


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


def _by_column_chunks(
    one: Callable[[Tensor, Tensor], Tensor],
) -> Callable[[Tensor, Tensor], Tensor]:
    """``one`` of the columns of ``X`` (n, k), run on chunks of columns when they are many.

    The wrapped function gets ``y`` as (n, c) float64 and at most ``GAIN_BLOCK // (FOLDS n c)``
    columns at a time (its per-column tables have FOLDS x n x c entries); the results, one
    leading entry per column, are concatenated.
    """

    @functools.wraps(one)
    def run(X: Tensor, y: Tensor) -> Tensor:
        n, k = X.shape
        y = y.reshape(n, -1).to(torch.float64)
        chunk = max(1, GAIN_BLOCK // (FOLDS * n * max(y.shape[1], 1)))
        if k > chunk:
            return torch.cat([one(X[:, i : i + chunk], y) for i in range(0, k, chunk)])
        return one(X, y)

    return run


def _folds(n: int, y: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The out-of-fold split of ``n`` rows: ``(folds, fold, w, mean)``.

    ``folds`` (FOLDS,) the fold numbers; ``fold`` (n,) each row's (row ``i`` in fold
    ``i mod FOLDS``); ``w`` (FOLDS, n) 0/1, fold ``j``'s training rows; ``mean`` (FOLDS, c) the
    mean of ``y`` (n, c) over each fold's training rows.
    """
    folds = torch.arange(FOLDS, device=y.device)
    fold = torch.arange(n, device=y.device) % FOLDS
    w = (fold != folds[:, None]).to(y.dtype)
    mean = (y * w[:, :, None]).sum(1) / w.sum(1, keepdim=True)
    return folds, fold, w, mean


@_by_column_chunks
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
    c = y.shape[1]
    x = X.to(torch.float64).T.contiguous()  # (k, n)
    inverse, counts, values = _value_index(x)
    spike = values.gather(1, counts.argmax(1, keepdim=True))  # (k, 1): the most frequent (smallest)
    folds, fold, w, mean = _folds(n, y)
    probs = torch.linspace(0, 1, BINS + 1, dtype=x.dtype, device=x.device)[1:-1]
    n_bins = BINS + 1
    xk = x[:, None, :]  # (k, 1, n)
    edges = _quantiles(xk, (w > 0) & (xk != spike[:, :, None]), probs)  # (k, FOLDS, BINS - 1)
    ranks = torch.searchsorted(edges, xk.expand(k, FOLDS, n).contiguous(), right=True)
    b = torch.where(xk == spike[:, :, None], 0, 1 + ranks)  # (k, FOLDS, n)

    count, total = _fold_sums((b + n_bins * folds[:, None]).reshape(k, -1), FOLDS * n_bins, w, y)
    v_at = (inverse[:, None, :] + n * folds[:, None]).reshape(k, -1)
    v_count, v_total = _fold_sums(v_at, FOLDS * n, w, y)
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


def _value_index(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per row of ``x`` (k, n): each entry's value index, each value's count and the values.

    Value ``j`` is the ``j``-th smallest distinct value of its row (a sort, not ``unique``,
    whose output size the host must read); ``counts`` and ``values`` are (k, n), zero past the
    row's last value.
    """
    s, order = x.sort(dim=1)
    changes = F.pad(s[:, 1:] != s[:, :-1], (1, 0))  # a new value starts (not at the first row)
    ids = changes.long().cumsum(1)  # (k, n): value index of each sorted row
    inverse = torch.empty_like(ids).scatter_(1, order, ids)  # (k, n): each row's value index
    counts = torch.zeros_like(s).scatter_add_(1, ids, torch.ones_like(s))  # (k, n): rows a value
    values = torch.zeros_like(s).scatter_(1, ids, s)  # (k, n): the values, ascending
    return inverse, counts, values


def _fold_sums(at: Tensor, width: int, w: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """Per column, the training rows' counts (k, width) and target sums (k, width, c) by entry.

    ``at`` (k, FOLDS * n): each (fold, row)'s entry; ``w`` (FOLDS, n): the folds' training rows
    (0/1); ``y`` (n, c). Counts by ``scatter_add_`` (exact: sums of 0/1), as a GPU's
    ``bincount`` reads its input's maximum.
    """
    k, c = at.shape[0], y.shape[1]
    wy = (y * w[:, :, None]).reshape(1, -1, c).expand(k, -1, c)
    count = w.new_zeros(k, width).scatter_add_(1, at, w.reshape(1, -1).expand(k, -1))
    total = y.new_zeros(k, width, c).scatter_add_(1, at[..., None].expand(-1, -1, c), wy)
    return count, total


@torch.no_grad()
def code_gain(x: Tensor, y: Tensor) -> float:
    r"""Share of the variance of ``y`` that per-value means explain beyond neighbouring values'.

    For a column without a spike (an identifier, a year, a panel or a subject number), the smooth
    alternative to its values' own means is the mean of the rows at the two adjacent values
    (the next smaller and the next larger value of the column): where the target moves smoothly
    with the value they agree, and where each value is a code of its own (neighbouring numbers
    are unrelated units) they do not. Out of fold as :func:`level_gain`: for each of
    :data:`FOLDS` folds the other folds' rows give each value's mean shrunk towards its
    neighbours' mean ``m_nb = (sum_nb + P m) / (n_nb + P)`` (itself shrunk to the fold's mean
    ``m``), ``(sum_v + P m_nb) / (n_v + P)`` (``P`` = :data:`PRIOR_ROWS`). With ``R2_v`` and
    ``R2_nb`` the two predictions' out-of-fold R^2, the gain is ``R2_v - R2_nb`` where the
    column acts as codes (``R2_v >= MIN_CODE_R2`` and ``R2_nb <= R2_v / 4``: the neighbours
    explain little of what the values do) and 0 elsewhere.

    Args:
        x: Observed values of one column, shape (n,) (no NaN).
        y: Targets, shape (n, c).

    Returns:
        The gain, a float (0 where ``y`` is constant).
    """
    return float(_code_gains(x[:, None], y)[0])


def _code_gains(X: Tensor, y: Tensor) -> Tensor:
    """:func:`code_gain` of each column of ``X`` (n, k) (no NaN), as one (k,) float64 tensor."""
    r2 = _code_fits(X, y)
    values, nb = r2.unbind(1)
    coded = (values >= MIN_CODE_R2) & (nb <= values / 4)
    return torch.where(coded, values - nb, 0.0)


@_by_column_chunks
def _code_fits(X: Tensor, y: Tensor) -> Tensor:
    """Out-of-fold R^2 of the values' and the neighbours' means per column of ``X``, (k, 2).

    Columns and folds side by side, as :func:`_gains`.
    """
    n, k = X.shape
    c = y.shape[1]
    inverse, _, _ = _value_index(X.to(torch.float64).T.contiguous())  # (k, n)
    folds, fold, w, mean = _folds(n, y)
    # one more slot at each end of a fold's block, always empty: the outer values' neighbours
    width = n + 2
    at_v = (inverse[:, None, :] + 1 + width * folds[:, None]).reshape(k, -1)
    count, total = _fold_sums(at_v, FOLDS * width, w, y)
    own = fold * width + 1 + inverse  # (k, n): each held-out row's value in its fold's block

    def at(i: Tensor) -> tuple[Tensor, Tensor]:
        return count.gather(1, i)[..., None], total.gather(1, i[..., None].expand(-1, -1, c))

    (n_lo, s_lo), (n_hi, s_hi), (n_v, s_v) = at(own - 1), at(own + 1), at(own)
    by_nb = (s_lo + s_hi + PRIOR_ROWS * mean[fold]) / (n_lo + n_hi + PRIOR_ROWS)
    by_value = (s_v + PRIOR_ROWS * by_nb) / (n_v + PRIOR_ROWS)
    sst = ((y - y.mean(0)) ** 2).sum()
    r2 = (
        1
        - torch.stack([((y - by_value) ** 2).sum((1, 2)), ((y - by_nb) ** 2).sum((1, 2))], 1) / sst
    )
    return torch.where(sst > 0, r2, 0.0)


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
def level_columns(X: Tensor, y: Tensor, columns: Sequence[int]) -> tuple[list[int], list[int]]:
    """The columns among ``columns`` of ``X`` (n, d) whose values act as codes for ``y`` (n, c).

    Two kinds, each tested on the rows where the column is observed: a zero-inflated column with
    repeated other values (module docstring) whose :func:`level_gain` is at least
    :data:`MIN_GAIN`, and a column without a spike of :data:`MIN_CODES` to :data:`MAX_CODES`
    values, :data:`CODE_ROWS` rows each on average (an identifier, a year, a subject number),
    whose :func:`code_gain` is at least :data:`MIN_GAIN`.

    Returns:
        ``(spiky, codes)``: the chosen columns of each kind, ascending.
    """
    cols = [int(c) for c in columns]
    if not cols:
        return [], []
    # the spike over all columns at once: a value held by half the observed rows sits at the
    # lower or the upper median (its run of sorted positions covers one of the two), so the
    # larger of their counts is at least half exactly when some value's is (an all-NaN column:
    # none); one sort of all columns counts their distinct values (the code candidates)
    Xc = X[:, cols]
    observed = (~torch.isnan(Xc)).sum(0)
    lower, upper = nanmedian(Xc, 0), -nanmedian(-Xc, 0)
    spike = torch.maximum((Xc == lower).sum(0), (Xc == upper).sum(0))
    distinct = _distinct(Xc)
    coded = (distinct >= MIN_CODES) & (distinct <= MAX_CODES) & (observed >= CODE_ROWS * distinct)
    spiky = spike >= SPIKE_SHARE * observed.clamp_min(1)
    flags = torch.stack([spiky, coded & ~spiky, torch.isnan(Xc).any(0)]).tolist()
    candidates = [(c, h) for c, ok, _, h in zip(cols, *flags) if ok]
    # their levels (other values of LEVEL_ROWS rows or more), all columns at once, read together
    levels = _levels(X[:, [c for c, _ in candidates]]).tolist() if candidates else []
    tested = [(c, h) for (c, h), n_levels in zip(candidates, levels) if n_levels >= MIN_LEVELS]
    codes = [(c, h) for c, _, ok, h in zip(cols, *flags) if ok]
    gains = _tested_gains(X, y, tested, _gains)
    gains.update(_tested_gains(X, y, codes, _code_gains))
    # the gains read back together: one host-device synchronization on a GPU
    order = [c for c, _ in tested + codes]
    kept = dict(zip(order, read_scalars(*(gains[c] for c in order))))
    return (
        [c for c, _ in tested if kept[c] >= MIN_GAIN],
        [c for c, _ in codes if kept[c] >= MIN_GAIN],
    )


def _tested_gains(
    X: Tensor, y: Tensor, tested: list[tuple[int, bool]], gains: Callable[[Tensor, Tensor], Tensor]
) -> dict[int, Tensor]:
    """``gains`` of each ``(column, has_missing)`` of ``tested`` on its observed rows."""
    complete = [c for c, has_nan in tested if not has_nan]
    out = dict(zip(complete, gains(X[:, complete], y).unbind())) if complete else {}
    for c, has_nan in tested:
        if has_nan:  # its observed rows only (a row selection: one column at a time)
            seen = ~torch.isnan(X[:, c])
            out[c] = gains(X[seen, c][:, None], y[seen])[0]
    return out


def _distinct(X: Tensor) -> Tensor:
    """Distinct observed values of each column of ``X`` (n, k), a (k,) long tensor (NaN: none)."""
    s = torch.where(torch.isnan(X), torch.inf, X).sort(dim=0).values
    starts = torch.cat([torch.isfinite(s[:1]), (s[1:] != s[:-1]) & torch.isfinite(s[1:])])
    return starts.sum(0)


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

    Each column gets one indicator per kept value (ties to the smaller value) and an "other"
    indicator for any other observed value; a missing cell lights none. A zero-inflated column
    keeps its ``SPIKE_WIDTH - 1`` most frequent values, a code column (``codes`` of :meth:`fit`)
    its ``max_levels - 1`` most frequent (all, within :data:`MAX_CODES`). Indicators are
    :data:`~xrfm_torch.inputs.categories.ONE_HOT`.

    Args:
        max_levels: Most indicator columns per column, "other" included (>= 2).

    Buffers:
        ``columns_`` (k,) the columns' indices; ``values_`` (k, w) the kept values (NaN padding;
        ``w`` at least ``SPIKE_WIDTH - 1``); ``widths_`` (k,) the indicators of each column (kept
        values + 1).
    """

    values_: Tensor

    def __init__(self, max_levels: int = MAX_CODES + 1) -> None:
        super().__init__(max_levels)
        self.register_buffer("values_", torch.zeros(0, self._narrow))

    @property
    def _narrow(self) -> int:
        return min(SPIKE_WIDTH, self.max_levels) - 1

    @torch.no_grad()
    def fit(self, X: Tensor, columns: Sequence[int], codes: Sequence[int] = ()) -> ValueLevels:
        """Keep the most frequent training values of ``X``'s (n, d) ``columns`` and ``codes``."""
        wide = {int(c) for c in codes}
        cols = sorted({int(c) for c in columns} | wide)
        kept, widths = [], []
        for c in cols:
            x = X[:, c][~torch.isnan(X[:, c])]
            values, counts = torch.unique(x, return_counts=True)  # ascending values
            keep = self.max_levels - 1 if c in wide else self._narrow
            order = torch.argsort(-counts, stable=True)[:keep]  # frequent first, ties: smaller
            kept.append(values[order])
            widths.append(int(order.numel()) + 1)
        width = max([self._narrow, *(w - 1 for w in widths)])
        table = torch.full((len(cols), width), torch.nan, dtype=X.dtype, device=X.device)
        for i, v in enumerate(kept):
            table[i, : v.numel()] = v
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
