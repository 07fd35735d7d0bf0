"""Cross-fitted bagging (xrfm_torch.models.bagging): folds, bags by definition, averages, OOF rows,
mixture standard deviation, files, export, gradients and bags spread over gloo ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from conftest import record_leaf_starts
from test_parallel import _assert_same, _run
from xrfm_torch import BaggedTree, LeafConfig, XRFMClassifier, XRFMRegressor, xRFMTree
from xrfm_torch.models import bagging, export_program, load_model, save_model
from xrfm_torch.models.bagging import cross_folds, first_bag_plan
from xrfm_torch.models.factory import model_from_config
from xrfm_torch.tree.parallel import leaf_seeds
from xrfm_torch.tree.plan import start_matrix


def _proto(**kw) -> xRFMTree:
    kw.setdefault("leaf", LeafConfig(n_iters=2))
    kw.setdefault("max_leaf_size", 150)
    kw.setdefault("input_transform", "identity")
    return xRFMTree(**kw)


@pytest.fixture(scope="module")
def regression():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(700, 4, generator=g, dtype=torch.float64)
    y = torch.sin(2 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.1 * torch.randn(700, generator=g)
    return X, y.double()


@pytest.fixture(scope="module")
def bagged(regression):
    X, y = regression
    model = BaggedTree(_proto(), n_bags=3)
    return model.fit(
        X[:450], y[:450], X[450:500], y[450:500], generator=torch.Generator().manual_seed(7)
    )


@pytest.fixture(scope="module")
def classifier():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(600, 3, generator=g, dtype=torch.float64)
    y = (X[:, 0] + 0.5 * X[:, 1] > 0).long() + (X[:, 2] > 0.8).long()
    model = BaggedTree(_proto(task="classification", n_trees=1), n_bags=4)
    model.fit(X[:500], y[:500], generator=torch.Generator().manual_seed(3))
    return model, X, y


def test_folds_are_balanced_stratified_and_seeded():
    g = lambda: torch.Generator().manual_seed(5)  # noqa: E731
    labels = torch.tensor([0] * 50 + [1] * 23 + [2] * 7)
    folds = cross_folds(80, 4, g(), labels)
    assert torch.bincount(folds).tolist() == [20, 20, 20, 20]
    for c in range(3):  # each class spread as evenly as its count allows
        per_fold = torch.bincount(folds[labels == c], minlength=4)
        assert int(per_fold.max() - per_fold.min()) <= 1
    assert torch.equal(folds, cross_folds(80, 4, g(), labels))
    assert not torch.equal(folds, cross_folds(80, 4, torch.Generator().manual_seed(6), labels))
    plain = torch.bincount(cross_folds(83, 5, g()))
    assert int(plain.max() - plain.min()) <= 1


def test_bag_k_is_the_tree_fitted_on_the_other_folds_validating_on_fold_k(regression, bagged):
    X, y = regression
    Xp, yp = X[:500], y[:500]
    g = torch.Generator().manual_seed(7)
    folds = cross_folds(500, 3, g)
    seeds = leaf_seeds(g, 3)
    assert torch.equal(bagged.folds_, folds)
    for k in (0, 2):  # 500 pooled rows: below PLAN_MIN_ROWS, every bag searches on its own
        tr, va = folds != k, folds == k
        ref = _proto().fit(
            Xp[tr], yp[tr], Xp[va], yp[va], generator=torch.Generator().manual_seed(seeds[k])
        )
        assert torch.equal(ref(X[500:]), bagged.members[k](X[500:]))


def test_prediction_is_the_mean_and_oof_rows_come_from_the_bag_that_left_them_out(
    regression, bagged
):
    X, y = regression
    Xq = X[500:]
    mean = sum(b(Xq) for b in bagged.members) / 3
    torch.testing.assert_close(bagged(Xq), mean, rtol=1e-12, atol=1e-12)
    Xp = X[:500]
    for k, bag in enumerate(bagged.members):
        rows = bagged.folds_ == k
        torch.testing.assert_close(bagged.oof_[rows], bag(Xp[rows]), rtol=0, atol=0)
    # out of fold = an honest score: near the test error, unlike the in-sample fit
    oof = float(((bagged.oof_[:, 0] - y[:500]) ** 2).mean())
    test = float(((bagged(Xq)[:, 0] - y[500:]) ** 2).mean())
    fitted = float(((bagged(Xp)[:, 0] - y[:500]) ** 2).mean())
    assert fitted < 0.8 * oof
    assert 0.5 < oof / test < 2.0


def test_classification_averages_probabilities(classifier):
    model, X, y = classifier
    Xq = X[500:]
    p = model.predict_proba(Xq)
    mean = sum(b.predict_proba(Xq) for b in model.members) / 4
    torch.testing.assert_close(p, mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(p.sum(1), torch.ones(100, dtype=p.dtype))
    assert float((p.argmax(1) == y[500:]).double().mean()) > 0.8
    for k, bag in enumerate(model.members):  # every bag validated on its own stratified fold
        rows = model.folds_ == k
        torch.testing.assert_close(model.oof_[rows], bag.predict_proba(X[:500][rows]))


def test_return_std_is_the_mixture_of_the_bags(regression):
    X, y = regression
    model = BaggedTree(_proto(uncertainty="calibrated"), n_bags=2)
    model.fit(X[:500], y[:500], generator=torch.Generator().manual_seed(0))
    Xq = X[500:520]
    mean, std = model(Xq, return_std=True)
    pairs = [b(Xq, return_std=True) for b in model.members]
    m = (pairs[0][0] + pairs[1][0]) / 2
    var = sum(s**2 + mk**2 for mk, s in pairs) / 2 - m**2
    torch.testing.assert_close(mean, m)
    torch.testing.assert_close(std, var.sqrt())
    assert bool((std >= torch.maximum(pairs[0][1], pairs[1][1]) * 0.5).all())
    lo, hi = model.predict_interval(Xq, coverage=0.9)
    torch.testing.assert_close((hi - lo) / 2, 1.6448536269514722 * std)


def test_file_and_state_dict_round_trip_bit_identical(tmp_path, bagged, regression):
    X, _ = regression
    path = tmp_path / "bags.pt"
    save_model(bagged, path)
    back = load_model(path)
    assert isinstance(back, BaggedTree) and back.n_bags == 3
    assert torch.equal(back(X[500:]), bagged(X[500:]))
    fresh = model_from_config(bagged.get_config())
    fresh.load_state_dict(bagged.state_dict())
    assert torch.equal(fresh(X[500:]), bagged(X[500:]))
    assert "oof_" not in bagged.state_dict()  # predictions of training rows stay out of files
    # a state of the earlier layout, the bags under "bags." (before every holder's "members."),
    # loads into a fresh model and predicts the same
    state = bagged.state_dict()
    assert sum(k.startswith("members.") for k in state) == len(state)
    old = {"bags." + k.removeprefix("members."): v for k, v in state.items()}
    fresh = model_from_config(bagged.get_config())
    fresh.load_state_dict(old)
    assert torch.equal(fresh(X[500:]), bagged(X[500:]))


@pytest.mark.slow
def test_export_matches_eager(bagged, regression, classifier):
    X, _ = regression
    program = export_program(bagged, X[:4])
    torch.testing.assert_close(program.module()(X[500:]), bagged(X[500:]), rtol=1e-9, atol=1e-9)
    model, Xc, _ = classifier
    program = export_program(model, Xc[:4], output="proba")
    torch.testing.assert_close(program.module()(Xc[500:]), model.predict_proba(Xc[500:]))


def test_soft_routing_is_differentiable_through_every_bag(bagged, regression):
    X, _ = regression
    x = X[500:505].clone()
    grads = bagged.input_grads(x, temperature=0.5)
    jac = torch.func.jacrev(lambda z: bagged(z, 0.5))(x)  # (n, c, n, d)
    torch.testing.assert_close(grads, torch.einsum("icid->icd", jac))
    mean_grads = sum(b.input_grads(x, 0.5) for b in bagged.members) / 3
    torch.testing.assert_close(grads, mean_grads)
    imp = bagged.feature_importance()
    torch.testing.assert_close(imp, sum(b.feature_importance() for b in bagged.members) / 3)
    assert int(imp.argmax()) in (0, 1, 2) and float(imp[3]) < float(imp.max())


def test_bad_arguments_are_named(regression):
    X, y = regression
    with pytest.raises(ValueError, match="n_bags"):
        BaggedTree(_proto(), n_bags=1)
    with pytest.raises(TypeError, match="xRFMTree"):
        BaggedTree("laplace", n_bags=3)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="not fitted"):
        BaggedTree(_proto(), n_bags=2)(X[:3])
    with pytest.raises(ValueError, match="too few"):
        BaggedTree(_proto(), n_bags=5).fit(X[:9], y[:9])
    labels = torch.cat([torch.zeros(60), torch.ones(59), torch.full((1,), 2.0)]).long()
    with pytest.raises(ValueError, match="class 2 has a single row"):
        BaggedTree(_proto(task="classification"), n_bags=3).fit(X[:120], labels)


@pytest.mark.slow
def test_two_gloo_ranks_share_the_bags_and_fit_the_single_process_model(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    (single,) = _run(1, tmp_path / "one", "--bagged")
    ranks = _run(2, tmp_path / "two", "--bagged")
    # each bag is fitted whole by one rank: rank 0 two bags, rank 1 one
    assert sum(r["fits"] for r in ranks) == single["fits"]
    assert ranks[0]["fits"] > ranks[1]["fits"] > 0
    _assert_same(ranks[1], ranks[0])
    _assert_same(ranks[0], single)


def test_estimators_take_n_bags():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(400, 3))
    y = np.sin(X[:, 0]) * 10 + X[:, 1]
    reg = XRFMRegressor("laplace", n_iters=2, n_bags=3, input_transform="identity", random_state=0)
    reg.fit(X, y)
    assert isinstance(reg.model_, BaggedTree) and len(reg.model_.single_trees()) == 3
    assert reg.score(X, y) > 0.9
    labels = np.where(X[:, 0] > 0, "a", "b")
    clf = XRFMClassifier("laplace", n_iters=2, n_bags=2, input_transform="identity", random_state=0)
    p = clf.fit(X, labels).predict_proba(X[:50])
    x = torch.tensor(clf.encoder_.transform(X[:50]), dtype=torch.float32)
    bags = [t for _, t in clf.model_.single_trees()]
    torch.testing.assert_close(
        torch.from_numpy(p).float(), (bags[0].predict_proba(x) + bags[1].predict_proba(x)) / 2
    )
    assert (clf.predict(X) == labels).mean() > 0.9
    with pytest.raises(ValueError, match="n_bags"):
        XRFMRegressor(n_bags=0).fit(X, y)


def test_lightning_experiment_bagged_logs_out_of_fold_scores(tmp_path):
    from test_configs import compose_with
    from xrfm_torch.lit import XRFMLitModule
    from xrfm_torch.pipeline import run

    cfg = compose_with(
        [
            "experiment=bagged",
            "debug=fast",
            "system.n_bags=3",
            "system.blend_kernels=null",
            "logger=none",
            "trainer.enable_progress_bar=false",
        ],
        tmp_path,
    )
    result = run(cfg)
    system, dm = result["objects"]["system"], result["objects"]["datamodule"]
    tree = system.model
    assert isinstance(tree, BaggedTree) and tree.n_bags == 3
    # the OOF rows are the training rows, then the validation rows; RMSE in original units
    y = torch.cat([torch.from_numpy(dm.data.y_train), torch.from_numpy(dm.data.y_val)])
    pred = system.to_output(tree.oof_)
    rmse = float((pred - system.original_targets(y.float())).double().square().mean().sqrt())
    assert result["metrics"]["val/oof_rmse"] == pytest.approx(rmse, rel=1e-6)
    x = torch.from_numpy(dm.data.X_test)
    expected = sum(b(x) for b in tree.members) / 3
    torch.testing.assert_close(system(x), expected)
    summary = (tmp_path / "tree_summary.json").read_text()
    assert '"n_bags": 3' in summary
    loaded = XRFMLitModule.load_from_checkpoint(result["checkpoint"], weights_only=True)
    assert torch.equal(loaded.predict_step((x,), 0), system.predict_step((x,), 0))


def test_classifier_bags_small_fits_by_default_and_not_large_ones():
    from xrfm_torch.estimators import AUTO_BAG_ROWS, AUTO_BAGS

    rng = np.random.default_rng(1)
    X = rng.normal(size=(300, 2))
    labels = (X[:, 0] > 0).astype(int)
    clf = XRFMClassifier("laplace", n_iters=1, input_transform="identity", random_state=0)
    assert clf.n_bags == "auto"
    clf.fit(X[:200], labels[:200], eval_set=(X[200:], labels[200:]))
    assert isinstance(clf.model_, BaggedTree) and clf.model_.n_bags == AUTO_BAGS
    assert clf.model_.oof_.shape == (300, 2)  # training and eval_set rows pooled

    assert clf._bags(np.arange(AUTO_BAG_ROWS + 1) % 2) == 1  # above the threshold: one model
    assert clf._bags(np.r_[np.zeros(50), 1.0]) == 1  # a class of one row cannot be in every bag
    assert clf._bags(np.arange(3 * AUTO_BAGS) % 2) == 1  # folds of fewer than 4 rows
    assert XRFMRegressor().n_bags == 1


def test_lightning_bagged_classification_scores_out_of_fold_probabilities(tmp_path):
    from test_configs import compose_with
    from xrfm_torch.pipeline import run

    rng = np.random.default_rng(0)
    X = rng.standard_normal((600, 3))
    label = (X[:, 0] + 0.5 * X[:, 1] > 0).astype(int)
    np.savetxt(
        tmp_path / "data.csv", np.column_stack([X, label]), delimiter=",",
        header="a,b,c,label", comments="",
    )  # fmt: skip
    cfg = compose_with(
        [
            "dataset=csv",
            "dataset.task=classification",
            "dataset.target=label",
            "model.leaf.n_iters=1",
            "system.n_bags=2",
            "callbacks=none",
            "logger=none",
            "trainer.enable_progress_bar=false",
        ],
        tmp_path,
    )
    result = run(cfg)
    tree, dm = result["objects"]["system"].model, result["objects"]["datamodule"]
    y = torch.from_numpy(np.concatenate([dm.data.y_train, dm.data.y_val])).long()
    p = tree.oof_.double()
    logloss = float(-p.gather(1, y[:, None]).clamp_min(1e-15).log().mean())
    assert result["metrics"]["val/oof_logloss"] == pytest.approx(logloss, rel=1e-5)
    accuracy = float((p.argmax(1) == y).double().mean())
    assert result["metrics"]["val/oof_accuracy"] == pytest.approx(accuracy, rel=1e-6)
    assert accuracy > 0.85


def test_the_input_map_probe_runs_once_per_bagged_model_and_every_bag_takes_its_choice(
    monkeypatch,
):
    """``input_transform="auto"``: one probe for the bags (not one per bag), one per kernel."""
    from xrfm_torch import KernelBlend
    from xrfm_torch.inputs import choice

    calls = []
    probe = choice.probe_input_maps

    def counted(*args, **kwargs):
        calls.append(1)
        return probe(*args, **kwargs)

    monkeypatch.setattr(choice, "probe_input_maps", counted)
    g = torch.Generator().manual_seed(0)
    X = torch.randn(400, 3, generator=g)
    y = torch.exp(2 * X[:, 0]) + X[:, 1]  # heavy-tailed target: the maps differ in error
    tree = xRFMTree(leaf=LeafConfig(n_iters=1), input_transform="auto")
    bags = BaggedTree(tree, n_bags=3).fit(X, y, generator=torch.Generator().manual_seed(1))
    assert len(calls) == 1
    assert len({tuple(b.input_map.names) for b in bags.models()}) == 1
    calls.clear()
    KernelBlend(BaggedTree(tree, n_bags=3), kernels=("laplace", "gaussian")).fit(
        X, y, generator=torch.Generator().manual_seed(1)
    )
    assert len(calls) == 2  # the probe's choice depends on the kernel
    calls.clear()
    xRFMTree(leaf=LeafConfig(n_iters=1), input_transform="quantile").fit(X, y)
    assert calls == []  # a given map is not probed


def test_a_classification_bag_is_one_tree_per_map_and_round_trips(tmp_path):
    # n_trees=None is 2 trees per map for one classification tree, 1 in each bag (the bags
    # already average); the bags equal those of an explicit n_trees=1 and load back the same
    g = torch.Generator().manual_seed(2)
    X = torch.randn(700, 3, generator=g, dtype=torch.float64)
    y = (torch.sin(2 * X[:, 0]) + X[:, 1] > 0).long()
    alone = _proto(task="classification").fit(X, y, generator=torch.Generator().manual_seed(0))
    assert alone.n_leaves > 2 and len(alone.partition_trees()) == 2
    fits = {}
    for n_trees in (None, 1):
        model = BaggedTree(_proto(task="classification", n_trees=n_trees), n_bags=3)
        fits[n_trees] = model.fit(X[:600], y[:600], generator=torch.Generator().manual_seed(4))
    assert all(len(bag.partition_trees()) == 1 for bag in fits[None].members)
    assert torch.equal(fits[None].predict_proba(X[600:]), fits[1].predict_proba(X[600:]))
    save_model(fits[None], tmp_path / "bags.pt")
    back = load_model(tmp_path / "bags.pt")
    assert torch.equal(back.predict_proba(X[600:]), fits[None].predict_proba(X[600:]))


def test_later_bags_follow_the_first_bags_plan(regression, monkeypatch):
    # the plan: iterate up to the last kept iteration, the leaves' majority shape,
    # the exponents they chose (offered beside the kernel's own); each leaf walks its ridge
    X, y = regression
    leaf = LeafConfig(n_iters=6, patience=4, reg_factors=(0.1, 10.0, 100.0))
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    alone = BaggedTree(_proto(leaf=leaf), n_bags=3, shared_plan=False)
    alone.fit(X[:500], y[:500], generator=g())
    small = BaggedTree(_proto(leaf=leaf), n_bags=3).fit(X[:500], y[:500], generator=g())
    assert torch.equal(small(X[500:]), alone(X[500:]))  # 500 rows < PLAN_MIN_ROWS: no plan
    monkeypatch.setattr(bagging, "PLAN_MIN_ROWS", 500)
    shared = BaggedTree(_proto(leaf=leaf), n_bags=3).fit(X[:500], y[:500], generator=g())
    assert torch.equal(shared.members[0](X[500:]), alone.members[0](X[500:]))  # the same first fit
    first = shared.members[0].leaves()
    plan = first_bag_plan(shared.members[0])
    assert plan is not None and plan.reg_factors == leaf.reg_factors and plan.reg == leaf.reg
    assert plan.n_iters == max(int(leaf.best_iter_) for leaf in first)
    diag = [leaf.sqrt_m_.ndim == 1 for leaf in first if leaf.sqrt_m_.numel()]
    assert plan.diag == (2 * sum(diag) >= len(diag))
    own = shared.members[0].kernel.q
    chosen = tuple(sorted({float(leaf.kernel.q) for leaf in first} - {own}))
    assert plan.kernel_exponents == (chosen or None)
    # the first bag explored with the warm-up and patience 4: its followers drop the warm-up
    # and stop after 2 steps without a gain (tree.plan.leaf_plan)
    assert plan.min_iters == 0 and plan.patience == 2
    for bag in shared.members[1:]:
        assert bag.config.leaf == plan
        for later in bag.leaves():
            assert int(later.best_iter_) <= plan.n_iters
            # no warm-up: the walk ends 2 steps after the last gain (or at the cap)
            steps = int(later.val_errors_.isfinite().sum())
            assert steps <= min(plan.n_iters, int(later.best_iter_) + 2) + 1
            assert (later.sqrt_m_.ndim == 1) == plan.diag or not later.sqrt_m_.numel()
    # following costs nothing in held-out error on this planted function
    err = {name: float(((m(X[500:])[:, 0] - y[500:]) ** 2).mean()) for name, m in
           (("shared", shared), ("alone", alone))}  # fmt: skip
    assert err["shared"] < 1.1 * err["alone"]
    assert BaggedTree.from_config(shared.get_config()).shared_plan is True
    with pytest.raises(TypeError, match="shared_plan"):
        BaggedTree(_proto(), shared_plan="yes")  # type: ignore[arg-type]


def test_later_bags_start_from_the_identity_not_from_the_first_bag(regression, monkeypatch):
    # the first bag trained on every later bag's validation fold: a start from its M would make
    # their validation errors (stopping, out-of-fold outputs) optimistic
    X, y = regression
    monkeypatch.setattr(bagging, "PLAN_MIN_ROWS", 500)
    starts = record_leaf_starts(monkeypatch)
    model = BaggedTree(_proto(leaf=LeafConfig(n_iters=4, diag=True)), n_bags=3)
    model.fit(X[:600], y[:600], generator=torch.Generator().manual_seed(3))
    first = model.members[0].leaves()
    assert len(starts) == sum(bag.n_leaves for bag in model.members)
    assert max(int(leaf.best_iter_) for leaf in first) >= 1  # there was an M to start from
    assert all(start is None for _, start, _ in starts)
    plan = first_bag_plan(model.members[0])
    assert all(cfg == plan for _, _, cfg in starts[len(first) :])


def test_a_start_matrix_takes_the_layout_asked_for(regression):
    X, y = regression
    tree = _proto(leaf=LeafConfig(n_iters=3, diag=False))
    tree.fit(X[:600], y[:600], generator=torch.Generator().manual_seed(0))
    part = tree.partition_trees()[0]
    ids = part.route(X[:600])
    learned = [k for k, leaf in enumerate(part.leaf_list()) if int(leaf.best_iter_) >= 1]
    assert learned  # some leaf learned an M (t* >= 1)
    k = learned[0]
    leaf = part.leaf_list()[k]
    S = leaf.sqrt_m_
    assert S.ndim == 2
    x = X[:600][ids == k]  # rows of leaf k: it is their majority leaf
    assert torch.equal(start_matrix(part, x, None), S)
    torch.testing.assert_close(start_matrix(part, x, True), (S @ S).diagonal().sqrt())
    s = S.diagonal().abs()
    leaf.sqrt_m_ = s  # a diagonal leaf asked for the full layout
    assert torch.equal(start_matrix(part, x, False), torch.diag(s))
    assert start_matrix(part, x[:, :3], None) is None  # another input width
    leaf.best_iter_ = torch.tensor(0)
    assert start_matrix(part, x, None) is None  # the identity
