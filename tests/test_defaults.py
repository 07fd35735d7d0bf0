"""One default model per task across entry points: the estimators and the LightningModule (and so
``python train.py``) build the same ensemble; ``xRFMTree`` is the one-tree building block."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from xrfm_torch import BaggedTree, KernelBlend, XRFMClassifier, XRFMRegressor, xRFMTree
from xrfm_torch.lit import XRFMLitModule
from xrfm_torch.models.factory import AUTO_BAG_ROWS, AUTO_BAGS, DEFAULT_KERNELS


def shape(model) -> tuple:
    """(kernels of a blend or None, bags or 1) of a model."""
    if isinstance(model, KernelBlend):  # its members' config: a bag's has "n_bags"
        return model.kernels, model.get_config()["model"].get("n_bags", 1)
    return None, model.n_bags if isinstance(model, BaggedTree) else 1


def test_classification_default_is_the_same_blend_of_bags_everywhere():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 3))
    y = (X[:, 0] > 0).astype(int)
    est = XRFMClassifier(n_iters=1, random_state=0).fit(X, y)
    system = XRFMLitModule(
        task="classification",
        num_classes=2,
        n_fit_rows=200,
        rarest_class_rows=int(np.bincount(y).min()),
    )
    assert shape(est.model_) == shape(system.model) == (DEFAULT_KERNELS, AUTO_BAGS)
    # above the row limit: one model per kernel in both
    big = XRFMLitModule(task="classification", num_classes=2, n_fit_rows=AUTO_BAG_ROWS + 1)
    assert shape(big.model) == (DEFAULT_KERNELS, 1)
    assert est._bags(np.arange(AUTO_BAG_ROWS + 1) % 2) == 1


def test_regression_default_is_the_same_blend_of_two_trees_everywhere():
    rng = np.random.default_rng(1)
    X = rng.normal(size=(200, 3))
    est = XRFMRegressor(n_iters=1, random_state=0).fit(X, X[:, 0])
    system = XRFMLitModule(task="regression", n_fit_rows=200)
    assert shape(est.model_) == shape(system.model) == (DEFAULT_KERNELS, 1)
    # its prediction: the members' (single trees') mean under the chosen weights
    blend = est.model_
    assert all(isinstance(m, xRFMTree) for m in blend.members)
    assert float(blend.weights_.sum()) == pytest.approx(1.0)
    x = torch.as_tensor(X[:20], dtype=torch.float32)
    with torch.no_grad():
        mixed = sum(w * m(x) for w, m in zip(blend.weights_.tolist(), blend.members))
        assert torch.allclose(blend(x), mixed, atol=1e-5)


def test_the_system_takes_explicit_choices_over_the_default():
    tree = xRFMTree(task="classification", kernel="gaussian")
    one = XRFMLitModule(
        tree, task="classification", num_classes=3, n_fit_rows=300, n_bags=1, blend_kernels=None
    )
    assert one.model is tree
    with pytest.raises(ValueError, match="n_bags must be"):
        XRFMLitModule(task="regression", n_bags=0)
    with pytest.raises(ValueError, match="blend_kernels must be"):
        XRFMLitModule(task="regression", blend_kernels="laplace")
    assert torch.is_tensor(one.target_mean)
