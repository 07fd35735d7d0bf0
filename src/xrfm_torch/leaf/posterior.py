"""A leaf's Gaussian-process view: posterior variance and a noise model from leave-one-out residuals.

A leaf solves ``A alpha = y`` with ``A = K + U U^T + lam I`` (kernel ``K`` in the learned M-space,
constant + linear features ``U``). Read as a Gaussian process with prior covariance
``k_tot(x, z) = k(x, z) + u(x)^T u(z)`` and noise variance ``lam`` (both up to a scale ``s^2``),
its mean is the leaf's prediction and its latent variance is

.. math::

    v(x) = k_{tot}(x, x) - b(x)^T A^{-1} b(x), \\qquad b(x) = K(X, x) + U u(x),

one triangular solve ``w = L^{-1} b(x)`` with the factor ``A = L L^T`` (``v = k_tot(x, x) - |w|^2``).

The process's noise is one number per leaf; real noise is not (counts, prices, duplicated rows).
Leave-one-out residuals come free with the factor, ``r_i = alpha_i / (A^{-1})_{ii}``, and they are
honest: each is the error at a row the leaf fitted without it. A kernel ridge regression of
``z_i = log r_i^2`` with the same factor (two triangular solves) gives ``g(x)``, the leaf's
estimate of the log noise level at ``x``. The tree turns ``(mean, v, g)`` into a variance with a
few coefficients fitted on validation rows (:mod:`xrfm_torch.tree.uncertainty`).

The marginal-likelihood scale of the plain process is ``s^2 = y^T A^{-1} y / n = alpha^T A alpha / n``
(per output), so ``s^2 (v(x) + lam)`` is the GP predictive variance with no validation data.
"""

from __future__ import annotations

import logging

import torch
from torch import Tensor

from xrfm_torch.kernels import Kernel, transform
from xrfm_torch.kernels.linear import features_or_none

log = logging.getLogger(__name__)

#: Squared leave-one-out residuals are floored at this fraction of their mean before the log (a
#: row the leaf reproduces exactly would give log 0).
LOG_FLOOR = 1e-6


def system_matrix(kernel: Kernel, xs: Tensor, reg: float, linear_mix: float) -> Tensor:
    """``A = K(xs, xs) + U U^T + reg I`` for transformed support points ``xs`` (n, d): (n, n)."""
    A = kernel.from_distance(kernel.distance(xs, xs))
    U = features_or_none(xs, linear_mix)
    if U is not None:
        A.addmm_(U, U.mT)
    A.diagonal().add_(reg)
    return A


def cholesky_factor(A: Tensor) -> Tensor | None:
    """Lower Cholesky factor of ``A`` (n, n), or ``None`` where it is not numerically SPD.

    A small ridge can leave float32 kernel values indefinite (the leaf's own solve then repeated
    in float64, :func:`~xrfm_torch.numerics.solvers.solve_krr`); the caller then builds ``A`` in
    float64 and the posterior's solves run in float64.
    """
    L, info = torch.linalg.cholesky_ex(A)
    if int(info) != 0:
        log.info("posterior factor (n=%d) not positive definite in %s", len(A), A.dtype)
        return None
    return L


def loo_residuals(L: Tensor, alpha: Tensor) -> Tensor:
    """Leave-one-out residuals ``r_i = alpha_i / (A^{-1})_{ii}`` from ``A = L L^T``: (n, c).

    ``A^{-1}`` from the factor (LAPACK ``potri``, about 1.5x faster than a triangular solve
    against the identity, which does not know its right-hand side is triangular).
    """
    diag_inv = torch.cholesky_inverse(L).diagonal()  # (n,)
    return alpha.to(L.dtype) / diag_inv[:, None]


def noise_model(L: Tensor, loo: Tensor) -> tuple[Tensor, Tensor]:
    """Kernel ridge regression of ``z = log r^2`` (floored) with the factor ``L``.

    Args:
        L: Lower factor of the leaf's system, (n, n).
        loo: Leave-one-out residuals, (n, c).

    Returns:
        ``(beta, z_mean)``: coefficients (n, c) and the mean of ``z`` (c,), so that
        ``g(x) = b(x)^T beta + z_mean`` (:func:`moments`).
    """
    r2 = loo * loo
    z = torch.log(r2 + LOG_FLOOR * r2.mean(0).clamp_min(torch.finfo(r2.dtype).tiny))
    z_mean = z.mean(0)
    beta = torch.cholesky_solve(z - z_mean, L)
    return beta, z_mean


def signal_variance(L: Tensor, alpha: Tensor) -> Tensor:
    """Marginal-likelihood scale ``s^2 = alpha^T A alpha / n`` (= ``y^T A^{-1} y / n``), (c,)."""
    La = L.mT @ alpha.to(L.dtype)  # A alpha . alpha = |L^T alpha|^2
    return (La * La).sum(0) / L.shape[0]


def moments(
    kernel: Kernel,
    sqrt_m: Tensor,
    support: Tensor,
    x: Tensor,
    L: Tensor,
    alpha: Tensor,
    beta: Tensor,
    z_mean: Tensor,
    linear_mix: float,
) -> tuple[Tensor, Tensor, Tensor]:
    """Mean, latent variance and log-noise estimate of a leaf at ``x`` (differentiable in ``x``).

    Args:
        kernel: The leaf's kernel.
        sqrt_m: ``sqrt(M)``, (d,) or (d, d).
        support: Support points, (n, d).
        x: Inputs, (m, d).
        L: Lower factor of ``A``, (n, n).
        alpha: KRR coefficients, (n, c).
        beta: Noise-model coefficients, (n, c).
        z_mean: Noise-model offset, (c,).
        linear_mix: Weight of the constant + linear part.

    Returns:
        ``(mean (m, c), v (m,) >= 0, g (m, c))``.
    """
    xs, zs = transform(x, sqrt_m), transform(support, sqrt_m)
    B = kernel.from_distance(kernel.distance(zs, xs))  # (n, m)
    prior = torch.ones(x.shape[0], dtype=x.dtype, device=x.device)  # k(x, x) = exp(0)
    U, u = features_or_none(zs, linear_mix), features_or_none(xs, linear_mix)
    if U is not None and u is not None:
        B = B + U @ u.mT
        prior = prior + (u * u).sum(1)
    mean = B.mT @ alpha
    g = B.mT @ beta.to(B.dtype) + z_mean.to(B.dtype)
    W = torch.linalg.solve_triangular(L, B.to(L.dtype), upper=False)  # (n, m), the factor's dtype
    v = (prior.to(L.dtype) - (W * W).sum(0)).clamp_min(0.0).to(x.dtype)
    return mean, v, g
