"""A lighter predictor: ``Model.compress`` makes large exact leaves predict from k-means centres.

Checked against its definition (the least-squares fit of the exact predictor at its rows: the
normal equations hold), on planted data (close to the exact model), and as a model (every kind,
saved, loaded and exported as compressed; refused where variances need the rows).
"""

from __future__ import annotations

import pytest
import torch

from conftest import planted
from xrfm_torch import BaggedTree, LeafConfig, export_program, load_model, save_model, xRFMTree
from xrfm_torch.kernels import transform
from xrfm_torch.leaf import LeafRFM
from xrfm_torch.leaf.approx import centre_features
from xrfm_torch.leaf.kinds import compress_leaf


def _leaf() -> tuple[LeafRFM, torch.Tensor]:
    X, y = planted(400, d=4, seed=5, dtype=torch.float64)
    leaf = LeafRFM(config=LeafConfig(n_iters=2))
    leaf.fit(X[:300], y[:300], X[300:], y[300:], generator=torch.Generator().manual_seed(0))
    return leaf, X


def test_a_compressed_leaf_is_the_least_squares_fit_of_the_exact_one_at_its_rows():
    leaf, X = _leaf()
    Z = leaf.support_.clone()
    exact = leaf(Z)
    assert compress_leaf(leaf, 60, torch.Generator().manual_seed(0))
    assert leaf.kind == "centroids" and leaf.support_.shape[0] == 60
    # the normal equations of min_w |Phi w - f|^2 at the old support rows
    s = leaf.sqrt_m_
    Phi = centre_features(
        leaf.kernel, transform(Z, s), transform(leaf.support_, s), leaf.config.linear_mix
    )
    residual = leaf(Z) - exact
    torch.testing.assert_close(leaf(Z), Phi @ leaf.alpha_)
    assert float((Phi.T @ residual).abs().max()) < 1e-6 * float(
        Phi.abs().sum(0).max() * exact.abs().max()
    )
    # 60 centres carry most of the 300-row predictor (which interpolates its noise-free rows)
    assert float(residual.square().mean().sqrt()) < 0.25 * float(exact.std())


def test_compress_leaves_small_and_other_leaves_alone():
    leaf, X = _leaf()
    before = leaf(X).clone()
    assert not compress_leaf(leaf, 300, torch.Generator().manual_seed(0))  # not above the rows
    assert leaf.kind == "exact" and torch.equal(leaf(X), before)


def test_a_compressed_model_saves_loads_exports_and_is_seeded(tmp_path):
    X, y = planted(800, d=5, seed=6)
    model = xRFMTree(max_leaf_size=300, leaf=LeafConfig(n_iters=2))
    model.fit(X[:700], y[:700], generator=torch.Generator().manual_seed(0))
    exact = model(X[700:]).clone()
    model.compress(100, generator=torch.Generator().manual_seed(1))
    leaves = model.leaves()
    assert all(lf.support_.shape[0] <= 100 for lf in leaves)
    assert {lf.kind for lf in leaves} == {"centroids"}
    pred = model(X[700:])
    rmse_exact = float((exact.squeeze() - y[700:]).square().mean().sqrt())
    rmse_light = float((pred.squeeze() - y[700:]).square().mean().sqrt())
    assert rmse_light < 1.25 * rmse_exact, (rmse_light, rmse_exact)  # held-out rows
    save_model(model, tmp_path / "light.pt")
    torch.testing.assert_close(load_model(tmp_path / "light.pt")(X[700:]), pred)
    program = export_program(model, X[:2])
    torch.testing.assert_close(program.module()(X[700:]), pred, rtol=1e-4, atol=1e-5)
    again = xRFMTree(max_leaf_size=300, leaf=LeafConfig(n_iters=2))
    again.fit(X[:700], y[:700], generator=torch.Generator().manual_seed(0))
    again.compress(100, generator=torch.Generator().manual_seed(1))
    assert torch.equal(again(X[700:]), pred)


def test_an_ensemble_compresses_every_single_tree():
    X, y = planted(600, d=4, seed=7)
    bags = BaggedTree(xRFMTree(max_leaf_size=400, leaf=LeafConfig(n_iters=1)), n_bags=3)
    bags.fit(X, y, generator=torch.Generator().manual_seed(0))
    assert bags.compress(30) is bags
    assert all(lf.support_.shape[0] <= 30 for _, t in bags.single_trees() for lf in t.leaves())


@pytest.mark.filterwarnings("ignore:uncertainty is calibrated")
def test_compress_refuses_variances_unfitted_models_and_bad_sizes():
    with pytest.raises(RuntimeError):
        xRFMTree().compress(10)
    X, y = planted(300, d=3, seed=8)
    gp = xRFMTree(uncertainty="gp", leaf=LeafConfig(n_iters=1)).fit(X, y)
    with pytest.raises(ValueError, match="uncertainty"):
        gp.compress(10)
    plain = xRFMTree(leaf=LeafConfig(n_iters=1)).fit(X, y)
    with pytest.raises(ValueError, match="max_support"):
        plain.compress(0)


def test_the_estimators_compress_their_model_seeded_by_random_state():
    import numpy as np

    from xrfm_torch import XRFMRegressor

    X, y = (t.numpy() for t in planted(500, d=4, seed=9))
    fits = [XRFMRegressor(max_leaf_size=250, n_iters=1, random_state=3).fit(X, y) for _ in range(2)]
    assert fits[0].compress(50) is fits[0]
    fits[1].compress(50)
    leaves = [lf for _, tree in fits[0].model_.single_trees() for lf in tree.leaves()]
    assert leaves and all(lf.support_.shape[0] <= 50 for lf in leaves)
    np.testing.assert_array_equal(fits[0].predict(X), fits[1].predict(X))
