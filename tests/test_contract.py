"""One contract: xRFMTree, BaggedTree and KernelBlend implement every member of
``xrfm_torch.models.contract.Model`` with the same parameters, and what build_model returns keeps it."""

from __future__ import annotations

import inspect

import pytest
import torch

from xrfm_torch import Anytime, BaggedTree, KernelBlend, LeafConfig, xRFMTree
from xrfm_torch.models.contract import Model
from xrfm_torch.models.factory import build_model

CLASSES = [xRFMTree, BaggedTree, KernelBlend, Anytime]
MEMBERS = sorted(
    {n for n in vars(Model) if not n.startswith("_")} | {"honest_outputs", "state_dict"}
)
#: What each kind defines itself (the base raises NotImplementedError); the rest is derived.
OWN = ["task", "is_fitted", "uncertainty", "n_leaves", "n_features_in_", "n_outputs_", "fit",
       "predict_proba", "feature_importance", "single_trees", "summary", "get_config",
       "_mean", "_mean_std", "_mean_agop"]  # fmt: skip


def parameters(fn) -> list[tuple[str, object, object]]:
    """(name, kind, default) of each parameter: annotations and return types may differ."""
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_the_contract_lists_the_shared_api():
    assert {"fit", "forward", "predict_proba", "predict_interval", "input_grads", "agop"} <= set(
        MEMBERS
    )
    assert {"feature_importance", "honest_outputs", "get_config", "state_dict"} <= set(MEMBERS)


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
@pytest.mark.parametrize("member", MEMBERS)
def test_every_model_class_implements_each_member_alike(cls, member):
    ours, contract = getattr(cls, member, None), getattr(Model, member)
    assert ours is not None, f"{cls.__name__} lacks {member}"
    if isinstance(contract, property):
        assert isinstance(ours, property) or not callable(ours), f"{cls.__name__}.{member}"
    elif not callable(contract):  # a data member with the base's default
        assert isinstance(ours, type(contract)), f"{cls.__name__}.{member}"
    elif member != "state_dict":  # nn.Module's own
        assert parameters(ours) == parameters(contract), f"{cls.__name__}.{member}"


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_every_model_class_defines_what_the_base_leaves_open(cls):
    open_ = [m for m in OWN if getattr(cls, m) is getattr(Model, m)]
    assert open_ == [], f"{cls.__name__} leaves {open_} to the base, which raises"
    assert issubclass(cls, Model)


@pytest.mark.parametrize(
    ("n_bags", "kernels"), [(1, None), (2, None), (2, ["laplace", "gaussian"])]
)
def test_what_build_model_returns_keeps_the_contract_when_fitted(n_bags, kernels):
    g = torch.Generator().manual_seed(0)
    X = torch.randn(200, 3, generator=g)
    y = X[:, 0].sin()
    model = build_model(xRFMTree(leaf=LeafConfig(n_iters=1)), n_bags, kernels)
    assert not model.is_fitted
    fitted = model.fit(X, y, generator=torch.Generator().manual_seed(0))
    # (isinstance reads the properties on Python < 3.12, and an unfitted model's raise)
    assert fitted is model and isinstance(model, Model) and model.n_features_in_ == 3
    # the input-map choice's share of the fit: a tree's or bags' own; a blend chooses none itself
    spent = model.fit_seconds_
    assert spent is not None and 0.0 <= model.probe_seconds_ < spent
    assert (model.probe_seconds_ > 0.0) == (kernels is None)
    torch.testing.assert_close(model.get_grads(X[:3]), model.input_grads(X[:3]))
    assert model.feature_importance().sum().item() == pytest.approx(1.0, rel=1e-5)
    # its single trees mix to its predictions (a kernel of weight 0 is dropped from a blend)
    pairs = model.single_trees()
    assert all(isinstance(t, xRFMTree) for _, t in pairs) and len(pairs) % n_bags == 0
    assert sum(w for w, _ in pairs) == pytest.approx(1.0)
    if model.task == "regression":
        mixed = sum(w * t(X[:5]) for w, t in pairs)
        torch.testing.assert_close(mixed, model(X[:5]), rtol=1e-5, atol=1e-6)
