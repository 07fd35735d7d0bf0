"""Class codings (one-hot rows, or minus the training prior: the reference's prevalence) and how
scores become probabilities (clipped, or a softmax fitted on validation rows)."""

from __future__ import annotations

import pytest
import torch

from xrfm_torch import LeafConfig, LeafRFM, xRFMTree
from xrfm_torch.leaf.criteria import (
    CLIP,
    PLATT_RIDGE,
    choose_softmax_scale,
    class_probabilities,
    fit_platt,
    fit_softmax_scale,
    platt_logits,
    row_logloss,
)
from xrfm_torch.tree.targets import TargetCoding


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def imbalanced(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Three classes with priors about 0.6 / 0.3 / 0.1, decided by x0 (two cuts)."""
    g = seeded(seed)
    X = torch.randn(n, 4, generator=g, dtype=torch.float64)
    y = (X[:, 0] > 0.25).long() + (X[:, 0] > 1.28).long()
    return X, y


def simplex_basis(k: int) -> torch.Tensor:
    """(k, k-1) orthonormal columns spanning the rows that sum to zero (the reference's code)."""
    eye = torch.eye(k, dtype=torch.float64)
    q, _ = torch.linalg.qr(eye[:, :-1] - eye[:, -1:])
    return q


def test_prevalence_codes_are_one_hot_minus_the_prior_and_decode_back():
    y = torch.tensor([0, 0, 0, 1, 2, 0, 1, 0])
    coding = TargetCoding("classification", "prevalence").fit(y)
    prior = torch.tensor([5, 2, 1], dtype=torch.float32) / 8
    torch.testing.assert_close(coding.prior_, prior)
    codes = coding.encode(y.float())
    torch.testing.assert_close(codes, torch.eye(3)[y] - prior)
    torch.testing.assert_close(codes.sum(1), torch.zeros(8))  # in the sum-zero plane
    torch.testing.assert_close(coding.decode(codes), torch.eye(3)[y])
    # a zero score (no kernel evidence) decodes to the prior
    torch.testing.assert_close(coding.probabilities(coding.decode(torch.zeros(1, 3)))[0], prior)
    # the reference's simplex decoding of the same point: pi solves [C^T; 1^T] pi = [code; 1]
    c = simplex_basis(3) - prior.double() @ simplex_basis(3)
    a = torch.cat([c.T, torch.ones(1, 3, dtype=torch.float64)])
    code = (codes[3].double() @ simplex_basis(3)).unsqueeze(0)
    pi = torch.linalg.solve(a, torch.cat([code, torch.ones(1, 1, dtype=torch.float64)], 1).T)
    torch.testing.assert_close(pi[:, 0].float(), coding.decode(codes[3:4])[0])


@pytest.mark.parametrize("config", [LeafConfig.plain(n_iters=2), LeafConfig(n_iters=2)])
def test_a_leaf_on_centred_one_hot_equals_a_leaf_on_the_reference_simplex_code(config):
    # KRR is linear in the targets and the AGOP and squared error are rotation-invariant, so the
    # simplex code Y Q (Q orthonormal) gives the rotated predictions, iterations and choices alike
    X, y = imbalanced(500, 0)
    Xv, yv = imbalanced(200, 1)
    coding = TargetCoding("classification", "prevalence").fit(y)
    Y, Yv = coding.encode(y.double()), coding.encode(yv.double(), "y_val")
    q = simplex_basis(3)
    centred = LeafRFM(config=config).fit(X, Y, Xv, Yv, generator=seeded())
    simplex = LeafRFM(config=config).fit(X, Y @ q, Xv, Yv @ q, generator=seeded())
    Xt, _ = imbalanced(100, 2)
    torch.testing.assert_close(centred(Xt), simplex(Xt) @ q.T, rtol=1e-6, atol=1e-8)
    assert int(centred.best_iter_) == int(simplex.best_iter_)


def test_far_from_every_row_prevalence_predicts_the_prior_and_one_hot_does_not():
    X, y = imbalanced(1200, 3)
    Xv, yv = imbalanced(300, 4)
    far = torch.full((1, 4), 500.0, dtype=torch.float64)
    probs = {}
    leaf = LeafConfig(n_iters=1, linear_mix=0.0)  # a linear part would extrapolate its trend
    for coding in ("one_hot", "prevalence"):
        model = xRFMTree(
            "laplace",
            task="classification",
            class_coding=coding,
            calibration="clip",  # the coding's own probabilities
            leaf=leaf,
            input_transform="identity",
        )
        model.fit(X, y, Xv, yv, generator=seeded())
        probs[coding] = model.predict_proba(far)[0]
        Xt, yt = imbalanced(500, 5)
        assert float((model.predict_proba(Xt).argmax(1) == yt).double().mean()) > 0.9
    prior = torch.bincount(y, minlength=3).double() / len(y)
    torch.testing.assert_close(probs["prevalence"], prior, atol=2e-3, rtol=0)
    # one-hot scores vanish there: all clipped to the floor, so every class looks equally likely
    torch.testing.assert_close(probs["one_hot"], torch.full((3,), 1 / 3, dtype=torch.float64))


def test_prevalence_state_round_trips_and_older_states_load():
    X, y = imbalanced(600, 6)
    model = xRFMTree(task="classification", class_coding="prevalence", leaf=LeafConfig(n_iters=1))
    model.fit(X, y, generator=seeded())
    fresh = xRFMTree.from_config(model.get_config())
    assert fresh.class_coding == "prevalence"
    fresh.load_state_dict(model.state_dict())
    Xt, _ = imbalanced(40, 7)
    assert torch.equal(fresh.predict_proba(Xt), model.predict_proba(Xt))
    # a one-hot model saved before class codings existed has no prior_: it loads as zeros
    plain = xRFMTree(task="classification", leaf=LeafConfig(n_iters=1)).fit(
        X, y, generator=seeded()
    )
    state = plain.state_dict()
    del state["targets.prior_"]
    old = xRFMTree.from_config(plain.get_config())
    old.load_state_dict(state)
    assert torch.equal(old.predict_proba(Xt), plain.predict_proba(Xt))


def test_prevalence_with_a_criterion_that_reads_scores_is_refused():
    with pytest.raises(ValueError, match="class_coding='prevalence' needs criterion 'mse'"):
        xRFMTree(
            task="classification", class_coding="prevalence", leaf=LeafConfig(criterion="logloss")
        )
    with pytest.raises(ValueError, match="class_coding must be one of"):
        xRFMTree(task="classification", class_coding="simplex")  # type: ignore[arg-type]


def test_the_softmax_scale_minimizes_the_unclipped_log_loss_and_the_output_is_clipped():
    g = seeded(8)
    labels = torch.randint(0, 4, (300,), generator=g)
    scores = torch.eye(4, dtype=torch.float64)[labels] + 0.4 * torch.randn(
        300, 4, generator=g, dtype=torch.float64
    )
    a = fit_softmax_scale(scores, labels)
    grid = torch.logspace(-2, 4, 4001, dtype=torch.float64)
    losses = torch.stack([row_logloss(torch.softmax(t * scores, 1), labels).mean() for t in grid])
    assert a == pytest.approx(float(grid[losses.argmin()]), rel=5e-3)
    p = class_probabilities(scores, 1e4)  # however sharp: clipped, rows summing to 1
    assert float(p.min()) >= CLIP / (1 + 3 * CLIP) and float(p.max()) <= 1 - CLIP
    torch.testing.assert_close(p.sum(1), torch.ones(300, dtype=torch.float64))


def test_auto_calibration_keeps_calibrated_scores_and_softens_clipped_mistakes():
    g = seeded(9)
    # scores that are the true probabilities: clipping them is already calibrated
    p = torch.rand(2000, generator=g, dtype=torch.float64)
    labels = (torch.rand(2000, generator=g, dtype=torch.float64) < p).long()
    scores = torch.stack([1 - p, p], 1)
    assert choose_softmax_scale(scores, labels) == 0.0
    # ten classes, right about 90 % of the time, the true class often scored below 0 otherwise:
    # clipping charges ~7 nats for each such row, the softmax far less
    labels = torch.randint(0, 10, (1000,), generator=g)
    wrong = torch.rand(1000, generator=g) < 0.1
    shown = torch.where(wrong, (labels + 1) % 10, labels)
    scores = torch.eye(10, dtype=torch.float64)[shown] + 0.2 * torch.randn(
        1000, 10, generator=g, dtype=torch.float64
    )
    scale = choose_softmax_scale(scores, labels)
    assert scale == pytest.approx(fit_softmax_scale(scores, labels))
    clipped = row_logloss(class_probabilities(scores), labels).mean()
    assert row_logloss(class_probabilities(scores, scale), labels).mean() < 0.8 * clipped


@pytest.mark.parametrize("calibration", ["clip", "softmax", "platt"])
def test_the_tree_calibrates_on_its_validation_rows(calibration):
    X, y = imbalanced(900, 10)
    Xv, yv = imbalanced(300, 11)
    model = xRFMTree(task="classification", calibration=calibration, leaf=LeafConfig(n_iters=1))
    model.fit(X, y, Xv, yv, generator=seeded())
    scale = float(model.targets.softmax_scale_)
    platt = model.targets.platt_
    Xt, _ = imbalanced(50, 12)
    scores = model(Xt)
    if calibration == "clip":
        assert scale == 0.0 and platt.numel() == 0
    elif calibration == "softmax":  # fitted on the model's own validation outputs
        assert scale == pytest.approx(fit_softmax_scale(model(Xv), yv), rel=1e-4)
    else:
        assert scale == 0.0 and platt.shape == (int(model.targets.n_classes_) + 1,)
        torch.testing.assert_close(platt, fit_platt(model(Xv), yv), rtol=1e-4, atol=1e-5)
    want = class_probabilities(scores, scale, platt)
    torch.testing.assert_close(model.predict_proba(Xt), want)
    state = model.state_dict()
    fresh = xRFMTree.from_config(model.get_config())
    fresh.load_state_dict(state)
    assert fresh.calibration == calibration
    torch.testing.assert_close(fresh.predict_proba(Xt), model.predict_proba(Xt))
    del state["targets.softmax_scale_"]  # a state saved before calibration existed: clipping
    del state["targets.platt_"]
    fresh.load_state_dict(state)
    torch.testing.assert_close(fresh.predict_proba(Xt), class_probabilities(scores))


def test_platt_map_recovers_a_planted_map_and_sits_at_its_optimum():
    # labels drawn from softmax(a log s + b) with a = 2, b = (0.5, -0.5, 0): the fit finds them
    # (b up to a common shift, which the softmax ignores; the ridge barely moves them at n = 40k)
    g = seeded(21)
    n = 40_000
    e = -torch.rand(n, 3, generator=g, dtype=torch.float64).log()  # Dirichlet(1, 1, 1) rows
    scores = e / e.sum(1, keepdim=True)
    scores = (scores + 0.02 * torch.randn(n, 3, generator=g, dtype=torch.float64)).clamp(0.02, 1)
    true = torch.tensor([2.0, 0.5, -0.5, 0.0], dtype=torch.float64)
    p = torch.softmax(platt_logits(scores, true), 1)
    labels = torch.multinomial(p, 1, generator=g)[:, 0]
    w = fit_platt(scores, labels)
    assert w[0].item() == pytest.approx(2.0, abs=0.05)
    torch.testing.assert_close(w[1:] - w[1:].mean(), true[1:] - true[1:].mean(), atol=0.05, rtol=0)
    # zero gradient of the fitted objective (mean cross-entropy + ridge)
    v = w.clone().requires_grad_(True)
    loss = torch.nn.functional.cross_entropy(platt_logits(scores, v), labels)
    (loss + PLATT_RIDGE * (v * v).sum()).backward()
    assert v.grad.abs().max().item() < 1e-6
    # the probabilities: the map, clipped and renormalized
    probs = class_probabilities(scores, platt=w)
    torch.testing.assert_close(probs.sum(1), torch.ones(n, dtype=torch.float64))
    raw = torch.softmax(platt_logits(scores, w), 1).clamp(1e-3, 1 - 1e-3)
    torch.testing.assert_close(probs, raw / raw.sum(1, keepdim=True))


def test_one_confident_mistake_keeps_the_softmax_scale_finite():
    # clipped, a confident mistake costs the same at any sharper scale, so a fit of the clipped
    # loss runs to the search bound; the unclipped loss charges it and stops
    g = seeded(13)
    labels = torch.randint(0, 10, (200,), generator=g)
    scores = torch.eye(10, dtype=torch.float64)[labels] + 0.05 * torch.randn(
        200, 10, generator=g, dtype=torch.float64
    )
    scores[0] = torch.eye(10, dtype=torch.float64)[(labels[0] + 1) % 10]  # wrong and sure of it
    a = fit_softmax_scale(scores, labels)
    assert 1.0 < a < 100.0
    clipped = torch.stack(
        [row_logloss(class_probabilities(scores, t), labels).mean() for t in (a, 1e4)]
    )
    assert clipped[1] < clipped[0]  # what the clipped objective would have preferred
