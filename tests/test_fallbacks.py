"""Fault injection: a leaf's RFM iterations fall back to the best finished iteration."""

from __future__ import annotations

import logging

import torch

import xrfm_torch.leaf.iteration as iteration
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
    pcg_tol=None,  # every step factors: one solve_krr call per iteration
)


def _fit(generator):
    X, y = planted(500, d=4)
    Xv, yv = planted(150, d=4, seed=1)
    return LeafRFM("laplace", CFG).fit(X, y, Xv, yv, generator=generator), Xv


def test_nan_in_a_later_iteration_keeps_the_best_finished_one(monkeypatch, generator, caplog):
    clean, Xv = _fit(generator)
    real = iteration.sqrt_psd
    calls = [0]

    def poisoned(G):
        calls[0] += 1
        root = real(G)
        return root * float("nan") if calls[0] == 2 else root  # M of iteration 2 is NaN

    monkeypatch.setattr(iteration, "sqrt_psd", poisoned)
    with caplog.at_level(logging.WARNING, logger="xrfm_torch.leaf.iteration"):
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
    real = iteration.solve_krr
    calls = [0]

    def failing(*args, **kwargs):
        calls[0] += 1
        if calls[0] == 3:  # iteration 2
            raise KRRSolveError("injected")
        return real(*args, **kwargs)

    monkeypatch.setattr(iteration, "solve_krr", failing)
    with caplog.at_level(logging.WARNING, logger="xrfm_torch.leaf.iteration"):
        leaf, _ = _fit(generator)
    assert "iter 2: non-finite validation error; stopping" in caplog.text
    assert int(leaf.best_iter_) == int(torch.argmin(clean.val_errors_[:2]))
    torch.testing.assert_close(leaf.val_errors_[:2], clean.val_errors_[:2])
    assert bool(leaf(Xv).isfinite().all())


def test_a_degenerate_agop_stops_at_the_plain_kernel_machine(monkeypatch, generator, caplog):
    monkeypatch.setattr(
        iteration, "agop_from_grads", lambda g, diag: torch.full((g.shape[-1],), float("inf"))
    )
    with caplog.at_level(logging.WARNING, logger="xrfm_torch.leaf.iteration"):
        leaf, Xv = _fit(generator)
    assert "degenerate AGOP (max inf); stopping" in caplog.text
    assert int(leaf.best_iter_) == 0 and int(leaf.val_errors_.isfinite().sum()) == 1
    torch.testing.assert_close(leaf.M, torch.ones(4))  # identity M: no feature learning
    assert bool(leaf(Xv).isfinite().all())
