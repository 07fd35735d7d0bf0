"""State-dict loading into freshly constructed (unfitted) modules.

Fitted modules own buffers whose shapes depend on the data (support points, coefficients, tree
arrays). A fresh module registers them empty; before torch copies values in, this hook resizes each
buffer to the incoming shape (and dtype), the same ``_load_from_state_dict`` hook torch's
``_NormBase`` uses for ``num_batches_tracked``. No training data is needed to load a model.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


class ResizableBuffers(nn.Module):
    """Mixin: resize registered buffers (and parameters) to the incoming tensors before loading.

    A parameter keeps its identity (its ``.data`` is swapped), so an optimizer built on it stays valid.
    """

    def _load_from_state_dict(
        self,
        state_dict: dict[str, Any],
        prefix: str,
        local_metadata: dict[str, Any],
        strict: bool,
        missing_keys: list[str],
        unexpected_keys: list[str],
        error_msgs: list[str],
    ) -> None:
        for name, buf in list(self._buffers.items()):
            key = prefix + name
            incoming = state_dict.get(key)
            if buf is None or not isinstance(incoming, torch.Tensor):
                continue
            if incoming.shape != buf.shape or incoming.dtype != buf.dtype:
                self._buffers[name] = torch.empty(
                    incoming.shape, dtype=incoming.dtype, device=buf.device
                )
        for name, param in self._parameters.items():
            incoming = state_dict.get(prefix + name)
            if (
                param is not None
                and isinstance(incoming, torch.Tensor)
                and incoming.shape != param.shape
            ):
                param.data = torch.empty(incoming.shape, dtype=incoming.dtype, device=param.device)
        super()._load_from_state_dict(
            state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
        )


def as_dtype(value: torch.dtype | str | None, name: str) -> torch.dtype | None:
    """Accept ``torch.float64`` or ``"float64"`` (config files) or ``None``."""
    if value is None or isinstance(value, torch.dtype):
        return value
    dtype = getattr(torch, str(value), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"{name} must be a floating torch dtype or its name, got {value!r}")
    return dtype
