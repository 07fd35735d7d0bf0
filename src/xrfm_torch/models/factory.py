"""The default ensemble per task, one rule for every entry point.

``XRFMClassifier()``, ``XRFMLitModule`` (and so ``python train.py``) build the same model for a
task: classification fits the Laplace and the Gaussian kernel and mixes them
(:class:`~xrfm_torch.models.blend.KernelBlend`), each as ``AUTO_BAGS`` cross-fitted bags when the
fit has at most ``AUTO_BAG_ROWS`` rows (on small tables one model's validation rows are too few to
calibrate its probabilities); regression fits one tree. ``xRFMTree`` itself is always one tree:
it is the building block the ensembles wrap (docs/design.md: defaults). The classifier's default
fits 10 single trees below ``AUTO_BAG_ROWS`` rows (2 kernels x 5 bags; measured 6.7-8.9x one
tree's fit time, ``python -m bench.preset_costs``), 2 above.
"""

from __future__ import annotations

from collections.abc import Sequence

from xrfm_torch.models.bagging import BaggedTree
from xrfm_torch.models.blend import KernelBlend
from xrfm_torch.models.xrfm_tree import xRFMTree
from xrfm_torch.tree.targets import Task

#: ``n_bags="auto"``: this many cross-fitted bags for a fit of at most ``AUTO_BAG_ROWS`` rows.
AUTO_BAGS = 5
AUTO_BAG_ROWS = 20_000
#: ``kernel="auto"`` for classification: these kernels, blended.
CLASSIFICATION_KERNELS: tuple[str, ...] = ("laplace", "gaussian")


def default_bags(task: Task) -> int | str:
    """``n_bags`` of the default model: ``"auto"`` (:func:`auto_bags`) for classification, else 1."""
    return "auto" if task == "classification" else 1


def auto_bags(n_rows: int | None, rarest_class_rows: int | None = None) -> int:
    """``n_bags="auto"`` resolved: ``AUTO_BAGS`` or 1.

    ``AUTO_BAGS`` for a fit of ``4 * AUTO_BAGS`` to ``AUTO_BAG_ROWS`` rows (training plus
    validation) whose rarest class, if any, has 2 rows or more (every bag trains on every class),
    else 1. ``n_rows=None`` (unknown): 1.
    """
    if n_rows is None:
        return 1
    if not 4 * AUTO_BAGS <= n_rows <= AUTO_BAG_ROWS:
        return 1
    if rarest_class_rows is not None and rarest_class_rows < 2:
        return 1
    return AUTO_BAGS


def auto_kernels(task: Task) -> tuple[str, ...] | None:
    """Kernels the default model blends (``None``: the tree's own kernel alone)."""
    return CLASSIFICATION_KERNELS if task == "classification" else None


def build_model(
    tree: xRFMTree, n_bags: int = 1, kernels: Sequence[str] | None = None
) -> xRFMTree | BaggedTree | KernelBlend:
    """The one place a tree becomes an ensemble (the estimators and the LightningModule use it).

    ``n_bags`` cross-fitted bags of ``tree`` (1: the tree itself), fitted once per kernel of
    ``kernels`` and blended (``None``: the tree's kernel alone).
    """
    model: xRFMTree | BaggedTree = tree
    if n_bags > 1:
        model = BaggedTree(tree, n_bags=n_bags, distributed=tree.config.distributed)
    return model if not kernels else KernelBlend(model, kernels=list(kernels))
