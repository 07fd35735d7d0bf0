"""Random Fourier features of the Lpq-Laplace kernels with ``p = 2`` (seed ``004_…``).

Rahimi and Recht's map: a shift-invariant kernel ``k(x - z) = E_w[cos(w^T (x - z))]`` is the
expectation of ``phi(x) phi(z)`` with ``phi(x) = sqrt(2 / D) cos(W^T x + b)`` over ``D``
frequencies ``w ~ mu`` (the kernel's spectral measure) and phases ``b ~ U[0, 2 pi)``.

For the kernels of :mod:`xrfm_torch.kernels.lpq` with the Euclidean norm,
``k(r) = exp(-(r / L)^q)`` with ``0 < q <= 2``, the spectral measure is a scale mixture of
Gaussians: ``exp(-t^(q/2)) = E[exp(-t S)]`` for a positive ``(q/2)``-stable ``S`` (Bochner and
Lévy; ``S = 1`` at ``q = 2``), so with ``t = r^2 / L^2``,

.. math::

    k(r) = E_S\\left[\\exp\\left(-\\frac{2 S r^2}{2 L^2}\\right)\\right]
         = E_{S, z}\\left[\\cos\\left(\\frac{\\sqrt{2 S}}{L} z^\\top (x - x')\\right)\\right],
    \\qquad z \\sim N(0, I_d).

So ``w = sqrt(2 S) z / L``: Gaussian frequencies for ``q = 2`` (the Gaussian kernel),
multivariate Cauchy ones for ``q = 1`` (Laplace), and heavier or lighter tails between.
``S`` is drawn with Kanter's representation of the positive stable law (exact, no rejection).
The ``p < 2`` kernels (product Laplace) are products of one-dimensional kernels and are not
covered. A leaf's learned ``M`` enters through its root: the features are taken of ``S_M x``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def positive_stable(
    alpha: float,
    n: int,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """``n`` draws of the positive ``alpha``-stable law with ``E[exp(-t S)] = exp(-t^alpha)``.

    Kanter (1975): with ``U ~ U(0, pi)`` and ``E ~ Exp(1)`` independent,

    .. math::

        S = \\frac{\\sin(\\alpha U)}{\\sin(U)^{1/\\alpha}}
            \\left(\\frac{\\sin((1 - \\alpha) U)}{E}\\right)^{(1 - \\alpha)/\\alpha},

    and ``S = 1`` at ``alpha = 1``. Drawn in float64 on the CPU (heavy tails), returned in ``dtype``.

    Args:
        alpha: Stability index, ``0 < alpha <= 1``.
        n: Number of draws.
        generator: CPU random generator.
        dtype: Dtype of the result.

    Returns:
        Shape (n,), positive.
    """
    if not 0.0 < float(alpha) <= 1.0:
        raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
    if float(alpha) == 1.0:
        return torch.ones(n, dtype=dtype)
    a = float(alpha)
    tiny = torch.finfo(torch.float64).tiny
    u = torch.rand(n, generator=generator, dtype=torch.float64).clamp_min(tiny) * math.pi
    e = -torch.rand(n, generator=generator, dtype=torch.float64).clamp_min(tiny).log()
    s = torch.sin(a * u) / torch.sin(u) ** (1.0 / a)
    s = s * (torch.sin((1.0 - a) * u) / e) ** ((1.0 - a) / a)
    return s.to(dtype)


def fourier_frequencies(
    d: int,
    n_features: int,
    q: float,
    bandwidth: float,
    *,
    generator: torch.Generator | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, Tensor]:
    """Frequencies ``W`` (d, D) and phases ``b`` (D,) of ``exp(-(||x - z||_2 / L)^q)``.

    Args:
        d: Input dimension.
        n_features: ``D``.
        q: Distance exponent, ``0 < q <= 2``.
        bandwidth: ``L > 0``.
        generator: CPU random generator (the draws are made on the CPU: seeded alike everywhere).
        dtype: Dtype of the results.
    """
    if not 0.0 < float(q) <= 2.0:
        raise ValueError(f"random Fourier features need 0 < q <= 2, got q={q!r}")
    if not float(bandwidth) > 0:
        raise ValueError(f"bandwidth must be > 0, got {bandwidth!r}")
    if int(n_features) < 1:
        raise ValueError(f"n_features must be >= 1, got {n_features!r}")
    s = positive_stable(q / 2.0, n_features, generator=generator)
    z = torch.randn(d, n_features, generator=generator, dtype=torch.float64)
    w = z * ((2.0 * s).sqrt() / float(bandwidth))
    b = torch.rand(n_features, generator=generator, dtype=torch.float64) * (2.0 * math.pi)
    return w.to(dtype), b.to(dtype)


def fourier_features(xs: Tensor, w: Tensor, b: Tensor) -> Tensor:
    """``phi(xs) = sqrt(2 / D) cos(xs W + b)``: shape (n, D), ``phi(x) . phi(z) ~ k(x, z)``."""
    return math.sqrt(2.0 / w.shape[1]) * torch.cos(xs @ w + b)


def fourier_grads(xs: Tensor, w: Tensor, b: Tensor, coef: Tensor) -> Tensor:
    """Gradients of ``f(xs) = phi(xs) coef`` with respect to ``xs``: shape (n, c, d).

    ``d f_c / d xs = -sqrt(2 / D) W (sin(xs W + b) * coef[:, c])``: two matrix products.

    Args:
        xs: Inputs in the feature space, (n, d).
        w: Frequencies (d, D).
        b: Phases (D,).
        coef: Feature coefficients (D, c).
    """
    sin = math.sqrt(2.0 / w.shape[1]) * torch.sin(xs @ w + b)  # (n, D)
    # (n, c, D) would be large; per output column: (n, D) * coef[:, c] then @ W^T
    cols = [-(sin * coef[:, j]) @ w.mT for j in range(coef.shape[1])]
    return torch.stack(cols, dim=1)
