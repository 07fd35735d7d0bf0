"""Sample weights through the tree: splits, temperature, calibration and the whole fit."""

from __future__ import annotations

import pytest
import torch

from conftest import planted
from test_weights import integer_weights
from xrfm_torch import LeafConfig, LeafRFM, xRFMTree
from xrfm_torch.leaf.criteria import fit_platt, fit_softmax_scale
from xrfm_torch.tree.splits import PCASplit, balanced_split, sse_cut
from xrfm_torch.tree.temperature import prediction_errors


def small_tree(**kw) -> xRFMTree:
    base = {"leaf": LeafConfig(n_iters=2), "max_leaf_size": 250, "input_transform": "identity"}
    return xRFMTree(**{**base, **kw})


def test_weighted_median_cut_holds_half_the_weight_on_each_side():
    g = torch.Generator().manual_seed(0)
    proj = torch.randn(201, generator=g, dtype=torch.float64)
    w = torch.rand(201, generator=g, dtype=torch.float64) ** 3
    left, right, thr = balanced_split(proj, w)
    total = float(w.sum())
    assert float(w[left].sum()) >= total / 2
    last = left[proj[left].argmax()]  # without its last row the left side holds less than half
    assert float(w[left].sum() - w[last]) < total / 2
    assert bool((proj[left] <= thr).all()) and bool((proj[right] > thr).all())
    # equal weights: the unweighted rank-balanced cut
    same = balanced_split(proj, torch.full_like(proj, 2.0))
    assert torch.equal(same[0], balanced_split(proj)[0])
    # extreme weights: each side keeps a quarter of the rows
    heavy = torch.ones(201, dtype=torch.float64)
    heavy[proj.argmin()] = 1e6
    left, right, _ = balanced_split(proj, heavy)
    assert left.shape[0] == 51 and right.shape[0] == 150


def test_weighted_sse_cut_and_pca_direction_are_those_of_repeated_rows():
    g = torch.Generator().manual_seed(1)
    X = torch.randn(120, 3, generator=g, dtype=torch.float64)
    y = torch.stack([torch.tanh(3 * X[:, 1]), X[:, 0]], 1)
    w, rep = integer_weights(120, seed=7)
    keep = w > 0
    assert sse_cut(X[keep], y[keep], 0.05, w[keep]) == pytest.approx(sse_cut(X[rep], y[rep], 0.05))
    kw = {"kernel": None, "generator": None}
    v = PCASplit()(X[keep], y[keep], None, None, weights=(w[keep], None), **kw).direction
    v_rep = PCASplit()(X[rep], y[rep], None, None, **kw).direction
    torch.testing.assert_close(v, v_rep)


def test_temperature_and_calibration_criteria_weigh_rows_like_repeats():
    g = torch.Generator().manual_seed(2)
    preds = [torch.randn(60, 3, generator=g, dtype=torch.float64) for _ in range(3)]
    y = torch.randn(60, 3, generator=g, dtype=torch.float64)
    w, rep = integer_weights(60, seed=8)
    ref = prediction_errors([p[rep] for p in preds], y[rep])
    assert prediction_errors(preds, y, "mse", w) == pytest.approx(ref, rel=1e-12)
    scores = torch.rand(60, 3, generator=g, dtype=torch.float64)
    labels = torch.randint(0, 3, (60,), generator=g)
    torch.testing.assert_close(fit_platt(scores, labels, w), fit_platt(scores[rep], labels[rep]))
    a = fit_softmax_scale(scores, labels, weights=w)
    assert a == pytest.approx(fit_softmax_scale(scores[rep], labels[rep]), rel=1e-5)


def test_equal_weights_fit_the_unweighted_model_bit_for_bit():
    X, y = planted(700, d=4)
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    plain = small_tree().fit(X, y, generator=g())
    equal = small_tree().fit(X, y, sample_weight=torch.full((700,), 3.5), generator=g())
    assert plain.n_leaves > 1
    for (k, a), b in zip(plain.state_dict().items(), equal.state_dict().values()):
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, k


def test_weights_of_one_set_only_reach_the_leaves_that_borrow_validation_rows(monkeypatch):
    # split leaves borrow training rows for validation: with weights on one set only, every
    # validation row still needs one (1 where its set had none); this used to raise
    X, y = planted(700, d=4)
    Xv, yv = planted(200, d=4, seed=3)
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    plain = small_tree().fit(X, y, Xv, yv, generator=g())
    assert plain.n_leaves > 1
    ones = small_tree().fit(X, y, Xv, yv, val_sample_weight=torch.ones(200), generator=g())
    Xq, _ = planted(50, d=4, seed=4)
    assert torch.equal(ones(Xq), plain(Xq))
    seen = []  # what each leaf's fit gets: validation rows and their weights
    fit = LeafRFM.fit

    def spy(leaf, X_, y_, X_val=None, y_val=None, **kw):
        seen.append((X_val, kw.get("val_sample_weight")))
        return fit(leaf, X_, y_, X_val, y_val, **kw)

    tilted = torch.linspace(0.2, 3.0, 200)
    monkeypatch.setattr(LeafRFM, "fit", spy)
    small_tree().fit(X, y, Xv, yv, val_sample_weight=tilted, generator=g())
    borrowed = [(xv, wv) for xv, wv in seen if xv is not None and xv.shape[0] > 0]
    assert borrowed and all(wv is not None and wv.shape[0] == xv.shape[0] for xv, wv in borrowed)
    # the user's rows keep their (relative) weights, none of which is 1; borrowed rows weigh 1
    relative = tilted / tilted.mean()
    user = [torch.isclose(wv[:, None], relative[None, :]).any(1) for _, wv in borrowed]
    assert all(bool((u | (wv == 1.0)).all()) for u, (_, wv) in zip(user, borrowed))
    assert any(bool((wv == 1.0).any()) for _, wv in borrowed)  # some leaf borrowed rows
    assert sum(int(u.sum()) for u in user) >= 200  # the user rows reach the leaves (and splits)
    monkeypatch.undo()
    train_only = small_tree().fit(
        X, y, Xv, yv, sample_weight=torch.full((700,), 2.0), generator=g()
    )
    assert torch.equal(train_only(Xq), plain(Xq))  # equal weights: the unweighted model


def test_zero_weights_are_the_rows_left_out():
    X, y = planted(800, d=4, seed=1)
    w = (torch.arange(800) % 5 != 0).float() * 2.0  # every fifth row weighs 0
    w[1::5] = 1.0  # and the others 1 or 2
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    keep = w > 0
    weighted = small_tree().fit(X, y, sample_weight=w, generator=g())
    reference = small_tree().fit(X[keep], y[keep], sample_weight=w[keep], generator=g())
    Xq, _ = planted(100, d=4, seed=2)
    assert torch.equal(weighted(Xq), reference(Xq))


def test_weights_steer_the_tree_to_the_rows_that_count():
    # y depends on x0 where x2 > 0 and on x1 elsewhere: weighting one regime 50:1 gives a model
    # that is accurate there and worse on the other, whatever the test weighting
    X, _ = planted(3000, d=4, seed=3)
    y = torch.where(X[:, 2] > 0, torch.sin(2 * X[:, 0]), torch.sin(2 * X[:, 1]))
    first = X[:, 2] > 0
    Xq, _ = planted(1000, d=4, seed=4)
    yq = torch.where(Xq[:, 2] > 0, torch.sin(2 * Xq[:, 0]), torch.sin(2 * Xq[:, 1]))
    fq = Xq[:, 2] > 0
    err = {}
    for name, w in (
        ("first", torch.where(first, 1.0, 0.02)),
        ("second", torch.where(first, 0.02, 1.0)),
    ):
        model = small_tree(max_leaf_size=1500).fit(
            X, y, sample_weight=w, generator=torch.Generator().manual_seed(0)
        )
        sq = (model(Xq)[:, 0] - yq) ** 2
        err[name] = (float(sq[fq].mean()), float(sq[~fq].mean()))
    assert err["first"][0] < 0.7 * err["second"][0]
    assert err["second"][1] < 0.7 * err["first"][1]


def test_weighted_classification_and_bad_weights():
    X, y = planted(900, d=4, seed=5)
    labels = (y > y.quantile(0.85)).long()  # 15 % positives
    w = torch.where(labels == 1, 85 / 15, 1.0)
    model = small_tree(task="classification").fit(
        X, labels, sample_weight=w, generator=torch.Generator().manual_seed(0)
    )
    plain = small_tree(task="classification").fit(
        X, labels, generator=torch.Generator().manual_seed(0)
    )
    Xq, yq = planted(2000, d=4, seed=6)
    lq = (yq > y.quantile(0.85)).long()

    def recall(m) -> float:
        return float((m.predict_proba(Xq).argmax(1)[lq == 1] == 1).float().mean())

    assert recall(model) > recall(plain)  # the minority class is found more often
    with pytest.raises(ValueError, match="non-negative"):
        small_tree().fit(X, y, sample_weight=-torch.ones(900))
    with pytest.raises(ValueError, match="val_sample_weight needs X_val"):
        small_tree().fit(X, y, val_sample_weight=torch.ones(10))
    with pytest.raises(ValueError, match="uncertainty='calibrated' cannot be fitted with sample"):
        small_tree(uncertainty="calibrated").fit(X, y, sample_weight=torch.rand(900) + 0.5)
