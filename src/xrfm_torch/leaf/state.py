"""Older layouts of a leaf's saved state, brought to the current one on load.

The tree's format version and its own upgrades are in :mod:`xrfm_torch.models.state`; a leaf
upgrades its entries itself (its ``_load_from_state_dict``), before torch copies the tensors.
"""

from __future__ import annotations

from typing import Any

import torch

from xrfm_torch.leaf.kinds import KINDS


def upgrade_leaf_state(state_dict: dict[str, Any], prefix: str) -> None:
    """Bring a leaf's saved state of an older format to the current one, in place.

    Before format 4 the Gaussian-process buffers sat on the leaf itself (now under ``gp.``) and
    the kind was read from the buffers: ``approx_`` (0 exact, else 1 + the index of the
    approximation; absent before format 3, exact) and a non-empty ``offset_`` for the mean
    fallback (absent before format 2). Older buffers absent from the state load empty.
    """
    for name in ("noise_coef_", "noise_mean_", "signal_var_"):
        if prefix + name in state_dict:
            state_dict.setdefault(prefix + "gp." + name, state_dict.pop(prefix + name))
    for name, empty in (
        ("gp.noise_coef_", (0, 0)),
        ("gp.noise_mean_", (0,)),
        ("gp.signal_var_", (0,)),
        ("offset_", (0,)),
        ("fourier_w_", (0, 0)),
        ("fourier_b_", (0,)),
    ):
        state_dict.setdefault(prefix + name, torch.empty(empty))
    if prefix + "kind_" not in state_dict:
        code = state_dict.pop(prefix + "approx_", torch.tensor(0))
        if state_dict[prefix + "offset_"].numel() > 0:
            code = torch.tensor(KINDS.index("mean"))
        state_dict[prefix + "kind_"] = code
