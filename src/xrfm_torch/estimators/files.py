"""Estimator files: a fitted ``XRFMRegressor`` / ``XRFMClassifier`` as plain data.

:func:`xrfm_torch.save_model` writes, and :func:`xrfm_torch.load_model` reads, through here
when it is given an estimator. The file is ``torch.save`` of plain data only, as a model file
is (:mod:`xrfm_torch.models.io`)::

    {"format": "xrfm_torch.estimator", "format_version": 1,
     "estimator": "XRFMClassifier",          # a key of ESTIMATORS, never a class path
     "params": {...},                        # get_params(), plain data
     "fitted": {"n_features_in_": 7, "feature_names_in_": [...] | None,
                "categorical": [...], "levels": [[...], ...],   # the column encoding
                "classes": [...], "classes_dtype": "<U3",      # classifier
                "y_ndim": 1},                                  # regressor
     "model": {"format": "xrfm_torch.model", ...}}            # model_'s own file data

So it loads with ``torch.load(weights_only=True)``: nothing is unpickled as code. The estimator
class is looked up in :data:`ESTIMATORS` by name, the model is built from its config through
the same allow-list as a model file, and the fitted attributes are checked against each other
(column counts, names, levels) before the estimator is returned. The loaded estimator reads a
DataFrame (column names, text categories, missing cells) and predicts bit for bit as the saved
one did.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import numpy as np

from xrfm_torch.data.tabular import TableEncoder
from xrfm_torch.estimators.base import _XRFMEstimator
from xrfm_torch.estimators.classifier import XRFMClassifier
from xrfm_torch.estimators.regressor import XRFMRegressor
from xrfm_torch.models.io import ESTIMATOR_FORMAT, model_from_payload, model_payload
from xrfm_torch.numerics.config import check_targets, from_config, to_plain

log = logging.getLogger(__name__)

#: The layout version of estimator files this package writes and reads.
ESTIMATOR_FORMAT_VERSION = 1
#: The estimator classes a file may name (by these keys only).
ESTIMATORS: dict[str, type[_XRFMEstimator]] = {
    "XRFMRegressor": XRFMRegressor,
    "XRFMClassifier": XRFMClassifier,
}
_SCALARS = (str, int, float, bool, type(None))


def is_estimator(obj: object) -> bool:
    """Whether ``obj`` is one of :data:`ESTIMATORS` (subclasses too)."""
    return isinstance(obj, tuple(ESTIMATORS.values()))


def estimator_payload(est: _XRFMEstimator) -> dict[str, Any]:
    """The plain data of a fitted estimator (module docstring).

    Raises:
        TypeError: ``est`` is not one of :data:`ESTIMATORS`.
        RuntimeError: It is not fitted.
        ValueError: A parameter, a label or a category level is not plain data (naming it).
    """
    name = next((k for k, c in ESTIMATORS.items() if isinstance(est, c)), None)
    if name is None:
        raise TypeError(
            f"save_model takes an xrfm_torch model or a fitted XRFMRegressor / XRFMClassifier, "
            f"got {type(est).__name__}"
        )
    if not hasattr(est, "model_"):
        raise RuntimeError(f"save_model needs a fitted estimator; this {name} is not fitted")
    params = {}
    for key, value in est.get_params(deep=False).items():
        if key == "random_state" and not isinstance(value, (int, np.integer, type(None))):
            log.info("save_model: random_state %s is saved as None", type(value).__name__)
            value = None
        params[key] = _plain(value, f"parameter {key!r}")
    enc = est.encoder_
    names = getattr(est, "feature_names_in_", None)
    fitted: dict[str, Any] = {
        "n_features_in_": int(est.n_features_in_),
        "feature_names_in_": None if names is None else [str(n) for n in names],
        "categorical": [int(j) for j in enc.categorical],
        "levels": [
            _plain(lv.tolist(), f"the levels of column {enc.names[j]!r}")
            for j, lv in zip(enc.categorical, enc.levels)
        ],
        "names": list(enc.names),
    }
    if isinstance(est, XRFMClassifier):
        fitted["classes"] = _plain(est.classes_.tolist(), "the class labels")
        fitted["classes_dtype"] = est.classes_.dtype.str
    else:
        fitted["y_ndim"] = int(est._y_ndim)
    model = est.model_
    return {
        "format": ESTIMATOR_FORMAT,
        "format_version": ESTIMATOR_FORMAT_VERSION,
        "estimator": name,
        "params": params,
        "fitted": fitted,
        "model": model_payload(model),
    }


def estimator_from_payload(obj: dict[str, Any], path: str | os.PathLike[str]) -> _XRFMEstimator:
    """The fitted estimator of a payload read from ``path`` (checked; module docstring).

    Raises:
        ValueError: The payload names no known estimator, a parameter it does not take, a
            target outside the allow-list, a newer format version, or fitted attributes that
            disagree with each other (each message names the offending value).
    """
    where = os.fspath(path)
    version = obj.get("format_version")
    if not isinstance(version, int) or version > ESTIMATOR_FORMAT_VERSION:
        raise ValueError(
            f"{where!r} has estimator format version {version!r}; this xrfm_torch reads "
            f"versions up to {ESTIMATOR_FORMAT_VERSION}: upgrade the package"
        )
    name = obj.get("estimator")
    if not isinstance(name, str) or name not in ESTIMATORS:
        raise ValueError(f"{where!r} names estimator {name!r}; known: {sorted(ESTIMATORS)}")
    params, fitted, model = (_dict(obj, k, where) for k in ("params", "fitted", "model"))
    check_targets(params, f"{where!r} params")  # a Kernel given as a config, nothing else
    cls = ESTIMATORS[name]
    try:
        est = cls(**_params(params))
    except TypeError as err:
        raise ValueError(f"{where!r}: {name} does not take these params ({err})") from None
    n = fitted.get("n_features_in_")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"{where!r}: n_features_in_ must be an int >= 1, got {n!r}")
    _encoding(est, fitted, n, where)
    if isinstance(est, XRFMClassifier):
        classes, dtype = fitted.get("classes"), fitted.get("classes_dtype")
        if not isinstance(classes, list) or len(classes) < 2 or not isinstance(dtype, str):
            raise ValueError(f"{where!r}: the class labels must be a list of >= 2, got {classes!r}")
        est.classes_ = np.array(classes, dtype=np.dtype(dtype))
    else:
        y_ndim = fitted.get("y_ndim")
        if y_ndim not in (1, 2):
            raise ValueError(f"{where!r}: y_ndim must be 1 or 2, got {y_ndim!r}")
        est._y_ndim = y_ndim
    est.model_ = model_from_payload(model, path)  # format, version and config allow-list checked
    return est


def _encoding(est: _XRFMEstimator, fitted: dict[str, Any], n: int, where: str) -> None:
    """Set the estimator's column names and encoder from ``fitted``, checked against ``n``."""
    names, categorical = fitted.get("feature_names_in_"), fitted.get("categorical")
    levels, columns = fitted.get("levels"), fitted.get("names")
    if names is not None and (not isinstance(names, list) or len(names) != n):
        raise ValueError(f"{where!r}: feature_names_in_ must list {n} names, got {names!r}")
    if not isinstance(columns, list) or len(columns) != n:
        raise ValueError(f"{where!r}: the encoder must name {n} columns, got {columns!r}")
    ok = isinstance(categorical, list) and all(
        isinstance(j, int) and 0 <= j < n for j in categorical
    )
    if not ok or len(set(categorical)) != len(categorical):  # type: ignore[arg-type]
        raise ValueError(
            f"{where!r}: categorical must be distinct indices < {n}, got {categorical!r}"
        )
    if not isinstance(levels, list) or len(levels) != len(categorical):  # type: ignore[arg-type]
        raise ValueError(f"{where!r}: need one list of levels per categorical column")
    est.n_features_in_ = n
    if names is not None:
        est.feature_names_in_ = np.array(names, dtype=object)
    est.encoder_ = TableEncoder(
        list(categorical),  # type: ignore[arg-type]
        [np.array(lv, dtype=object) for lv in levels],
        [str(c) for c in columns],
    )


def _params(params: dict[str, Any]) -> dict[str, Any]:
    """Constructor arguments from saved params: a kernel config built, a blend's names a tuple."""
    out = dict(params)
    kernel = out.get("kernel")
    if isinstance(kernel, list):
        out["kernel"] = tuple(kernel)
    elif isinstance(kernel, dict):
        out["kernel"] = from_config(kernel)
    return out


def _dict(obj: dict[str, Any], key: str, where: str) -> dict[str, Any]:
    value = obj.get(key)
    if not isinstance(value, dict):
        raise ValueError(f"{where!r}: {key!r} must be a dict, got {type(value).__name__}")
    return value


def _plain(value: Any, what: str) -> Any:
    """``value`` as plain data (numpy scalars as Python ones; a Kernel as its config).

    Raises:
        ValueError: Something else (naming ``what`` and its type).
    """
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, _SCALARS):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v, what) for v in value]
    if isinstance(value, dict):
        return {_plain(k, what): _plain(v, what) for k, v in value.items()}
    if hasattr(value, "get_config") or type(value).__module__.startswith("xrfm_torch"):
        return to_plain(value)
    raise ValueError(
        f"save_model: {what} holds a {type(value).__name__} ({value!r:.60}), which an estimator "
        "file cannot hold (plain numbers, text, bools and None only)"
    )
