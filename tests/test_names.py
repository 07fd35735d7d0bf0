"""One name per thing: the old names are gone, but for the reference package's ``get_grads``."""

import pytest
import torch

from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.kernels import LaplaceKernel
from xrfm_torch.models.bagging import BaggedTree
from xrfm_torch.models.state import upgrade_tree_state


def _data(n=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 3, generator=g, dtype=torch.float64)
    return X, X[:, 0].sin() + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)


@pytest.fixture(scope="module")
def model():
    X, y = _data()
    m = xRFMTree(leaf=LeafConfig(n_iters=1), max_leaf_size=150, temperature=0.4).double()
    return m.fit(X, y, generator=torch.Generator().manual_seed(0))


def test_input_grads_everywhere_and_get_grads_is_the_one_alias(model, recwarn):
    x = _data(5, 1)[0]
    assert torch.equal(model.get_grads(x), model.input_grads(x))  # the reference xrfm's name
    assert not recwarn.list  # a plain alias, not a deprecation
    leaf, k = model.leaves()[0], LaplaceKernel()
    # the deprecated names of 0.14 are gone (pre-1.0)
    assert not hasattr(leaf, "get_grads") and not hasattr(k, "function_grads")
    assert not hasattr(model, "current_temperature")


def test_temperature_in_use_is_temperature_underscore(model):
    assert float(model.temperature_) == pytest.approx(0.4)
    assert model.temperature_ is model.fitted_temperature_
    # trainable routing: the in-use temperature is softplus(raw), starting at the fitted one
    X, y = _data()
    t = (
        xRFMTree(
            leaf=LeafConfig(n_iters=1), max_leaf_size=150, temperature=0.4, trainable_routing=True
        )
        .double()
        .fit(X, y, generator=torch.Generator().manual_seed(0))
    )
    torch.testing.assert_close(t.temperature_, torch.nn.functional.softplus(t.raw_temperature))
    assert float(t.temperature_) == pytest.approx(0.4) and t.temperature_.requires_grad
    with torch.no_grad():
        t.raw_temperature += 1.0
    assert float(t.temperature_) > 0.8 and float(t.fitted_temperature_) == pytest.approx(0.4)


def test_a_state_with_the_old_temperature_key_loads(model):
    state = dict(model.state_dict())
    state["temperature_"] = state.pop("fitted_temperature_")
    state["_extra_state"] = {"format_version": 3}
    upgrade_tree_state(state, "")
    assert "temperature_" not in state and float(state["fitted_temperature_"]) == pytest.approx(0.4)


def test_bagged_input_grads_and_alias():
    X, y = _data()
    bag = BaggedTree(xRFMTree(leaf=LeafConfig(n_iters=1), max_leaf_size=150).double(), n_bags=2)
    bag.fit(X, y, generator=torch.Generator().manual_seed(0))
    x = X[:4]
    assert torch.equal(bag.get_grads(x), bag.input_grads(x))
