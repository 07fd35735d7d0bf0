"""Model files: ``save_model`` / ``load_model``, and the state-dict format version.

A model file (an ``xRFMTree``, a :class:`~xrfm_torch.models.bagging.BaggedTree` or a
:class:`~xrfm_torch.models.blend.KernelBlend`; the ``format``
string names the file layout, the config the class) is ``torch.save`` of plain data only::

    {"format": "xrfm_torch.xRFMTree", "format_version": int, "config": model.get_config(),
     "state_dict": model.state_dict()}

so it loads with ``torch.load(weights_only=True)``: no code is unpickled. The config is then
built by :func:`~xrfm_torch.numerics.config.from_config`, which builds only the package's own
classes (the registered models, :func:`~xrfm_torch.models.factory.register_model`, and the parts
their configs name, :data:`~xrfm_torch.numerics.config.CONFIG_TARGETS`: ``LeafConfig``, the
kernels, the split rules), checking every ``_target_`` before importing anything; a file naming
any other target is refused with a ``ValueError``. So reading a file from an untrusted source
runs no code of the file's choosing (its tensors still go through ``load_state_dict``'s shape
checks only: a crafted file can make a model that predicts nonsense). It holds the leaves' support points, i.e. training rows (in the
model's standardized units): share it as you would the training data.

Every ``xRFMTree.state_dict()`` also carries ``_extra_state = {"format_version": N}``; a state
saved before versions existed (no such key) loads as version 0, and a state from a newer
version than this package knows is refused with a message naming both versions
(:mod:`xrfm_torch.models.state`, which also upgrades older layouts on load).
"""

from __future__ import annotations

import os
import pickle
import zipfile
from typing import Any

import torch

from xrfm_torch.models.contract import Model
from xrfm_torch.models.factory import model_from_config
from xrfm_torch.models.state import STATE_FORMAT_VERSION

#: The label of a model file (any model kind; files written before 0.16 carry ``OLD_FORMATS``).
FILE_FORMAT = "xrfm_torch.model"
OLD_FORMATS = ("xrfm_torch.xRFMTree",)
#: The label of a scikit-learn estimator's file (:mod:`xrfm_torch.estimators.files`).
ESTIMATOR_FORMAT = "xrfm_torch.estimator"


def save_model(model: Model, path: str | os.PathLike[str]) -> None:
    """Write a fitted model to ``path`` (plain data; see the module docstring).

    Raises:
        RuntimeError: The model is not fitted.
    """
    torch.save(model_payload(model), path)


def model_payload(model: Model) -> dict[str, Any]:
    """A fitted model's file data (the module docstring; an estimator file nests it).

    Raises:
        RuntimeError: The model is not fitted.
    """
    if not model.is_fitted:
        raise RuntimeError(f"save_model needs a fitted model; this {type(model).__name__} is not")
    return {
        "format": FILE_FORMAT,
        "format_version": STATE_FORMAT_VERSION,
        "config": model.get_config(),
        "state_dict": model.state_dict(),
    }


def load_model(
    path: str | os.PathLike[str], map_location: str | torch.device | None = None
) -> Model:
    """Read a model written by :func:`save_model` (``torch.load(weights_only=True)``).

    Args:
        path: The file.
        map_location: Device for the tensors (as in ``torch.load``).

    Raises:
        FileNotFoundError: No such file.
        ValueError: The file is truncated or not a torch file, holds something other than an
            xrfm_torch model, or comes from a newer format version.
    """
    return model_from_payload(read_file(path, map_location), path, map_location)


def read_file(path: str | os.PathLike[str], map_location: str | torch.device | None = None) -> Any:
    """The plain data of a torch file (``torch.load(weights_only=True)``: no code unpickled).

    Raises:
        FileNotFoundError: No such file.
        ValueError: The file is truncated, corrupted or not a torch file of plain data.
    """
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except FileNotFoundError:
        raise
    except (OSError, RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile) as err:
        size = os.path.getsize(path)
        raise ValueError(
            f"{os.fspath(path)!r} ({size} bytes) is not a readable xrfm_torch model file: it is "
            f"truncated, corrupted or not a torch file ({type(err).__name__}: "
            f"{str(err).splitlines()[0][:200]})"
        ) from err


def model_from_payload(
    obj: Any, path: str | os.PathLike[str], map_location: str | torch.device | None = None
) -> Model:
    """The model of a model file's plain data (checked: format, version, config allow-list).

    Raises:
        ValueError: ``obj`` is not a model file's data (an estimator file is named as such),
            or comes from a newer format version.
    """
    if isinstance(obj, dict) and obj.get("format") == ESTIMATOR_FORMAT:
        raise ValueError(
            f"{os.fspath(path)!r} holds a scikit-learn estimator, not a model: read it with "
            "xrfm_torch.load_model"
        )
    if not isinstance(obj, dict) or obj.get("format") not in (FILE_FORMAT, *OLD_FORMATS):
        what = (
            f"a dict with keys {sorted(map(str, obj))[:8]}"
            if isinstance(obj, dict)
            else type(obj).__name__
        )
        raise ValueError(
            f"{os.fspath(path)!r} holds {what}, not an xrfm_torch model written by save_model"
        )
    version = obj.get("format_version")
    if not isinstance(version, int) or version > STATE_FORMAT_VERSION:
        raise ValueError(
            f"{os.fspath(path)!r} has format version {version!r}; this xrfm_torch reads versions "
            f"up to {STATE_FORMAT_VERSION}: upgrade the package"
        )
    model = model_from_config(obj["config"])
    model.load_state_dict(obj["state_dict"])
    return model.to(map_location) if map_location is not None else model
