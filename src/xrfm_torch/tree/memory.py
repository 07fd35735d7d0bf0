"""Peak memory of a leaf fit, estimated before any leaf is fitted, against a budget.

A leaf's fit is dominated by dense (rows x rows) matrices: the kernel matrix, its Cholesky
factor, the distance/gradient-weight buffers of the AGOP and the validation kernel. Measured peak
resident memory of single-leaf fits (``bench/results/leaf-memory/``: 3.3–5.6 float32 n x n
matrices at 12k–2k rows) is below ``LEAF_MATRICES`` such matrices of the leaf's largest solve plus
the validation block and a fixed overhead (the estimate is 27–38 % above the measurement), so a
tree checks its largest planned leaf before fitting: a fit that cannot fit stops at once with a
message that names the leaf size, the estimate, the budget and the knobs, instead of an
out-of-memory kill an hour in. A leaf whose final solve is approximate
(:mod:`xrfm_torch.leaf.approx`) pays dense matrices only for its iteration rows, and for the final
solve its (rows x width) features twice (its dtype and float64) and two float64 (width x width)
matrices, ``width`` being its centres or Fourier features.
"""

from __future__ import annotations

import os
from typing import Literal

import torch

#: Dense (n, n) matrices alive at a leaf fit's peak (measured; see the module docstring).
LEAF_MATRICES = 4.0
#: Fixed allocator and workspace overhead of a fit, bytes (what small leaves add beyond n^2).
LEAF_OVERHEAD = 32 * 2**20
#: What ``memory_budget`` may be: bytes, ``"auto"`` (what the device has free) or ``None`` (off).
MemoryBudget = int | Literal["auto"] | None


class MemoryBudgetError(MemoryError):
    """A planned leaf fit needs more memory than the budget allows."""


def leaf_peak_bytes(
    n_fit: int, n_val: int, n_final: int, dtype: torch.dtype, approx_width: int | None = None
) -> int:
    """Estimated peak bytes of fitting one leaf.

    Args:
        n_fit: Rows of the RFM iterations.
        n_val: Validation rows scored at each iteration.
        n_final: Rows of the final solve (the fitted rows plus overlap and borrowed rows).
        dtype: The model's floating dtype.
        approx_width: Centres or features of an approximate final solve (``None``: exact).
    """
    size = torch.finfo(dtype).bits // 8
    if approx_width is None:
        n = max(n_fit, n_final)
        return int(size * (LEAF_MATRICES * n * n + 2 * n_val * n_fit)) + LEAF_OVERHEAD
    iterations = size * (LEAF_MATRICES * n_fit * n_fit + 2 * n_val * n_fit)
    final = (size + 8) * n_final * approx_width + 2 * 8 * approx_width * approx_width
    return int(max(iterations, final)) + LEAF_OVERHEAD


def available_bytes(device: torch.device) -> int | None:
    """Free memory on ``device``: CUDA's free memory, or the host's available memory (Linux)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    if device.type == "cpu":
        try:
            with open("/proc/meminfo") as fh:
                for line in fh:
                    if line.startswith("MemAvailable:"):
                        return int(line.split()[1]) * 1024
        except OSError:
            pass
        try:
            return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    return None


def check_leaf_memory(
    sizes: list[tuple[int, int, int]] | list[tuple[int, int, int, int | None]],
    dtype: torch.dtype,
    device: torch.device,
    budget: MemoryBudget,
) -> None:
    """Raise :class:`MemoryBudgetError` if the largest planned leaf exceeds ``budget``.

    Args:
        sizes: Per leaf ``(n_fit, n_val, n_final)`` rows, or ``(n_fit, n_val, n_final, width)``
            with the width of an approximate final solve (:func:`leaf_peak_bytes`).
        dtype: The model's dtype.
        device: Where the leaves are fitted.
        budget: Bytes, ``"auto"`` (:func:`available_bytes`; no check where unknown) or ``None``.
    """
    if budget is None or not sizes:
        return
    limit = available_bytes(device) if budget == "auto" else int(budget)
    if limit is None:
        return
    need, (n_fit, n_val, n_final, *_) = max(
        (leaf_peak_bytes(*s[:3], dtype, *s[3:]), s) for s in sizes
    )
    if need <= limit:
        return
    gib = 2.0**30
    where = f"free on {device}" if budget == "auto" else "memory_budget"
    raise MemoryBudgetError(
        f"the largest leaf ({n_fit} rows fitted, {n_val} validation rows, final solve on "
        f"{n_final} rows, {dtype}) needs about {need / gib:.2f} GiB, more than the memory "
        f"budget of {limit / gib:.2f} GiB ({where}). Lower max_leaf_size (the rows per leaf; "
        "the need grows with its square), solve large leaves approximately "
        "(LeafConfig(iter_rows=..., approx_above=...)), fit in float32 rather than float64, or "
        "raise memory_budget (memory_budget=None turns the check off)"
    )
