"""xrfm_torch: tree-partitioned Recursive Feature Machines in PyTorch.

The core (this package's top level) imports only torch. Lightning, Hydra and torchmetrics pieces live
in :mod:`xrfm_torch.lit`, which imports the core.
"""

from xrfm_torch.__about__ import __version__
from xrfm_torch.kernels import (
    KERNELS,
    GaussianKernel,
    Kernel,
    LaplaceKernel,
    LpqLaplaceKernel,
    ProductLaplaceKernel,
)
from xrfm_torch.leaf import LeafRFM
from xrfm_torch.splits import AGOPSplit, CARTSplit, PCASplit, RandomSplit, Split
from xrfm_torch.tree import xRFMTree

__all__ = [
    "KERNELS",
    "AGOPSplit",
    "CARTSplit",
    "GaussianKernel",
    "Kernel",
    "LaplaceKernel",
    "LeafRFM",
    "LpqLaplaceKernel",
    "PCASplit",
    "ProductLaplaceKernel",
    "RandomSplit",
    "Split",
    "__version__",
    "xRFMTree",
]
