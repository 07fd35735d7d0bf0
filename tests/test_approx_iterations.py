"""RFM iterations and searches on approximate solves (xrfm_torch.leaf.approx_iteration)."""

from __future__ import annotations

import pytest
import torch

from conftest import planted
from xrfm_torch import LeafConfig, LeafRFM, xRFMTree
from xrfm_torch.kernels import make_kernel, transform
from xrfm_torch.kernels.fourier import fourier_frequencies
from xrfm_torch.kernels.linear import summed_predict
from xrfm_torch.leaf.approx import fourier_predict, nystrom_weights
from xrfm_torch.leaf.approx_iteration import approx_fitter
from xrfm_torch.numerics.agop import normalize_agop, sqrt_psd

KINDS = ["nystrom", "centroids", "fourier"]


@pytest.mark.parametrize("kind", KINDS)
def test_approximate_step_gradients_are_those_of_its_predictor(kind):
    """The AGOP of a step comes from the input gradients of the fitted approximation: equal
    to autograd's Jacobian of that predictor (with a learned full M and the linear part)."""
    X, y = planted(300, d=3, dtype=torch.float64, noise=0.1)
    X_val, _ = planted(40, d=3, seed=5, dtype=torch.float64)
    cfg = LeafConfig(approx=kind, linear_mix=0.3, fourier_features=64)
    kernel = make_kernel("laplace").double()
    centres = X[:50]
    fit = approx_fitter(kernel, cfg, X, y[:, None], X_val, centres, fourier_seed=7)
    A = torch.randn(3, 3, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    S = sqrt_psd(A @ A.T + 0.1 * torch.eye(3, dtype=torch.float64))
    coef, pred, g = fit(S, 1e-3, True)
    assert g is not None

    if kind == "fourier":
        w, b = fourier_frequencies(
            3, 64, 1.0, 10.0, generator=torch.Generator().manual_seed(7), dtype=torch.float64
        )

        def f(x):
            return fourier_predict(transform(x, S), w, b, coef, 0.3)
    else:

        def f(x):
            return summed_predict(kernel, transform(x, S), transform(centres, S), coef, 0.3)

    torch.testing.assert_close(pred, f(X_val))
    rows = X[100:110]  # rows that are not centres (a centre's own kernel gradient is cut at r=0)
    jac = torch.func.jacrev(lambda x: f(x[None])[0])
    expected = torch.stack([jac(r) for r in rows])  # (10, 1, 3)
    torch.testing.assert_close(g[100:110], expected, rtol=1e-6, atol=1e-9)


def test_nystrom_iterations_follow_the_rfm_update_on_all_rows():
    """One AGOP update by hand (diagonal M, no searches) gives the leaf's M and errors."""
    X, y = planted(1200, d=4, noise=0.1, dtype=torch.float64)
    X_val, y_val = planted(200, d=4, seed=3, dtype=torch.float64)
    cfg = LeafConfig.plain(
        n_iters=1,
        iter_rows=200,
        approx_above=400,
        approx="nystrom",
        approx_iters=True,
        early_stop_multiplier=None,
    )
    leaf = LeafRFM("laplace", cfg).double()
    leaf.fit(X, y, X_val, y_val, generator=torch.Generator().manual_seed(0), final_solve=False)
    centres = leaf.support_
    assert centres.shape == (200, 4)
    kernel = make_kernel("laplace").double()
    w0 = nystrom_weights(kernel, X, centres, y[:, None], cfg.reg, 0.0)
    g0 = kernel.input_grads(X, centres, w0)  # at all 1200 rows
    G0 = (g0**2).sum((0, 1)) / X.shape[0]
    S1 = sqrt_psd(normalize_agop(G0, cfg.eps, 0.0))
    w1 = nystrom_weights(kernel, transform(X, S1), transform(centres, S1), y[:, None], cfg.reg, 0.0)
    errs = [
        float(
            (
                (
                    summed_predict(kernel, transform(X_val, s), transform(centres, s), w, 0.0)[:, 0]
                    - y_val
                )
                ** 2
            ).mean()
        )
        for s, w in ((None, w0), (S1, w1))
    ]
    torch.testing.assert_close(leaf.val_errors_, torch.tensor(errs, dtype=torch.float64))
    if errs[1] < errs[0]:
        torch.testing.assert_close(leaf.sqrt_m_, S1)
        torch.testing.assert_close(leaf.alpha_, w1)
    # the leaf learned from all rows: M singles out the planted features 0 and 1
    m = leaf.M / leaf.M.max()
    assert float(m[2:].max()) < 0.05 < float(m[:2].min())


@pytest.mark.parametrize("kind", KINDS)
def test_a_leaf_predicts_its_chosen_approximation_before_and_after_the_final_solve(kind):
    X, y = planted(1500, d=4, noise=0.05)
    X_val, y_val = planted(300, d=4, seed=4)
    cfg = LeafConfig(
        n_iters=3,
        iter_rows=250,
        approx_above=500,
        approx=kind,
        approx_iters=True,
        fourier_features=1024,  # 256 features are too coarse for M to help (RMSE 0.40 vs 0.05)
        kernel_exponents=None,
        reg_factors=None,
    )
    g = torch.Generator
    leaf = LeafRFM("laplace", cfg)
    leaf.fit(X, y, X_val, y_val, generator=g().manual_seed(0), final_solve=False)
    assert leaf.approximation == kind
    # before any refit the leaf is the chosen candidate: its validation error is the recorded one
    val_mse = float(((leaf(X_val)[:, 0] - y_val) ** 2).mean())
    assert val_mse == pytest.approx(float(leaf.val_errors_[leaf.best_iter_]), rel=1e-4)
    # a fresh leaf loads the state and predicts the same
    other = LeafRFM("laplace", cfg)
    other.load_state_dict(leaf.state_dict())
    torch.testing.assert_close(other(X_val), leaf(X_val))
    # the final solve on all rows keeps the approximation, and the fit learned the function
    leaf.refit(X, y)
    assert leaf.approximation == kind
    X_test, y_test = planted(500, d=4, seed=9)
    assert float(((leaf(X_test)[:, 0] - y_test) ** 2).mean()) < 0.05 * float(y_test.var())


def test_approximate_iterations_in_a_tree_and_their_settings():
    """Leaves above approx_above learn M through the approximation; smaller ones stay exact."""
    X, y = planted(3000, d=4, noise=0.05)
    cfg = LeafConfig(n_iters=2, iter_rows=300, approx_above=1000, approx_iters=True)
    model = xRFMTree(leaf=cfg, max_leaf_size=1500, input_transform="identity", n_trees=1)
    model.fit(X, y, generator=torch.Generator().manual_seed(0))
    leaves = model.leaves()
    assert len(leaves) == 2 and all(leaf.approximation == "nystrom" for leaf in leaves)
    X_test, y_test = planted(500, d=4, seed=9)
    assert float(((model(X_test)[:, 0] - y_test) ** 2).mean()) < 0.05 * float(y_test.var())
    small = LeafRFM("laplace", cfg).fit(
        X[:900], y[:900], generator=torch.Generator().manual_seed(0)
    )
    assert small.approximation is None  # 900 rows: not above approx_above
    with pytest.raises(ValueError, match="approx_iters"):
        LeafConfig(approx_iters="yes")
