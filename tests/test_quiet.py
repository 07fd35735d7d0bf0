"""Quiet by default: no warning from a default fit, fallbacks summed up once, progress that moves."""

from __future__ import annotations

import logging
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from xrfm_torch import LeafConfig, XRFMClassifier, XRFMRegressor, xRFMTree
from xrfm_torch.numerics.progress import FitBar, on_iteration

ROOT = Path(__file__).resolve().parents[1]


def test_default_estimator_fits_say_nothing(caplog, monkeypatch):
    from sklearn.datasets import load_breast_cancer, load_diabetes

    from xrfm_torch.numerics import threads

    # on a quiet machine (a busy one is named once: tests/test_threads.py)
    monkeypatch.setattr(threads, "other_running", lambda: 0)

    caplog.set_level(logging.WARNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        X, y = load_breast_cancer(return_X_y=True)
        XRFMClassifier(random_state=0).fit(X[:300], y[:300]).predict_proba(X[300:])
        X, y = load_diabetes(return_X_y=True)
        XRFMRegressor(random_state=0).fit(X, y).predict(X)
    assert [str(w.message) for w in caught] == []
    assert caplog.records == []


def test_fallbacks_log_at_debug_and_once_at_info(caplog):
    # pure noise: the leaves' validation rows prefer the training mean to the fitted model
    g = torch.Generator().manual_seed(0)
    X, y = torch.randn(600, 3, generator=g), torch.randn(600, generator=g)
    caplog.set_level(logging.DEBUG, logger="xrfm_torch")
    xRFMTree(max_leaf_size=150, leaf=LeafConfig(n_iters=2), input_transform="identity").fit(
        X, y, generator=torch.Generator().manual_seed(0)
    )
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    per_leaf = [r for r in caplog.records if "predicting the mean" in r.getMessage()]
    assert per_leaf and all(r.levelno == logging.DEBUG for r in per_leaf)
    summary = [r for r in caplog.records if "numerical fallbacks in this fit" in r.getMessage()]
    assert len(summary) == 1 and summary[0].levelno == logging.INFO
    assert f"{len(per_leaf)} leaves predict their training mean" in summary[0].getMessage()


def test_progress_moves_during_a_one_leaf_fit():
    events: list[tuple[str, int]] = []
    g = torch.Generator().manual_seed(1)
    X = torch.randn(400, 3, generator=g)
    y = X[:, 0].sin()
    with on_iteration(lambda t, tau: events.append(("iteration", t))):
        tree = xRFMTree(leaf=LeafConfig(n_iters=4, patience=None), input_transform="identity")
        tree.fit(
            X,
            y,
            generator=torch.Generator().manual_seed(0),
            progress=lambda i, done, total: events.append(("leaf", done)),
        )
    assert tree.n_leaves == 1
    # every iteration the leaf ran (t = 0, 1, ...) is reported before the single leaf is
    assert events[-1] == ("leaf", 1)
    iterations = [t for kind, t in events[:-1] if kind == "iteration"]
    assert len(iterations) >= 3 and iterations == list(range(len(iterations)))


def test_fit_bar_counts_leaves_and_shows_iterations():
    bar = FitBar("fit")
    bar.iteration(0, 3)
    assert bar._bar is not None and bar._bar.postfix.endswith("RFM iteration 0/3")
    assert bar._bar.desc.startswith("fit: preparing (input maps, splits)")  # no leaf counted yet
    assert str(bar._bar) == "fit: preparing (input maps, splits), RFM iteration 0/3"  # no "0leaf"
    bar.leaf_done(0, 1, 2)
    assert (bar._bar.n, bar._bar.total) == (1, 2) and bar._bar.desc.startswith("fit (tree 1)")
    assert "1/2" in str(bar._bar)  # the leaves counted again
    bar.iteration(1, 3)
    assert bar._bar.desc.startswith("fit (tree 1)")  # a leaf's iterations keep the tree's label
    bar.leaf_done(0, 2, 2)
    assert bar._bar is None  # closed with the tree's last leaf
    bar.close()


@pytest.mark.slow
def test_default_train_run_prints_no_warning_or_tip(tmp_path):
    out = subprocess.run(
        [sys.executable, str(ROOT / "train.py"), "dataset=cpu_act"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    text = out.stdout + out.stderr
    for noise in ("Warning", "warn", "Tip", "weights_only", "deprecated", "Traceback"):
        assert noise not in text, text
    assert "test/rmse" in text and (tmp_path / "outputs" / "train" / "runs").is_dir()
    rmse = float(text.split("test/rmse")[1].split()[0])
    assert np.isfinite(rmse) and rmse < 2.5


def test_a_missing_column_is_one_error_not_a_chain(tmp_path):
    pytest.importorskip("pandas")
    from xrfm_torch.data.tabular import read_any

    path = tmp_path / "data.csv"
    path.write_text("a,b,price\n1,x,2\n3,y,4\n")  # text cells: the numeric reader hands over
    with pytest.raises(ValueError, match="no column named 'prize'") as err:
        read_any(path, "prize")
    # before: the numeric reader's error, then "During handling ... another exception occurred"
    assert err.value.__context__ is None and err.value.__cause__ is None
