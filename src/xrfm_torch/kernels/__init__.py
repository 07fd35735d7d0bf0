"""Kernels: the Lpq-Laplace family, distances in the learned feature space, the linear part.

Layer 1: imports only :mod:`xrfm_torch.numerics` (and torch).
"""

from xrfm_torch.kernels.distance import chain_rule, pairwise_distance, transform
from xrfm_torch.kernels.lpq import (
    KERNELS,
    GaussianKernel,
    Kernel,
    LaplaceKernel,
    LpqLaplaceKernel,
    ProductLaplaceKernel,
    make_kernel,
)

__all__ = [
    "KERNELS",
    "GaussianKernel",
    "Kernel",
    "LaplaceKernel",
    "LpqLaplaceKernel",
    "ProductLaplaceKernel",
    "chain_rule",
    "make_kernel",
    "pairwise_distance",
    "transform",
]
