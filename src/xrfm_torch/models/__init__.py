"""The public models and their persistence: one contract, one factory.

Layer 5: imports :mod:`xrfm_torch.tree` and the layers below. :class:`xRFMTree` (one model: a
tree, or trees averaged over input maps), the models that hold models built on it (the
ensembles :class:`BaggedTree` and :class:`KernelBlend`, sharing
:class:`~xrfm_torch.models.ensemble.Ensemble`, and the time-limited selector :class:`Anytime`,
all :class:`~xrfm_torch.models.holder.Holder` s), the contract they keep (:mod:`~xrfm_torch.models.contract`), the factory that builds them from settings
(:mod:`~xrfm_torch.models.factory`) and saving, loading and export.
"""

from xrfm_torch.models.anytime import Anytime
from xrfm_torch.models.bagging import BaggedTree
from xrfm_torch.models.blend import KernelBlend
from xrfm_torch.models.export import ExportableEnsemble, ExportableTree, export_onnx, export_program
from xrfm_torch.models.io import load_model, save_model
from xrfm_torch.models.xrfm_tree import xRFMTree

__all__ = [
    "Anytime",
    "BaggedTree",
    "ExportableEnsemble",
    "ExportableTree",
    "KernelBlend",
    "export_onnx",
    "export_program",
    "load_model",
    "save_model",
    "xRFMTree",
]
