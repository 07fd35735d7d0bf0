"""The versioned layout of ``xRFMTree.state_dict()``: its version, the check, the upgrades.

Every state carries ``_extra_state = {"format_version": N}``. A state saved before versions
existed has no such key and is version 0; a newer version than this package knows is refused
with a message naming both. Older layouts are brought to the current one on load, before torch
copies the tensors, so a model file or checkpoint of any earlier version loads into a fresh
model (the leaves upgrade their own entries: :func:`xrfm_torch.leaf.state.upgrade_leaf_state`).
"""

from __future__ import annotations

from typing import Any

import torch

#: Version of the ``xRFMTree.state_dict()`` layout; 0 = saved before versions existed. Bump it
#: when the layout changes, and keep loading the older ones.
#: 2: leaves have ``offset_`` (mean-predictor fallback), class codings ``platt_``; versions 0
#: and 1 load with both empty (no fallback, no Platt map). 3: leaves have ``approx_`` (which final
#: solve) and ``fourier_w_``, ``fourier_b_``; older states load as exact solves. 4: leaves store
#: their kind (``kind_``, :mod:`xrfm_torch.leaf.kinds`) in place of ``approx_`` and hold their
#: Gaussian-process buffers under ``gp.``; the fitted routing temperature is the buffer
#: ``fitted_temperature_`` (was ``temperature_``, now the property of the temperature in use).
#: 5: the input map has the log maps' buffers (``log_``, ``log_offset_``, ``log_scale_``,
#: ``log_standardize.*``); older states load with no column on a log scale. 6: the input map has
#: the value-level blocks' buffers (``levels.columns_``, ``levels.values_``, ``levels.widths_``);
#: older states load with none.
STATE_FORMAT_VERSION = 6


def format_state() -> dict[str, int]:
    """The ``_extra_state`` an ``xRFMTree`` saves."""
    return {"format_version": STATE_FORMAT_VERSION}


def check_format(state: Any) -> int:
    """The format version of an ``_extra_state``; a ``ValueError`` for one this package cannot read."""
    version = state.get("format_version") if isinstance(state, dict) else None
    if not isinstance(version, int) or not 0 <= version <= STATE_FORMAT_VERSION:
        raise ValueError(
            f"xRFMTree state of format version {version!r}; this xrfm_torch reads versions "
            f"0 .. {STATE_FORMAT_VERSION}: upgrade the package"
        )
    return version


def upgrade_tree_state(state_dict: dict[str, Any], prefix: str) -> None:
    """Bring the tree-level entries of a state under ``prefix`` to the current layout, in place."""
    # a state saved before format versions existed is version 0 (same layout as version 1)
    state_dict.setdefault(prefix + "_extra_state", {"format_version": 0})
    if prefix + "temperature_" in state_dict:  # before format 4
        state_dict.setdefault(
            prefix + "fitted_temperature_", state_dict.pop(prefix + "temperature_")
        )
    imap = prefix + "input_map."
    center = state_dict.get(imap + "standardize.center_")
    if center is not None:  # before format 5, each missing buffer: no column on a log scale
        state_dict.setdefault(imap + "log_", torch.zeros(center.shape, dtype=torch.bool))
        state_dict.setdefault(imap + "log_offset_", torch.zeros_like(center))
        state_dict.setdefault(imap + "log_scale_", torch.ones_like(center))
        for name in ("center_", "scale_"):
            state_dict.setdefault(
                imap + "log_standardize." + name, state_dict[imap + "standardize." + name]
            )
        # before format 6: no column with a value-level block
        state_dict.setdefault(imap + "levels.columns_", torch.zeros(0, dtype=torch.long))
        state_dict.setdefault(imap + "levels.values_", torch.zeros(0, 0, dtype=center.dtype))
        state_dict.setdefault(imap + "levels.widths_", torch.zeros(0, dtype=torch.long))
