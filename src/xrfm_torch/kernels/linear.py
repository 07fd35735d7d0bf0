"""The constant + linear part of a leaf kernel: ``k(x, z) + c (1 + <S x, S z> / d)``.

A Laplace-type kernel decays to 0 away from the training rows, so a kernel ridge regression
predicts the target mean there; a small constant + linear part (weight ``c``) lets a leaf
extrapolate along the linear trend of its M-space instead, which matters where the test error is
decided by rows outside the training range. The part has rank ``d + 1``, so it enters as
features ``U = sqrt(c) [1, S x / sqrt(d)]`` with ``K_total = K + U U^T``: never an extra (n, n)
matrix, and the kernel matrix itself stays intact for the AGOP's gradient weights.
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor

from xrfm_torch.kernels.lpq import Kernel


def linear_features(xs: Tensor, c: float) -> Tensor:
    """``U = sqrt(c) [1, xs / sqrt(d)]`` of transformed inputs ``xs`` (n, d): shape (n, d + 1)."""
    d = xs.shape[1]
    # the column of ones as padding: one operation fewer than ones + cat (a launch on a GPU)
    return F.pad(xs / math.sqrt(d), (1, 0), value=1.0) * math.sqrt(c)


def batched_features(
    x: Tensor, scale: Tensor | float, c: float, pad: Tensor | None
) -> Tensor | None:
    """The features ``sqrt(c) [1, x * scale]`` of a batch of row sets ``x`` (B, n, D), (B, n, D + 1).

    ``scale`` is each set's ``1 / sqrt(d)`` (its own width ``d`` where sets were padded to ``D``
    columns); rows where ``pad`` (B, n) is 1 get no features. ``None`` where ``c`` is 0.
    """
    if c <= 0:
        return None
    U = F.pad(x * scale, (1, 0), value=1.0) * math.sqrt(c)
    return U if pad is None else U * (1.0 - pad)[..., None]


def features_or_none(xs: Tensor, c: float) -> Tensor | None:
    """:func:`linear_features`, or ``None`` when the part is off (``c == 0``): ``solve_krr``'s input."""
    return linear_features(xs, c) if c > 0 else None


def summed_predict(kernel: Kernel, xs: Tensor, zs: Tensor, alpha: Tensor, c: float) -> Tensor:
    """``(K(xs, zs) + U(xs) U(zs)^T) alpha`` for transformed inputs (n, d) and centres (m, d).

    The linear part is applied as ``U(xs) (U(zs)^T alpha)`` (rank ``d + 1``), not as a matrix.
    """
    pred = kernel.predict(xs, zs, alpha)  # (n, c_out)
    if c > 0:
        pred = pred + linear_features(xs, c) @ linear_weights(linear_features(zs, c), alpha)
    return pred


def linear_weights(features: Tensor, alpha: Tensor) -> Tensor:
    """``v = U(zs)^T alpha``, shape (d + 1, c_out): the linear part is ``f_lin(x) = U(x) v``.

    For callers that hold the centres' features ``U(zs)`` (the solve's) and need ``v`` for both
    a prediction and the gradient (:func:`weights_grad`): made once, not once per use.
    """
    return features.mT @ alpha


def weights_grad(v: Tensor, c: float) -> Tensor:
    """The gradient of ``f_lin(x) = U(x) v`` w.r.t. ``S x``: ``sqrt(c / d) v[1:]``, (1, c_out, d).

    The same at every row (broadcasts over rows); :func:`linear_grad` of the centres' ``v``.
    """
    return (math.sqrt(c / (v.shape[0] - 1)) * v[1:].mT)[None]


def linear_grad(zs: Tensor, alpha: Tensor, c: float) -> Tensor | None:
    """Gradient of the linear part of ``f`` with respect to the transformed input ``S x``.

    ``f_lin(x) = U(S x) v`` with ``v = U(zs)^T alpha``, so the gradient is ``sqrt(c / d) v[1:]``:
    the same at every row, shape (1, c_out, d) (broadcasts over rows); ``None`` when ``c == 0``.
    :func:`~xrfm_torch.kernels.chain_rule` maps it to the input space.
    """
    if c <= 0:
        return None
    return weights_grad(linear_weights(linear_features(zs, c), alpha), c)
