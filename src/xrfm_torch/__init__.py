"""xrfm_torch: tree-partitioned Recursive Feature Machines in PyTorch.

Layers, each importing only the ones before it: :mod:`~xrfm_torch.numerics` (tensor functions),
:mod:`~xrfm_torch.kernels`, :mod:`~xrfm_torch.leaf` (one RFM leaf), :mod:`~xrfm_torch.inputs`
(input maps), :mod:`~xrfm_torch.tree` (the partition tree), :mod:`~xrfm_torch.models` (the
models, their factory and files). This core imports only torch; the Lightning,
Hydra and torchmetrics pieces live in :mod:`xrfm_torch.lit` and :mod:`xrfm_torch.pipeline`, and
datasets in :mod:`xrfm_torch.data` (numpy). The scikit-learn estimators ``XRFMRegressor`` and
``XRFMClassifier`` (:mod:`xrfm_torch.estimators`) load scikit-learn on first use.
"""

from typing import Any

from xrfm_torch.__about__ import __version__
from xrfm_torch.files import load_model, save_model
from xrfm_torch.inputs import InputMap, QuantileNormal
from xrfm_torch.kernels import (
    KERNELS,
    GaussianKernel,
    Kernel,
    LaplaceKernel,
    LpqLaplaceKernel,
    ProductLaplaceKernel,
)
from xrfm_torch.leaf import LeafConfig, LeafRFM
from xrfm_torch.models import (
    Anytime,
    BaggedTree,
    ExportableTree,
    KernelBlend,
    export_onnx,
    export_program,
    xRFMTree,
)
from xrfm_torch.tree.config import TreeConfig
from xrfm_torch.tree.splits import AGOPSplit, CARTSplit, PCASplit, RandomSplit, SplitRule

__all__ = [
    "KERNELS",
    "AGOPSplit",
    "Anytime",
    "BaggedTree",
    "CARTSplit",
    "ExportableTree",
    "GaussianKernel",
    "InputMap",
    "Kernel",
    "KernelBlend",
    "LaplaceKernel",
    "LeafConfig",
    "LeafRFM",
    "LpqLaplaceKernel",
    "PCASplit",
    "ProductLaplaceKernel",
    "QuantileNormal",
    "RandomSplit",
    "SplitRule",
    "TreeConfig",
    "XRFMClassifier",
    "XRFMRegressor",
    "__version__",
    "export_onnx",
    "export_program",
    "load_model",
    "save_model",
    "xRFMTree",
]


def __getattr__(name: str) -> Any:
    # the estimators need scikit-learn; importing the core must not
    if name in ("XRFMClassifier", "XRFMRegressor"):
        from xrfm_torch import estimators

        return getattr(estimators, name)
    raise AttributeError(f"module 'xrfm_torch' has no attribute {name!r}")
