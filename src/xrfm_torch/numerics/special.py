"""Special functions written with operators every export target has (ONNX has no ``erfinv``)."""

from __future__ import annotations

import math

import torch
from torch import Tensor

# Giles (2010), "Approximating the erfinv function", GPU Computing Gems: single-precision
# polynomials in w = -log(1 - y^2), one for w < 5 (central) and one in sqrt(w) (tails).
_CENTRAL = (
    2.81022636e-08,
    3.43273939e-07,
    -3.5233877e-06,
    -4.39150654e-06,
    0.00021858087,
    -0.00125372503,
    -0.00417768164,
    0.246640727,
    1.50140941,
)
_TAIL = (
    -0.000200214257,
    0.000100950558,
    0.00134934322,
    -0.00367342844,
    0.00573950773,
    -0.0076224613,
    0.00943887047,
    1.00167406,
    2.83297682,
)


def _horner(coefficients: tuple[float, ...], w: Tensor) -> Tensor:
    p = torch.full_like(w, coefficients[0])
    for c in coefficients[1:]:
        p = p * w + c
    return p


def erfinv_poly(y: Tensor, newton_steps: int = 2) -> Tensor:
    r"""Inverse error function from ``log``, ``sqrt``, ``exp`` and ``erf`` only, for ``|y| < 1``.

    Giles' polynomials (relative error about 4e-7), then Newton steps on ``erf(z) = y``,
    :math:`z \leftarrow z - (\mathrm{erf}(z) - y)\, \tfrac{\sqrt{\pi}}{2} e^{z^2}`, each of
    which roughly squares the relative error (two reach float64 rounding away from ``|y| -> 1``).

    Args:
        y: Values in (-1, 1), any shape.
        newton_steps: Newton refinements (>= 0).

    Returns:
        ``erfinv(y)``, same shape and dtype.
    """
    w = -torch.log((1 - y) * (1 + y))
    central = _horner(_CENTRAL, w - 2.5)
    tail = _horner(_TAIL, torch.sqrt(w) - 3)
    z = torch.where(w < 5, central, tail) * y
    for _ in range(newton_steps):
        z = z - (torch.erf(z) - y) * (0.5 * math.sqrt(math.pi)) * torch.exp(z * z)
    return z
