"""A weight column through the Lightning path: datamodule, closed-form fit, weighted metrics."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torchmetrics.regression import MeanAbsoluteError, MeanSquaredError, R2Score

from test_head import quiet_trainer
from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.lit import TabularDataModule, XRFMLitModule
from xrfm_torch.lit.metrics import make_metrics
from xrfm_torch.lit.weighted_metrics import WeightedMean, WeightedR2


def test_weighted_metrics_are_the_metrics_of_repeated_rows():
    g = torch.Generator().manual_seed(0)
    pred, y = torch.randn(80, generator=g), torch.randn(80, generator=g)
    w = torch.randint(0, 4, (80,), generator=g)
    rep = torch.repeat_interleave(torch.arange(80), w)
    pairs = (
        (WeightedMean("se"), MeanSquaredError()),
        (WeightedMean("se", root=True), MeanSquaredError(squared=False)),
        (WeightedMean("ae"), MeanAbsoluteError()),
        (WeightedR2(), R2Score()),
    )
    for weighted, plain in pairs:
        weighted.update(pred[:50], y[:50], w[:50].float())  # two batches
        weighted.update(pred[50:], y[50:], w[50:].float())
        plain.update(pred[rep], y[rep])
        torch.testing.assert_close(weighted.compute(), plain.compute(), rtol=1e-5, atol=1e-6)
    probs = torch.softmax(torch.randn(80, 3, generator=g), 1)
    labels = torch.randint(0, 3, (80,), generator=g)
    acc, ll = WeightedMean("correct"), WeightedMean("logloss")
    acc.update(probs, labels, w.float())
    ll.update(probs, labels, w.float())
    expected_acc = (probs[rep].argmax(1) == labels[rep]).float().mean()
    expected_ll = -probs[rep].gather(1, labels[rep][:, None]).log().mean()
    torch.testing.assert_close(acc.compute(), expected_acc)
    torch.testing.assert_close(ll.compute(), expected_ll.float(), rtol=1e-5, atol=1e-6)
    assert set(make_metrics("classification", 3, weighted=True)) == {"accuracy", "auroc", "logloss"}


@pytest.fixture
def weighted_csv(tmp_path):
    pd = pytest.importorskip("pandas")
    r = np.random.default_rng(0)
    n = 900
    x = r.normal(size=(n, 3))
    w = np.where(x[:, 2] > 0, 5.0, 0.2)  # rows with x2 > 0 count 25x more
    y = np.where(x[:, 2] > 0, np.sin(2 * x[:, 0]), np.sin(2 * x[:, 1]))
    frame = pd.DataFrame(
        {"a": x[:, 0], "b": x[:, 1], "c": x[:, 2], "w": w, "kind": r.choice(["u", "v"], n), "y": y}
    )
    path = tmp_path / "weighted.csv"
    frame.to_csv(path, index=False)
    return path


def test_a_weight_column_is_not_a_feature_and_fits_the_core_weighted_model(weighted_csv):
    dm = TabularDataModule("csv", path=str(weighted_csv), target="y", weight="w", seed=0)
    dm.setup()
    assert dm.feature_names == ["a", "b", "c", "kind"] and dm.categorical_features == [3]
    kw = dm.system_kwargs()
    assert kw["weighted"] is True
    batch = next(iter(dm.train_dataloader()))
    assert len(batch) == 4
    torch.testing.assert_close(batch[3].unique(), torch.tensor([0.2, 5.0]))
    tree_args = {"leaf": LeafConfig(n_iters=2), "max_leaf_size": 400, **dm.model_kwargs()}
    system = XRFMLitModule(xRFMTree(input_transform="identity", **tree_args), **kw)
    trainer = quiet_trainer(1)
    trainer.fit(system, datamodule=dm)
    # the same fit from the core, with the split's weights
    d = dm.data
    w_all = dm.sample_weight
    from xrfm_torch.data.protocol import protocol_split

    tr, va, te = protocol_split(len(w_all), 0)
    t = torch.from_numpy
    core = xRFMTree(input_transform="identity", **tree_args).fit(
        t(d.X_train),
        t(d.y_train),
        t(d.X_val),
        t(d.y_val),
        sample_weight=t(w_all[tr]).float(),
        val_sample_weight=t(w_all[va]).float(),
        generator=torch.Generator().manual_seed(0),
    )
    Xt = t(d.X_test)
    assert torch.equal(system(Xt), core(Xt))
    # the logged test RMSE is the weighted RMSE of the test rows, in target units
    trainer.test(system, datamodule=dm, verbose=False)
    pred = system.to_output(core(Xt)).double().numpy()
    y_test = d.y_scaler.inverse(d.y_test)
    wt = w_all[te]
    expected = np.sqrt(np.sum(wt * (pred - y_test) ** 2) / np.sum(wt))
    assert float(trainer.callback_metrics["test/rmse"]) == pytest.approx(expected, rel=1e-4)


def test_bad_weight_columns_are_refused(weighted_csv):
    with pytest.raises(ValueError, match="not a column"):
        TabularDataModule("csv", path=str(weighted_csv), target="y", weight="nope").setup()
    with pytest.raises(ValueError, match="holds text"):
        TabularDataModule("csv", path=str(weighted_csv), target="y", weight="kind").setup()
    with pytest.raises(ValueError, match="needs a csv or openml"):
        TabularDataModule("synthetic", weight="w")
