"""Several leaves' RFM steps as one batched step: the same operations for ``B`` leaves as for one.

On a GPU an RFM step costs the host about 20 us per dispatched operation, and a step's ~110
operations are as many for a leaf of 500 rows as for one of 5000; a tree's median splits give its
leaves (nearly) equal row counts. So the steps that ``B`` leaves ask for together
(:class:`~xrfm_torch.leaf.lockstep.Lockstep`) run here as one step on (B, N, N) batches, padded to
the largest leaf ``N``, with one read back for all of them.

Padding leaves each leaf's system intact: a padded training row has kernel row and column 0, a 1
on the diagonal, target 0 and no linear features, so its coefficient is 0 and the other rows'
solution is that of the leaf alone; padded validation rows weigh 0 in the loss and padded
training rows 0 in the AGOP. The result is :func:`~xrfm_torch.leaf.step.rfm_step`'s up to
float rounding (batched kernels sum in other orders).

What is batched: kernels of the ``p = 2`` family with the base class's formulas (Laplace,
Gaussian), factored afresh (no warm solve), without autograd. Everything else, and a leaf whose
first solve needs the retries or whose ``sqrt(M)`` is not finite, is solved one by one with
:func:`~xrfm_torch.leaf.step.rfm_step`.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor

from xrfm_torch.kernels import Kernel
from xrfm_torch.kernels.bandwidth import median_pairwise_distance
from xrfm_torch.kernels.distance import transform
from xrfm_torch.leaf.batch_ops import (
    BatchRows,
    LeafRows,
    distances,
    kernel_params,
    shared_key,
    solve_and_score,
)
from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.leaf.selection import Candidate
from xrfm_torch.leaf.step import failed_candidate, rfm_step
from xrfm_torch.numerics.agop import RootedAgop, batched_roots, usable_agop

#: What one step gives: the candidate, its AGOP (or ``None``), whether the leaf's workspace now
#: holds the step's factor (never after a batched step).
StepResult = tuple[Candidate, Tensor | RootedAgop | None, bool]


@dataclass
class StepRequest:
    """The arguments of one :func:`~xrfm_torch.leaf.step.rfm_step` call."""

    kernel: Kernel
    X: Tensor
    y: Tensor
    X_val: Tensor
    y_val: Tensor
    sqrt_m: Tensor | None
    buffers: tuple[Tensor, Tensor, Tensor]
    cfg: LeafConfig
    agop: bool
    diag: bool
    generator: torch.Generator | None
    warm: tuple[float, int] | None
    weights: tuple[Tensor | None, Tensor | None]

    @classmethod
    def of_call(cls, *args: Any, **kwargs: Any) -> StepRequest:
        """The request of ``rfm_step(*args, **kwargs)``."""
        bound = inspect.signature(rfm_step).bind(*args, **kwargs)
        bound.apply_defaults()
        return cls(**bound.arguments)

    def run(self) -> StepResult:
        """The step on its own (:func:`rfm_step`)."""
        return rfm_step(
            self.kernel,
            self.X,
            self.y,
            self.X_val,
            self.y_val,
            self.sqrt_m,
            self.buffers,
            self.cfg,
            agop=self.agop,
            diag=self.diag,
            generator=self.generator,
            warm=self.warm,
            weights=self.weights,
        )


def batch_key(r: StepRequest) -> Hashable | None:
    """Requests with equal keys can run as one batched step; ``None``: this one runs alone.

    :func:`~xrfm_torch.leaf.batch_ops.shared_key` and the ridge; no warm solve. Not in the key:
    ``sqrt(M)``'s layout and the AGOP's (a batch of mixed layouts runs full).
    """
    methods = ("distance", "from_distance", "grad_weights", "transformed_grads")
    tensors = [r.X, r.y, r.X_val, r.y_val] + ([] if r.sqrt_m is None else [r.sqrt_m])
    shared = shared_key(r.kernel, r.cfg, r, methods, tensors)
    return None if shared is None or r.warm is not None else (*shared, r.cfg.reg)


def batch_bytes(requests: Sequence[LeafRows]) -> int:
    """About the device memory a batched step or solve takes: six (B, N, N) temporaries."""
    n = max(r.X.shape[0] for r in requests)
    return 6 * len(requests) * n * n * requests[0].X.element_size()


def batched_rfm_step(requests: Sequence[StepRequest], rows: BatchRows) -> list[StepResult]:
    """:func:`~xrfm_torch.leaf.step.rfm_step` for each request, as one batched step.

    Args:
        requests: Steps with equal :func:`batch_key`, in batch order.
        rows: Their :func:`batch_rows`.

    Returns:
        Per request, what ``rfm_step`` returns (the workspace never holds the batch's factor).
    """
    r0 = requests[0]
    cfg, kernel = r0.cfg, r0.kernel
    B = rows.X.shape[0]
    for r in requests:  # each leaf's bandwidth from its own subsample and generator
        if cfg.adaptive_bandwidth is not None:
            med = median_pairwise_distance(transform(r.X, r.sqrt_m), 2.0, generator=r.generator)
            if med > 1e-14:
                r.kernel.bandwidth.fill_(cfg.adaptive_bandwidth * med)
    S = _stacked_roots(requests, rows.dims)
    usable = None if S is None else (S - S == 0).flatten(1).all(1)
    q, bandwidth = kernel_params([r.kernel for r in requests], rows.X)
    if S is None:
        xs, xv = rows.X, rows.Xv
    elif S.ndim == 2:
        xs, xv = rows.X * S[:, None, :], rows.Xv * S[:, None, :]
    else:
        xs, xv = rows.X @ S, rows.Xv @ S
    R, Rv = distances(xs, xv, rows)
    K, alpha, v, unsure, err, per_row = solve_and_score(
        R, Rv, xs, xv, q, bandwidth, cfg.reg, rows, cfg
    )
    G = None
    if any(r.agop for r in requests):  # diagonal where every leaf wants its diagonal
        diag = (S is None or S.ndim == 2) and all(r.diag for r in requests)
        bw = bandwidth[:, None, None]
        G = _agop(R, K, xs, alpha, v, S, rows, kernel, q, bw, cfg.linear_mix, diag)
    none = err.new_zeros(B)
    values = torch.cat(  # float64 (err): cat promotes the others exactly, no conversion of each
        [
            err,
            bandwidth,
            none + 1 if usable is None else usable,
            none if G is None else G.flatten(1).amax(1),
            unsure,
        ]
    ).tolist()  # one read back for the batch
    per_leaf = [values[i::B] for i in range(B)]  # (error, bandwidth, finite M, top, retry)
    # alone, a leaf makes its own root for the one layout it continues in (fewer operations)
    roots = None
    if G is not None and B > 1:
        wanted = [  # the AGOPs that usable_agop will pass (finite, positive)
            r.agop and math.isfinite(e) and math.isfinite(top) and top > 0
            for r, (e, _, _, top, _) in zip(requests, per_leaf)
        ]
        roots = _next_roots(G, requests, wanted, cfg)
    results: list[StepResult] = []
    for i, (r, (e, bandwidth_i, finite_m, top, retry)) in enumerate(zip(requests, per_leaf)):
        if not finite_m:
            results.append(
                (failed_candidate(r.X, r.y, r.X_val, r.sqrt_m, r.kernel, cfg.reg), None, False)
            )
            continue
        if retry:  # the first attempt failed or was useless: the leaf's own step and its retries
            results.append(r.run())
            continue
        rows_i = per_row[i, : rows.m[i]]
        cand = Candidate(
            e, -1, alpha[i, : rows.n[i]], r.sqrt_m, bandwidth_i, r.kernel.q, cfg.reg, rows_i
        )
        if G is None or not r.agop or not math.isfinite(e):
            results.append((cand, None, False))
        else:
            k = rows.dims[i]  # (a narrower leaf's padded columns have no gradient)
            Gi = (
                G[i, :k, :k].diagonal()
                if r.diag and G.ndim == 3
                else G[i, :k, :k]
                if G.ndim == 3
                else G[i, :k]
            )
            G_i: Tensor | RootedAgop | None = usable_agop(Gi, top, rows.n[i])
            if G_i is not None and roots is not None:  # the next step's roots, made here
                made = {
                    layout: m[i, :k] if m.ndim == 2 else m[i, :k, :k] for layout, m in roots.items()
                }
                G_i = RootedAgop(Gi, made if Gi.ndim == 2 else {True: made[True]})
            results.append((cand, G_i, False))
    return results


def _next_roots(
    G: Tensor, requests: Sequence[StepRequest], wanted: list[bool], cfg: LeafConfig
) -> dict[bool, Tensor]:
    """The next steps' roots of the batch's AGOPs (:func:`~xrfm_torch.numerics.agop.batched_roots`).

    A leaf whose AGOP is not ``wanted`` (not usable: not finite, not positive) gets the zero
    matrix in the batch instead (its step ends the leaf's iterations): one leaf's NaN cannot
    fail the batch's ``eigh``.
    """
    if not all(wanted):
        keep = torch.tensor(wanted, device=G.device).reshape(-1, *([1] * (G.ndim - 1)))
        G = torch.where(keep, G, 0.0)
    full = G.ndim == 3 and any(r.agop and not r.diag for r in requests)
    return batched_roots(G, cfg.eps, cfg.agop_ridge, full)


def _stacked_roots(requests: Sequence[StepRequest], dims: Sequence[int]) -> Tensor | None:
    """The leaves' ``sqrt(M)`` as one batch: ``None``, (B, d) or (B, d, d).

    ``None`` where all are the identity, (B, d) where all are diagonal; otherwise a diagonal root
    becomes its diagonal matrix and the identity the identity (``x @ diag(s)`` is ``x * s``
    exactly: the other terms are zeros). A narrower leaf's root is padded with zeros.
    """
    roots = [r.sqrt_m for r in requests]
    if all(s is None for s in roots):
        return None
    D = max(dims)
    if all(s is not None and s.ndim == 1 for s in roots):
        vectors = cast(list[Tensor], roots)
        return torch.stack([F.pad(s, (0, D - s.shape[0])) for s in vectors])
    X = requests[0].X

    def full(s: Tensor | None, k: int) -> Tensor:
        m = torch.eye(k, dtype=X.dtype, device=X.device) if s is None else s
        m = torch.diag(m) if m.ndim == 1 else m
        return m if k == D else F.pad(m, (0, D - k, 0, D - k))

    return torch.stack([full(s, k) for s, k in zip(roots, dims)])


def _agop(
    R: Tensor,
    K: Tensor,
    xs: Tensor,
    alpha: Tensor,
    v: Tensor | None,
    S: Tensor | None,
    rows: BatchRows,
    kernel: Kernel,
    q: float | Tensor,
    bw: Tensor,
    lm: float,
    diag: bool,
) -> Tensor:
    """Each leaf's AGOP of its fitted predictor at its training rows, self-terms excluded.

    As :meth:`~xrfm_torch.kernels.Kernel.transformed_grads` (``p = 2``) with the linear part's
    gradient, :func:`~xrfm_torch.kernels.chain_rule` and
    :func:`~xrfm_torch.numerics.agop.agop_from_grads`: (B, d, d), or (B, d) if ``diag``.
    """
    B, N, d = xs.shape
    c = alpha.shape[2]
    p = kernel.p
    scale = -q / bw.pow(q)
    w = K * scale if isinstance(q, float) and q == p else R.pow(q - p).mul_(K).mul_(scale)
    w = w.masked_fill_(kernel.eps > R, 0.0)
    if rows.keep is not None:  # padded pairs (0 * inf where padded rows coincide)
        w = w.masked_fill_(~rows.keep, 0.0)
    w.diagonal(dim1=1, dim2=2).zero_()  # the self-terms
    wa = w @ alpha  # (B, N, c)
    waz = (w @ (alpha[..., None] * xs[:, :, None, :]).reshape(B, N, c * d)).reshape(B, N, c, d)
    g = xs[:, :, None, :] * wa[..., None] - waz  # (B, N, c, d) w.r.t. S x
    if v is not None:
        g = g + (math.sqrt(lm) * rows.scale * v[:, 1:].mT)[:, None]
    if S is not None:
        g = g * S[:, None, None, :] if S.ndim == 2 else g @ S.mT[:, None]
    g = (g * rows.row.sqrt()[:, :, None, None]).reshape(B, N * c, d)
    return (g * g).sum(1) if diag else g.mT @ g
