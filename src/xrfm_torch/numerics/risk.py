"""Ridge from a predicted risk: generalized cross-validation (GCV) on the kernel's spectrum.

For kernel ridge regression with system ``K + lam I`` (``K`` symmetric PSD, n rows), the hat matrix
is ``H = K (K + lam I)^-1``. GCV estimates the test risk without validation rows as

    GCV(lam) = (1/n) ||(I - H) y||^2 / ((1/n) tr(I - H))^2.

With ``K = V diag(s) V^T`` and ``z = V^T y``, ``I - H = V diag(lam / (s + lam)) V^T``, so

    ||(I - H) y||^2 = sum_i (lam / (s_i + lam))^2 |z_i|^2,    tr(I - H) = sum_i lam / (s_i + lam),

and one eigendecomposition (``O(n^3)``, several Cholesky factorizations' worth) prices every
``lam`` at ``O(n)`` each. GCV is a consistent estimate of the deterministic equivalent of the
KRR test risk in the proportional regime (seed ``004_…``; Craven and Wahba 1979 for the
estimator), so the grid can be fine where a validation walk pays a solve per step.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def kernel_spectrum(K: Tensor, y: Tensor, features: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Eigenvalues of the system's kernel and the targets' energy along each eigenvector.

    Args:
        K: Kernel matrix, shape (n, n), symmetric PSD (not modified).
        y: Targets, shape (n,) or (n, c).
        features: Optional ``U`` (n, k): the kernel is ``K + U U^T`` (the leaf's linear part).

    Returns:
        ``(s, e)``: eigenvalues (n,) clamped at 0, and ``e_i = sum_c (v_i^T y_c)^2`` (n,), both
        float64.
    """
    A = K.double()
    if features is not None:
        U = features.double()
        A = A + U @ U.T
    s, V = torch.linalg.eigh(A)
    z = V.T @ y.double().reshape(y.shape[0], -1)
    return s.clamp_min(0.0), (z * z).sum(1)


def gcv_scores(s: Tensor, e: Tensor, lams: Sequence[float] | Tensor) -> Tensor:
    """``GCV(lam)`` for each ridge, from :func:`kernel_spectrum`'s ``(s, e)``.

    Returns:
        Shape (len(lams),), float64 (per output column, summed over columns).
    """
    lam = torch.as_tensor(lams, dtype=torch.float64, device=s.device).reshape(-1, 1)
    shrink = lam / (s.unsqueeze(0) + lam)  # (L, n): the eigenvalues of I - H
    n = s.shape[0]
    residual = (shrink * shrink * e.unsqueeze(0)).sum(1) / n
    dof = shrink.sum(1) / n
    return residual / dof.clamp_min(torch.finfo(torch.float64).tiny) ** 2


def gcv_ridge(
    K: Tensor,
    y: Tensor,
    low: float,
    high: float,
    *,
    features: Tensor | None = None,
    n_grid: int = 41,
) -> tuple[float, Tensor, Tensor]:
    """The ridge minimizing GCV on a log grid between ``low`` and ``high``.

    Args:
        K: Kernel matrix (n, n).
        y: Targets (n,) or (n, c).
        low: Smallest ridge (> 0).
        high: Largest ridge (>= ``low``).
        features: Optional linear part ``U`` (the system kernel is ``K + U U^T``).
        n_grid: Grid points (log-spaced, ends included).

    Returns:
        ``(lam, grid, scores)``: the chosen ridge (the smallest on ties), the grid and its GCV.
    """
    if not 0 < low <= high:
        raise ValueError(f"need 0 < low <= high, got low={low!r}, high={high!r}")
    if n_grid < 1:
        raise ValueError(f"n_grid must be >= 1, got {n_grid}")
    s, e = kernel_spectrum(K, y, features)
    grid = torch.logspace(
        torch.log10(torch.tensor(low)).item(),
        torch.log10(torch.tensor(high)).item(),
        n_grid,
        dtype=torch.float64,
    )
    scores = gcv_scores(s, e, grid)
    return float(grid[int(torch.argmin(scores))]), grid, scores
