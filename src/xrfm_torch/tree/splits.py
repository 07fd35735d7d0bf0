"""Split rules: how an internal node chooses its direction ``v`` (and, for CART, its threshold).

Each rule is a small strategy object called as ``rule(X, y, X_val, y_val, kernel=..., generator=...)``
and returning a :class:`Split`. A split without a threshold is cut at the median by
:func:`balanced_split` (left gets ``ceil(n/2)`` rows).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Literal, Protocol

import torch
from torch import Tensor

from xrfm_torch.kernels import Kernel
from xrfm_torch.leaf import LeafRFM
from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.numerics import deadline
from xrfm_torch.numerics.agop import top_eigenvector
from xrfm_torch.numerics.checks import check_fraction, check_positive
from xrfm_torch.numerics.deterministic import cumsum
from xrfm_torch.numerics.events import count

#: Where a split direction is cut: the rank-balanced median, or the least-squares point.
Threshold = Literal["median", "sse"]


@dataclass
class Split:
    """A node's split: go left iff ``x @ direction <= threshold``.

    Attributes:
        direction: Unit vector, shape (d,).
        threshold: Scalar threshold, or ``None`` for the rank-balanced median cut.
    """

    direction: Tensor
    threshold: float | None = None


class SplitRule(Protocol):
    """Protocol of split strategies."""

    def __call__(
        self,
        X: Tensor,
        y: Tensor,
        X_val: Tensor | None,
        y_val: Tensor | None,
        *,
        kernel: Kernel,
        generator: torch.Generator | None,
    ) -> Split:
        """Choose the split of the node holding ``X`` (n, d) and ``y`` (n, c).

        A rule that takes a keyword ``weights``, ``(training row weights (n,), validation row
        weights (n_val,) or None)``, is given it in a weighted fit (the package's rules do);
        a rule without it cannot serve a weighted fit (the tree says so).
        """
        ...


def _subsample(
    n: int, size: int, generator: torch.Generator | None, device: torch.device
) -> Tensor:
    if n <= size:
        return torch.arange(n, device=device)
    return torch.randperm(n, generator=generator)[:size].to(device)


#: A weighted median cut leaves each child at least this share of the rows (so extreme weights
#: cannot make the tree deep: leaf sizes, and the cost of a leaf, are counted in rows).
MIN_WEIGHTED_SIDE = 0.25


def balanced_split(proj: Tensor, weights: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """Rank-balanced median cut of projections (weighted median with ``weights``).

    Rows are ordered by ``(proj, row index)`` (a stable sort), so ties are broken deterministically
    and duplicate rows cannot recurse forever: the left child always gets exactly ``ceil(n/2)``.
    With ``weights`` (n,) the cut is the weighted median, the first position where the left
    side's weight reaches half the total, kept within ``[MIN_WEIGHTED_SIDE, 1 -
    MIN_WEIGHTED_SIDE]`` of the rows.

    Args:
        proj: Projections ``X @ v``, shape (n,), n >= 2.
        weights: Optional row weights (n,).

    Returns:
        ``(left_idx, right_idx, threshold)``; the threshold (0-dim, float64, on ``proj``'s
        device: not read back per node) is the midpoint of the two
        middle projections, so routing ``proj <= threshold`` reproduces the cut except at exact
        ties.
    """
    n = proj.shape[0]
    order = torch.sort(proj, stable=True).indices
    k = math.ceil(n / 2)
    if weights is not None and n > 1:
        cum = cumsum(weights[order].double(), 0)
        half = int(torch.searchsorted(cum, cum[-1] / 2)) + 1  # rows up to the weighted median
        low = max(1, math.ceil(MIN_WEIGHTED_SIDE * n))
        k = min(max(half, low), n - low) if n - low >= low else k
    left, right = order[:k], order[k:]
    if n > 1:  # float64: the same number as the two read back as Python floats and averaged
        middle = proj[order[k - 1 : k + 1]].double()  # (indexing by a 0-dim tensor would read)
        threshold = 0.5 * (middle[0] + middle[1])
    else:
        threshold = proj[0].double()
    return left, right, threshold


def sse_cut(
    X: Tensor, y: Tensor, min_child_fraction: float, weights: Tensor | None = None
) -> tuple[int, float] | None:
    """Best single column and threshold by summed squared error (the CART regression cost).

    With ``weights`` (n,), the weighted SSE ``sum_i w_i (y_i - mean_w)^2`` of each side (the
    admissible cuts still count rows).

    ``(j*, t*) = argmin_j argmin_t SSE(y | x_j <= t) + SSE(y | x_j > t)``, summed over outputs, with
    each side keeping at least ``min_child_fraction`` of the rows and cuts only between distinct
    values.

    Args:
        X: Candidate coordinates, shape (n, d) (features, or one projection as (n, 1)).
        y: Targets, shape (n, c).
        min_child_fraction: Smallest share of the rows either side may get, in (0, 0.5].
        weights: Optional row weights (n,).

    Returns:
        ``(j, threshold)`` with the threshold midway between the two values at the cut, or ``None``
        when no admissible cut exists.
    """
    n, d = X.shape
    xs, order = torch.sort(X, dim=0, stable=True)  # (n, d) per-column order
    ys = y[order]  # (n, d, c): targets in each column's order
    total: float | Tensor
    if weights is None:
        wy, k = ys, torch.arange(1, n, device=X.device, dtype=X.dtype)[:, None]  # left sizes
        total = float(n)
    else:
        ws = weights.to(X.dtype)[order]  # (n, d)
        wy = ys * ws[..., None]
        cw = cumsum(ws, 0)
        k, total = cw[:-1], cw[-1]  # left weights (n-1, d), total weight (d,)
    csum = cumsum(wy, 0)  # (n, d, c)
    csq = cumsum(wy * ys, 0).sum(-1)  # (n, d)
    tot, tot_sq = csum[-1], csq[-1]  # (d, c), (d,)
    left_s, left_q = csum[:-1], csq[:-1]
    sse_left = left_q - (left_s * left_s).sum(-1) / k
    right_s = tot - left_s
    sse_right = (tot_sq - left_q) - (right_s * right_s).sum(-1) / (total - k)
    cost = sse_left + sse_right  # (n-1, d): cut after sorted position i
    lo = max(1, math.ceil(min_child_fraction * n))
    valid = torch.zeros(n - 1, d, dtype=torch.bool, device=X.device)
    valid[lo - 1 : n - lo] = True
    valid &= xs[1:] > xs[:-1]  # only cut between distinct values
    if not bool(valid.any()):
        return None
    cost = cost.masked_fill(~valid, float("inf"))
    i, j = divmod(int(cost.argmin()), d)
    return j, 0.5 * float(xs[i, j] + xs[i + 1, j])


@dataclass
class AGOPSplit:
    """Top eigenvector of the AGOP of a small LeafRFM fitted on a row subsample (the xRFM default).

    Where the split model falls back to its training mean (the node's targets show no signal its
    validation rows confirm) the AGOP is 0 and gives no direction: the node is cut along its
    inputs' principal direction (:class:`PCASplit`) instead.

    Args:
        n_iters: ``tau`` of the split model (AGOP updates; the fits at ``t = 0..tau`` compete on
            the node's validation rows).
        sample_size: Rows ``N`` of the random subset the split model is fitted on.
        reg: Ridge of the split model.
        diag: Learn a diagonal ``M`` in the split model (its final AGOP is always full).
        threshold: ``"median"`` (rank-balanced cut) or ``"sse"``: the cut of the projections
            ``X v`` (all the node's rows) with the lowest summed squared error, each side keeping at
            least ``min_child_fraction`` of the rows.
        min_child_fraction: See ``threshold="sse"``.
    """

    n_iters: int = 1
    sample_size: int = 4000
    reg: float = 1e-3
    diag: bool = False
    threshold: Threshold = "median"
    min_child_fraction: float = 0.25

    def __post_init__(self) -> None:
        if self.n_iters < 0:
            raise ValueError(f"n_iters must be >= 0, got {self.n_iters}")
        if self.sample_size < 4:
            raise ValueError(f"sample_size must be >= 4, got {self.sample_size}")
        check_positive(self.reg, "reg", allow_zero=True)
        if self.threshold not in ("median", "sse"):
            raise ValueError(f"threshold must be 'median' or 'sse', got {self.threshold!r}")
        check_fraction(self.min_child_fraction, "min_child_fraction", high=0.5)

    def __call__(
        self,
        X: Tensor,
        y: Tensor,
        X_val: Tensor | None,
        y_val: Tensor | None,
        *,
        kernel: Kernel,
        generator: torch.Generator | None,
        weights: tuple[Tensor | None, Tensor | None] = (None, None),
    ) -> Split:
        if deadline.should_stop():  # out of time: the direction of the inputs alone, no solve
            count("splits by principal component at the time limit")
            return PCASplit()(X, y, X_val, y_val, kernel=kernel, generator=None, weights=weights)
        w, w_val = weights
        idx = _subsample(X.shape[0], self.sample_size, generator, X.device)
        if X_val is not None and y_val is not None and X_val.shape[0] >= 2:
            vidx = _subsample(X_val.shape[0], max(2, self.sample_size // 4), generator, X.device)
            X_val, y_val = X_val[vidx], y_val[vidx]
            w_val = None if w_val is None else w_val[vidx]
        else:
            X_val = y_val = w_val = None
        config = LeafConfig.plain(n_iters=self.n_iters, reg=self.reg, diag=self.diag)
        model = LeafRFM(kernel, config)
        model.fit(
            X[idx],
            y[idx],
            X_val,
            y_val,
            sample_weight=None if w is None else w[idx],
            val_sample_weight=w_val,
            generator=generator,
        )
        if model.is_constant:
            # its training mean predicted the node's validation rows better: the AGOP is 0 and
            # its "top eigenvector" an arbitrary axis (the last column, from eigh); with no
            # supervised direction to follow, the inputs' own principal direction
            count("splits by principal component (the split model predicts its mean)")
            v = PCASplit()(
                X, y, None, None, kernel=kernel, generator=None, weights=weights
            ).direction
        else:
            v = top_eigenvector(model.agop(diag=False))  # at the (weighted) model's support rows
        if self.threshold == "median":
            return Split(v)
        cut = sse_cut((X @ v.to(X.dtype))[:, None], y, self.min_child_fraction, w)
        return Split(v, None if cut is None else cut[1])


def with_sample_at_most(rule: SplitRule, rows: int) -> SplitRule:
    """``rule`` with its split models fitted on at most ``rows`` rows.

    An ``AGOPSplit``'s ``sample_size`` is capped; a rule without a sample, or with a smaller
    one, is returned as it is.
    """
    if isinstance(rule, AGOPSplit) and rule.sample_size > rows:
        return replace(rule, sample_size=rows)
    return rule


@dataclass
class PCASplit:
    """Top principal component of the node's (centred) inputs: an unsupervised baseline."""

    def __call__(
        self,
        X: Tensor,
        y: Tensor,
        X_val: Tensor | None,
        y_val: Tensor | None,
        *,
        kernel: Kernel,
        generator: torch.Generator | None,
        weights: tuple[Tensor | None, Tensor | None] = (None, None),
    ) -> Split:
        w = weights[0]
        if w is None:
            Xc = X - X.mean(0)
            return Split(top_eigenvector(Xc.mT @ Xc))
        w = (w / w.sum()).to(X.dtype)[:, None]  # weighted mean and covariance
        Xc = X - (w * X).sum(0)
        return Split(top_eigenvector(Xc.mT @ (w * Xc)))


@dataclass
class RandomSplit:
    """A uniformly random unit direction."""

    def __call__(
        self,
        X: Tensor,
        y: Tensor,
        X_val: Tensor | None,
        y_val: Tensor | None,
        *,
        kernel: Kernel,
        generator: torch.Generator | None,
        weights: tuple[Tensor | None, Tensor | None] = (None, None),
    ) -> Split:
        v = torch.randn(X.shape[1], generator=generator, dtype=X.dtype).to(X.device)
        return Split(v / v.norm())  # (weights: the tree's weighted median places the cut)


@dataclass
class CARTSplit:
    """Best single feature and threshold by summed squared error (CART regression cost).

    ``(j*, t*) = argmin_j argmin_t SSE(y | x_j <= t) + SSE(y | x_j > t)``, with ``SSE`` summed over
    outputs. Thresholds are restricted so each child keeps at least ``min_child_fraction`` of the rows,
    which bounds the depth the way the median cut does (CART's "too few examples" stopping heuristic).

    Args:
        min_child_fraction: Smallest share of the rows either child may get, in (0, 0.5].
    """

    min_child_fraction: float = 0.25

    def __post_init__(self) -> None:
        check_fraction(self.min_child_fraction, "min_child_fraction", high=0.5)

    def __call__(
        self,
        X: Tensor,
        y: Tensor,
        X_val: Tensor | None,
        y_val: Tensor | None,
        *,
        kernel: Kernel,
        generator: torch.Generator | None,
        weights: tuple[Tensor | None, Tensor | None] = (None, None),
    ) -> Split:
        cut = sse_cut(X, y, self.min_child_fraction, weights[0])
        d = X.shape[1]
        if cut is None:
            return Split(torch.eye(d, dtype=X.dtype, device=X.device)[0])  # caller falls back
        j, threshold = cut
        v = torch.zeros(d, dtype=X.dtype, device=X.device)
        v[j] = 1.0
        return Split(v, threshold)
