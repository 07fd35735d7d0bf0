"""The constant + linear part of a leaf kernel: ``k(x, z) + c (1 + <S x, S z> / d)``.

A Laplace-type kernel decays to 0 away from the training rows, so a kernel ridge regression
predicts the target mean there; a small constant + linear part (weight ``c``) lets a leaf
extrapolate along the linear trend of its M-space instead (Brazilian_houses, whose test error is
decided by a few rows outside the training range). The part has rank ``d + 1``, so it enters as
features ``U = sqrt(c) [1, S x / sqrt(d)]`` with ``K_total = K + U U^T``: never an extra (n, n)
matrix, and the kernel matrix itself stays intact for the AGOP's gradient weights.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def linear_features(xs: Tensor, c: float) -> Tensor:
    """``U = sqrt(c) [1, xs / sqrt(d)]`` of transformed inputs ``xs`` (n, d): shape (n, d + 1)."""
    d = xs.shape[1]
    ones = xs.new_ones(xs.shape[0], 1)
    return math.sqrt(c) * torch.cat([ones, xs / math.sqrt(d)], dim=1)


def linear_weights(zs: Tensor, alpha: Tensor, c: float) -> Tensor:
    """``v = U(zs)^T alpha``, shape (d + 1, c_out): the linear part of ``f`` in feature form."""
    return linear_features(zs, c).mT @ alpha


def linear_predict(xs: Tensor, v: Tensor, c: float) -> Tensor:
    """``U(xs) v``, shape (n, c_out): the linear part's prediction at transformed inputs."""
    return linear_features(xs, c) @ v


def linear_grad(v: Tensor, c: float) -> Tensor:
    """Gradient of ``U(xs) v`` with respect to ``xs`` (the same at every row), shape (c_out, d)."""
    d = v.shape[0] - 1
    return math.sqrt(c / d) * v[1:].mT
