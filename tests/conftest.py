from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from xrfm_torch import LeafConfig, LeafRFM
from xrfm_torch.numerics.threads import available_cores

# Deterministic cuBLAS for the gpu-marked tests that turn on torch.use_deterministic_algorithms:
# read once when CUDA starts, so it is set before any test touches the device (no effect on CPU).
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

# A pytest-xdist worker (the default run, pyproject's addopts) takes its share of the cores: torch's
# default of one thread per core in every worker would have the workers' threads wait on each other.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    torch.set_num_threads(max(1, available_cores() // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))

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


@pytest.fixture
def quick_probes(monkeypatch) -> None:
    """An anytime fit's quick candidates probe their input maps on fits of any size (as above
    ``QUICK_PROBE_ROWS`` rows), for the tests of the probe's reuse on small planted tables."""
    from xrfm_torch.models import anytime

    monkeypatch.setattr(anytime, "QUICK_PROBE_ROWS", 0)


@pytest.fixture
def huge_tree_cost(monkeypatch) -> None:
    """An anytime fit's first full candidate is estimated far beyond any limit (after a probed
    quick candidate or a raw one alike), so the main line stops after its quick candidate."""
    from xrfm_torch.models import ladder

    monkeypatch.setattr(ladder, "TREE_COST", 1e9)
    monkeypatch.setattr(ladder, "RAW_TREE_COST", 1e9)


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


def record_leaf_starts(monkeypatch) -> list[tuple[torch.Tensor, torch.Tensor | None, LeafConfig]]:
    """``(rows, start_sqrt_m, settings)`` of every tree leaf fit from now on, in fit order.

    Split models fit their leaves without ``start_sqrt_m`` and are not recorded.
    """
    calls = []
    fit = LeafRFM.fit

    def recorded(leaf, X_leaf, *args, **kwargs):
        if "start_sqrt_m" in kwargs:
            calls.append((X_leaf, kwargs["start_sqrt_m"], leaf.config))
        return fit(leaf, X_leaf, *args, **kwargs)

    monkeypatch.setattr(LeafRFM, "fit", recorded)
    return calls


def record_probes(monkeypatch, maps: list[str] | None = None) -> list[str]:
    """The kernel class of every input-map probe from now on; with ``maps``, probes choose those.

    Each probe still runs as usual (its time and draws are unchanged); ``maps`` only replaces its
    answer.
    """
    from xrfm_torch.inputs import choice

    probed: list[str] = []
    real = choice.probe_input_maps

    def spy(*args, **kwargs):
        probed.append(type(kwargs["kernel"]).__name__)
        chosen = real(*args, **kwargs)
        return chosen if maps is None else list(maps)

    monkeypatch.setattr(choice, "probe_input_maps", spy)
    return probed


def honest_loss(model, task: str = "regression") -> float:
    """A fitted model's mean loss on its honest outputs (weighted rows as the anytime fit weighs)."""
    from xrfm_torch.tree.honest import mean_loss, row_losses

    h = model.honest_outputs()
    return float(mean_loss(row_losses(h.outputs.double(), h.targets, task), h.weights))


def check_starts(first, calls) -> int:
    """Assert each recorded leaf started from ``first``'s majority-routed leaf; count the warm ones.

    ``first`` is a fitted ``PartitionTree``; ``calls`` are :func:`record_leaf_starts` entries of
    leaves that follow it. Where that leaf kept ``t* = 0`` the start is ``None`` (the identity),
    else its ``sqrt(M)``.
    """
    warm = 0
    for X_leaf, start, _ in calls:
        votes = torch.bincount(first.route(X_leaf), minlength=first.n_leaves)
        source = first.leaf_list()[int(votes.argmax())]
        if int(source.best_iter_) == 0:
            assert start is None  # that leaf kept the identity
        else:
            assert start is not None and torch.equal(start, source.sqrt_m_)
            warm += 1
    return warm
