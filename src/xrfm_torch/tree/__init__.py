"""The tree: splits, routing, growth, per-leaf fits, temperature, and the :class:`xRFMTree` module.

Layer 4: imports :mod:`xrfm_torch.inputs`, :mod:`xrfm_torch.leaf` and the layers below.
"""

from xrfm_torch.tree.bagging import BaggedTree
from xrfm_torch.tree.blend import KernelBlend
from xrfm_torch.tree.export import ExportableBags, ExportableTree, export_onnx, export_program
from xrfm_torch.tree.io import load_model, save_model
from xrfm_torch.tree.model import xRFMTree

__all__ = [
    "BaggedTree",
    "ExportableBags",
    "ExportableTree",
    "KernelBlend",
    "export_onnx",
    "export_program",
    "load_model",
    "save_model",
    "xRFMTree",
]
