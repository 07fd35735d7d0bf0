"""Lockstep leaves: a batched RFM step is each leaf's own step, and a lockstep fit the sequential one."""

from __future__ import annotations

import threading

import pytest
import torch

from conftest import planted
from tools.host_reads import HostReads
from xrfm_torch import (
    GaussianKernel,
    LaplaceKernel,
    LeafConfig,
    LeafRFM,
    LpqLaplaceKernel,
    xRFMTree,
)
from xrfm_torch.inputs import choice
from xrfm_torch.leaf import lockstep
from xrfm_torch.leaf.batch_ops import batch_rows
from xrfm_torch.leaf.batched_search import batched_solve, solve_key
from xrfm_torch.leaf.batched_step import StepRequest, batch_key, batched_rfm_step
from xrfm_torch.leaf.lockstep import BATCH_BYTES, CancelledError, Lockstep, fit_together
from xrfm_torch.leaf.solve_request import SolveRequest
from xrfm_torch.numerics import context, host
from xrfm_torch.numerics.agop import RootedAgop, next_root
from xrfm_torch.numerics.context import watching
from xrfm_torch.numerics.solvers import krr_workspace

D = torch.float64


def request(
    n: int,
    m: int,
    root: str,
    *,
    seed: int,
    kernel=None,
    cfg: LeafConfig | None = None,
    d: int = 5,
    c: int = 2,
    weighted: bool = False,
    diag: bool = False,
    agop: bool = True,
) -> StepRequest:
    """One leaf's step: ``n`` training and ``m`` validation rows, ``sqrt(M)`` by ``root``."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g, dtype=D)
    Xv = torch.randn(m, d, generator=g, dtype=D)
    coef = torch.randn(d, c, generator=g, dtype=D)
    y, yv = torch.sin(X @ coef), torch.sin(Xv @ coef)
    if cfg is not None and cfg.criterion != "mse":  # one-hot classes
        y = torch.nn.functional.one_hot(y.argmax(1), c).to(D)
        yv = torch.nn.functional.one_hot(yv.argmax(1), c).to(D)
    A = torch.randn(d, d, generator=g, dtype=D) / 2
    sqrt_m = {
        "identity": None,
        "diag": torch.rand(d, generator=g, dtype=D) + 0.2,
        "full": A @ A.mT + 0.3 * torch.eye(d, dtype=D),
    }[root]
    w = (
        (torch.rand(n, generator=g, dtype=D) + 0.5, torch.rand(m, generator=g, dtype=D) + 0.5)
        if weighted
        else (None, None)
    )
    kernel = (kernel or LaplaceKernel(bandwidth=2.0 + seed)).double()
    buffers = (X.new_empty(n, n), X.new_empty(n, n), krr_workspace(n, D, X.device))
    return StepRequest(
        kernel, X, y, Xv, yv, sqrt_m, buffers, cfg or LeafConfig(), agop, diag, None, None, w
    )


def assert_same_step(batched, alone, cfg: LeafConfig) -> None:
    (cb, Gb, fb), (ca, Ga, _) = batched, alone
    assert cb.err == pytest.approx(ca.err, rel=1e-9)
    assert cb.bandwidth == ca.bandwidth and cb.q == ca.q and cb.reg == ca.reg
    assert cb.sqrt_m is ca.sqrt_m and not fb
    torch.testing.assert_close(cb.alpha, ca.alpha, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(cb.sq_err, ca.sq_err, rtol=1e-8, atol=1e-12)
    assert (Gb is None) == (Ga is None)
    if Ga is not None:
        # the batch makes the next step's roots: each is the leaf's own learned root
        assert isinstance(Gb, RootedAgop) and isinstance(Ga, torch.Tensor)
        assert Gb.G.shape == Ga.shape
        torch.testing.assert_close(Gb.G, Ga, rtol=1e-8, atol=1e-12)
        layouts = (True, False) if Ga.ndim == 2 else (True,)
        assert set(Gb.roots) == set(layouts)
        for diag in layouts:
            own = next_root(Ga, diag, cfg.eps, cfg.agop_ridge)
            assert Gb.roots[diag].shape == own.shape
            torch.testing.assert_close(Gb.roots[diag], own, rtol=1e-8, atol=1e-10)


def check_batch(requests) -> None:
    keys = {batch_key(r) for r in requests}
    assert len(keys) == 1 and None not in keys
    batched = batched_rfm_step(requests, batch_rows(requests))
    for r, got in zip(requests, batched):
        assert_same_step(got, r.run(), r.cfg)


@pytest.mark.parametrize(("linear_mix", "agop_ridge"), [(0.1, 0.0), (0.0, 0.0), (0.1, 0.05)])
def test_batched_step_of_unequal_leaves_with_mixed_roots_is_each_leafs_step(linear_mix, agop_ridge):
    cfg = LeafConfig(linear_mix=linear_mix, agop_ridge=agop_ridge)
    # padded rows (70 / 64 / 67 training, 25 / 19 / 30 validation), identity, diagonal and full
    # roots in one batch, the diagonal AGOP where a leaf asks for it
    check_batch(
        [
            request(70, 25, "full", seed=0, cfg=cfg),
            request(64, 19, "diag", seed=1, cfg=cfg, diag=True),
            request(67, 30, "identity", seed=2, cfg=cfg),
            request(70, 25, "full", seed=3, cfg=cfg, agop=False),
        ]
    )


def test_a_leaf_with_a_non_finite_root_fails_alone_and_the_others_get_their_roots():
    # the batch's eigh makes every leaf's next root at once: one leaf's NaN AGOP must neither
    # fail it nor reach the others' roots
    reqs = [request(40 + k, 20, "full", seed=k) for k in range(3)]
    reqs[1].sqrt_m = reqs[1].sqrt_m.clone()
    reqs[1].sqrt_m[0, 1] = reqs[1].sqrt_m[1, 0] = float("nan")
    got = batched_rfm_step(reqs, batch_rows(reqs))
    failed, G_failed, _ = got[1]
    assert G_failed is None and failed.err != failed.err  # NaN: the leaf's iterations stop
    for k in (0, 2):
        assert_same_step(got[k], reqs[k].run(), reqs[k].cfg)


def test_validation_rows_as_many_as_the_padded_training_rows_keep_their_linear_part():
    # 40 training rows padded to 50, and 50 validation rows: the validation rows' linear features
    # are their own, not masked like padded training rows (the batch tells them apart by role)
    check_batch([request(50, 50, "full", seed=0), request(40, 50, "full", seed=1)])
    search = [
        candidate(50, 50, seed=0, kernel=LaplaceKernel(2.0), lam=1e-3),
        candidate(40, 50, seed=1, kernel=LaplaceKernel(3.0), lam=1e-3),
    ]
    for r, (alpha, err, sq, _, _) in zip(search, batched_solve(search, batch_rows(search))):
        a_alpha, a_err, a_sq, _, _ = r.run()
        assert err == pytest.approx(a_err, rel=1e-9)
        torch.testing.assert_close(alpha, a_alpha, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(sq, a_sq, rtol=1e-8, atol=1e-12)


@pytest.mark.parametrize("roots", [("identity",) * 3, ("diag",) * 3, ("full", "diag", "identity")])
def test_batched_step_of_leaves_with_other_input_widths_pads_their_columns(roots):
    # an input-map probe's leaves: the same rows, 5, 9 and 3 columns
    reqs = [
        request(50, 20, root, seed=k, d=d, diag=root == "diag")
        for k, (root, d) in enumerate(zip(roots, (5, 9, 3)))
    ]
    check_batch(reqs)


@pytest.mark.parametrize("root", ["identity", "diag"])
def test_batched_step_with_one_root_layout_and_diagonal_agops(root):
    check_batch([request(40 + k, 20 - k, root, seed=k, diag=True) for k in range(3)])


def test_batched_step_with_weights_gaussian_kernel_and_logloss():
    cfg = LeafConfig(criterion="logloss")
    reqs = [
        request(
            50 + 3 * k, 21 + k, "full", seed=k, cfg=cfg, weighted=True, kernel=GaussianKernel(3.0)
        )
        for k in range(3)
    ]
    check_batch(reqs)


def test_batched_step_of_laplace_and_gaussian_leaves_together():
    # a kernel blend's members: exponents 1, 2 and 0.7 in one batch
    reqs = [
        request(40, 15, "full", seed=0, kernel=LaplaceKernel(2.0)),
        request(38, 17, "diag", seed=1, kernel=GaussianKernel(3.0), diag=True),
        request(40, 15, "full", seed=2, kernel=LaplaceKernel(2.5)),
    ]
    reqs[2].kernel.q = 0.7
    check_batch(reqs)


def test_batched_step_with_a_laplace_exponent_and_error_criterion():
    cfg = LeafConfig(criterion="error")
    reqs = [request(45, 30, "full", seed=k, cfg=cfg, kernel=LaplaceKernel(4.0)) for k in range(2)]
    for r in reqs:
        r.kernel.q = 0.7  # an exponent the post-hoc search may choose: q != 1 and != p
    check_batch(reqs)


def test_a_leaf_whose_first_solve_fails_takes_its_own_step_and_retries():
    cfg = LeafConfig(reg=0.0, linear_mix=0.0, solve_dtype=torch.float32)
    good = request(40, 20, "full", seed=0, cfg=cfg)
    bad = request(40, 20, "full", seed=1, cfg=cfg)
    bad.X[1:] = bad.X[0]  # one distinct row: K is all ones, singular without a ridge
    results = batched_rfm_step([good, bad], batch_rows([good, bad]))
    alone = bad.run()
    assert results[1][0].err == alone[0].err  # the leaf's own step, bit for bit
    torch.testing.assert_close(results[1][0].alpha, alone[0].alpha, rtol=0, atol=0)
    assert results[0][0].err == pytest.approx(good.run()[0].err, rel=1e-4)


def test_steps_that_do_not_batch_have_no_key():
    warm = request(30, 10, "full", seed=0)
    warm.warm = (1e-4, 10)
    lp = request(30, 10, "full", seed=0, kernel=LpqLaplaceKernel(2.0, p=1.5, q=1.0))
    assert batch_key(warm) is None and batch_key(lp) is None
    a, b = request(30, 10, "full", seed=0), request(30, 10, "full", seed=1, cfg=LeafConfig(reg=0.1))
    assert batch_key(a) != batch_key(b)  # another ridge: another batch


def test_a_batched_step_costs_the_same_operations_for_any_number_of_leaves():
    counts = []
    for B in (2, 5):
        reqs = [request(60 - k, 20 + k, "full", seed=k) for k in range(B)]
        rows = batch_rows(reqs)
        with HostReads() as mode:
            batched_rfm_step(reqs, rows)
        counts.append(mode.computed)
    assert counts[0] == counts[1]


def test_lockstep_runs_rounds_of_all_live_leaves_and_reports_the_first_error():
    lock = Lockstep()
    seen: list[tuple[int, int]] = []

    def job(k: int, steps: int):
        def run():
            step = context.current().step_runner  # a lockstep's job's steps go to the lockstep
            for t in range(steps):
                r = request(30, 12, "full", seed=10 * k + t)
                cand, _, _ = step(
                    r.kernel, r.X, r.y, r.X_val, r.y_val, r.sqrt_m, r.buffers, r.cfg,
                    agop=True, diag=False, generator=None,
                )  # fmt: skip
                assert cand.err == pytest.approx(r.run()[0].err, rel=1e-9)
                seen.append((lock.rounds, k))

        return run

    lock.run([job(0, 3), job(1, 1), job(2, 2)])
    assert lock.rounds == 3 and lock.batched == 3 + 2 and lock.alone == 1
    assert sorted(seen) == [(1, 0), (1, 1), (1, 2), (2, 0), (2, 2), (3, 0)]

    def failing():
        raise ValueError("leaf 1 is broken")

    with pytest.raises(ValueError, match="leaf 1 is broken"):
        Lockstep().run([job(0, 3), failing, job(2, 3)])
    assert not [t for t in threading.enumerate() if t.name.startswith("xrfm-leaf-")]


def test_a_failed_leaf_cancels_the_others_at_their_next_step():
    lock, steps = Lockstep(), []

    def waiting():
        r = request(20, 8, "full", seed=0)
        steps.append(1)
        context.current().step_runner(r.kernel, r.X, r.y, r.X_val, r.y_val, r.sqrt_m, r.buffers, r.cfg,
             agop=True, diag=False, generator=None)  # fmt: skip
        steps.append(2)  # never: the round cancels it

    def failing():
        raise KeyError("boom")

    with pytest.raises(KeyError):
        lock.run([waiting, failing])
    assert steps == [1]
    with pytest.raises(CancelledError):
        Lockstep().run([lambda: (_ for _ in ()).throw(CancelledError("x"))])


def fitted(batch_steps, X, y, **kw):
    model = xRFMTree(batch_steps=batch_steps, max_leaf_size=150, **kw)
    return model.fit(X, y, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize("task", ["regression", "classification"])
def test_a_lockstep_tree_fit_is_the_one_by_one_fit(task):
    X, y = planted(900, d=6, seed=3, dtype=D)
    if task == "classification":
        y = (y > y.median()).long()
    kw = {"leaf": LeafConfig(n_iters=4), "task": task}
    one, lock = fitted(False, X, y, **kw), fitted(True, X, y, **kw)
    assert one.n_leaves == lock.n_leaves >= 4
    for a, b in zip(one.trees[0].leaves, lock.trees[0].leaves):
        assert int(a.best_iter_) == int(b.best_iter_)
        torch.testing.assert_close(a.alpha_, b.alpha_, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(lock(X), one(X), rtol=1e-6, atol=1e-9)
    again = fitted(True, X, y, **kw)  # the same seed, the same model: scheduling does not matter
    for (name, a), b in zip(lock.state_dict().items(), again.state_dict().values()):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=name)
        else:
            assert a == b, name


def test_autos_two_first_learned_steps_run_in_one_round():
    # diag="auto" fits the diagonal and the full M from G_0 at t = 1: in a lockstep both go to
    # the same round and batch (a lone leaf's other steps run alone); the leaf is the same
    X, y = planted(300, d=5, seed=4, dtype=D)
    Xv, yv = planted(100, d=5, seed=5, dtype=D)
    cfg = LeafConfig(
        n_iters=3,
        patience=None,
        early_stop_multiplier=None,
        kernel_exponents=None,  # no post-hoc search (its candidates take rounds too)
        bandwidth_factors=None,
        reg_factors=None,
    )
    one = LeafRFM("laplace", cfg).fit(X, y, Xv, yv, generator=torch.Generator().manual_seed(0))
    lock, got = Lockstep(), []
    lock.run(
        [
            lambda: got.append(
                LeafRFM("laplace", cfg).fit(
                    X, y, Xv, yv, generator=torch.Generator().manual_seed(0)
                )
            )
        ]
    )
    (leaf,) = got
    # t = 0, t = 1 (two steps, one round), t = 2, t = 3: 4 rounds for 5 steps
    assert lock.rounds == 4 and lock.batched == 2 and lock.alone == 3
    torch.testing.assert_close(leaf.val_errors_, one.val_errors_, rtol=1e-9, atol=1e-12)
    assert int(leaf.best_iter_) == int(one.best_iter_)
    torch.testing.assert_close(leaf.alpha_, one.alpha_, rtol=1e-7, atol=1e-10)


def test_the_callers_thread_state_goes_with_the_leaves():
    def work() -> None:
        torch.ones(3, dtype=D).add_(1).sum()

    seen = []

    def job() -> None:
        seen.append(torch.is_grad_enabled())
        work()

    with HostReads() as here:
        work()
    with torch.no_grad(), HostReads() as alone:  # modes are per thread: this one sees no leaf
        Lockstep().run([job, job])
    with torch.no_grad(), watching(HostReads()) as mode:  # the leaves' threads enter this one
        Lockstep().run([job, job])
    assert seen == [False, False, False, False]
    assert here.computed > 0 and mode.computed == 2 * here.computed and alone.computed == 0


def test_probes_in_lockstep_choose_the_same_maps(monkeypatch):
    X, y = planted(1200, d=6, seed=5, dtype=D)
    y = y + torch.where(X[:, 0] > 1, 3.0, 0.0)
    chosen, real = [], choice.choose_map_set
    for pays in (False, True):
        monkeypatch.setattr(host, "launch_bound", lambda device, pays=pays: pays)
        calls: list = []
        monkeypatch.setattr(
            choice,
            "choose_map_set",
            lambda preds, *a, calls=calls: calls.append(preds) or real(preds, *a),
        )
        model = fitted(False, X, y, leaf=LeafConfig(n_iters=2))
        chosen.append((calls[0], model.input_map.names))
    (one, maps_one), (lock, maps_lock) = chosen
    assert list(one) == list(lock) and maps_one == maps_lock
    for name in one:
        torch.testing.assert_close(lock[name], one[name], rtol=1e-6, atol=1e-8)


def test_batch_steps_is_checked():
    with pytest.raises(TypeError, match="batch_steps"):
        xRFMTree(batch_steps="yes")  # type: ignore[arg-type]


def test_a_blend_of_bags_in_lockstep_is_the_one_by_one_blend(monkeypatch):
    # members and bags in lockstep too: every leaf's steps of every bag of both kernels batch
    from xrfm_torch.models.bagging import BaggedTree
    from xrfm_torch.models.blend import KernelBlend

    X, y = planted(1300, d=5, seed=2, dtype=D)
    y = (y > y.median()).long()
    models, batches = [], []
    real = lockstep.batched_rfm_step
    monkeypatch.setattr(
        lockstep,
        "batched_rfm_step",
        lambda reqs, rows: batches.append([r.kernel.q for r in reqs]) or real(reqs, rows),
    )
    for batch_steps in (False, True, True):
        tree = xRFMTree(
            task="classification",
            batch_steps=batch_steps,
            max_leaf_size=300,
            leaf=LeafConfig(n_iters=3),
            input_transform="identity",
        )
        blend = KernelBlend(BaggedTree(tree, n_bags=3), kernels=("laplace", "gaussian"))
        models.append(blend.fit(X, y, generator=torch.Generator().manual_seed(0)))
        assert bool(batches) == batch_steps
    # batches of steps from leaves of several bags of both kernels
    assert max(len(set(qs)) for qs in batches) == 2  # (q = 1 and 2 while iterating)
    assert max(len(b) for b in batches) > 3 * 2
    one, lock, again = models
    assert one.summary()["kernels"] == lock.summary()["kernels"]
    torch.testing.assert_close(lock(X), one(X), rtol=1e-6, atol=1e-8)
    for (name, a), b in zip(lock.state_dict().items(), again.state_dict().values()):
        if isinstance(a, torch.Tensor):  # the same seed, the same model
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg=name)


def candidate(
    n, m, *, seed, kernel, lam, d=4, cfg=None, weighted=False, one_row=False
) -> SolveRequest:
    """A post-hoc search candidate of one leaf (rows already in its M-space)."""
    from xrfm_torch.kernels.linear import features_or_none, linear_weights

    cfg = cfg or LeafConfig()
    r = request(n, m, "identity", seed=seed, d=d, cfg=cfg, weighted=weighted)
    if one_row:  # every training row the same: K is all ones
        r.X[1:] = r.X[0]
    kernel = kernel.double()
    xs, xv = r.X, r.X_val
    K = kernel.from_distance(kernel.distance(xs, xs))
    U = features_or_none(xs, cfg.linear_mix)

    def predict(alpha):
        pred = kernel.from_distance(kernel.distance(xv, xs)) @ alpha
        Uv = features_or_none(xv, cfg.linear_mix)
        return pred if U is None else pred + Uv @ linear_weights(U, alpha)

    F = krr_workspace(n, D, xs.device)
    return SolveRequest(kernel, K, xs, r.y, xv, r.y_val, lam, U, F, cfg, r.weights, predict, True)


@pytest.mark.parametrize("weighted", [False, True])
def test_batched_search_candidates_are_each_leafs_own_solve(weighted):
    g = GaussianKernel(3.0)
    laplace = LaplaceKernel(2.0)
    laplace.q = 0.7
    reqs = [  # other rows, widths, exponents, bandwidths and ridges in one batch
        candidate(50, 20, seed=0, kernel=LaplaceKernel(2.5), lam=1e-3, weighted=weighted),
        candidate(46, 24, seed=1, kernel=g, lam=1e-2, d=6, weighted=weighted),
        candidate(50, 20, seed=2, kernel=laplace, lam=1e-1, weighted=weighted),
    ]
    assert len({solve_key(r) for r in reqs}) == 1
    for r, (alpha, err, sq, retry, holds) in zip(reqs, batched_solve(reqs, batch_rows(reqs))):
        a_alpha, a_err, a_sq, a_retry, _ = r.run()
        assert err == pytest.approx(a_err, rel=1e-9) and not retry and not a_retry
        assert not holds  # the batch's factor is not the leaf's workspace
        torch.testing.assert_close(alpha, a_alpha, rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(sq, a_sq, rtol=1e-8, atol=1e-12)


def test_a_search_candidate_that_fails_its_check_is_solved_alone():
    cfg = LeafConfig(linear_mix=0.0, solve_dtype=torch.float32)
    good = candidate(30, 10, seed=0, kernel=LaplaceKernel(2.0), lam=1e-3, cfg=cfg)
    # singular without a ridge: the Cholesky fails
    bad = candidate(30, 10, seed=1, kernel=LaplaceKernel(2.0), lam=0.0, cfg=cfg, one_row=True)
    results = batched_solve([good, bad], batch_rows([good, bad]))
    alone = bad.run()
    assert results[1][3] and alone[3]  # the retries are the caller's, as one by one
    assert results[1][4]  # solved alone: its workspace holds the factor
    assert results[0][1] == pytest.approx(good.run()[1], rel=1e-4)


def test_auto_runs_one_by_one_until_a_gpu_run_decides_and_true_runs_in_lockstep(monkeypatch):
    X, y = planted(700, d=4, seed=4, dtype=D)
    runs = []
    real = Lockstep.run
    monkeypatch.setattr(
        Lockstep, "run", lambda self, jobs: runs.append(len(jobs)) or real(self, jobs)
    )
    fitted("auto", X, y, leaf=LeafConfig(n_iters=2))  # on the CPU: no thread, bit for bit
    assert runs == []
    monkeypatch.setattr(host, "launch_bound", lambda device: True)  # as on a GPU: still none
    fitted("auto", X, y, leaf=LeafConfig(n_iters=2))
    assert runs == []
    fitted(True, X, y, leaf=LeafConfig(n_iters=2))
    assert runs and runs[0] >= 2


def test_jobs_that_would_exceed_the_memory_limit_run_one_by_one_in_the_callers_thread():
    names = []

    def job():
        names.append(threading.current_thread().name)

    fit_together([job, job], batched=True, held_bytes=10, limit=BATCH_BYTES + 5)
    assert names == [threading.current_thread().name] * 2
    fit_together([job, job], batched=True, held_bytes=10, limit=BATCH_BYTES + 10)
    assert sorted(names[2:]) == ["xrfm-lockstep-0", "xrfm-lockstep-1"]  # within the limit


def test_the_batched_steps_probe_reports_agreement_and_fewer_operations(capsys):
    # tools.batched_steps (the device check's second command): the batched step agrees with
    # the steps one by one and dispatches fewer operations, on the packaged table
    from pathlib import Path

    import xrfm_torch
    from tools import batched_steps

    files = Path(xrfm_torch.__file__).parent / "data" / "files"
    args = ["--table", "cpu_act", "--data-dir", str(files), "--leaves", "3", "--rows", "80"]
    batched_steps.main([*args, "--repeats", "1"])
    out = capsys.readouterr().out
    ops = {
        line.split("|")[1].strip(): int(line.split("|")[2])
        for line in out.splitlines()
        if line.startswith("| one by one") or line.startswith("| batched")
    }
    assert ops["batched"] < ops["one by one"] / 2
    diffs = [float(v.rstrip(",")) for v in out.split("diff ")[1].split() if v[0].isdigit()]
    assert len(diffs) == 3 and max(diffs) < 1e-2
