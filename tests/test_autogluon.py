"""The AutoGluon model against AutoGluon itself (``pip install -e '.[autogluon]'``).

Run in CI in its own environment (.ci/run: AutoGluon pins pandas below 2.4); elsewhere it
skips without AutoGluon.
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from test_estimator_files import mixed_table

ag = pytest.importorskip("autogluon.tabular", reason="the autogluon extra (its own CI venv)")
from autogluon.tabular import TabularPredictor  # noqa: E402

from xrfm_torch.integrations.autogluon import XRFMModel, fit_time_limit  # noqa: E402

FAST = {"n_iters": 2, "max_leaf_size": 200}


def table(task: str, n: int = 500, seed: int = 0):
    df, labels, score = mixed_table(n, seed=seed)
    if task == "regression":
        return df.assign(y=score)
    if task == "multiclass":
        return df.assign(y=np.digitize(score, np.quantile(score, [1 / 3, 2 / 3])).astype(str))
    return df.assign(y=labels)


@pytest.mark.parametrize("task", ["binary", "multiclass", "regression"])
def test_autogluon_fits_scores_and_reloads_the_model(task, tmp_path):
    train, test = table(task), table(task, 200, seed=1)
    limit = 30.0
    start = time.perf_counter()
    predictor = TabularPredictor(label="y", path=str(tmp_path / "ag"), verbosity=0).fit(
        train, hyperparameters={XRFMModel: FAST, "GBM": {}}, time_limit=limit
    )
    assert time.perf_counter() - start < 1.2 * limit
    board = predictor.leaderboard(test, silent=True).set_index("model")
    assert {"XRFMTorch", "LightGBM"} <= set(board.index)
    assert np.isfinite(board.loc["XRFMTorch", "score_test"])
    again = TabularPredictor.load(str(tmp_path / "ag"))
    ours = again.predict(test, model="XRFMTorch")
    assert ours.tolist() == predictor.predict(test, model="XRFMTorch").tolist()
    if task == "regression":
        rmse = float(np.sqrt(np.mean((ours.to_numpy() - test["y"].to_numpy()) ** 2)))
        assert rmse < 0.6 * float(test["y"].std())  # the planted signal, learned
    else:
        proba = again.predict_proba(test, model="XRFMTorch")
        np.testing.assert_allclose(proba.sum(axis=1).to_numpy(), 1.0, atol=1e-5)
        assert (ours.to_numpy() == test["y"].to_numpy()).mean() > 0.6


def test_bagged_mode_and_the_time_limit_it_is_given(tmp_path):
    train = table("binary", 400)
    predictor = TabularPredictor(label="y", path=str(tmp_path / "ag"), verbosity=0).fit(
        train, hyperparameters={XRFMModel: FAST}, num_bag_folds=2, time_limit=40
    )
    info = predictor.info()["model_info"]
    bagged = [name for name in info if name.startswith("XRFMTorch")]
    bags = info[bagged[0]]["bagged_info"]  # k-fold bags of our model
    assert bags["child_model_type"] == "XRFMModel" and bags["num_child_models"] == 2
    assert predictor.predict_proba(train.head(5)).shape == (5, 2)


def test_the_anytime_limit_leaves_headroom_and_the_memory_estimate_grows_with_leaves():
    assert fit_time_limit(None) is None
    assert fit_time_limit(60.0) == pytest.approx(47.0) and fit_time_limit(1.0) == 0.5
    train = table("binary", 400).drop(columns="y")
    small = XRFMModel._estimate_memory_usage_static(X=train, hyperparameters={"max_leaf_size": 100})
    big = XRFMModel._estimate_memory_usage_static(X=train, hyperparameters={"max_leaf_size": 400})
    # 3 float32 copies of the largest leaf's kernel matrix: 3 * 4 * (400^2 - 100^2) bytes more
    assert big - small == 3 * 4 * (400**2 - 100**2)
