"""Classification in the core: labels in, one-hot codes in the leaves, clipped probabilities out."""

from __future__ import annotations

import pytest
import torch

from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.leaf.criteria import CLIP, class_probabilities


def seeded(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def planted_classes(n: int, k: int, seed: int, d: int = 5) -> tuple[torch.Tensor, torch.Tensor]:
    """Labels decided by the angle of (x0, x1): k wedges, so classes depend on two features."""
    g = torch.Generator().manual_seed(seed)
    X = torch.randn(n, d, generator=g)
    angle = torch.atan2(X[:, 1], X[:, 0]) + torch.pi  # [0, 2 pi]
    y = (angle / (2 * torch.pi) * k).long().clamp_max(k - 1)
    return X, y


@pytest.mark.parametrize("k", [2, 3])
def test_labels_in_probabilities_out(k):
    X, y = planted_classes(1500, k, seed=0)
    Xv, yv = planted_classes(400, k, seed=1)
    Xt, yt = planted_classes(600, k, seed=2)
    model = xRFMTree(
        task="classification", calibration="clip", max_leaf_size=600, leaf=LeafConfig(n_iters=2)
    )
    model.fit(X, y, Xv, yv, generator=seeded())
    assert model.n_leaves > 1 and int(model.targets.n_classes_) == k
    scores = model(Xt)
    assert scores.shape == (600, k)
    p = model.predict_proba(Xt)
    clipped = scores.clamp(CLIP, 1 - CLIP)
    torch.testing.assert_close(p, clipped / clipped.sum(1, keepdim=True))
    torch.testing.assert_close(p.sum(1), torch.ones(600))
    assert float(p.min()) > 0
    accuracy = float((p.argmax(1) == yt).float().mean())
    assert accuracy > 0.9
    # the temperature is tuned by the Brier score of the (soft-routed) one-hot codes
    onehot = torch.nn.functional.one_hot(yv, k).float()
    grid = [0.0, 0.1, 1.0]
    brier = [float(((model(Xv, temperature=t) - onehot) ** 2).mean()) for t in grid]
    assert model.temperature_errors(Xv, yv, grid) == pytest.approx(brier, rel=1e-4)


def test_classification_state_round_trip_and_config():
    X, y = planted_classes(800, 3, seed=3)
    model = xRFMTree(task="classification", max_leaf_size=400, leaf=LeafConfig(n_iters=1))
    model.fit(X, y, generator=seeded())
    fresh = xRFMTree.from_config(model.get_config())
    assert fresh.task == "classification"
    fresh.load_state_dict(model.state_dict())
    Xt, _ = planted_classes(50, 3, seed=4)
    assert torch.equal(fresh.predict_proba(Xt), model.predict_proba(Xt))


@pytest.mark.parametrize(
    ("labels", "match"),
    [
        (torch.tensor([0.0, 1.0, 2.5, 1.0] * 25), r"class labels 0 .. K-1 .*got 2.5 at row 2"),
        (torch.tensor([0, 1, -1, 1] * 25), r"got -1.0 at row 2"),
        (torch.zeros(100), "at least 2 classes"),
    ],
)
def test_bad_labels_are_refused_by_name(labels, match):
    X = torch.randn(100, 3, generator=seeded())
    with pytest.raises(ValueError, match=match):
        xRFMTree(task="classification", leaf=LeafConfig(n_iters=0)).fit(X, labels)


def test_a_label_the_fit_never_saw_is_refused_at_refit():
    X, y = planted_classes(400, 2, seed=5)
    model = xRFMTree(task="classification", leaf=LeafConfig(n_iters=0)).fit(
        X, y, generator=seeded()
    )
    with pytest.raises(ValueError, match="label 2, but the model was fitted on 2 classes"):
        model.refit_leaves(X, torch.where(y == 1, 2, 0))
    with pytest.raises(ValueError, match="task='classification'"):
        xRFMTree(leaf=LeafConfig(n_iters=0)).fit(X, y.float(), generator=seeded()).predict_proba(X)
    with pytest.raises(ValueError, match="task must be"):
        xRFMTree(task="ranking")


def test_the_lightning_system_and_its_tree_agree_on_the_task():
    from xrfm_torch.lit import XRFMLitModule

    with pytest.raises(ValueError, match="pass xRFMTree\\(task='classification'\\)"):
        XRFMLitModule(xRFMTree(), task="classification", num_classes=3)
    assert XRFMLitModule(task="classification", num_classes=3).model.task == "classification"


def test_validation_criteria_against_their_formulas():
    from xrfm_torch.leaf.criteria import class_probabilities, validation_errors

    pred = torch.tensor([[0.9, 0.2, -0.1], [0.3, 0.5, 0.4], [0.0, 0.0, 1.2]])
    onehot = torch.tensor([[1.0, 0, 0], [0, 0, 1.0], [0, 0, 1.0]])
    value, rows = validation_errors(pred, onehot, "mse")
    assert rows.tolist() == pytest.approx(((pred - onehot) ** 2).sum(1).tolist())
    assert value == pytest.approx(float(((pred - onehot) ** 2).mean()))
    value, rows = validation_errors(pred, onehot, "logloss")
    p = pred.clamp(CLIP, 1 - CLIP)
    p = p / p.sum(1, keepdim=True)
    assert rows.tolist() == pytest.approx(
        [-p[0, 0].log().item(), -p[1, 2].log().item(), -p[2, 2].log().item()]
    )
    torch.testing.assert_close(class_probabilities(pred), p)
    value, rows = validation_errors(pred, onehot, "error")
    assert rows.tolist() == [0.0, 1.0, 0.0] and value == pytest.approx(1 / 3)
    with pytest.raises(ValueError, match="criterion must be one of"):
        LeafConfig(criterion="auc")
    with pytest.raises(ValueError, match="criterion 'logloss' needs task='classification'"):
        xRFMTree(leaf=LeafConfig(criterion="logloss"))


@pytest.mark.parametrize("criterion", ["logloss", "error"])
def test_a_classification_criterion_drives_the_validation_choices(criterion):
    X, y = planted_classes(1200, 3, seed=6)
    Xv, yv = planted_classes(300, 3, seed=7)
    leaf = LeafConfig(n_iters=3, criterion=criterion)
    model = xRFMTree(task="classification", max_leaf_size=500, leaf=leaf)
    model.fit(X, y, Xv, yv, generator=seeded())
    # the temperature search scores the soft-routed ensemble's clipped scores by the criterion
    # (the probability calibration is fitted afterwards, on the chosen routing)
    grid = [0.0, 0.2]
    errs = model.temperature_errors(Xv, yv, grid)
    for t, err in zip(grid, errs):
        p = class_probabilities(model(Xv, temperature=t))
        direct = (
            float(-p.gather(1, yv[:, None]).log().mean())
            if criterion == "logloss"
            else float((p.argmax(1) != yv).float().mean())
        )
        assert err == pytest.approx(direct, rel=1e-4, abs=1e-7)


@pytest.mark.parametrize("criterion", ["mse", "logloss", "error"])
def test_a_leaf_records_and_selects_by_its_criterion(criterion):
    from xrfm_torch import LeafRFM
    from xrfm_torch.leaf.criteria import validation_errors

    X, y = planted_classes(400, 3, seed=8)
    Xv, yv = planted_classes(150, 3, seed=9)
    code, code_v = (torch.nn.functional.one_hot(t, 3).float() for t in (y, yv))
    leaf = LeafRFM("laplace", LeafConfig.plain(n_iters=3, criterion=criterion))
    leaf.fit(X, code, Xv, code_v, generator=seeded())
    curve = leaf.val_errors_[leaf.val_errors_.isfinite()]
    t = int(leaf.best_iter_)
    assert float(leaf.val_errors_[t]) == float(curve.min())  # the kept fit is the criterion's best
    # without post-hoc searches the kept model is that fit: it reproduces the recorded value
    value = validation_errors(leaf(Xv), code_v, criterion)[0]  # float32 sums in another order
    assert value == pytest.approx(float(leaf.val_errors_[t]), rel=1e-4)
    if criterion == "error":  # a share of 150 rows
        assert torch.allclose(curve * 150, (curve * 150).round(), atol=1e-4)
