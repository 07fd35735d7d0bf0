"""Kernel ridge regression solve by Cholesky with bounded jitter retries."""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from xrfm_torch._checks import check_positive

log = logging.getLogger(__name__)


class KRRSolveError(RuntimeError):
    """Raised when ``K + reg I`` stays numerically indefinite after every jitter retry."""


def solve_krr(
    K: Tensor,
    y: Tensor,
    reg: float,
    *,
    solve_dtype: torch.dtype | None = None,
    max_tries: int = 4,
    in_place: bool = False,
    workspace: Tensor | None = None,
) -> Tensor:
    """Solve ``(K + reg I) alpha = y`` by Cholesky.

    If the factorization fails (``cholesky_ex`` reports a non-positive pivot), a jitter
    ``reg_k = max(reg, 1e-6 * mean(diag K)) * 10^k`` is tried for ``k = 1 .. max_tries - 1``.

    Args:
        K: Symmetric PSD kernel matrix, shape (n, n).
        y: Targets, shape (n,) or (n, c).
        reg: Ridge ``lambda >= 0`` (absolute, not scaled by n).
        solve_dtype: Factor in this dtype (e.g. ``torch.float64``) and cast back.
        max_tries: Number of factorization attempts (>= 1).
        in_place: Allow adding the ridge to ``K``'s diagonal in place (it is removed again before
            returning), saving one (n, n) copy.
        workspace: Optional (n, n) buffer of the solve dtype for the Cholesky factor (reused across
            calls, it avoids allocating and page-faulting a fresh matrix each time).

    Returns:
        Coefficients ``alpha`` with the shape and dtype of ``y``.

    Raises:
        KRRSolveError: If every attempt fails.
    """
    if K.ndim != 2 or K.shape[0] != K.shape[1]:
        raise ValueError(f"K must be square, got shape {tuple(K.shape)}")
    if y.shape[0] != K.shape[0]:
        raise ValueError(f"y has {y.shape[0]} rows but K is {K.shape[0]} x {K.shape[1]}")
    check_positive(reg, "reg", allow_zero=True)
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries}")
    out_dtype = y.dtype
    A = K if solve_dtype is None or solve_dtype == K.dtype else K.to(solve_dtype)
    own = A is not K or in_place
    if not own:
        A = A.clone()
    rhs = y.to(A.dtype)
    base = max(float(reg), 1e-6 * float(A.diagonal().mean()))
    diag = A.diagonal()
    added = 0.0
    try:
        for attempt in range(max_tries):
            ridge = float(reg) if attempt == 0 else base * 10.0**attempt
            diag.add_(ridge - added)
            added = ridge
            if workspace is not None and workspace.shape == A.shape and workspace.dtype == A.dtype:
                info_buf = torch.empty((), dtype=torch.int32, device=A.device)
                L, info = torch.linalg.cholesky_ex(A, out=(workspace, info_buf))
            else:
                L, info = torch.linalg.cholesky_ex(A)
            if int(info) == 0:
                if attempt > 0:
                    log.warning(
                        "KRR Cholesky needed jitter: ridge raised from %g to %g", reg, ridge
                    )
                # two triangular solves: much faster than cholesky_solve for few right-hand sides
                b = rhs if rhs.ndim == 2 else rhs[:, None]
                z = torch.linalg.solve_triangular(L, b, upper=False)
                alpha = torch.linalg.solve_triangular(L.mT, z, upper=True)
                return (alpha if y.ndim == 2 else alpha[:, 0]).to(out_dtype)
    finally:
        diag.sub_(added)
    raise KRRSolveError(
        f"Cholesky of K + reg*I failed for n={K.shape[0]} after {max_tries} tries "
        f"(reg={reg:g}, last ridge={added:g}, dtype={A.dtype}); the kernel matrix is badly "
        "conditioned: increase reg or use solve_dtype=torch.float64"
    )
