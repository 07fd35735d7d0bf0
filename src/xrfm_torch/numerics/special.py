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


def erfinv_poly(y: Tensor) -> Tensor:
    r"""Inverse error function from ``log``, ``sqrt``, ``exp`` and ``erf`` only, for ``|y| < 1``.

    Giles' polynomials (relative error about 4e-7: float32 accuracy). In float64, two Newton steps
    on ``erf(z) = y``, :math:`z \leftarrow z - (\mathrm{erf}(z) - y)\, \tfrac{\sqrt{\pi}}{2}
    e^{z^2}`, each roughly squaring the relative error. Not in float32: there the residual
    ``erf(z) - y`` is mostly rounding, and ``e^{z^2}`` (2e5 at z = 3.5) would amplify it.

    Args:
        y: Values in (-1, 1), any shape.

    Returns:
        ``erfinv(y)``, same shape and dtype.
    """
    w = -torch.log((1 - y) * (1 + y))
    central = _horner(_CENTRAL, w - 2.5)
    tail = _horner(_TAIL, torch.sqrt(w) - 3)
    z = torch.where(w < 5, central, tail) * y
    for _ in range(2 if y.dtype == torch.float64 else 0):
        z = z - (torch.erf(z) - y) * (0.5 * math.sqrt(math.pi)) * torch.exp(z * z)
    return z


def count_sorted(q: Tensor, x: Tensor, *, right: bool) -> Tensor:
    """``torch.searchsorted(q, x, right=right)`` as a branch-free binary search (gathers only).

    The count of entries of each sorted row ``q[i]`` that are ``<= x[i, j]`` (``right``) or
    ``< x[i, j]``: ``ceil(log2(K + 1))`` steps, each a gather and a comparison, with shapes that
    do not depend on the data (what ONNX export needs; it has no searchsorted). NaN in ``x``
    counts 0 (searchsorted puts it after every entry; callers here never pass NaN).

    Args:
        q: Sorted rows, shape (m, K).
        x: Values, shape (m, n).
        right: Count entries ``<= x`` (True) or ``< x`` (False).

    Returns:
        Counts in ``0 .. K``, shape (m, n), long.
    """
    k = q.shape[1]
    count = torch.zeros(x.shape, dtype=torch.long, device=x.device)
    step = 1 << (k.bit_length() - 1) if k > 0 else 0
    while step > 0:
        candidate = count + step
        value = q.gather(1, (candidate - 1).clamp_max(k - 1))
        ok = (candidate <= k) & ((value <= x) if right else (value < x))
        count = torch.where(ok, candidate, count)
        step //= 2
    return count
