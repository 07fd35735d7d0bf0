"""The batched numerics of leaves in lockstep: padded rows, distances, kernels, solves, losses.

:mod:`xrfm_torch.leaf.batched_step` (the RFM steps) and :mod:`xrfm_torch.leaf.batched_search`
(the post-hoc search's candidates) run ``B`` leaves' work as one on (B, N, N) batches, padded to
the largest leaf ``N``. Padding leaves each leaf's system intact: a padded training row has
kernel row and column 0, a 1 on the diagonal, target 0 and no linear features, so its
coefficient is 0 and the other rows' solution is that of the leaf alone; padded validation rows
weigh 0 in the loss; narrower leaves' inputs get zero columns (the linear part keeps each leaf's
own ``1 / sqrt(d)``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from xrfm_torch.kernels import Kernel
from xrfm_torch.kernels.distance import needs_graph
from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.leaf.criteria import class_probabilities, row_logloss


class LeafRows(Protocol):
    """What :func:`batch_rows` reads of a request: its rows, targets and weights."""

    X: Tensor
    y: Tensor
    X_val: Tensor
    y_val: Tensor
    weights: tuple[Tensor | None, Tensor | None]


@dataclass
class BatchRows:
    """A batch's rows, padded: built once per set of leaves (the rows do not change by step)."""

    X: Tensor  # (B, N, D), D the widest leaf's input width
    y: Tensor  # (B, N, c)
    Xv: Tensor  # (B, Mv, d)
    yv: Tensor  # (B, Mv, c)
    n: list[int]
    m: list[int]
    dims: list[int]  # each leaf's input width
    scale: Tensor | float  # 1 / sqrt(width) of the linear features: (B, 1, 1), or one float
    keep: Tensor | None  # (B, N, N) bool: real pairs (None: no padding)
    pad: Tensor | None  # (B, N) float: 1 on padded rows
    row: Tensor  # (B, N) float: the AGOP's row weights (sum 1 per leaf, 0 on padding)
    inv_w: Tensor | None  # (B, N): 1 / training weight (None: unweighted)
    res_w: Tensor | None  # (B, N, 1) float64: the residual norm's weights (None: 1)
    bb: Tensor  # (B,) float64: ||y||_w^2, the residual bound
    val: Tensor | None  # (B, Mv): relative validation weights or the real rows (None: all real)
    count: Tensor  # (B,) float64: validation rows per leaf
    cache: dict[str, Tensor] = field(default_factory=dict)  # made once per set of leaves


def shared_key(
    kernel: Kernel,
    cfg: LeafConfig,
    request: LeafRows,
    methods: Sequence[str],
    tensors: Sequence[Tensor],
) -> tuple[object, ...] | None:
    """What leaves' solves must share to run as one batch; ``None``: this one runs alone.

    A ``p = 2`` kernel whose ``methods`` are the base class's formulas, no autograd, and the same
    distance cut-off, device, dtype, outputs, linear weight, solve dtype, criterion and weighting.
    Not in it (one per leaf in a batch): the rows, input width, ``sqrt(M)``, exponent, bandwidth.
    """
    standard = all(getattr(type(kernel), m) is getattr(Kernel, m) for m in methods)
    if kernel.p != 2.0 or not standard or needs_graph(*tensors):
        return None
    return (
        kernel.eps,
        request.X.device,
        request.X.dtype,
        request.y.shape[1],
        cfg.linear_mix,
        cfg.solve_dtype,
        cfg.criterion,
        request.weights[0] is None,
        request.weights[1] is None,
    )


def padded(parts: Sequence[Tensor], rows: int, cols: int | None = None) -> Tensor:
    """``parts`` (each (n_b, k_b)) stacked into (B, rows, cols), zeros after each.

    ``cols`` ``None``: all parts have the same number of columns.
    """
    return torch.stack(
        [
            p
            if p.shape[0] == rows and (cols is None or p.shape[1] == cols)
            else F.pad(p, (0, 0 if cols is None else cols - p.shape[1], 0, rows - p.shape[0]))
            for p in parts
        ]
    )


def batch_rows(requests: Sequence[LeafRows]) -> BatchRows:
    """The padded rows, masks and weights of a batch (see :class:`_Rows`)."""
    X0 = requests[0].X
    n = [r.X.shape[0] for r in requests]
    m = [r.X_val.shape[0] for r in requests]
    N, Mv = max(n), max(m)
    lengths = torch.tensor(n, device=X0.device)
    real = torch.arange(N, device=X0.device)[None, :] < lengths[:, None]  # (B, N)
    short = min(n) < N  # some leaf's rows are padded
    keep = (real[:, :, None] & real[:, None, :]) if short else None
    pad = (~real).to(X0.dtype) if short else None
    weighted = requests[0].weights[0] is not None
    if weighted:
        w = padded([r.weights[0][:, None] for r in requests], N)[..., 0]  # type: ignore[index]
        row = w / w.sum(1, keepdim=True)
        inv_w = torch.where(real, 1.0 / w.double().clamp_min(1e-300), 1.0).to(X0.dtype)
        res_w = w.double()[..., None]
    else:
        row = real.to(X0.dtype) / lengths[:, None].to(X0.dtype)
        inv_w, res_w = None, None
    y = padded([r.y for r in requests], N)
    y64 = y.double() ** 2
    bb = (y64 if res_w is None else res_w * y64).sum((1, 2))
    val_real = (
        torch.arange(Mv, device=X0.device)[None, :] < torch.tensor(m, device=X0.device)[:, None]
    )
    if requests[0].weights[1] is not None:
        wv = padded([r.weights[1][:, None] for r in requests], Mv)[..., 0]  # type: ignore[index]
        mean = wv.sum(1, keepdim=True) / torch.tensor(m, device=X0.device)[:, None].to(wv)
        val: Tensor | None = wv / mean
    else:
        val = val_real.to(X0.dtype) if min(m) < Mv else None
    dims = [r.X.shape[1] for r in requests]
    D = max(dims)
    scale = (
        1.0 / math.sqrt(D)
        if min(dims) == D
        else torch.tensor([1.0 / math.sqrt(k) for k in dims], dtype=X0.dtype, device=X0.device)[
            :, None, None
        ]
    )
    return BatchRows(
        X=padded([r.X for r in requests], N, D),
        y=y,
        Xv=padded([r.X_val for r in requests], Mv, D),
        yv=padded([r.y_val for r in requests], Mv),
        n=n,
        m=m,
        dims=dims,
        scale=scale,
        keep=keep,
        pad=pad,
        row=row,
        inv_w=inv_w,
        res_w=res_w,
        bb=bb,
        val=val,
        count=torch.tensor(m, dtype=torch.float64, device=X0.device),
    )


def distance(x: Tensor, z: Tensor, centre: Tensor) -> Tensor:
    """``||x_i - z_j||`` per batch (B, n, m), on inputs centred at ``centre`` (B, 1, d).

    As :func:`~xrfm_torch.kernels.distance.pairwise_distance` makes it (tiny squares snap to 0).
    """
    c = 16 * torch.finfo(x.dtype).eps
    same = x is z
    x = x - centre
    z = x if same else z - centre
    xx = (x * x).sum(-1, keepdim=True)  # (B, n, 1)
    s = xx + (xx.mT if same else (z * z).sum(-1)[:, None, :])  # |x|^2 + |z|^2
    o = torch.baddbmm(s, x, z.mT, alpha=-2.0)
    return o.masked_fill_(o <= c * s, 0.0).sqrt_()


def kernel_values(R: Tensor, bw: Tensor, q: float | Tensor) -> Tensor:
    """``exp(-(R / L)^q)`` with one bandwidth per batch, ``bw`` (B, 1, 1).

    ``q``: one exponent, or one per batch (B, 1, 1).
    """
    s = R / bw
    if isinstance(q, Tensor) or q != 1.0:
        s = s.pow_(q)
    return s.neg_().exp_()


def batch_losses(
    pred: Tensor, target: Tensor, rows: BatchRows, criterion: str
) -> tuple[Tensor, Tensor]:
    """Per-leaf validation errors (B,) float64 and per-row losses (B, Mv).

    As :func:`~xrfm_torch.leaf.criteria.validation_loss` gives them leaf by leaf.
    """
    B, Mv, c = pred.shape
    if criterion == "mse":
        per_row = ((pred - target) ** 2).sum(2)
    else:
        true = target.argmax(2)
        if criterion == "logloss":
            probs = class_probabilities(pred.reshape(B * Mv, c))
            per_row = row_logloss(probs, true.reshape(-1)).reshape(B, Mv)
        else:  # "error" (the key holds one criterion per batch)
            per_row = (pred.argmax(2) != true).to(pred.dtype)
    if rows.val is not None:
        per_row = per_row * rows.val
    err = per_row.sum(1).double() / rows.count
    return (err / c if criterion == "mse" else err), per_row


def masked_kernel(R: Tensor, bw: Tensor, q: float | Tensor, rows: BatchRows) -> Tensor:
    """:func:`kernel_values` of the training pairs, padded rows made identity rows and columns."""
    K = kernel_values(R, bw, q)
    if rows.keep is not None and rows.pad is not None:
        K = K.masked_fill_(~rows.keep, 0.0)
        K.diagonal(dim1=1, dim2=2).add_(rows.pad)
    return K


def linear_features(x: Tensor, rows: BatchRows, lm: float) -> Tensor | None:
    """The constant + linear part's features ``sqrt(c) [1, x / sqrt(d)]``, (B, n, D + 1).

    Padded training rows zeroed (``rows.pad``, where ``x`` has N rows); ``None`` where ``lm`` is 0.
    """
    if lm <= 0:
        return None
    U = F.pad(x * rows.scale, (1, 0), value=1.0) * math.sqrt(lm)
    if rows.pad is not None and x.shape[1] == rows.pad.shape[1]:
        U = U * (1.0 - rows.pad)[..., None]
    return U


def solve_batch(
    K: Tensor,
    U: Tensor | None,
    rows: BatchRows,
    reg: float | Tensor,
    solve_dtype: torch.dtype | None,
) -> tuple[Tensor, Tensor]:
    """``alpha = (K + U U^T + reg W^{-1})^{-1} y`` per leaf, one batched Cholesky, and its flags.

    The flags of :func:`~xrfm_torch.numerics.solvers.first_krr_solve`: a failed factorization
    or, below float64, a residual ``||(K + U U^T) alpha - y||_w`` above ``||y||_w``.

    ``reg``: one ridge, or one per leaf (B,). Returns ``alpha`` (B, N, c) in ``y``'s dtype and the
    flags (B,) bool, on the device.
    """
    dtype = solve_dtype or K.dtype
    Kd = K.to(dtype)
    A = Kd.clone() if U is None else torch.baddbmm(Kd, U.to(dtype), U.to(dtype).mT)
    lam = reg if isinstance(reg, float) else reg.to(dtype)[:, None]
    ridge = A.diagonal(dim1=1, dim2=2)
    if rows.inv_w is None:
        ridge.add_(lam)
    else:
        ridge.add_(rows.inv_w.to(dtype) * lam)
    L, info = torch.linalg.cholesky_ex(A)
    z = torch.linalg.solve_triangular(L, rows.y.to(dtype), upper=False)
    alpha_s = torch.linalg.solve_triangular(L.mT, z, upper=True)
    unsure = info != 0
    if dtype != torch.float64:
        a = alpha_s.to(K.dtype)
        ka = K @ a if U is None else torch.baddbmm(K @ a, U, U.mT @ a)
        r64 = ka.double() - rows.y.double()
        r2 = r64 * r64 if rows.res_w is None else rows.res_w * r64 * r64
        unsure = unsure | ~(r2.sum((1, 2)) <= rows.bb)  # also true for NaN
    return alpha_s.to(rows.y.dtype), unsure


def predict_batch(
    Rv: Tensor,
    bw: Tensor,
    q: float | Tensor,
    alpha: Tensor,
    xv: Tensor,
    v: Tensor | None,
    rows: BatchRows,
    lm: float,
) -> Tensor:
    """Validation predictions (B, Mv, c) from their distances to the training rows ``Rv``.

    With the linear part's weights ``v = U^T alpha`` (B, D + 1, c) where it is on.
    """
    pred = kernel_values(Rv, bw, q) @ alpha
    Uv = linear_features(xv, rows, lm)
    return pred if Uv is None or v is None else torch.baddbmm(pred, Uv, v)
