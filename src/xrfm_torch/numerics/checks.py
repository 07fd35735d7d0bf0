"""Input validation shared by the core modules.

Every check raises ``ValueError`` (or ``TypeError``) with the offending name and value, so that bad
input never turns into a silently wrong model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor

from xrfm_torch.numerics.host import read_scalars


def as_tensor(x: Any, name: str, device: torch.device | str | None = None) -> Tensor:
    """``x`` as a tensor (no copy when it is one); ``TypeError`` naming ``name`` if it cannot be.

    Arrays and nested lists are converted (onto ``device`` when given); text or object arrays
    are refused with a message that names the estimators, which encode them.
    """
    if isinstance(x, Tensor):
        return x
    kind = getattr(getattr(x, "dtype", None), "kind", None)  # a numpy dtype's kind
    if kind in ("U", "S", "O"):
        raise TypeError(
            f"{name} holds {x.dtype} values (text or objects), but the core models take numbers: "
            "class labels 0 .. K-1 and float inputs. XRFMClassifier takes labels of any type "
            "(classes_), and both estimators encode text columns as categories"
        )
    try:
        return torch.as_tensor(x, device=device)
    except (TypeError, ValueError, RuntimeError) as err:
        raise TypeError(
            f"{name} must be a tensor or array-like of numbers, got {type(x).__name__}"
        ) from err


def as_float_matrix(
    x: Any,
    name: str,
    *,
    n_features: int | None = None,
    allow_nan: bool = False,
    finite: bool = True,
) -> Tensor:
    """Return ``x`` as a finite, non-empty floating 2-D tensor.

    Args:
        x: Tensor or array-like, shape (n, d).
        name: Argument name used in error messages.
        n_features: If given, the required number of columns.
        allow_nan: Let NaN through (missing cells); infinities are refused either way.
        finite: Check the values here (``False``: the caller checks them, e.g. with
            :func:`check_all_finite` together with other arguments).

    Returns:
        The input as a tensor (no copy when it already is a floating tensor).
    """
    x = as_tensor(x, name)
    if not x.is_floating_point():
        raise TypeError(f"{name} must have a floating dtype, got {x.dtype}")
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_features), got shape {tuple(x.shape)}")
    if x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} is empty: shape {tuple(x.shape)}")
    if n_features is not None and x.shape[1] != n_features:
        raise ValueError(f"{name} has {x.shape[1]} features but the model expects {n_features}")
    if finite:
        check_finite(x, name, allow_nan=allow_nan)
    return x


def as_float_targets(
    y: Any, name: str, *, n_rows: int, dtype: torch.dtype, finite: bool = True
) -> Tensor:
    """Return targets as a finite floating tensor of shape (n, c).

    Args:
        y: Targets, shape (n,) or (n, c).
        name: Argument name used in error messages.
        n_rows: Required number of rows (the matching inputs' row count).
        dtype: Floating dtype to cast to (the inputs' dtype).
        finite: Check the values here (as in :func:`as_float_matrix`).
    """
    y = as_tensor(y, name)
    if y.ndim == 1:
        y = y[:, None]
    if y.ndim != 2:
        raise ValueError(f"{name} must be 1-D or 2-D, got shape {tuple(y.shape)}")
    if y.shape[0] != n_rows:
        raise ValueError(f"{name} has {y.shape[0]} rows but the inputs have {n_rows}")
    if y.shape[1] == 0:
        raise ValueError(f"{name} has no output columns: shape {tuple(y.shape)}")
    y = y.to(dtype)
    if finite:
        check_finite(y, name)
    return y


def as_real_dtype(x: Tensor, dtype: torch.dtype, name: str) -> Tensor:
    """Real ``x`` in ``dtype`` (a differentiable cast; rounds a wider dtype); complex is refused.

    Raises:
        TypeError: ``x`` holds complex numbers.
    """
    if x.dtype == dtype:
        return x
    if x.is_complex():
        raise TypeError(f"{name} must hold real numbers, got dtype {x.dtype}")
    return x.to(dtype)


def all_finite(x: Tensor) -> Tensor:
    """Whether every entry of the float tensor ``x`` is finite: a 0-dim bool tensor, not read back.

    ``x - x`` is exactly 0 where ``x`` is finite and NaN at an infinity or a NaN: three
    operations where ``isfinite(x).all()`` dispatches five (on a GPU each is a launch).
    Integer and bool tensors are finite.
    """
    if not (x.is_floating_point() or x.is_complex()):
        return torch.ones((), dtype=torch.bool, device=x.device)
    return ((x - x) == 0).all()


def check_all_finite(items: Sequence[tuple[Tensor, str, bool]]) -> None:
    """:func:`check_finite` of several ``(tensor, name, allow_nan)`` with one read back.

    The flags of all of them come to the host together (one host-device synchronization on a
    GPU); the first offending tensor, in the given order, gets :func:`check_finite`'s error.
    """
    if not items:
        return
    flags = [torch.isinf(x).any() if nan else ~all_finite(x) for x, _, nan in items]
    for (x, name, nan), bad in zip(items, read_scalars(*flags)):
        if bad:
            check_finite(x, name, allow_nan=nan)


def check_finite(x: Tensor, name: str, *, allow_nan: bool = False) -> None:
    """Raise ``ValueError`` naming the first non-finite entry of ``x`` (NaN allowed if asked)."""
    bad = torch.isinf(x) if allow_nan else ~torch.isfinite(x)
    if bool(bad.any()):
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"{name} contains {int(bad.sum())} non-finite value(s), first at index {idx}: "
            f"{x[idx].item()}"
        )


def check_positive(value: float, name: str, *, allow_zero: bool = False) -> float:
    """Raise ``ValueError`` unless ``value`` is a finite positive (or non-negative) number."""
    v = float(value)
    ok = v >= 0 if allow_zero else v > 0
    if not (ok and v == v and v != float("inf")):
        kind = "non-negative" if allow_zero else "positive"
        raise ValueError(f"{name} must be a finite {kind} number, got {value!r}")
    return v


def check_bool(value: bool, name: str) -> bool:
    """Raise ``TypeError`` unless ``value`` is a ``bool`` (not merely truthy: ``1``, ``"yes"``)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {value!r}")
    return value


def check_int(value: int, name: str, low: int, high: int | None = None) -> int:
    """Raise ``ValueError`` unless ``value`` is an integer in ``[low, high]`` (no upper bound: None)."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and int(value) == value
    if not ok or value < low or (high is not None and value > high):
        bound = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise ValueError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


def check_fraction(value: float, name: str, *, low: float = 0.0, high: float = 1.0) -> float:
    """Raise ``ValueError`` unless ``low < value < high``... inclusive of ``high``."""
    v = float(value)
    if not low < v <= high:
        raise ValueError(f"{name} must be in ({low}, {high}], got {value!r}")
    return v


def as_weights(w: Any, name: str, *, n_rows: int, dtype: torch.dtype, device: Any) -> Tensor:
    """Sample weights as a floating (n,) tensor: finite, non-negative, not all zero.

    Args:
        w: Weights, shape (n,) (a tensor, array or list).
        name: Argument name used in error messages.
        n_rows: Required length (the matching inputs' row count).
        dtype: Floating dtype to cast to (the inputs').
        device: Device to move to (the inputs').
    """
    w = as_tensor(w, name)
    if w.is_complex() or w.dtype == torch.bool:
        raise TypeError(f"{name} must hold real numbers, got dtype {w.dtype}")
    if w.ndim != 1 or w.shape[0] != n_rows:
        raise ValueError(f"{name} must have shape ({n_rows},), got {tuple(w.shape)}")
    w = w.to(dtype=dtype, device=device)
    check_finite(w, name)
    if bool((w < 0).any()):
        i = int((w < 0).nonzero()[0, 0])
        raise ValueError(f"{name} must be non-negative; index {i} holds {w[i].item()}")
    if not bool((w > 0).any()):
        raise ValueError(f"{name} is zero for every row: no row would have any influence")
    return w
