"""Where models are built: the default per task, the wrapping of a tree, and configs back to models.

Every entry point builds its model here: ``XRFMClassifier`` / ``XRFMRegressor`` and
``XRFMLitModule`` (so ``python train.py``) through :func:`resolve_bags`, :func:`resolve_kernels`
and :func:`build_model`; :func:`~xrfm_torch.models.io.load_model`, Lightning checkpoints and the
tests through :func:`model_from_config`. The model classes a config may build are the registered
ones (:func:`register_model`): a new kind of model is its own file plus one registration.

The default per task: both tasks fit the Laplace and the Gaussian kernel and mix them
(:class:`~xrfm_torch.models.blend.KernelBlend`); classification fits each as ``AUTO_BAGS``
cross-fitted bags when the fit has at most ``AUTO_BAG_ROWS`` rows (on small tables one model's
validation rows are too few to calibrate its probabilities), regression as one tree.
``xRFMTree`` itself is always one tree:
it is the building block the ensembles wrap (docs/design.md: defaults). The classifier's default
fits 10 single trees below ``AUTO_BAG_ROWS`` rows (2 kernels x 5 bags, the later bags following
the first one's plan; measured 2.1-4.6x one tree's fit time, ``python -m bench.preset_costs``),
2 above.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar, cast

from xrfm_torch.models.anytime import Anytime
from xrfm_torch.models.bagging import BaggedTree
from xrfm_torch.models.blend import KernelBlend, compose
from xrfm_torch.models.contract import Model
from xrfm_torch.models.xrfm_tree import xRFMTree
from xrfm_torch.numerics.config import allow_target, from_config
from xrfm_torch.tree.targets import Task

M = TypeVar("M", bound=type[Model])

#: The model classes a config may build (:func:`register_model`), by their ``_target_`` name.
MODEL_CLASSES: dict[str, type[Model]] = {}


def register_model(cls: M) -> M:
    """Let configs and files build ``cls``: :func:`model_from_config`, ``load_model``, checkpoints.

    ``cls`` keeps the contract (:class:`~xrfm_torch.models.contract.Model`; an ensemble derives
    from :class:`~xrfm_torch.models.ensemble.Ensemble`) and round-trips ``get_config``. Its name
    joins the config allow-list (:func:`~xrfm_torch.numerics.config.allow_target`): loading a
    file still builds only classes registered by code.
    """
    name = f"{cls.__module__}.{cls.__qualname__}"
    allow_target(name)
    MODEL_CLASSES[name] = cls
    return cls


for _cls in (xRFMTree, BaggedTree, KernelBlend, Anytime):
    register_model(_cls)


def model_from_config(cfg: dict[str, Any]) -> Model:
    """Build an unfitted model of a registered class from its ``get_config()`` output.

    Raises:
        ValueError: ``cfg`` names a ``_target_`` outside the allow-list.
        TypeError: ``cfg`` builds something other than a registered model class.
    """
    model = from_config(cfg)
    if type(model) not in MODEL_CLASSES.values():
        raise TypeError(f"the config builds a {type(model).__name__}, not an xrfm_torch model")
    return cast(Model, model)


#: ``n_bags="auto"``: this many cross-fitted bags for a fit of at most ``AUTO_BAG_ROWS`` rows.
AUTO_BAGS = 5
AUTO_BAG_ROWS = 20_000
#: The default model's kernels (both tasks), blended.
DEFAULT_KERNELS: tuple[str, ...] = ("laplace", "gaussian")


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


def resolve_bags(
    n_bags: Any, task: Task, n_rows: int | None, rarest_class_rows: int | None = None
) -> int:
    """``n_bags`` as a count: ``None`` the task's default, ``"auto"`` :func:`auto_bags`.

    Raises:
        ValueError: ``n_bags`` is none of ``None``, ``"auto"`` or an int >= 1.
    """
    if n_bags is None:
        n_bags = default_bags(task)
    if isinstance(n_bags, str) and n_bags == "auto":
        return auto_bags(n_rows, rarest_class_rows if task == "classification" else None)
    if isinstance(n_bags, bool) or not hasattr(n_bags, "__index__") or int(n_bags) < 1:
        raise ValueError(f"n_bags must be an int >= 1, 'auto' or None, got {n_bags!r}")
    return int(n_bags)


def resolve_kernels(kernels: Sequence[str] | str | None, name: str = "kernels") -> list[str] | None:
    """The kernels to blend: ``"auto"`` the default's (``DEFAULT_KERNELS``), ``None`` none.

    Raises:
        ValueError: ``kernels`` is a string other than ``"auto"``.
    """
    if isinstance(kernels, str):
        if kernels != "auto":
            raise ValueError(f"{name} must be 'auto', a list of names or None, got {kernels!r}")
        return list(DEFAULT_KERNELS)
    return None if kernels is None else [str(k) for k in kernels]


def build_model(
    tree: xRFMTree,
    n_bags: int = 1,
    kernels: Sequence[str] | None = None,
    time_limit: float | None = None,
) -> Model:
    """The one place a tree becomes an ensemble (the estimators and the LightningModule use it).

    ``n_bags`` cross-fitted bags of ``tree`` (1: the tree itself), fitted once per kernel of
    ``kernels`` and blended (``None``: the tree's kernel alone). With ``time_limit`` (seconds),
    that model is the target of an anytime fit (:class:`~xrfm_torch.models.anytime.Anytime`):
    the best of its cheaper candidates found within the limit.
    """
    model = compose(tree, n_bags, kernels)
    return model if time_limit is None else Anytime(model, time_limit=time_limit)
