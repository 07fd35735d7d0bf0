"""Kernel ridge regression solves: Cholesky with jitter retries, and the Nystrom solve.

Solves that continue from an earlier factor (CG, bordered) are in
:mod:`xrfm_torch.numerics.warm_solves`.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

import torch
from torch import Tensor

from xrfm_torch.numerics.checks import check_positive
from xrfm_torch.numerics.events import count
from xrfm_torch.numerics.host import read_scalars

log = logging.getLogger(__name__)


class KRRSolveError(RuntimeError):
    """Raised when ``K + reg I`` stays numerically indefinite after every jitter retry."""


#: The factorization runs on a matrix padded to a multiple of this size: MKL's float32 Cholesky
#: is markedly slower when a row is not a whole number of 32-byte vectors (docs/design.md).
PAD_TO = 8


def padded_size(n: int) -> int:
    """``n`` rounded up to a multiple of :data:`PAD_TO`."""
    return -(-n // PAD_TO) * PAD_TO


def krr_workspace(
    n: int, dtype: torch.dtype | None = None, device: torch.device | str | None = None
) -> Tensor:
    """A reusable factorization buffer for :func:`solve_krr` of an (n, n) system.

    Column-major (LAPACK's layout, so the factorization runs in place without a transposed copy)
    and padded to :func:`padded_size` ``(n)``.
    """
    m = padded_size(n)
    return torch.empty(m, m, dtype=dtype, device=device).mT


def _residual_too_large(
    K: Tensor, alpha: Tensor, b: Tensor, U: Tensor | None = None, w: Tensor | None = None
) -> Tensor:
    """Whether ``||(K + U U^T) alpha - b||_w^2 > ||b||_w^2`` (float64 sums, row chunks of ``K``).

    ``w``: row weights of the norm (default 1). A 0-dim bool tensor on ``K``'s device, so the
    caller reads it back together with the factorization's status (one synchronization).
    """
    a = alpha.to(K.dtype)
    wd = None if w is None else w.double()[:, None]
    Uk = None if U is None else U.to(K.dtype)
    ua = None if Uk is None else Uk.mT @ a  # (r, c): U^T alpha once, not per chunk
    b64 = b.double()
    res: Tensor | None = None  # the sum of the chunks' sums (no zero to start from: one launch)
    for i in range(0, K.shape[0], 4096):
        ka = K[i : i + 4096] @ a
        if Uk is not None and ua is not None:
            ka = ka + Uk[i : i + 4096] @ ua
        r = ka.double() - b64[i : i + 4096]
        part = (r * r if wd is None else wd[i : i + 4096] * r * r).sum()
        res = part if res is None else res + part
    if res is None:  # no rows
        res = b64.new_zeros(())
    bb = b64**2
    return ~(res <= (bb if wd is None else wd * bb).sum())  # also True for NaN


def solve_krr(
    K: Tensor,
    y: Tensor,
    reg: float,
    *,
    solve_dtype: torch.dtype | None = None,
    max_tries: int = 4,
    workspace: Tensor | None = None,
    features: Tensor | None = None,
    weights: Tensor | None = None,
) -> Tensor:
    """Solve ``(K + U U^T + reg W^{-1}) alpha = y`` by Cholesky (``U = features``, default none).

    ``W = diag(weights)`` (default ``I``): the minimizer of the weighted ridge objective
    ``sum_i w_i (y_i - f(x_i))^2 + reg ||f||^2``. Integer weights give exactly the ``alpha`` of
    the rows repeated that many times, summed over the copies (a copy's row of the repeated
    system reads ``(K a)_i + reg a_i / w_i = y_i`` for ``a_i`` the copies' total).

    ``K + reg I`` is copied into a padded buffer ``[[K + reg I, 0], [0, I]]`` (see :data:`PAD_TO`)
    and factored there in place, so ``K`` is never modified and the solve allocates at most that
    one buffer. If the factorization fails (``cholesky_ex`` reports a non-positive pivot), a jitter
    ``reg_k = max(reg, 1e-6 * mean(diag K)) * 10^k`` is tried for ``k = 1 .. max_tries - 1``.

    A factorization can also succeed and still be useless: with a learned ``M`` that collapses
    rows together, ``K`` is so ill-conditioned that a float32 ``alpha`` is mostly rounding error
    (huge ``|alpha|_1``, predictions off by many standard deviations). The exact
    solution always satisfies ``||K alpha - y||^2 <= ||y||^2`` (``alpha = 0`` is feasible for the
    ridge objective), so a residual above that bound marks a failed solve, which is then repeated
    in float64 (one extra matrix-vector product per solve; a warning is logged).
    The in-place factorization is not differentiable; with autograd on (``K`` or ``y`` requiring
    grad) a plain ``torch.linalg`` path is taken instead.

    On success the workspace holds the factor of ``K + U U^T + reg I`` for reuse
    (:func:`pcg_krr`, :func:`solve_bordered`); after a jittered ridge or the float64 repeat it
    holds no such factor, and its first entry is set to NaN so that no later solve reuses it.

    Args:
        K: Symmetric PSD kernel matrix, shape (n, n).
        y: Targets, shape (n,) or (n, c).
        reg: Ridge ``lambda >= 0`` (absolute, not scaled by n).
        solve_dtype: Factor in this dtype (e.g. ``torch.float64``) and cast back.
        max_tries: Number of factorization attempts (>= 1).
        workspace: Optional buffer from :func:`krr_workspace` ``(n)`` in the solve dtype, reused
            across calls (a fresh matrix of this size costs as much as an elementwise pass).
        features: Optional low-rank part ``U``, shape (n, r), added to ``K`` in the factored copy
            only (e.g. :func:`xrfm_torch.kernels.linear.linear_features`), so ``K`` stays as it was.
        weights: Optional positive row weights (n,); the residual bound is then in the weighted
            norm ``sum_i w_i r_i^2`` (the weighted objective at ``alpha = 0``).

    Returns:
        Coefficients ``alpha`` with the shape and dtype of ``y``.

    Raises:
        KRRSolveError: If every attempt fails.
    """
    p = _prepare(K, y, reg, solve_dtype, workspace, features, weights)
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries}")
    n, dtype, W = p.n, p.dtype, p.W
    base = None  # the jitter's base, read from K only when a retry needs it (a GPU sync)
    for attempt in range(max_tries):
        if attempt == 0:
            ridge = float(reg)
        else:
            if base is None:
                base = max(float(reg), 1e-6 * float(K.detach().diagonal().mean()))
            ridge = base * 10.0**attempt
        alpha, info = _attempt(p, K, ridge)
        if not p.differentiable and dtype != torch.float64:
            excess = _residual_too_large(K, alpha, p.b, p.U, weights)
            failed, too_large = (bool(v) for v in read_scalars(info != 0, excess))
        else:
            failed, too_large = int(info) != 0, False
        if not failed:
            if attempt > 0:
                log.debug("KRR Cholesky needed jitter: ridge raised from %g to %g", reg, ridge)
                count("solves needed jitter (ridge raised)")
            reusable = attempt == 0 and not p.differentiable
            if too_large:
                count(f"{dtype} solves repeated in float64")
                log.debug(
                    "KRR solve in %s is numerically useless for n=%d (residual above ||y||); "
                    "repeating it in float64",
                    dtype,
                    n,
                )
                alpha = solve_krr(
                    K,
                    p.b,
                    ridge,
                    solve_dtype=torch.float64,
                    max_tries=1,
                    features=features,
                    weights=weights,
                )
                reusable = False  # the workspace holds the failed float32 factor
            if not reusable and W is not None:
                W[0, 0] = float("nan")  # not the factor of K + reg I: nothing may reuse it
            return (alpha if y.ndim == 2 else alpha[:, 0]).to(y.dtype)
    raise KRRSolveError(
        f"Cholesky of K + reg*I failed for n={n} after {max_tries} tries "
        f"(reg={reg:g}, last ridge={ridge:g}, dtype={dtype}); the kernel matrix is badly "
        "conditioned: increase reg or use solve_dtype=torch.float64"
    )


def first_krr_solve(
    K: Tensor,
    y: Tensor,
    reg: float,
    *,
    solve_dtype: torch.dtype | None = None,
    workspace: Tensor | None = None,
    features: Tensor | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """:func:`solve_krr`'s first attempt, its check left on the device.

    Returns ``alpha`` and a 0-dim bool tensor that is true where that attempt failed (a
    non-positive pivot) or was numerically useless (its residual above ``||y||``). The check
    is not read back (given ``weights`` are, as :func:`solve_krr` checks them): the caller
    reads the flag together with the other scalars of its decision (one host-device
    synchronization per RFM step instead of two) and, where it is true, calls
    :func:`solve_krr`, which repeats the attempt and goes on to its jitter and float64 retries.
    Where it is false, ``alpha`` and the workspace are what ``solve_krr`` would have left.
    With autograd on, this is ``solve_krr`` itself and a false flag.

    Arguments as :func:`solve_krr`.
    """
    p = _prepare(K, y, reg, solve_dtype, workspace, features, weights)
    if p.differentiable:
        alpha = solve_krr(
            K,
            y,
            reg,
            solve_dtype=solve_dtype,
            workspace=workspace,
            features=features,
            weights=weights,
        )
        return alpha, torch.zeros((), dtype=torch.bool)
    alpha, info = _attempt(p, K, float(reg))
    unsure = info != 0
    if p.dtype != torch.float64:
        unsure = unsure | _residual_too_large(K, alpha, p.b, p.U, weights)
    return (alpha if y.ndim == 2 else alpha[:, 0]).to(y.dtype), unsure


class _Prepared(NamedTuple):
    """A KRR solve's checked inputs (:func:`_prepare`)."""

    n: int
    m: int  # the padded size
    dtype: torch.dtype
    W: Tensor | None  # the workspace (with autograd: the one given, unused)
    b: Tensor  # the right-hand sides (n, c) in the solve dtype
    U: Tensor | None
    inv_w: Tensor | None
    differentiable: bool


def _prepare(
    K: Tensor,
    y: Tensor,
    reg: float,
    solve_dtype: torch.dtype | None,
    workspace: Tensor | None,
    features: Tensor | None,
    weights: Tensor | None,
) -> _Prepared:
    """Check a solve's arguments; its dtype, padded size, workspace and right-hand sides."""
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise ValueError(f"K must be square, got shape {tuple(K.shape)}")
    if y.shape[0] != K.shape[0]:
        raise ValueError(f"y has {y.shape[0]} rows but K is {K.shape[0]} x {K.shape[1]}")
    check_positive(reg, "reg", allow_zero=True)
    n, dtype = K.shape[0], solve_dtype or K.dtype
    if features is not None and (features.ndim != 2 or features.shape[0] != n):
        raise ValueError(f"features must have shape ({n}, r), got {tuple(features.shape)}")
    U = None if features is None else features.to(dtype)
    if weights is not None and (weights.shape != (n,) or not bool((weights > 0).all())):
        raise ValueError(f"weights must be positive with shape ({n},), got {tuple(weights.shape)}")
    inv_w = None if weights is None else (1.0 / weights.double()).to(dtype)
    differentiable = torch.is_grad_enabled() and (
        K.requires_grad or y.requires_grad or (U is not None and U.requires_grad)
    )
    m = n if differentiable else padded_size(n)
    W = workspace
    if not differentiable and (
        W is None
        or W.shape != (m, m)
        or W.dtype != dtype
        or W.device != K.device
        or W.stride(0) != 1
    ):
        W = krr_workspace(n, dtype, K.device)
    b = (y if y.ndim == 2 else y[:, None]).to(dtype)
    return _Prepared(n, m, dtype, W, b, U, inv_w, differentiable)


def _attempt(p: _Prepared, K: Tensor, ridge: float) -> tuple[Tensor, Tensor]:
    """One factorization of ``K + U U^T + ridge W^{-1}`` and the two triangular solves.

    Returns ``(alpha (n, c), the factorization's info)``; nothing is read back.
    """
    n, m, dtype, W, b, U, inv_w = p.n, p.m, p.dtype, p.W, p.b, p.U, p.inv_w
    if p.differentiable or W is None:
        eye = torch.eye(n, dtype=dtype, device=K.device)
        A = K.to(dtype) + (ridge * eye if inv_w is None else torch.diag(ridge * inv_w))
        if U is not None:
            A = A + U @ U.mT
        L, info = torch.linalg.cholesky_ex(A)
    else:
        # K is symmetric: writing it through W.mT (row-major) is a contiguous copy
        W.mT[:n, :n].copy_(K)
        if U is not None:
            W[:n, :n].addmm_(U, U.mT)
        if m > n:
            W[n:].zero_()
            W[:, n:].zero_()
            W.diagonal()[n:].fill_(1.0)
        if inv_w is None:
            W.diagonal()[:n].add_(ridge)
        else:
            W.diagonal()[:n].add_(inv_w, alpha=ridge)
        info_buf = torch.empty((), dtype=torch.int32, device=K.device)
        L, info = torch.linalg.cholesky_ex(W, out=(W, info_buf))
    rhs = b if m == n else torch.nn.functional.pad(b, (0, 0, 0, m - n))  # zero rows: one launch
    # two triangular solves: much faster than cholesky_solve for few right-hand sides
    # (run before the factorization's status is known: a failed one is rare, and reading
    # the status together with the residual bound costs one host-device synchronization)
    z = torch.linalg.solve_triangular(L, rhs, upper=False)
    alpha = torch.linalg.solve_triangular(L.mT, z, upper=True)[:n]
    return alpha, info


def solve_nystrom(
    Phi: Tensor, K_cc: Tensor, y: Tensor, reg: float, weights: Tensor | None = None
) -> Tensor:
    """Nyström kernel ridge regression: ``(Phi^T W Phi + reg K_cc) w = Phi^T W y``.

    The predictor ``f(x) = k(x, C) w`` over ``b`` centres ``C`` minimizing
    ``||Phi w - y||^2 + reg w^T K_cc w`` (``Phi = k(X, C)``, (n, b); ``K_cc = k(C, C)``, (b, b)):
    the exact KRR of ``(K + reg I) alpha = y`` restricted to the span of the centres, so with
    ``C = X`` it is that solve's ``alpha``. Costs ``O(n b^2)`` instead of ``O(n^3)``. Solved in
    float64 (``b`` is small); if the system is not numerically positive definite, a jitter of
    ``1e-10 * mean(diag)`` times ``10^k`` is added (``k = 0 .. 5``).

    Args:
        Phi: Kernel between the rows and the centres, shape (n, b).
        K_cc: Kernel among the centres, shape (b, b), symmetric PSD.
        y: Targets, shape (n,) or (n, c).
        reg: Ridge (>= 0).
        weights: Optional row weights ``W = diag(weights)`` (n,) (default ``I``).

    Returns:
        ``w``, shape (b, c), in ``Phi``'s dtype.
    """
    if Phi.shape[1] != K_cc.shape[0] or K_cc.shape[0] != K_cc.shape[1]:
        raise ValueError(f"Phi {tuple(Phi.shape)} and K_cc {tuple(K_cc.shape)} do not match")
    if y.shape[0] != Phi.shape[0]:
        raise ValueError(f"y has {y.shape[0]} rows, Phi {Phi.shape[0]}")
    P = Phi.double()  # float32 products left the system indefinite at 160k rows (reg 1e-4)
    Y = y.double().reshape(y.shape[0], -1)
    if weights is not None:  # rows scaled by sqrt(w): the weighted least squares
        root = weights.double().sqrt()[:, None]
        P, Y = P * root, Y * root
    A = P.T @ P + float(reg) * K_cc.double()
    rhs = P.T @ Y
    scale = float(A.diagonal().mean()) or 1.0
    eye = torch.eye(A.shape[0], dtype=A.dtype, device=A.device)
    for k in range(6):
        L, info = torch.linalg.cholesky_ex(A + (1e-10 * scale * 10**k) * eye)
        if int(info) == 0:
            return torch.cholesky_solve(rhs, L).to(Phi.dtype)
    raise RuntimeError(f"the Nyström system (b={A.shape[0]}, reg={reg:g}) is not positive definite")
