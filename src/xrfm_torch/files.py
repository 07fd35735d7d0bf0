"""The public ``save_model`` / ``load_model``: models and fitted scikit-learn estimators.

A model (``xRFMTree``, ``BaggedTree``, ``KernelBlend``, ``Anytime``) goes to a model file
(:mod:`xrfm_torch.models.io`); a fitted ``XRFMRegressor`` / ``XRFMClassifier`` to an estimator
file (:mod:`xrfm_torch.estimators.files`), which also holds its column encoding, so the loaded
estimator predicts a DataFrame as the saved one did. Both are plain data read with
``torch.load(weights_only=True)``; a file runs none of its own code when loaded. This module
sits above the layers it dispatches to, and imports scikit-learn only for an estimator.
"""

from __future__ import annotations

import os
from typing import Any

import torch
from torch import nn

from xrfm_torch.models import io


def save_model(model: Any, path: str | os.PathLike[str]) -> None:
    """Write a fitted model or a fitted ``XRFMRegressor`` / ``XRFMClassifier`` to ``path``.

    Raises:
        RuntimeError: It is not fitted.
        TypeError: It is neither.
        ValueError: An estimator holds a value a file cannot (a parameter or label that is not
            plain data; the message names it).
    """
    if isinstance(model, nn.Module):
        io.save_model(model, path)  # type: ignore[arg-type]
        return
    files = _estimator_files()
    torch.save(files.estimator_payload(model), path)


def load_model(path: str | os.PathLike[str], map_location: str | torch.device | None = None) -> Any:
    """Read a file written by :func:`save_model`: the model, or the fitted estimator.

    Args:
        path: The file.
        map_location: Device for the tensors (as in ``torch.load``); an estimator then also
            predicts there.

    Raises:
        FileNotFoundError: No such file.
        ValueError: The file is not an xrfm_torch file, names a class or a parameter outside
            the allow-lists, or comes from a newer format version (the message names it).
    """
    obj = io.read_file(path, map_location)
    if isinstance(obj, dict) and obj.get("format") == io.ESTIMATOR_FORMAT:
        est = _estimator_files().estimator_from_payload(obj, path)
        if map_location is not None:
            est.set_params(device=str(torch.device(map_location)))
        return est
    return io.model_from_payload(obj, path, map_location)


def _estimator_files() -> Any:
    try:
        from xrfm_torch.estimators import files
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            f"estimator files need scikit-learn ({err.name} is missing): "
            "pip install 'xrfm-torch[sklearn]'"
        ) from err
    return files
