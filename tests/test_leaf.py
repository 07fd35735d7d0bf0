from __future__ import annotations

import logging
import math

import numpy as np
import pytest
import torch
from sklearn.kernel_ridge import KernelRidge

from conftest import plain_leaf, planted
from xrfm_torch import LaplaceKernel, LeafConfig, ProductLaplaceKernel
from xrfm_torch.kernels import transform
from xrfm_torch.kernels.bandwidth import median_pairwise_distance
from xrfm_torch.leaf.selection import Candidate, beats, paired_win


def mse(model, X, y):
    return float(((model(X)[:, 0] - y) ** 2).mean())


def test_planted_features_get_the_agop_mass_and_beat_plain_krr():
    X, y = planted(1200)
    Xv, yv = planted(300, seed=1)
    Xt, yt = planted(1000, seed=2)
    rfm = plain_leaf(n_iters=3, early_stop_multiplier=None).fit(X, y, Xv, yv)
    krr = plain_leaf(n_iters=0).fit(X, y, Xv, yv)
    M = rfm.M
    assert float(M[:2].sum() / M.sum()) >= 0.9
    assert mse(rfm, Xt, yt) < 0.5 * mse(krr, Xt, yt)


def test_full_m_is_symmetric_psd_and_concentrates_on_planted_block():
    X, y = planted(1000, d=6)
    Xv, yv = planted(300, d=6, seed=1)
    M = plain_leaf(n_iters=2, diag=False, early_stop_multiplier=None).fit(X, y, Xv, yv).M
    assert M.shape == (6, 6)
    torch.testing.assert_close(M, M.T, rtol=1e-4, atol=1e-6)
    assert float(torch.linalg.eigvalsh(M.double()).min()) > -1e-5
    assert float(M.diagonal()[:2].sum() / M.diagonal().sum()) >= 0.9


def test_tau_zero_is_kernel_ridge_regression():
    X, y = planted(300, d=4, dtype=torch.float64)
    Xt, _ = planted(50, d=4, seed=3, dtype=torch.float64)
    L, reg = 3.0, 1e-2
    leaf = plain_leaf(ProductLaplaceKernel(bandwidth=L), n_iters=0, reg=reg)
    leaf.fit(X, y, Xt, torch.zeros(50, dtype=torch.float64))
    ref = KernelRidge(alpha=reg, kernel="laplacian", gamma=1 / L).fit(X.numpy(), y.numpy())
    torch.testing.assert_close(
        leaf(Xt)[:, 0], torch.from_numpy(ref.predict(Xt.numpy())), rtol=0, atol=1e-8
    )


def test_best_iteration_is_the_argmin_and_counts_the_last_fit():
    X, y = planted(600)
    Xv, yv = planted(200, seed=1)
    leaf = plain_leaf(n_iters=4, early_stop_multiplier=None).fit(X, y, Xv, yv)
    errs = leaf.val_errors_
    assert errs.shape == (5,) and torch.isfinite(errs).all()  # tau + 1 fits
    assert int(leaf.best_iter_) == int(torch.argmin(errs))
    # the stored model reproduces the selected validation error
    assert math.isclose(mse(leaf, Xv, yv), float(errs[int(leaf.best_iter_)]), rel_tol=1e-4)


def test_early_stopping_stops_after_a_worse_iteration():
    X, y = planted(400, noise=0.3)
    Xv, yv = planted(200, seed=1, noise=0.3)
    leaf = plain_leaf(GaussianLike(), n_iters=5, early_stop_multiplier=1.0).fit(X, y, Xv, yv)
    errs = leaf.val_errors_.tolist()
    ran = [e for e in errs if not math.isnan(e)]
    # every run iteration before the last improved on the best so far; the last one did not
    for i in range(1, len(ran) - 1):
        assert ran[i] < min(ran[:i])
    if len(ran) < len(errs):
        assert ran[-1] > min(ran[:-1])


@pytest.mark.parametrize(
    ("patience", "tol", "min_iters"), [(1, 0.0, 0), (2, 0.0, 0), (2, 0.05, 0), (1, 0.0, 6)]
)
def test_patience_stops_after_that_many_iterations_without_enough_gain(patience, tol, min_iters):
    X, y = planted(400, noise=0.3)
    Xv, yv = planted(200, seed=1, noise=0.3)
    # iterations to spare: where the errors plateau they move by float32 rounding, which
    # depends on the threads, so where the last gain falls does too (one thread: at 10 of 12)
    n_iters = 30
    kw = {"n_iters": n_iters, "early_stop_multiplier": None}
    free = plain_leaf(GaussianLike(), **kw).fit(X, y, Xv, yv).val_errors_.tolist()
    leaf = plain_leaf(GaussianLike(), patience=patience, tol=tol, min_iters=min_iters, **kw)
    leaf.fit(X, y, Xv, yv)
    errs = leaf.val_errors_
    ran = int(torch.isfinite(errs).sum())
    # the same trajectory as without patience, cut `patience` iterations after the last
    # iteration that lowered the best error by more than tol (written out here)
    torch.testing.assert_close(errs[:ran].tolist(), free[:ran])
    best, t_gain, stop = free[0], 0, n_iters
    for t in range(1, n_iters + 1):
        if free[t] < (1 - tol) * best:
            t_gain = t
        best = min(best, free[t])
        if t >= min_iters and t - t_gain >= patience:
            stop = t
            break
    assert ran == stop + 1 < n_iters + 1
    assert int(leaf.best_iter_) == int(torch.argmin(errs[:ran]))  # the lowest error is kept


def test_iter_rows_learns_m_on_a_subsample_and_solves_once_on_all_rows():
    X, y = planted(500, d=4, dtype=torch.float64)
    Xv, yv = planted(150, d=4, seed=1, dtype=torch.float64)
    leaf = plain_leaf(n_iters=2, iter_rows=200).fit(
        X, y, Xv, yv, generator=torch.Generator().manual_seed(3)
    )
    keep = torch.randperm(500, generator=torch.Generator().manual_seed(3))[:200]
    sub = plain_leaf(n_iters=2).fit(X[keep], y[keep], Xv, yv)
    torch.testing.assert_close(leaf.sqrt_m_, sub.sqrt_m_)  # M, t* from the subsample
    torch.testing.assert_close(leaf.val_errors_, sub.val_errors_, equal_nan=True)
    assert torch.equal(leaf.support_, X)  # ... then one KRR solve on all 500 rows
    xs = leaf.kernel.distance(X @ torch.diag(leaf.sqrt_m_), X @ torch.diag(leaf.sqrt_m_))
    K = leaf.kernel.from_distance(xs)
    alpha = torch.linalg.solve(K + 1e-3 * torch.eye(500, dtype=K.dtype), y[:, None])
    torch.testing.assert_close(leaf.alpha_, alpha, rtol=1e-6, atol=1e-6)
    # without the final solve the caller gets the subsample model
    raw = plain_leaf(n_iters=2, iter_rows=200).fit(
        X, y, Xv, yv, generator=torch.Generator().manual_seed(3), final_solve=False
    )
    assert torch.equal(raw.support_, X[keep]) and torch.equal(raw.alpha_, sub.alpha_)


def GaussianLike():  # a kernel whose RFM iterations get worse (bandwidth far too wide)
    from xrfm_torch import GaussianKernel

    return GaussianKernel(bandwidth=10.0)


def test_adaptive_bandwidth_is_multiple_of_median_distance():
    X, y = planted(500, d=5)
    Xv, yv = planted(100, d=5, seed=1)
    leaf = plain_leaf(n_iters=0, adaptive_bandwidth=2.0).fit(X, y, Xv, yv)
    assert math.isclose(leaf.bandwidth, 2.0 * median_pairwise_distance(X), rel_tol=1e-6)


def test_fit_without_validation_is_seeded_and_uses_all_rows():
    X, y = planted(400)
    a = plain_leaf(n_iters=2).fit(X, y, generator=torch.Generator().manual_seed(5))
    b = plain_leaf(n_iters=2).fit(X, y, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a.alpha_, b.alpha_) and torch.equal(a.sqrt_m_, b.sqrt_m_)
    assert a.support_.shape[0] == 400  # held-out rows were added back by the final refit


def test_multi_output():
    X, y = planted(500)
    Y = torch.stack([y, -2 * y], 1)
    Xv, yv = planted(150, seed=1)
    leaf = plain_leaf(n_iters=1).fit(X, Y, Xv, torch.stack([yv, -2 * yv], 1))
    pred = leaf(Xv)
    assert pred.shape == (150, 2)
    torch.testing.assert_close(pred[:, 1], -2 * pred[:, 0], rtol=1e-3, atol=1e-3)


def test_get_grads_and_agop_use_the_stored_model():
    X, y = planted(300, d=4, dtype=torch.float64)
    leaf = plain_leaf(LaplaceKernel(2.0), n_iters=1, diag=False).fit(
        X[:250], y[:250], X[250:], y[250:]
    )
    Xq = X[250:255]  # not support points (the Laplace kernel has a kink there)
    g = leaf.input_grads(Xq)
    eps = 1e-6
    e0 = torch.zeros(4, dtype=torch.float64)
    e0[2] = eps
    fd = (leaf(Xq + e0) - leaf(Xq - e0)) / (2 * eps)
    torch.testing.assert_close(g[:, :, 2], fd, rtol=1e-5, atol=1e-7)
    assert leaf.agop().shape == (4, 4)
    torch.testing.assert_close(leaf.agop(diag=True), leaf.agop().diagonal())


@pytest.mark.parametrize(
    ("call", "exc", "match"),
    [
        (
            lambda m: m.fit(torch.tensor([[float("nan"), 1.0]] * 5), torch.ones(5)),
            ValueError,
            "X contains 5 non-finite",
        ),
        (lambda m: m.fit(torch.ones(5, 2), torch.ones(4)), ValueError, "y has 4 rows"),
        (
            lambda m: m.fit(torch.ones(5, 2), torch.ones(5), torch.ones(3, 3), torch.ones(3)),
            ValueError,
            "X_val has 3 features",
        ),
        (
            lambda m: m.fit(torch.ones(5, 2), torch.ones(5), torch.ones(3, 2), None),
            ValueError,
            "together",
        ),
        (
            lambda m: m.fit(torch.ones(5, 2, dtype=torch.long), torch.ones(5)),
            TypeError,
            "floating dtype",
        ),
        (lambda m: m.fit(torch.ones(0, 2), torch.ones(0)), ValueError, "empty"),
        (lambda m: m(torch.ones(3, 2)), RuntimeError, "not fitted"),
    ],
)
def test_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call(plain_leaf(n_iters=1))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"n_iters": -1}, "n_iters"),
        ({"reg": -1.0}, "reg"),
        ({"early_stop_multiplier": 0.5}, "early_stop"),
        ({"solve_dtype": "int32"}, "solve_dtype"),
        ({"val_fraction": 0.0}, "val_fraction"),
        ({"patience": 0}, "patience"),
        ({"tol": 1.0}, "tol"),
        ({"min_iters": -1}, "min_iters"),
        ({"iter_rows": 1}, "iter_rows"),
        ({"iter_rows": 2.5}, "iter_rows"),
        ({"kernel_exponents": [1.0, 0.0]}, "kernel_exponents"),
        ({"bandwidth_factors": [-2.0]}, "bandwidth_factors"),
        ({"reg_factors": [10.0, 0.0]}, "reg_factors"),
        ({"pcg_tol": 0.0}, "pcg_tol"),
        ({"pcg_tol": 1.5}, "pcg_tol"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plain_leaf(**kwargs)


def test_wrong_dtype_at_predict_is_named():
    X, y = planted(100, d=3)
    leaf = plain_leaf(n_iters=0).fit(X, y, X, y)
    with pytest.raises(TypeError, match="float64 does not match the model dtype torch.float32"):
        leaf(X.double())


def krr_val_mse(leaf, X, y, Xv, yv, q, bandwidth, reg=None):
    """Validation MSE of sklearn KernelRidge with the leaf's M, at exponent q, bandwidth, ridge."""
    xs, xv = transform(X, leaf.sqrt_m_).numpy(), transform(Xv, leaf.sqrt_m_).numpy()

    def gram(a, b):
        r = np.sqrt(((a[:, None, :] - b[None, :, :]) ** 2).sum(-1))
        return np.exp(-((r / bandwidth) ** q))

    ref = KernelRidge(alpha=leaf.config.reg if reg is None else reg, kernel="precomputed").fit(
        gram(xs, xs), y.numpy()
    )
    pred = ref.predict(gram(xv, xs))
    return float(((pred - yv.numpy()) ** 2).mean()), torch.from_numpy(pred)


def test_kernel_selection_is_the_validation_argmin_and_matches_kernel_ridge():
    X, y = planted(300, d=4, dtype=torch.float64, noise=0.05)
    Xv, yv = planted(120, d=4, seed=5, dtype=torch.float64, noise=0.05)
    grid = {"kernel_exponents": [0.7, 1.5], "bandwidth_factors": [0.5, 2.0]}
    leaf = plain_leaf(
        LaplaceKernel(bandwidth=3.0), n_iters=2, reg=1e-2, kernel_margin=0.0, **grid
    ).fit(X, y, Xv, yv)
    errs = {
        (q, 3.0 * f): krr_val_mse(leaf, X, y, Xv, yv, q, 3.0 * f)[0]
        for q in (0.7, 1.0, 1.5)
        for f in (0.5, 1.0, 2.0)
    }
    chosen = (leaf.kernel.q, leaf.bandwidth)
    assert chosen == min(errs, key=errs.get)
    assert chosen != (1.0, 3.0)  # the planted smooth target is not best at the prototype's kernel
    _, pred = krr_val_mse(leaf, X, y, Xv, yv, *chosen)
    torch.testing.assert_close(leaf(Xv)[:, 0], pred, rtol=0, atol=1e-8)
    # a second fit starts again from the prototype's q and bandwidth (same data: same choice)
    leaf.kernel.q, _ = 0.5, leaf.kernel.bandwidth.fill_(50.0)
    leaf.fit(X, y, Xv, yv)
    assert (leaf.kernel.q, leaf.bandwidth) == chosen
    # the selected exponent is part of the state dict
    fresh = plain_leaf(LaplaceKernel(bandwidth=3.0))
    fresh.load_state_dict(leaf.state_dict())
    assert fresh.kernel.q == chosen[0]
    torch.testing.assert_close(fresh(Xv), leaf(Xv))


def test_beats_is_a_paired_one_sided_t_test():
    def cand(sq):
        sq = torch.as_tensor(sq, dtype=torch.float64)
        return Candidate(float(sq.mean()), 0, torch.zeros(1, 1), None, 1.0, 1.0, 1e-3, sq)

    # one outlying row decides the MSE: d has a single non-zero entry D, so
    # mean(d) / (std(d) / sqrt(n)) = (D / n) / (D / n) = 1 whatever D is
    n = 100
    for outlier in (10.0, 1e6):
        inc = cand([outlier] + [1.0] * (n - 1))
        ch = cand([1.0] * n)
        assert beats(ch, inc, 0.0) and beats(ch, inc, 0.99)
        assert not beats(ch, inc, 1.01)
    # a uniform small gain on every row has zero spread: significant at any margin
    rng = np.random.default_rng(0)
    base = rng.uniform(1.0, 2.0, n)
    assert beats(cand(base - 0.01), cand(base), 50.0)
    # general case against the formula
    a = rng.exponential(size=n)
    b = a * rng.uniform(0.5, 1.2, n)
    d = a - b
    t = d.mean() / (d.std(ddof=1) / math.sqrt(n))
    assert 0 < t < 50
    assert beats(cand(b), cand(a), t - 1e-6) and not beats(cand(b), cand(a), t + 1e-6)
    # never when the challenger's MSE is not lower, or not finite
    assert not beats(cand(a), cand(a), 0.0)
    assert not beats(cand([math.inf] * n), cand(a), 0.0)
    # margin 0 takes any finite improvement, over an infinite MSE too
    assert beats(cand(a), cand([math.inf] * n), 0.0)
    # the input probe's paired_win is the same test on the per-row errors alone
    ta, tb = torch.as_tensor(a), torch.as_tensor(b)
    assert paired_win(tb, ta, t - 1e-6) and not paired_win(tb, ta, t + 1e-6)
    assert not paired_win(ta, ta, 0.0) and not paired_win(torch.full((n,), math.nan), ta, 0.0)


def test_kernel_margin_keeps_the_iterations_kernel_unless_the_best_is_significant():
    X, y = planted(300, d=4, dtype=torch.float64, noise=0.05)
    Xv, yv = planted(120, d=4, seed=5, dtype=torch.float64, noise=0.05)
    grid = {"kernel_exponents": [0.7, 1.5], "bandwidth_factors": [0.5, 2.0]}

    def fit(margin):
        return plain_leaf(
            LaplaceKernel(bandwidth=3.0), n_iters=2, reg=1e-2, kernel_margin=margin, **grid
        ).fit(X, y, Xv, yv)

    raw = fit(0.0)
    keys = [(q, 3.0 * f) for q in (0.7, 1.0, 1.5) for f in (0.5, 1.0, 2.0)]
    preds = {k: krr_val_mse(raw, X, y, Xv, yv, *k)[1] for k in keys}
    sq = {k: (p - yv) ** 2 for k, p in preds.items()}
    best = min(keys, key=lambda k: float(sq[k].mean()))
    own = (1.0, 3.0)
    assert best != own and (raw.kernel.q, raw.bandwidth) == best
    d = sq[own] - sq[best]
    t = float(d.mean() / (d.std() / math.sqrt(d.shape[0])))  # paired t statistic, > 0
    below, above = fit(t - 1e-3), fit(t + 1e-3)
    assert (below.kernel.q, below.bandwidth) == best
    assert (above.kernel.q, above.bandwidth) == own  # not significant: the iterations' kernel
    torch.testing.assert_close(above(Xv)[:, 0], preds[own], rtol=0, atol=1e-8)
    assert above.best_iter_ == raw.best_iter_  # the margin acts after the iterations only
    with pytest.raises(ValueError, match="kernel_margin"):
        plain_leaf(kernel_margin=-1.0)


def test_reg_search_walks_up_from_reg_and_refit_keeps_the_choice(caplog):
    # strong noise: a larger ridge must win on validation data
    X, y = planted(300, d=4, dtype=torch.float64, noise=1.0)
    Xv, yv = planted(150, d=4, seed=5, dtype=torch.float64, noise=1.0)
    factors = [0.1, 10.0, 100.0, 1e3, 1e4, 1e5]
    leaf = plain_leaf(
        LaplaceKernel(bandwidth=3.0),
        n_iters=1,
        reg=1e-3,
        kernel_exponents=[1.5],
        reg_factors=factors,
    )
    with caplog.at_level(logging.DEBUG, logger="xrfm_torch.leaf.selection"):
        leaf.fit(X, y, Xv, yv)
    q = leaf.kernel.q
    q_errs = {e: krr_val_mse(leaf, X, y, Xv, yv, e, 3.0)[0] for e in (1.0, 1.5)}
    assert q == min(q_errs, key=q_errs.get)  # the exponent is chosen at the base ridge
    regs = [1e-3 * f for f in [1.0, *factors]]
    errs = {r: krr_val_mse(leaf, X, y, Xv, yv, q, 3.0, reg=r)[0] for r in regs}
    chosen = float(leaf.reg_)
    assert chosen == pytest.approx(min(errs, key=errs.get), rel=1e-12)
    assert 1e-2 <= chosen < 1e2  # an interior optimum: the walk stops before the ladder's end
    # the walk: upwards from 1e-3 up to the first ridge that does not lower the error, no further,
    # and never downwards (its first step improved)
    tried = [float(m.split(" reg ")[1].split(":")[0]) for m in caplog.messages if " reg " in m]
    up = sorted(r for r in regs if r > 1e-3)
    expected, current = [], 1e-3
    for r in up:
        expected.append(r)
        if errs[r] >= errs[current]:
            break
        current = r
    assert tried[1:] == pytest.approx(expected, rel=1e-2)  # tried[0]: the q = 1.5 candidate
    assert len(expected) < len(up)
    _, pred = krr_val_mse(leaf, X, y, Xv, yv, q, 3.0, reg=chosen)
    torch.testing.assert_close(leaf(Xv)[:, 0], pred, rtol=0, atol=1e-8)
    # refit on more rows solves with the selected ridge, and the ridge is in the state dict
    X2, y2 = torch.cat([X, Xv]), torch.cat([y, yv])
    leaf.refit(X2, y2)
    _, pred2 = krr_val_mse(leaf, X2, y2, Xv, yv, q, 3.0, reg=chosen)
    torch.testing.assert_close(leaf(Xv)[:, 0], pred2, rtol=0, atol=1e-8)
    fresh = plain_leaf(LaplaceKernel(bandwidth=3.0))
    fresh.load_state_dict(leaf.state_dict())
    assert float(fresh.reg_) == chosen
    # noise-free target and a large ridge: the step up fails, so the walk goes down
    Xc, yc = planted(300, d=4, dtype=torch.float64)
    Xcv, ycv = planted(150, d=4, seed=5, dtype=torch.float64)
    caplog.clear()
    down = plain_leaf(
        LaplaceKernel(bandwidth=3.0), n_iters=0, reg=1.0, reg_factors=[1e-2, 0.1, 10.0]
    )
    with caplog.at_level(logging.DEBUG, logger="xrfm_torch.leaf.selection"):
        down.fit(Xc, yc, Xcv, ycv)
    tried = [float(m.split(" reg ")[1].split(":")[0]) for m in caplog.messages if " reg " in m]
    assert tried[0] == pytest.approx(10.0) and tried[1] == pytest.approx(0.1)
    assert float(down.reg_) < 1.0
    # without reg_factors the ridge is the constructor's
    assert float(plain_leaf(reg=0.5).fit(X, y, Xv, yv).reg_) == 0.5


def test_kernel_exponents_above_p_are_skipped(caplog):
    X, y = planted(200, d=3, dtype=torch.float64)
    Xv, yv = planted(60, d=3, seed=2, dtype=torch.float64)
    leaf = plain_leaf(ProductLaplaceKernel(), n_iters=1, kernel_exponents=[0.5, 1.5, 2.0])
    with caplog.at_level(logging.DEBUG, logger="xrfm_torch.leaf.selection"):
        leaf.fit(X, y, Xv, yv)
    tried = [m for m in caplog.messages if " q " in m]
    assert len(tried) == 1 and " q 0.5 " in tried[0]  # only 0.5 competes with the kernel's q = 1
    assert leaf.kernel.q in (0.5, 1.0)


def spy_accepted(monkeypatch, module, name):
    """Wrap ``module.name`` (a solver returning ``None`` when it gives up); record who returned."""
    accepted = []
    real = getattr(module, name)

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        accepted.append(out is not None)
        return out

    monkeypatch.setattr(module, name, spy)
    return accepted


def test_warm_cg_iterations_give_the_factored_leaf(monkeypatch):
    """Later iterations solved by CG from the previous factor: same curve and model as factoring.

    1600 rows is the smallest leaf that tries CG (5 iterations at 300 rows each); a spy counts the
    warm solves that were accepted, so the test fails if the warm path never runs.
    """
    import xrfm_torch.leaf.step as step

    accepted = spy_accepted(monkeypatch, step, "pcg_krr")
    X, y = planted(2000, d=6, seed=3)
    Xv, yv = planted(400, d=6, seed=4)
    # reg 1e-2: CG converges from t = 3 on (at 1e-3 the first two tries give up, which ends them)
    kw = {"n_iters": 6, "diag": False, "early_stop_multiplier": None, "reg": 1e-2}
    warm = plain_leaf(pcg_tol=1e-4, **kw).fit(X[:1600], y[:1600], Xv, yv)
    assert sum(accepted) >= 3  # t = 2 .. 6 may warm-start from t = 1's factor onwards
    accepted.clear()
    cold = plain_leaf(pcg_tol=None, **kw).fit(X[:1600], y[:1600], Xv, yv)
    assert not accepted
    torch.testing.assert_close(warm.val_errors_, cold.val_errors_, rtol=2e-3, atol=0)
    # the curve is flat at its minimum (t = 4 .. 6 within 3e-5 relative): t* may differ only
    # between iterations whose errors agree to rounding (on some CPUs it does: 5 vs 6)
    tw, tc = int(warm.best_iter_), int(cold.best_iter_)
    errs = cold.val_errors_
    assert tw == tc or abs(float(errs[tw] - errs[tc])) <= 1e-4 * float(errs[tc]), (tw, tc)
    torch.testing.assert_close(warm(X[1600:]), cold(X[1600:]), rtol=0, atol=2e-3 * float(y.std()))


@pytest.mark.parametrize(("pattern", "expected"), [("0", "00"), ("01", "01010"), ("001", "00")])
def test_two_warm_give_ups_in_a_row_end_the_warm_tries(monkeypatch, pattern, expected):
    """A leaf stops trying CG once WARM_GIVE_UPS tries in a row gave up, not after one.

    A stub CG gives up (0) or solves (1) by ``pattern``, repeated; the tries it sees over
    t = 2 .. 6 (t = 1 factors: the first learned M) are ``expected``: a run of give-ups ends
    the tries, an alternating pattern (regression's) keeps every one.
    """
    import xrfm_torch.leaf.iteration as iteration
    import xrfm_torch.leaf.step as step

    assert iteration.WARM_GIVE_UPS == 2
    seen: list[str] = []

    def stub(K, y, reg, factor, **kwargs):
        ok = pattern[len(seen) % len(pattern)] == "1"
        seen.append("1" if ok else "0")
        return step.solve_krr(K, y, reg, features=kwargs.get("features")) if ok else None

    monkeypatch.setattr(step, "pcg_krr", stub)
    X, y = planted(1600, d=6, seed=3)
    Xv, yv = planted(400, d=6, seed=4)
    kw = {"n_iters": 6, "diag": False, "early_stop_multiplier": None, "patience": None}
    leaf = plain_leaf(pcg_tol=1e-4, **kw).fit(X, y, Xv, yv)
    assert int(leaf.val_errors_.isfinite().sum()) == 7  # every iteration ran
    assert "".join(seen) == expected


def test_warm_budget_follows_the_device(monkeypatch):
    """CG budgets: n // 300 steps on the CPU, n // 2000 elsewhere (a GPU), none below 5."""
    import xrfm_torch.leaf.iteration as iteration
    import xrfm_torch.leaf.step as step
    from xrfm_torch.leaf.iteration import warm_budget

    cpu, gpu = torch.device("cpu"), torch.device("meta")  # any device but the CPU
    assert [warm_budget(n, cpu) for n in (1499, 1500, 9000)] == [0, 5, 30]
    assert [warm_budget(n, gpu) for n in (1600, 9999, 10_000, 32_000)] == [0, 0, 5, 16]
    # the leaf reads its budget there: at the device's rate a 1600-row leaf never tries CG
    monkeypatch.setattr(iteration, "PCG_ROWS_PER_ITER", iteration.PCG_ROWS_PER_ITER_DEVICE)
    accepted = spy_accepted(monkeypatch, step, "pcg_krr")
    X, y = planted(1600, d=6, seed=3)
    Xv, yv = planted(400, d=6, seed=4)
    plain_leaf(pcg_tol=1e-4, n_iters=4, diag=False, early_stop_multiplier=None).fit(X, y, Xv, yv)
    assert accepted == []


def test_warm_ridge_steps_reach_the_factored_choice(monkeypatch):
    """Ridge steps within 10x of a factored ridge of the same kernel are solved by CG from it."""
    import xrfm_torch.leaf.selection as selection

    accepted = spy_accepted(monkeypatch, selection, "pcg_krr")
    # strong noise: the walk goes up several steps. 4800 rows: a CG budget of 16 iterations, about
    # what a ridge 10x away needs (smaller leaves factor, which is cheap there)
    X, y = planted(4800, d=4, seed=6, noise=1.0)
    Xv, yv = planted(400, d=4, seed=7, noise=1.0)
    kw = {"n_iters": 0, "reg": 1e-3, "kernel_exponents": [1.5], "reg_factors": [10.0, 100.0, 1e3]}
    warm = plain_leaf(LaplaceKernel(bandwidth=3.0), pcg_tol=1e-4, **kw).fit(X, y, Xv, yv)
    assert any(accepted)
    accepted.clear()
    cold = plain_leaf(LaplaceKernel(bandwidth=3.0), pcg_tol=None, **kw).fit(X, y, Xv, yv)
    assert not accepted
    assert (warm.kernel.q, float(warm.reg_)) == (cold.kernel.q, float(cold.reg_))
    assert float(cold.reg_) >= 1e-1  # the walk took at least two steps up
    torch.testing.assert_close(warm(Xv), cold(Xv), rtol=0, atol=1e-3 * float(yv.std()))


def test_extra_rows_join_the_final_solve_by_continuing_the_factor(monkeypatch):
    """``fit(..., extra=...)`` equals a fit followed by ``refit`` on all rows, without refactoring."""
    import xrfm_torch.leaf.kinds as kinds

    used = spy_accepted(monkeypatch, kinds, "solve_bordered")
    X, y = planted(500, d=4, seed=8, dtype=torch.float64, noise=1.0)  # noisy: 10x the ridge wins
    Xv, yv = planted(200, d=4, seed=9, dtype=torch.float64, noise=1.0)
    kw = {"n_iters": 2, "reg": 1e-3, "kernel_exponents": None, "reg_factors": [10.0]}
    ext = plain_leaf(**kw).fit(X[:420], y[:420], Xv, yv, extra=(X[420:], y[420:]))
    assert used == [True]
    assert float(ext.reg_) == pytest.approx(1e-2)
    ref = plain_leaf(**kw).fit(X[:420], y[:420], Xv, yv, final_solve=False).refit(X, y)
    torch.testing.assert_close(ext.support_, ref.support_)
    torch.testing.assert_close(ext.alpha_, ref.alpha_, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(ext(Xv), ref(Xv), rtol=0, atol=1e-9)
    # no factor to continue (no post-hoc search): the same result by a fresh solve
    plain = {**kw, "reg_factors": None}
    used.clear()
    a = plain_leaf(**plain).fit(X[:420], y[:420], Xv, yv, extra=(X[420:], y[420:]))
    b = plain_leaf(**plain).fit(X[:420], y[:420], Xv, yv, final_solve=False).refit(X, y)
    assert not used
    torch.testing.assert_close(a(Xv), b(Xv), rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match="extra rows"):
        plain_leaf(iter_rows=100, **kw).fit(X[:420], y[:420], Xv, yv, extra=(X[420:], y[420:]))


@pytest.mark.parametrize("p", [1.0, 1.6, 2.0])
def test_iteration_agop_from_the_gram_matrix_matches_input_grads(p):
    # rfm_step takes the AGOP's gradients from the Gram matrix it solved with; it must equal the
    # AGOP of the kernel's own input gradients with the self-terms excluded
    from xrfm_torch import LpqLaplaceKernel
    from xrfm_torch.leaf.step import rfm_step
    from xrfm_torch.numerics.agop import agop_from_grads

    X, y = planted(120, d=4, dtype=torch.float64)
    Xv, yv = planted(40, d=4, seed=1, dtype=torch.float64)
    kernel = LpqLaplaceKernel(3.0, p=p, q=1.0).double()
    sqrt_m = torch.tensor([1.0, 0.5, 2.0, 0.3], dtype=torch.float64)
    n = X.shape[0]
    buffers = tuple(torch.empty(n, n, dtype=torch.float64) for _ in range(3))
    cfg = LeafConfig(reg=1e-3, linear_mix=0.0)
    cand, G, _ = rfm_step(
        kernel, X, y[:, None], Xv, yv[:, None], sqrt_m, buffers, cfg, agop=True, diag=False,
        generator=None,
    )  # fmt: skip
    grads = kernel.input_grads(X, X, cand.alpha, sqrt_m, exclude_self=True)
    torch.testing.assert_close(G, agop_from_grads(grads), rtol=1e-9, atol=1e-12)


def test_a_start_matrix_is_t_zero_and_fixes_the_layout():
    # t = 0 from sqrt(M) = s is kernel ridge regression on the inputs scaled by s
    X, y = planted(300, d=4, dtype=torch.float64)
    Xt, _ = planted(50, d=4, seed=3, dtype=torch.float64)
    s = torch.tensor([2.0, 1.5, 0.2, 0.1], dtype=torch.float64)
    L, reg = 3.0, 1e-2
    leaf = plain_leaf(ProductLaplaceKernel(bandwidth=L), n_iters=0, reg=reg, diag=False)
    leaf.fit(X, y, Xt, torch.zeros(50, dtype=torch.float64), start_sqrt_m=s)
    ref = KernelRidge(alpha=reg, kernel="laplacian", gamma=1 / L).fit((X * s).numpy(), y.numpy())
    torch.testing.assert_close(
        leaf(Xt)[:, 0], torch.from_numpy(ref.predict((Xt * s).numpy())), rtol=0, atol=1e-8
    )
    assert torch.equal(leaf.sqrt_m_, s) and int(leaf.best_iter_) == 0  # diagonal, as started
    # from a learned M the walk starts ahead: its t = 0 beats the identity's on planted features
    Xv, yv = planted(200, d=4, seed=1, dtype=torch.float64)
    cold = plain_leaf(n_iters=3, early_stop_multiplier=None).fit(X, y, Xv, yv)
    warm = plain_leaf(n_iters=3, early_stop_multiplier=None)
    warm.fit(X, y, Xv, yv, start_sqrt_m=cold.sqrt_m_)
    assert float(warm.val_errors_[0]) == pytest.approx(
        float(cold.val_errors_[int(cold.best_iter_)]), rel=1e-6
    )
    assert float(warm.val_errors_[0]) < 0.8 * float(cold.val_errors_[0])
    with pytest.raises(
        ValueError, match=r"start_sqrt_m must have shape \(4,\) or \(4, 4\), got \(3,\)"
    ):
        plain_leaf(n_iters=1).fit(X, y, Xv, yv, start_sqrt_m=s[:3])
