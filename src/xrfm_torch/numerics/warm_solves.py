"""Solves that continue from an earlier Cholesky factor instead of factoring afresh.

:func:`pcg_krr`: conjugate gradients preconditioned by the factor of a nearby system (the next
RFM iteration, a neighbouring ridge); :func:`solve_bordered`: the factor of a leaf's iteration
rows extended to all its rows (the final solve of a subsampled leaf). Both fall back to, or
build on, :mod:`xrfm_torch.numerics.solvers`.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import Tensor

from xrfm_torch.numerics.checks import all_finite

log = logging.getLogger(__name__)


def pcg_krr(
    K: Tensor,
    y: Tensor,
    reg: float,
    factor: Tensor,
    *,
    features: Tensor | None = None,
    tol: float = 1e-4,
    max_iters: int = 30,
    accept: float = 1e-2,
    weights: Tensor | None = None,
) -> Tensor | None:
    """Solve ``(K + U U^T + reg W^{-1}) alpha = y`` by CG preconditioned with ``factor``.

    ``W = diag(weights)`` as in :func:`solve_krr` (default ``I``).

    ``factor`` is the lower Cholesky factor ``L`` that :func:`solve_krr` left in its workspace for
    a *nearby* system ``P = L L^T`` (padded to ``m >= n`` with an identity block), e.g. the
    previous RFM iteration's kernel matrix. Once ``M`` settles, ``P^{-1} A`` is close to the
    identity and a few iterations of O(n^2) each (one product with ``K``, two triangular solves)
    replace an O(n^3 / 3) factorization. Each column of ``y`` is its own CG run, started at
    ``P^{-1} y``.

    CG runs until its (recursively updated) residual is below ``tol ||y||`` per column; the
    solution is then accepted if the residual computed directly, ``||y - A alpha|| / ||y||``, is
    at most ``accept``. The two differ: a float32 product with ``K`` cannot resolve residuals
    below a data-dependent floor where the recursive estimate keeps falling. Factored float32
    solves of 9000-row leaves measure 2e-4 (synthetic task) to 1-3e-3 (houses, one grid entry
    1.4e-2) directly, and CG solutions at ``tol = 1e-4`` measure the same, so ``accept`` only
    catches a recursion that drifted away from the truth. The run gives up (``None``) when it
    cannot reach ``tol`` within ``max_iters`` iterations: after three iterations the observed
    mean rate of decrease is extrapolated, so a poor preconditioner costs a few iterations, not
    ``max_iters``. The caller then factors afresh.

    Args:
        K: Symmetric PSD kernel matrix, shape (n, n).
        y: Targets, shape (n, c).
        reg: Ridge ``lambda >= 0``.
        factor: (m, m) with the lower factor in its lower triangle (``m >= n``), dtype of ``K``.
        features: Optional low-rank part ``U``, shape (n, r).
        tol: Relative residual at which CG stops (its recursive estimate, each column).
        accept: Largest directly computed relative residual of an accepted solution.
        max_iters: Most CG iterations.
        weights: Optional positive row weights (n,) (the ridge of row ``i`` is ``reg / w_i``).

    Returns:
        ``alpha`` with the shape and dtype of ``y``, or ``None``.
    """
    n, m = K.shape[0], factor.shape[0]
    if factor.dtype != K.dtype or m < n or y.ndim != 2:
        return None
    U = None if features is None else features.to(K.dtype)
    b = y.to(K.dtype)
    pad = b.new_zeros(m - n, b.shape[1])

    inv_w = None if weights is None else (1.0 / weights.double()).to(K.dtype)[:, None]

    def apply_a(v: Tensor) -> Tensor:
        # K v + reg W^{-1} v
        out = (
            torch.addmm(v, K, v, beta=reg) if inv_w is None else torch.addmm(reg * inv_w * v, K, v)
        )
        return out if U is None else out.addmm_(U, U.mT @ v)

    def apply_p_inv(r: Tensor) -> Tensor:
        z = torch.linalg.solve_triangular(factor, torch.cat([r, pad]), upper=False)
        return torch.linalg.solve_triangular(factor.mT, z, upper=True)[:n]

    b_norm = b.norm(dim=0).clamp_min(torch.finfo(b.dtype).tiny)  # (c,)
    x = apply_p_inv(b)
    r = b - apply_a(x)
    start = (r.norm(dim=0) / b_norm).max().item()
    if start <= tol:  # the preconditioner alone solved it (r is the direct residual here)
        return x.to(y.dtype)
    if not start < float("inf"):
        return None
    z = apply_p_inv(r)
    p = z.clone()
    rz = (r * z).sum(0)
    for i in range(1, max_iters + 1):
        ap = apply_a(p)
        pap = (p * ap).sum(0)
        step = torch.where(pap > 0, rz / pap, 0.0)  # 0 for a column already solved exactly
        x.addcmul_(step, p)
        r.addcmul_(step, ap, value=-1.0)
        rel = (r.norm(dim=0) / b_norm).max().item()
        if not rel < float("inf"):  # NaN or inf: the preconditioner does not fit
            return None
        if rel <= tol:
            true = ((b - apply_a(x)).norm(dim=0) / b_norm).max().item()
            return x.to(y.dtype) if true <= accept else None
        # geometric extrapolation of the observed rate: stop early when the budget cannot suffice
        if i >= 3 and (
            rel >= start or i * math.log(tol / start) / math.log(rel / start) > max_iters
        ):
            return None
        z = apply_p_inv(r)
        rz_new = (r * z).sum(0)
        p = z + torch.where(rz > 0, rz_new / rz, 0.0) * p
        rz = rz_new
    return None


def solve_bordered(
    factor: Tensor,
    K_ss: Tensor,
    K_sb: Tensor,
    K_bb: Tensor,
    y: Tensor,
    reg: float,
    *,
    features: Tensor | None = None,
    factor_out: Tensor | None = None,
    weights: Tensor | None = None,
) -> Tensor | None:
    """Solve the KRR system of rows ``S`` plus ``b`` new rows ``B`` from the factor of ``S``'s.

    With ``A_SS = L L^T`` already factored (``factor``: the (m, m) workspace that
    :func:`solve_krr` left, ``m >= n_S``), the system
    ``[[A_SS, A_SB], [A_BS, A_BB]] alpha = y`` (``A = K + U U^T + reg I`` over ``S`` then ``B``)
    is solved by block elimination: ``W = L^{-1} A_SB``, the Schur complement
    ``A_BB - W^T W = L_B L_B^T`` and two block triangular solves. That is the factorization of
    the bordered matrix continued, not an approximation, and costs ``O(n_S^2 b)`` instead of the
    ``O((n_S + b)^3 / 3)`` of factoring it afresh.

    Args:
        factor: (m, m), the lower factor of ``A_SS`` in its leading (n_S, n_S) block.
        K_ss: Kernel values among ``S``, shape (n_S, n_S) (for the residual check only).
        K_sb: Kernel values between ``S`` and ``B``, shape (n_S, b).
        K_bb: Kernel values among ``B``, shape (b, b).
        y: Targets of ``S`` then ``B``, shape (n_S + b, c).
        reg: The ridge ``A_SS`` was factored with.
        features: Optional low-rank part ``U`` of ``S`` then ``B``, shape (n_S + b, r).
        factor_out: Optional (n_S + b, n_S + b) buffer that receives the lower factor of the
            whole bordered matrix, ``[[L, 0], [W^T, L_B]]`` (valid only when ``alpha`` is returned).
        weights: Optional positive row weights of ``S`` then ``B`` (n_S + b,): the ridge of row
            ``i`` is ``reg / w_i`` (:func:`solve_krr`), ``A_SS`` factored so.

    Returns:
        ``alpha`` (n_S + b, c) in the dtype of ``y``, or ``None`` when the factor is marked
        unusable, the Schur complement is not numerically positive definite or the solution
        fails :func:`solve_krr`'s residual bound ``||(K + U U^T) alpha - y|| <= ||y||`` (then
        factor afresh).
    """
    n, b = K_sb.shape
    if factor.dtype != K_sb.dtype or factor.shape[0] < n or not bool(factor[0, 0].isfinite()):
        return None
    L = factor[:n, :n]
    U = None if features is None else features.to(K_sb.dtype)
    eye = torch.eye(b, dtype=K_bb.dtype, device=K_bb.device)
    if weights is None:
        A_sb, A_bb = K_sb, K_bb + reg * eye
    else:
        A_sb, A_bb = K_sb, K_bb + torch.diag(reg / weights[n:].to(K_bb.dtype))
    if U is not None:
        A_sb = A_sb + U[:n] @ U[n:].mT
        A_bb = A_bb + U[n:] @ U[n:].mT
    W = torch.linalg.solve_triangular(L, A_sb, upper=False)  # (n, b)
    L_b, info = torch.linalg.cholesky_ex(A_bb - W.mT @ W)
    if int(info) != 0:
        return None
    rhs = y.to(K_sb.dtype)
    z_s = torch.linalg.solve_triangular(L, rhs[:n], upper=False)
    z_b = torch.linalg.solve_triangular(L_b, rhs[n:] - W.mT @ z_s, upper=False)
    alpha_b = torch.linalg.solve_triangular(L_b.mT, z_b, upper=True)
    alpha_s = torch.linalg.solve_triangular(L.mT, z_s - W @ alpha_b, upper=True)
    alpha = torch.cat([alpha_s, alpha_b])
    if not bool(all_finite(alpha)):
        return None
    # residual of the whole system, block by block: (K + U U^T) alpha - y
    r = torch.cat([K_ss @ alpha_s + K_sb @ alpha_b, K_sb.mT @ alpha_s + K_bb @ alpha_b])
    if U is not None:
        r = r + U @ (U.mT @ alpha)
    wd = 1.0 if weights is None else weights.double()[:, None]
    res = float((wd * (r.double() - rhs.double()) ** 2).sum())
    if not res <= float((wd * rhs.double() ** 2).sum()):
        return None
    if factor_out is not None:
        factor_out[:n, :n].copy_(L)  # cholesky_ex zeroes the upper triangle
        factor_out[:n, n:].zero_()
        factor_out[n:, :n].copy_(W.mT)
        factor_out[n:, n:].copy_(L_b)
    return alpha.to(y.dtype)
