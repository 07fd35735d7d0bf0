"""One name per thing: the renamed members still answer under their old names, with a warning."""

import pytest
import torch

from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.kernels import LaplaceKernel
from xrfm_torch.tree.bagging import BaggedTree
from xrfm_torch.tree.state import upgrade_tree_state


def _data(n=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, 3, generator=g, dtype=torch.float64)
    return X, X[:, 0].sin() + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)


@pytest.fixture(scope="module")
def model():
    X, y = _data()
    m = xRFMTree(leaf=LeafConfig(n_iters=1), max_leaf_size=150, temperature=0.4).double()
    return m.fit(X, y, generator=torch.Generator().manual_seed(0))


def test_input_grads_everywhere_and_get_grads_warns(model):
    x = _data(5, 1)[0]
    with pytest.warns(
        DeprecationWarning, match="xRFMTree.get_grads is deprecated; use input_grads"
    ):
        old = model.get_grads(x)
    assert torch.equal(old, model.input_grads(x))
    leaf = model.leaves()[0]
    xl = model.input_map(x)[0]
    with pytest.warns(DeprecationWarning, match="LeafRFM.get_grads"):
        assert torch.equal(leaf.get_grads(xl), leaf.input_grads(xl))
    k, z, a = LaplaceKernel(), x.flip(0), torch.ones(5, 1, dtype=x.dtype)
    with pytest.warns(DeprecationWarning, match="function_grads is deprecated; use input_grads"):
        assert torch.equal(k.function_grads(x, z, a), k.input_grads(x, z, a))


def test_temperature_in_use_is_temperature_underscore(model):
    assert float(model.temperature_) == pytest.approx(0.4)
    assert model.temperature_ is model.fitted_temperature_
    with pytest.warns(DeprecationWarning, match="current_temperature is deprecated"):
        assert model.current_temperature is model.temperature_
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
    with pytest.warns(DeprecationWarning, match="BaggedTree.get_grads"):
        assert torch.equal(bag.get_grads(x), bag.input_grads(x))
