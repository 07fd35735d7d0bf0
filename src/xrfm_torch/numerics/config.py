"""Plain-data configs of objects built from constructor arguments (checkpoints, ``get_config``).

An object becomes ``{"_target_": "module.Class", **constructor_args}`` (the Hydra convention), with
each argument's value read back from the same-named attribute. Values that are themselves such
objects (a kernel, a split rule, a :class:`~xrfm_torch.leaf.config.LeafConfig`) nest the same way;
dtypes become their names and sequences lists. Plain data survives ``torch.load`` with
``weights_only=True`` and round-trips through YAML.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch

PLAIN = (str, int, float, bool, type(None))


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


def from_config(cfg: dict[str, Any]) -> Any:
    """Rebuild an object (and the objects nested in its arguments) from :func:`to_config` output."""
    cfg = dict(cfg)
    target = cfg.pop("_target_", None)
    if not isinstance(target, str) or "." not in target:
        raise ValueError(f"config needs a '_target_' class path, got {target!r}")
    module, _, name = target.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    args = {
        k: from_config(v) if isinstance(v, dict) and "_target_" in v else v for k, v in cfg.items()
    }
    return cls(**args)
