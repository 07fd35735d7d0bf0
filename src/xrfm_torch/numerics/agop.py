"""Average gradient outer product (AGOP) and the matrix functions RFM applies to it.

.. math::

    G = \\frac{1}{n} \\sum_{i=1}^{n} \\sum_{c} \\nabla f_c(x_i) \\nabla f_c(x_i)^\\top,
    \\qquad M = \\frac{G}{\\varepsilon + \\max_{ij} G_{ij}}.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from xrfm_torch.numerics.events import count

log = logging.getLogger(__name__)


def agop_from_grads(grads: Tensor, *, diag: bool = False, weights: Tensor | None = None) -> Tensor:
    """AGOP of per-sample gradients, summed over outputs and averaged over samples.

    Args:
        grads: Gradients, shape (n, c, d) (or (n, d) for one output).
        diag: Return only the diagonal.
        weights: Optional sample weights (n,): the weighted average
            ``sum_i w_i J_i^T J_i / sum_i w_i`` (integer weights: the samples repeated).

    Returns:
        ``G``, shape (d, d), or its diagonal, shape (d,).
    """
    n = grads.shape[0]
    if weights is not None:
        w = (weights / weights.sum()).to(grads.dtype)
        grads = grads * w.sqrt().reshape(n, *([1] * (grads.ndim - 1)))
        n = 1
    g = grads.reshape(-1, grads.shape[-1])  # (n * c, d)
    if diag:
        return (g * g).sum(0) / n
    return (g.mT @ g) / n


def normalize_agop(G: Tensor, eps: float = 1e-30, ridge: float = 0.0) -> Tensor:
    """Entry-wise max normalization ``G / (eps + max_ij G_ij) + ridge I`` (not trace normalization).

    ``ridge`` is the ``lambda_M`` of "Uncertainty Estimation with Recursive Feature Machines"
    (Gedon et al.): it shrinks the off-diagonal entries relative to the diagonal and keeps every
    direction in the metric, so no input is switched off entirely. ``G``: (d,) diagonal or (d, d).
    """
    M = G / (eps + G.max())
    if ridge == 0.0:
        return M
    if M.ndim == 1:
        return M + ridge
    return M + ridge * torch.eye(M.shape[0], dtype=M.dtype, device=M.device)


def sqrt_psd(M: Tensor) -> Tensor:
    """Square root of a PSD feature matrix.

    Args:
        M: Diagonal as a vector, shape (d,), or a symmetric matrix, shape (d, d).

    Returns:
        ``M^{1/2}`` of the same shape; negative eigenvalues (rounding) are clipped to 0.
    """
    if M.ndim == 1:
        return M.clamp_min(0).sqrt()
    evals, evecs = symmetric_eigh((M + M.mT) / 2)
    return (evecs * evals.clamp_min(0).sqrt()) @ evecs.mT


def symmetric_eigh(S: Tensor) -> tuple[Tensor, Tensor]:
    """``torch.linalg.eigh`` of a symmetric matrix (d, d), retried in float64 where it fails.

    In float32, LAPACK's divide-and-conquer solver can fail to converge on a matrix with many
    repeated eigenvalues (an AGOP of inputs with duplicated columns has a run of zeros); the
    float64 solve of the same matrix converges, and its result is cast back.
    """
    try:
        return torch.linalg.eigh(S)
    except torch.linalg.LinAlgError:
        if S.dtype == torch.float64:
            raise
        log.debug("eigh did not converge in %s; solving in float64", S.dtype)
        evals, evecs = torch.linalg.eigh(S.double())
        return evals.to(S.dtype), evecs.to(S.dtype)


def learned_root(G: Tensor, eps: float, ridge: float) -> Tensor:
    """``sqrt(M)`` of the next RFM step: :func:`sqrt_psd` of :func:`normalize_agop` of ``G``."""
    return sqrt_psd(normalize_agop(G, eps, ridge))


@dataclass(frozen=True)
class RootedAgop:
    """An AGOP ``G`` with the next step's roots already made (together with other leaves').

    ``roots[diag]`` is :func:`learned_root` of ``G``'s diagonal (``True``) or of ``G`` itself
    (``False``); a layout missing from ``roots`` is made on demand (:func:`next_root`).
    """

    G: Tensor
    roots: dict[bool, Tensor]


def next_root(G: Tensor | RootedAgop, diag: bool, eps: float, ridge: float) -> Tensor:
    """:func:`learned_root` of ``G`` in the diagonal (``diag``) or full layout.

    ``G``: (d,) (diagonal; only ``diag``), (d, d), or a :class:`RootedAgop` whose root is used.
    """
    if isinstance(G, RootedAgop):
        made = G.roots.get(diag)
        if made is not None:
            return made
        G = G.G
    return learned_root(G.diagonal() if diag and G.ndim == 2 else G, eps, ridge)


def batched_roots(G: Tensor, eps: float, ridge: float, full: bool) -> dict[bool, Tensor]:
    """:func:`learned_root` of each of ``B`` AGOPs at once, in the layouts they allow.

    Args:
        G: (B, d) diagonals or (B, d, d) matrices, each finite with a positive largest entry.
            A matrix padded with zero rows and columns keeps its root in its leading block (the
            root is a function of the eigenvalues on each invariant subspace).
        eps: As in :func:`normalize_agop`.
        ridge: As in :func:`normalize_agop`.
        full: Whether to make the full roots of (B, d, d) matrices (a batched ``eigh``).

    Returns:
        ``{True: (B, d) roots of the diagonals}``, with ``False: (B, d, d)`` full roots where
        ``full`` and ``G`` is (B, d, d), unless the batched ``eigh`` fails (then the leaves make
        their own, with :func:`symmetric_eigh`'s retry).
    """
    d = G.diagonal(dim1=1, dim2=2) if G.ndim == 3 else G
    m = d / (eps + d.amax(1, keepdim=True))
    roots = {True: (m if ridge == 0.0 else m + ridge).clamp_min(0).sqrt()}
    if full and G.ndim == 3:
        M = G / (eps + G.flatten(1).amax(1))[:, None, None]
        if ridge != 0.0:
            M = M + ridge * torch.eye(M.shape[1], dtype=M.dtype, device=M.device)
        try:
            evals, evecs = torch.linalg.eigh((M + M.mT) / 2)
        except torch.linalg.LinAlgError:
            return roots
        roots[False] = (evecs * evals.clamp_min(0).sqrt()[:, None, :]) @ evecs.mT
    return roots


def top_eigenvector(G: Tensor) -> Tensor:
    """Unit eigenvector of the largest eigenvalue of a symmetric matrix, shape (d,).

    The sign is fixed so that the largest-magnitude component is positive (deterministic output).
    """
    _, evecs = symmetric_eigh((G + G.mT) / 2)
    v = evecs[:, -1]
    return v * torch.sign(v[v.abs().argmax()])


def agop_or_none(g: Tensor, diag: bool, n: int, weights: Tensor | None = None) -> Tensor | None:
    """The (weighted) AGOP of gradients ``g`` (n, c, d): (d,) if ``diag`` else (d, d).

    ``None`` (counted and logged; the iterations then stop) when it is degenerate: not
    finite, or zero.
    """
    G = agop_from_grads(g, diag=diag, weights=weights)
    return usable_agop(G, float(G.max()), n)


def usable_agop(G: Tensor, top: float, n: int) -> Tensor | None:
    """``G``, or ``None`` when its largest entry ``top`` is not finite or not positive.

    A degenerate AGOP is counted and logged; the leaf's iterations then stop.
    """
    if not math.isfinite(top) or top <= 0.0:
        count("leaves stopped on a degenerate AGOP")
        log.debug("leaf n=%d: degenerate AGOP (max %g); stopping", n, top)
        return None
    return G
