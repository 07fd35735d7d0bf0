"""Plain-data configs of kernels and split rules (for checkpoints and ``xRFMTree.get_config``).

An object becomes ``{"_target_": "module.Class", **constructor_args}`` (the Hydra convention), with
the argument values read back from same-named attributes. Plain data survives ``torch.load`` with
``weights_only=True`` and round-trips through YAML.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import torch


def to_config(obj: Any) -> dict[str, Any]:
    """``{"_target_": qualified class name, **constructor args read from attributes}``."""
    cls = type(obj)
    cfg: dict[str, Any] = {"_target_": f"{cls.__module__}.{cls.__qualname__}"}
    for name, param in inspect.signature(cls.__init__).parameters.items():
        if name == "self" or param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if not hasattr(obj, name):
            raise TypeError(f"{cls.__name__} has no attribute {name!r} to export its config")
        value = getattr(obj, name)
        if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
            value = value.item()  # 0-d tensors (e.g. a kernel's bandwidth buffer)
        cfg[name] = value
    return cfg


def from_config(cfg: dict[str, Any]) -> Any:
    """Rebuild an object from :func:`to_config` output."""
    cfg = dict(cfg)
    target = cfg.pop("_target_", None)
    if not isinstance(target, str) or "." not in target:
        raise ValueError(f"config needs a '_target_' class path, got {target!r}")
    module, _, name = target.rpartition(".")
    cls = getattr(importlib.import_module(module), name)
    return cls(**cfg)


def plain_config(args: dict[str, Any], **objects: Any) -> dict[str, Any]:
    """Constructor arguments as plain data.

    Objects become :func:`to_config` dicts, dtypes their names, sequences lists (of floats, unless
    strings).
    """
    cfg = dict(args)
    for key, value in cfg.items():
        if isinstance(value, torch.dtype):
            cfg[key] = str(value).removeprefix("torch.")
        elif isinstance(value, (list, tuple)) or type(value).__name__ == "ListConfig":
            cfg[key] = [v if isinstance(v, str) else float(v) for v in value]
    cfg.update({key: to_config(obj) for key, obj in objects.items()})
    return cfg


def objects_from_config(cfg: dict[str, Any], keys: tuple[str, ...]) -> dict[str, Any]:
    """Copy of ``cfg`` with the ``_target_`` dicts under ``keys`` rebuilt into objects."""
    out = dict(cfg)
    for key in keys:
        if isinstance(out.get(key), dict):
            out[key] = from_config(out[key])
    return out
