"""Plain-data configs of objects built from constructor arguments (checkpoints, ``get_config``).

An object becomes ``{"_target_": "module.Class", **constructor_args}`` (the Hydra convention), with
each argument's value read back from the same-named attribute. Values that are themselves such
objects (a kernel, a split rule, a :class:`~xrfm_torch.leaf.config.LeafConfig`) nest the same way;
dtypes become their names and sequences lists. Plain data survives ``torch.load`` with
``weights_only=True`` and round-trips through YAML.

A config read from a file is data from whoever wrote the file, so :func:`from_config` builds only
allowed classes (:func:`allowed`): the model classes registered by code
(:func:`~xrfm_torch.models.factory.register_model`, which calls :func:`allow_target`) and the
parts their configs name (:data:`CONFIG_TARGETS`). Every ``_target_``, at every depth of dicts
and lists, is checked before anything is imported or called, and any other target is refused. Hydra's instantiation of the user's own
``conf/`` files does not pass through here and is not restricted.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch

PLAIN = (str, int, float, bool, type(None))

#: The parts a model's config may name: its tree and leaf settings, kernels and split rules (with the
#: registered model classes, exactly what the models' ``get_config`` can emit;
#: ``tests/test_untrusted_files.py`` checks both directions). Names only: checking a target
#: imports nothing. The model classes themselves are allowed by registration, in one place
#: (:func:`~xrfm_torch.models.factory.register_model`).
CONFIG_TARGETS: frozenset[str] = frozenset(
    {
        "xrfm_torch.tree.config.TreeConfig",
        "xrfm_torch.leaf.config.LeafConfig",
        "xrfm_torch.kernels.lpq.LpqLaplaceKernel",
        "xrfm_torch.kernels.lpq.LaplaceKernel",
        "xrfm_torch.kernels.lpq.ProductLaplaceKernel",
        "xrfm_torch.kernels.lpq.GaussianKernel",
        "xrfm_torch.tree.splits.AGOPSplit",
        "xrfm_torch.tree.splits.PCASplit",
        "xrfm_torch.tree.splits.RandomSplit",
        "xrfm_torch.tree.splits.CARTSplit",
    }
)

#: Model classes registered by code (``xrfm_torch.models.factory.register_model``: the package's
#: own at its import, any other only by the code that defines it).
_REGISTERED: set[str] = set()


def allow_target(name: str) -> None:
    """Let configs name the class ``name`` (``module.Class``); only code can call this."""
    _REGISTERED.add(name)


def allowed(target: object) -> bool:
    """Whether a config may name ``target`` (the built-in allow-list, registered classes, old names)."""
    if not isinstance(target, str):
        return False
    target = MOVED_TARGETS.get(target, target)
    return target in CONFIG_TARGETS or target in _REGISTERED


#: Where the models' classes lived before 0.16 (configs saved then name them): read as the new
#: names, so every file saved since the config format exists loads unchanged.
MOVED_TARGETS: dict[str, str] = {
    "xrfm_torch.tree.model.xRFMTree": "xrfm_torch.models.xrfm_tree.xRFMTree",
    "xrfm_torch.tree.bagging.BaggedTree": "xrfm_torch.models.bagging.BaggedTree",
    "xrfm_torch.tree.blend.KernelBlend": "xrfm_torch.models.blend.KernelBlend",
}


def to_config(obj: Any) -> dict[str, Any]:
    """``{"_target_": qualified class name, **constructor args read from attributes}``, nested."""
    cls = type(obj)
    cfg: dict[str, Any] = {"_target_": f"{cls.__module__}.{cls.__qualname__}"}
    for name, param in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if not hasattr(obj, name):
            raise TypeError(f"{cls.__name__} has no attribute {name!r} to export its config")
        cfg[name] = to_plain(getattr(obj, name))
    return cfg


def to_plain(value: Any) -> Any:
    """A constructor argument's value as plain data (see the module docstring)."""
    if isinstance(value, PLAIN):
        return value
    if isinstance(value, torch.dtype):
        return str(value).removeprefix("torch.")
    if isinstance(value, torch.Tensor) and value.ndim == 0:
        return value.item()  # e.g. a kernel's bandwidth buffer
    if isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
        return [to_plain(v) for v in value]
    return to_config(value)


def check_targets(cfg: Any, where: str = "config") -> None:
    """Refuse any ``_target_`` not :func:`allowed`, at any depth (imports nothing).

    Raises:
        ValueError: Naming the offending target, where it sits and the allowed ones.
    """
    if isinstance(cfg, dict):
        if "_target_" in cfg:
            target = cfg["_target_"]
            if not allowed(target):
                raise ValueError(
                    f"{where} names _target_ {target!r}, which is not a class xrfm_torch builds "
                    f"from a config; allowed: {sorted(CONFIG_TARGETS | _REGISTERED)}"
                )
        for key, value in cfg.items():
            check_targets(value, f"{where}[{key!r}]")
    elif isinstance(cfg, (list, tuple)):
        for i, value in enumerate(cfg):
            check_targets(value, f"{where}[{i}]")


def from_config(cfg: dict[str, Any]) -> Any:
    """Rebuild an object (and the objects nested in its arguments) from :func:`to_config` output.

    Every ``_target_`` in ``cfg`` is checked against :data:`CONFIG_TARGETS` first
    (:func:`check_targets`), so a crafted config cannot import or call anything else.

    Raises:
        ValueError: ``cfg`` is not a dict with a ``_target_``, or names a target not allowed.
    """
    if not isinstance(cfg, dict):
        raise ValueError(f"a config must be a dict with a '_target_', got {type(cfg).__name__}")
    check_targets(cfg)
    return _build(cfg)


def _build(cfg: dict[str, Any]) -> Any:
    cfg = dict(cfg)
    target = cfg.pop("_target_", None)
    target = MOVED_TARGETS.get(target, target) if isinstance(target, str) else target
    if not isinstance(target, str) or "." not in target:
        raise ValueError(f"config needs a '_target_' class path, got {target!r}")
    module, _, name = target.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return cls(**{k: _value(v) for k, v in cfg.items()})


def _value(value: Any) -> Any:
    """A constructor argument from a config: nested configs built, lists element by element."""
    if isinstance(value, dict) and "_target_" in value:
        return _build(value)
    if isinstance(value, list):
        return [_value(v) for v in value]
    return value
