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
from typing import NamedTuple, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from xrfm_torch.kernels import Kernel
from xrfm_torch.kernels.distance import batched_distance, needs_graph
from xrfm_torch.kernels.linear import batched_features
from xrfm_torch.kernels.lpq import kernel_values
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
    """The padded rows, masks and weights of a batch (see :class:`BatchRows`)."""
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
    count = torch.tensor(m, dtype=torch.float64, device=X0.device)
    val: Tensor | None = None
    if requests[0].weights[1] is not None:
        wv = padded([r.weights[1][:, None] for r in requests], Mv)[..., 0]  # type: ignore[index]
        val = wv / (wv.sum(1, keepdim=True) / count[:, None].to(wv))
    elif min(m) < Mv:  # the real validation rows
        val = (torch.arange(Mv, device=X0.device)[None, :] < count[:, None]).to(X0.dtype)
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
        count=count,
    )


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
    """Kernel values of the training pairs, padded rows made identity rows and columns."""
    K = kernel_values(R, bw, q)
    if rows.keep is not None and rows.pad is not None:
        K = K.masked_fill_(~rows.keep, 0.0)
        K.diagonal(dim1=1, dim2=2).add_(rows.pad)
    return K


def linear_features(x: Tensor, rows: BatchRows, lm: float, *, training: bool) -> Tensor | None:
    """The batch's constant + linear features (:func:`~xrfm_torch.kernels.linear.batched_features`).

    ``training``: ``x`` are the training rows, whose padded rows get no features (``rows.pad``).
    """
    return batched_features(x, rows.scale, lm, rows.pad if training else None)


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
    lam = reg.to(dtype)[:, None] if isinstance(reg, Tensor) else float(reg)
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


def kernel_params(kernels: Sequence[Kernel], like: Tensor) -> tuple[float | Tensor, Tensor]:
    """The batch's kernel exponent and bandwidths (B,) in ``like``'s dtype.

    The exponent is one float, or (B, 1, 1) where they differ (a blend's Laplace and Gaussian
    leaves).
    """
    qs = [k.q for k in kernels]
    q = qs[0] if len(set(qs)) == 1 else like.new_tensor(qs)[:, None, None]
    return q, torch.stack([k.bandwidth for k in kernels]).to(like)


def distances(xs: Tensor, xv: Tensor, rows: BatchRows) -> tuple[Tensor, Tensor]:
    """Training pairs' (B, N, N) and validation-to-training (B, Mv, N) distances.

    Centred at each leaf's training mean (its real rows; padded rows are zero).
    """
    n = torch.tensor(rows.n, device=xs.device)[:, None, None].to(xs)
    centre = xs.sum(1, keepdim=True) / n
    return batched_distance(xs, xs, centre), batched_distance(xv, xs, centre)


class Scored(NamedTuple):
    """A batched solve's kernel values, coefficients, linear weights, flags and losses."""

    K: Tensor  # (B, N, N), padded rows identity
    alpha: Tensor  # (B, N, c)
    v: Tensor | None  # (B, D + 1, c): U^T alpha, the linear part's weights
    unsure: Tensor  # (B,) bool: the first attempt failed its check
    err: Tensor  # (B,) float64: validation errors
    per_row: Tensor  # (B, Mv): per-row validation losses


def solve_and_score(
    R: Tensor,
    Rv: Tensor,
    xs: Tensor,
    xv: Tensor,
    q: float | Tensor,
    bandwidth: Tensor,
    reg: float | Tensor,
    rows: BatchRows,
    cfg: LeafConfig,
) -> Scored:
    """Each leaf's kernel ridge regression in its M-space and its validation error.

    What a step and a search candidate share: ``xs``, ``xv`` are the leaves' rows in their
    M-spaces and ``R``, ``Rv`` their distances (:func:`distances`).

    ``bandwidth`` (B,); ``reg`` one ridge or one per leaf (B,).
    """
    bw = bandwidth[:, None, None]
    K = masked_kernel(R, bw, q, rows)
    U = linear_features(xs, rows, cfg.linear_mix, training=True)
    alpha, unsure = solve_batch(K, U, rows, reg, cfg.solve_dtype)
    v = None if U is None else U.mT @ alpha
    pred = kernel_values(Rv, bw, q) @ alpha
    Uv = linear_features(xv, rows, cfg.linear_mix, training=False)
    if Uv is not None and v is not None:
        pred = torch.baddbmm(pred, Uv, v)
    err, per_row = batch_losses(pred, rows.yv, rows, cfg.criterion)
    return Scored(K, alpha, v, unsure, err, per_row)
