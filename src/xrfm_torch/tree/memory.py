"""Peak memory of a leaf fit, estimated before any leaf is fitted, against a budget.

A leaf's fit is dominated by dense (rows x rows) matrices: the kernel matrix, its Cholesky
factor, the distance/gradient-weight buffers of the AGOP and the validation kernel. Measured peak
resident memory of single-leaf fits (``python -m tools.leaf_memory``) is below
``LEAF_MATRICES`` such matrices of the leaf's largest solve plus the validation block and a
fixed overhead, so a
tree checks its largest planned leaf before fitting: a fit that cannot fit stops at once with a
message that names the leaf size, the estimate, the budget and the knobs, instead of an
out-of-memory kill an hour in. A leaf whose final solve is approximate
(:mod:`xrfm_torch.leaf.approx`) pays dense matrices only for its iteration rows, and for the final
solve its (rows x width) features twice (its dtype and float64) and two float64 (width x width)
matrices, ``width`` being its centres or Fourier features.

A leaf whose exact fit would exceed the budget is fitted approximately instead where that fits
(:func:`approximate_to_fit`: iterations on ``b`` rows, a Nyström final solve over ``b`` k-means
centres, ``b`` halved from :data:`AUTO_APPROX_ROWS` until the estimate fits); the fit stops only
when not even that fits. Below the budget every leaf stays exact: at equal time no approximation
was more accurate than an exact leaf of the tree's size (docs/benchmarks.md), so memory is what
decides.
"""

from __future__ import annotations

import os
from typing import Literal

import torch

from xrfm_torch.leaf.approx import approx_width
from xrfm_torch.leaf.config import LeafConfig

#: Dense (n, n) matrices alive at a leaf fit's peak (measured; see the module docstring).
LEAF_MATRICES = 4.0
#: Fixed allocator and workspace overhead of a fit, bytes (what small leaves add beyond n^2).
LEAF_OVERHEAD = 32 * 2**20
#: Iteration rows and Nyström centres of a leaf approximated to fit the budget (halved until it
#: does). More than a large fit's 2000 iteration rows: here the centres are also the final solve.
AUTO_APPROX_ROWS = 3000
#: Fewest centres :func:`approximate_to_fit` tries before the fit stops.
MIN_APPROX_ROWS = 64
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


def tree_step_bytes(max_leaf_size: int, rows: int, itemsize: int) -> int:
    """A bound on what a tree's leaves on ``rows`` rows hold at once in lockstep.

    Their step buffers: three (n, n) per leaf, and ``sum n_i^2 <= rows * max n_i``.
    """
    return 3 * rows * min(rows, max_leaf_size) * itemsize


def budget_bytes(budget: MemoryBudget, device: torch.device) -> int | None:
    """The budget in bytes: ``budget`` itself, the free memory for ``"auto"``, ``None`` for none."""
    if budget is None:
        return None
    return available_bytes(device) if budget == "auto" else int(budget)


def approximate_to_fit(
    config: LeafConfig,
    n_fit: int,
    n_val: int,
    n_final: int,
    d: int,
    dtype: torch.dtype,
    limit: int,
) -> LeafConfig | None:
    """A leaf's settings changed so that its fit stays within ``limit`` bytes, or ``None``.

    Iterations on ``b`` rows and an approximate final solve over them (the leaf's own
    ``approx`` and centres if it set ``approx_above``, else Nyström over k-means centres, the
    approximation that measured best), ``b`` from ``min(iter_rows or AUTO_APPROX_ROWS, n_final
    // 2)`` halved until :func:`leaf_peak_bytes` fits (``None`` below ``MIN_APPROX_ROWS``).

    Args:
        config: The leaf's settings.
        n_fit: Rows its iterations would see.
        n_val: Its validation rows.
        n_final: Rows of its final solve.
        d: Input columns.
        dtype: The model's dtype.
        limit: Bytes.
    """
    kind = (
        {} if config.approx_above is not None else {"approx": "nystrom", "approx_centres": "kmeans"}
    )
    b = min(config.iter_rows or AUTO_APPROX_ROWS, n_final // 2)
    while b >= MIN_APPROX_ROWS:
        new = config.replace(iter_rows=b, approx_above=b, **kind)
        rows = min(n_fit, b)
        width = approx_width(new, rows, n_final, d)
        if width is not None and leaf_peak_bytes(rows, n_val, n_final, dtype, width) <= limit:
            return new
        b //= 2
    return None


def check_leaf_memory(
    sizes: list[tuple[int, int, int]] | list[tuple[int, int, int, int | None]],
    dtype: torch.dtype,
    device: torch.device,
    budget: MemoryBudget,
    *,
    auto: bool = False,
) -> None:
    """Raise :class:`MemoryBudgetError` if the largest planned leaf exceeds ``budget``.

    Args:
        sizes: Per leaf ``(n_fit, n_val, n_final)`` rows, or ``(n_fit, n_val, n_final, width)``
            with the width of an approximate final solve (:func:`leaf_peak_bytes`).
        dtype: The model's dtype.
        device: Where the leaves are fitted.
        budget: Bytes, ``"auto"`` (:func:`available_bytes`; no check where unknown) or ``None``.
        auto: The byte budget is the free memory (for the message).
    """
    limit = budget_bytes(budget, device)
    if limit is None or not sizes:
        return
    need, (n_fit, n_val, n_final, *_) = max(
        (leaf_peak_bytes(*s[:3], dtype, *s[3:]), s) for s in sizes
    )
    if need <= limit:
        return
    gib = 2.0**30
    where = f"free on {device}" if budget == "auto" or auto else "memory_budget"
    raise MemoryBudgetError(
        f"the largest leaf ({n_fit} rows fitted, {n_val} validation rows, final solve on "
        f"{n_final} rows, {dtype}) needs about {need / gib:.2f} GiB, more than the memory "
        f"budget of {limit / gib:.2f} GiB ({where}). Lower max_leaf_size (the rows per leaf; "
        "the need grows with its square; not even a leaf approximated by "
        f"{MIN_APPROX_ROWS} Nystrom centres fits), fit in float32 rather than float64, or "
        "raise memory_budget (memory_budget=None turns the check off)"
    )
