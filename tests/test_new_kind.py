"""A new kind of model is one class plus its registration: shown with a toy kind defined here.

``SeedAverage`` fits its prototype tree with several seeds on the same rows and averages them.
It is written against the contract only (``Ensemble``: ``member_weights``, ``combine``; ``fit``,
``get_config``, ``summary``, ``is_fitted``, and which empty members a saved state holds),
registered with one call, and then every part of the package that takes a model takes it
unchanged: saving and loading, export, feature importance, a time-limited fit, the contract test.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
import torch
from torch import Tensor, nn

from conftest import planted
from xrfm_torch import Anytime, LeafConfig, export_program, load_model, save_model, xRFMTree
from xrfm_torch.models import factory
from xrfm_torch.models.contract import Model, is_ensemble
from xrfm_torch.models.ensemble import Ensemble
from xrfm_torch.models.holder import member_indices
from xrfm_torch.numerics import config as config_module


class SeedAverage(Ensemble):
    """The prototype tree fitted with ``n_seeds`` seeds on the same rows, averaged (a toy)."""

    prototype: xRFMTree

    def __init__(self, tree: xRFMTree | None = None, *, n_seeds: int = 2) -> None:
        super().__init__()
        self._hold_prototype(xRFMTree() if tree is None else tree)
        self.n_seeds = n_seeds
        self.distributed = False
        self.members = nn.ModuleList()
        self.fit_seconds_: float | None = None

    def get_config(self) -> dict[str, Any]:
        name = f"{type(self).__module__}.{type(self).__qualname__}"
        return {"_target_": name, "tree": self.prototype.get_config(), "n_seeds": self.n_seeds}

    @property
    def is_fitted(self) -> bool:
        return len(self.members) == self.n_seeds and all(m.is_fitted for m in self.models())

    def models(self) -> list[xRFMTree]:
        return list(self.members)  # type: ignore[arg-type]

    def member_weights(self) -> list[float]:
        return [1.0 / self.n_seeds] * self.n_seeds

    def combine(self, parts: Sequence[Tensor]) -> Tensor:
        return torch.stack(list(parts)).mean(0)

    def summary(self) -> dict[str, Any]:
        return {"n_seeds": self.n_seeds, "members": [m.summary() for m in self.models()]}

    def fit(self, X, y, X_val=None, y_val=None, *, sample_weight=None, val_sample_weight=None,
            generator=None, progress=None) -> SeedAverage:  # fmt: skip
        generator = generator or torch.Generator().manual_seed(0)
        self.members = nn.ModuleList()
        for _ in range(self.n_seeds):
            seed = int(torch.randint(2**31 - 1, (1,), generator=generator))
            member = xRFMTree.from_config(self.prototype.get_config())
            member.fit(X, y, X_val, y_val, sample_weight=sample_weight,
                       val_sample_weight=val_sample_weight,
                       generator=torch.Generator().manual_seed(seed), progress=progress)  # fmt: skip
            self.members.append(member)
        return self

    def _empty_members(self, state_dict, prefix):  # a saved state: one empty tree per member
        n = len(member_indices(state_dict, prefix))
        return [xRFMTree.from_config(self.prototype.get_config()) for _ in range(n)]


@pytest.fixture
def registered(monkeypatch):
    """The registration, undone after the test (the registries are copied)."""
    monkeypatch.setattr(factory, "MODEL_CLASSES", dict(factory.MODEL_CLASSES))
    monkeypatch.setattr(config_module, "_REGISTERED", set(config_module._REGISTERED))
    factory.register_model(SeedAverage)


@pytest.fixture
def fitted():
    X, y = planted(n=500, d=4, noise=0.1)
    tree = xRFMTree(leaf=LeafConfig(n_iters=1), max_leaf_size=200)
    return SeedAverage(tree, n_seeds=3).fit(X, y, generator=torch.Generator().manual_seed(1)), X


def test_the_toy_kind_predicts_the_mean_of_its_members(fitted):
    model, X = fitted
    assert isinstance(model, Model) and is_ensemble(model)
    members = model.models()
    assert len({float(m(X[:50]).sum()) for m in members}) == 3  # three different seeds
    expected = torch.stack([m(X) for m in members]).mean(0)
    assert torch.equal(model(X), expected)
    # derived by the base: gradients, AGOP, importance, single trees with their weights
    expected_grads = sum(m.input_grads(X[:5]) for m in members) / 3
    torch.testing.assert_close(model.input_grads(X[:5]), expected_grads, rtol=1e-4, atol=1e-5)
    assert float(model.feature_importance().sum()) == pytest.approx(1.0)
    assert [w for w, _ in model.single_trees()] == pytest.approx([1 / 3] * 3)


def test_a_registered_kind_saves_loads_and_exports(registered, fitted, tmp_path):
    model, X = fitted
    save_model(model, tmp_path / "toy.pt")
    loaded = load_model(tmp_path / "toy.pt")
    assert type(loaded) is SeedAverage and torch.equal(loaded(X), model(X))
    program = export_program(model, X[:8])
    torch.testing.assert_close(program.module()(X), model(X), rtol=1e-5, atol=1e-5)


def test_an_unregistered_kind_is_refused_by_files(fitted, tmp_path):
    model, _ = fitted
    save_model(model, tmp_path / "toy.pt")
    with pytest.raises(ValueError, match="SeedAverage"):
        load_model(tmp_path / "toy.pt")


def test_the_toy_kind_keeps_the_contract():
    from test_contract import MEMBERS, OWN, parameters

    assert [m for m in OWN if getattr(SeedAverage, m) is getattr(Model, m)] == []
    for member in MEMBERS:
        ours, contract = getattr(SeedAverage, member), getattr(Model, member)
        if callable(ours) and not isinstance(contract, property) and member != "state_dict":
            assert parameters(ours) == parameters(contract), member


def test_a_registered_kind_runs_under_a_time_limit(registered, tmp_path):
    """Anytime takes the kind as its target: with time, the target itself; with none, the target
    cut short at the limit (its leaves stop iterating); either one saves, loads and exports."""
    X, y = planted(n=500, d=4, noise=0.1)
    tree = xRFMTree(leaf=LeafConfig(n_iters=3), max_leaf_size=200)
    toy = SeedAverage(tree, n_seeds=2)
    alone = SeedAverage(tree, n_seeds=2).fit(X, y, generator=torch.Generator().manual_seed(4))
    roomy = Anytime(toy, time_limit=600.0).fit(X, y, generator=torch.Generator().manual_seed(4))
    assert [t["candidate"] for t in roomy.summary()["trials"]] == ["target"]
    assert type(roomy.chosen()) is SeedAverage and torch.equal(roomy(X), alone(X))
    cut = Anytime(toy, time_limit=1e-6).fit(X, y, generator=torch.Generator().manual_seed(4))
    assert cut.is_fitted and not torch.equal(cut(X), alone(X))  # no RFM step past the limit
    leaves = [leaf for _, t in cut.single_trees() for leaf in t.leaves()]
    assert leaves and all(int(leaf.best_iter_) == 0 for leaf in leaves)
    save_model(cut, tmp_path / "cut.pt")
    loaded = load_model(tmp_path / "cut.pt")
    assert type(loaded.chosen()) is SeedAverage and torch.equal(loaded(X), cut(X))
    program = export_program(cut, X[:8])
    torch.testing.assert_close(program.module()(X), cut(X), rtol=1e-5, atol=1e-5)
