"""The anytime fit's detours: where the main line runs out of time, the quick blend instead.

Each test makes the first full candidate's estimate huge (``huge_tree_cost``), so the main line stops
after its quick candidate and the fit goes on with that candidate's further kernels and their
mix. A quick single tree's detour grows on the input maps its base quick tree chose (no probe of
its own: the probe is most of a quick tree's cost); quick bags' detours probe for themselves.
"""

from __future__ import annotations

from typing import cast

import pytest
import torch

from conftest import honest_loss, planted, record_probes
from xrfm_torch import (
    Anytime,
    BaggedTree,
    KernelBlend,
    LeafConfig,
    load_model,
    save_model,
    xRFMTree,
)
from xrfm_torch.models import anytime as anytime_module
from xrfm_torch.models import ladder as ladder_module

# the quick candidates probe, as on fits of more than QUICK_PROBE_ROWS rows (conftest)
pytestmark = pytest.mark.usefixtures("quick_probes")


def _tree() -> xRFMTree:
    return xRFMTree(max_leaf_size=200, leaf=LeafConfig(n_iters=2))


def test_a_main_line_out_of_time_takes_the_detour_to_the_quick_blend(
    monkeypatch, tmp_path, huge_tree_cost
):
    monkeypatch.setattr(ladder_module, "QUICK_DRAWS", 1)  # no draws after it (their own tests)
    X, y = planted(400, d=5, seed=6, noise=0.1)
    target = KernelBlend(_tree(), kernels=("laplace", "gaussian"))
    model = Anytime(target, time_limit=600.0, quick_leaf_size=80)
    model.fit(X, y, generator=torch.Generator().manual_seed(3))
    names = [t["candidate"] for t in model.summary()["trials"]]
    assert names == [
        "quick tree laplace",
        "tree laplace",
        "tree gaussian",
        "mix tree",
        "quick tree gaussian",
        "mix quick tree",
    ]
    losses = model.trials_[:, 0]
    assert losses[1:4].isnan().all() and losses[[0, 4, 5]].isfinite().all()
    assert losses[5] <= min(losses[0], losses[4]) + 1e-12  # each kernel alone is a weighting
    assert int(model.chosen_) == min((0, 4, 5), key=lambda i: (float(losses[i]), i))
    # the quick blend is the blend of quick trees on the quick Laplace tree's maps, fitted as a
    # KernelBlend fits it
    quick = model._candidate(0).fit(X, y, generator=torch.Generator().manual_seed(3))
    maps = quick.input_map.names[0]
    alone = model._candidate(5)
    assert isinstance(alone, KernelBlend) and alone.kernels == ("laplace", "gaussian")
    tree = cast(xRFMTree, alone.prototype)
    assert tree.config.max_leaf_size == 80
    alone = KernelBlend(tree.with_settings(input_transform=maps), kernels=alone.kernels)
    alone.fit(X, y, generator=torch.Generator().manual_seed(3))
    assert honest_loss(alone) == pytest.approx(float(losses[5]), rel=1e-9)
    if int(model.chosen_) == 5:
        torch.testing.assert_close(model(X[:40]), alone(X[:40]))
    # it is saved and loaded as the candidate it kept
    save_model(model, tmp_path / "m.pt")
    loaded = load_model(tmp_path / "m.pt")
    assert int(loaded.chosen_) == int(model.chosen_)
    torch.testing.assert_close(loaded(X[:40]), model(X[:40]))


def test_a_quick_trees_detour_grows_on_its_base_trees_maps(monkeypatch, tmp_path, huge_tree_cost):
    """The detour's Gaussian tree does not probe: it takes the maps the Laplace probe chose."""
    probed = record_probes(monkeypatch, ["quantile"])  # (not what this table's probe would pick)
    X, y = planted(400, d=5, seed=6, noise=0.1)
    model = Anytime(KernelBlend(_tree(), kernels=("laplace", "gaussian")), time_limit=600.0,
                    quick_leaf_size=80)  # fmt: skip
    model.fit(X, y, generator=torch.Generator().manual_seed(3))
    assert probed == ["LaplaceKernel"]
    gaussian = model._candidate(4, "quantile").fit(X, y, generator=torch.Generator().manual_seed(3))
    assert list(gaussian.input_map.names) == ["quantile"]
    assert honest_loss(gaussian) == pytest.approx(float(model.trials_[4, 0]), rel=1e-9)
    # the same tree on its own probe's choice (raw inputs: the spy is gone) is another model
    monkeypatch.undo()
    own = model._candidate(4).fit(X, y, generator=torch.Generator().manual_seed(3))
    assert list(own.input_map.names) != ["quantile"]
    assert honest_loss(own) != pytest.approx(float(model.trials_[4, 0]), rel=1e-6)
    # a kept detour tree loads with the maps it grew on
    save_model(model, tmp_path / "m.pt")
    torch.testing.assert_close(load_model(tmp_path / "m.pt")(X[:40]), model(X[:40]))


def test_quick_bags_detours_probe_for_themselves(monkeypatch, huge_tree_cost):
    """Bags probe once for five trees: their detour keeps its own kernel's choice of maps."""
    probed = record_probes(monkeypatch)
    X, y = planted(300, d=4, seed=5)
    labels = (y > y.median()).long()
    tree = xRFMTree(task="classification", max_leaf_size=300, leaf=LeafConfig(n_iters=1))
    target = KernelBlend(BaggedTree(tree, n_bags=3), kernels=("laplace", "gaussian"))
    model = Anytime(target, time_limit=600.0, quick_leaf_size=60)
    X_val, y_val = X[240:], labels[240:]  # with validation rows, bags may grow on given maps
    model.fit(X[:240], labels[:240], X_val, y_val, generator=torch.Generator().manual_seed(0))
    done = model.trials_[:, 0].isfinite().tolist()
    fitted = [r.name for r, ok in zip(model.rungs(), done) if ok]
    assert fitted == ["quick tree laplace", "quick bags laplace", "quick bags gaussian",
                      "mix quick bags"]  # fmt: skip
    # the fallback tree probes, the Laplace bags grow on its maps, the Gaussian bags probe
    assert probed == ["LaplaceKernel", "GaussianKernel"]


@pytest.mark.parametrize("raw", [True, False])
def test_a_raw_quick_tree_takes_the_quick_blend_first_where_the_line_does_not_fit(monkeypatch, raw):
    """A quick tree on the raw inputs hides the probe each full tree adds: where the line's
    estimate exceeds the time left, its detours come first, then the line goes on. Each full
    tree is estimated at 400 s of 600: one fits, the line of two does not. Where the quick tree
    probed (``raw=False``), the line runs as before and needs no detour."""
    monkeypatch.setattr(anytime_module, "QUICK_PROBE_ROWS", 10**9 if raw else 0)
    monkeypatch.setattr(ladder_module, "QUICK_DRAWS", 1)
    monkeypatch.setattr(
        anytime_module, "estimate", lambda rung, *_: 0.0 if rung.quick or rung.mixes else 400.0
    )
    X, y = planted(400, d=5, seed=6, noise=0.1)
    model = Anytime(KernelBlend(_tree(), kernels=("laplace", "gaussian")), time_limit=600.0,
                    quick_leaf_size=80)  # fmt: skip
    built: list[int] = []
    real = model._candidate
    monkeypatch.setattr(model, "_candidate", lambda i, maps=None: built.append(i) or real(i, maps))
    model.fit(X, y, generator=torch.Generator().manual_seed(3))
    assert bool(model.quick_probe_) is not raw
    names = [r.name for r in model.rungs()]
    # (a small regression fit's quick tree is the Gaussian one: its detour the Laplace one)
    quick, other = ("gaussian", "laplace") if raw else ("laplace", "gaussian")
    assert names[0] == f"quick tree {quick}" and names[4:] == [
        f"quick tree {other}",
        "mix quick tree",
    ]
    assert built == ([0, 4, 5, 1, 2, 3] if raw else [0, 1, 2, 3])
    fitted = model.trials_[:, 0].isfinite()
    assert fitted.tolist() == [True] * 4 + [raw] * 2
    # the target was fitted: it is kept unless another candidate beats it clearly
    losses = model.trials_[:, 0]
    assert int(model.chosen_) == 3 or float(losses[int(model.chosen_)]) < float(losses[3])
