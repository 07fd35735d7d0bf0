"""Fault injection: a leaf's RFM iterations fall back to the best finished iteration."""

from __future__ import annotations

import logging

import torch

import xrfm_torch.leaf.iteration as iteration
import xrfm_torch.leaf.step as step
from conftest import planted
from xrfm_torch import LeafConfig, LeafRFM
from xrfm_torch.numerics.solvers import KRRSolveError

CFG = LeafConfig(
    n_iters=4,
    diag=True,
    patience=None,
    early_stop_multiplier=None,
    kernel_exponents=None,
    reg_factors=None,
    pcg_tol=None,  # every step factors: one first_krr_solve call per iteration
)


def _fit(generator):
    X, y = planted(500, d=4)
    Xv, yv = planted(150, d=4, seed=1)
    return LeafRFM("laplace", CFG).fit(X, y, Xv, yv, generator=generator), Xv


def test_nan_in_a_later_iteration_keeps_the_best_finished_one(monkeypatch, generator, caplog):
    clean, Xv = _fit(generator)
    real = iteration.next_root
    calls = [0]

    def poisoned(G, diag, eps, ridge):
        calls[0] += 1
        root = real(G, diag, eps, ridge)
        return root * float("nan") if calls[0] == 2 else root  # M of iteration 2 is NaN

    monkeypatch.setattr(iteration, "next_root", poisoned)
    with caplog.at_level(logging.DEBUG, logger="xrfm_torch.leaf.iteration"):
        leaf, _ = _fit(generator)
    assert "iter 2: non-finite validation error; stopping" in caplog.text
    errors = leaf.val_errors_
    assert bool(errors[:2].isfinite().all()) and not bool(errors[2:].isfinite().any())
    # the kept model is the clean run's best among iterations 0 and 1
    best = int(torch.argmin(clean.val_errors_[:2]))
    assert int(leaf.best_iter_) == best
    torch.testing.assert_close(leaf.val_errors_[:2], clean.val_errors_[:2])
    assert bool(leaf(Xv).isfinite().all())


def test_a_failed_factorization_in_a_later_iteration_keeps_the_best_one(
    monkeypatch, generator, caplog
):
    clean, Xv = _fit(generator)
    real = step.first_krr_solve
    calls = [0]

    def failing_first(K, y, reg, **kwargs):
        calls[0] += 1
        if calls[0] == 3:  # iteration 2: the first attempt fails, and so do the retries
            return torch.full_like(y, float("nan")), torch.tensor(True)
        return real(K, y, reg, **kwargs)

    def failing(*args, **kwargs):
        raise KRRSolveError("injected")

    monkeypatch.setattr(step, "first_krr_solve", failing_first)
    monkeypatch.setattr(step, "solve_krr", failing)
    with caplog.at_level(logging.DEBUG, logger="xrfm_torch.leaf.iteration"):
        leaf, _ = _fit(generator)
    assert "iter 2: non-finite validation error; stopping" in caplog.text
    assert int(leaf.best_iter_) == int(torch.argmin(clean.val_errors_[:2]))
    torch.testing.assert_close(leaf.val_errors_[:2], clean.val_errors_[:2])
    assert bool(leaf(Xv).isfinite().all())


def test_a_degenerate_agop_stops_at_the_plain_kernel_machine(monkeypatch, generator, caplog):
    monkeypatch.setattr(
        step,
        "agop_from_grads",
        lambda g, diag, weights=None: torch.full((g.shape[-1],), float("inf")),
    )
    with caplog.at_level(logging.DEBUG, logger="xrfm_torch"):
        leaf, Xv = _fit(generator)
    assert "degenerate AGOP (max inf); stopping" in caplog.text
    assert int(leaf.best_iter_) == 0 and int(leaf.val_errors_.isfinite().sum()) == 1
    torch.testing.assert_close(leaf.M, torch.ones(4))  # identity M: no feature learning
    assert bool(leaf(Xv).isfinite().all())


NOISE_CFG = LeafConfig(n_iters=1, reg=1e-6, kernel_exponents=None, reg_factors=None)


def _noise(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 4, generator=g), 3.0 + torch.randn(n, 1, generator=g)


def test_a_leaf_worse_than_its_mean_predicts_the_mean(generator, caplog):
    # pure-noise targets and a near-interpolating ridge: the kernel model's validation error is
    # about twice the noise variance, the mean's about once
    X, y = _noise(400, 0)
    Xv, yv = _noise(150, 1)
    with caplog.at_level(logging.DEBUG):
        leaf = LeafRFM("laplace", NOISE_CFG).fit(X, y, Xv, yv, generator=generator)
    assert "predicting the mean" in caplog.text
    assert leaf.is_constant
    assert torch.equal(leaf.alpha_, torch.zeros_like(leaf.alpha_))
    torch.testing.assert_close(leaf(Xv), y.mean(0).expand(150, 1))
    assert (
        float(((leaf(Xv) - yv) ** 2).mean()) < leaf.val_errors_[leaf.val_errors_.isfinite()].min()
    )
    assert leaf.agop().abs().max() == 0  # a constant has no gradient
    # later solves keep it constant, at the mean of their rows
    X2, y2 = _noise(300, 2)
    leaf.refit(X2, y2)
    torch.testing.assert_close(leaf(Xv[:3]), y2.mean(0).expand(3, 1))
    leaf2 = LeafRFM("laplace", NOISE_CFG).fit(X, y, Xv, yv, generator=generator, extra=(X2, y2))
    torch.testing.assert_close(leaf2(Xv[:3]), torch.cat([y, y2]).mean(0).expand(3, 1))
    # and it survives a state-dict round trip
    fresh = LeafRFM("laplace", NOISE_CFG)
    fresh.load_state_dict(leaf.state_dict())
    assert fresh.is_constant and torch.equal(fresh(Xv), leaf(Xv))
    # a leaf saved before kinds were stored (format 3: approx_ = 0, the fallback read from a
    # non-empty offset_) loads as a mean leaf too
    old = {k: v for k, v in leaf.state_dict().items() if k != "kind_"}
    old["approx_"] = torch.tensor(0)
    older = LeafRFM("laplace", NOISE_CFG)
    older.load_state_dict(old)
    assert older.kind == "mean" and torch.equal(older(Xv), leaf(Xv))


def test_a_leaf_better_than_its_mean_keeps_its_model(generator, caplog):
    X, y = planted(400, d=4)
    Xv, yv = planted(150, d=4, seed=1)
    with caplog.at_level(logging.DEBUG):
        leaf = LeafRFM("laplace", NOISE_CFG).fit(X, y, Xv, yv, generator=generator)
    assert not leaf.is_constant and "predicting the mean" not in caplog.text
    assert leaf.alpha_.abs().max() > 0
