from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from xrfm_torch import LeafConfig, LeafRFM

# Deterministic cuBLAS for the gpu-marked tests that turn on torch.use_deterministic_algorithms:
# read once when CUDA starts, so it is set before any test touches the device (no effect on CPU).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

# The benchmark tables: $XRFM_TORCH_DATASETS, else a shared/datasets folder beside the repository
# (as bench.common.DATASETS); tests that need them skip when neither exists.
SHARED_DATASETS = Path(
    os.environ.get("XRFM_TORCH_DATASETS")
    or Path(__file__).resolve().parents[2] / "shared" / "datasets"
)


@pytest.fixture(autouse=True)
def _restore_rng():
    state = torch.random.get_rng_state()
    yield
    torch.random.set_rng_state(state)


@pytest.fixture
def generator() -> torch.Generator:
    return torch.Generator().manual_seed(1234)


def planted(n: int, d: int = 10, seed: int = 0, dtype=torch.float32, noise: float = 0.0):
    """Target depending on features 0 and 1 only."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=torch.float64)
    y = (
        torch.sin(2 * X[:, 0])
        + X[:, 1] ** 2
        + noise * torch.randn(n, generator=g, dtype=torch.float64)
    )
    return X.to(dtype), y.to(dtype)


def needs_shared_datasets():
    return pytest.mark.skipif(
        not SHARED_DATASETS.is_dir(),
        reason=f"benchmark tables not found at {SHARED_DATASETS} (set XRFM_TORCH_DATASETS)",
    )


def plain_leaf(kernel=None, **settings) -> LeafRFM:
    """A leaf with the paper's fixed-budget settings (``LeafConfig.plain``), some changed."""
    return LeafRFM(kernel, LeafConfig.plain(**settings))
