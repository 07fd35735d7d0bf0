"""The search space (xrfm_torch.search) in its three views, and the Hydra Optuna sweep."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from test_configs import CONF, compose_with
from xrfm_torch import LpqLaplaceKernel, XRFMRegressor
from xrfm_torch.search import (
    SPACE,
    KernelDistribution,
    estimator_params,
    hydra_params,
    sklearn_distributions,
    suggest,
)

optuna = pytest.importorskip("optuna", reason="the tune extra (hydra-optuna-sweeper) is needed")
ROOT = Path(__file__).resolve().parents[1]


def test_the_sweeper_yaml_is_the_space():
    cfg = yaml.safe_load((CONF / "hparams_search" / "xrfm_optuna.yaml").read_text())
    assert cfg["hydra"]["sweeper"]["params"] == hydra_params()
    keys = {p.hydra for p in SPACE.values()}
    assert keys == set(hydra_params())


def test_every_hydra_key_is_a_real_config_key(tmp_path):
    cfg = compose_with(["hparams_search=xrfm_optuna"], tmp_path)
    assert cfg.model.kernel._target_.endswith("LpqLaplaceKernel")
    for key in hydra_params():
        node = cfg
        for part in key.split("."):
            assert part in node, f"{key}: {part!r} not in the composed config"
            node = node[part]


def test_suggest_builds_the_trial_values():
    values = {
        "bandwidth": 3.5,
        "q": 0.9,
        "p": 1.7,
        "reg": 1e-4,
        "diag": False,
        "input_transform": "identity",
        "max_leaf_size": 2000,
        "linear_mix": 0.2,
    }
    params = suggest(optuna.trial.FixedTrial(values))
    kernel = params.pop("kernel")
    assert isinstance(kernel, LpqLaplaceKernel)
    assert (float(kernel.bandwidth), kernel.p, kernel.q) == pytest.approx((3.5, 1.7, 0.9))
    assert params == {k: v for k, v in values.items() if k not in ("bandwidth", "p", "q")}
    with pytest.raises(ValueError, match="unknown search-space names"):
        estimator_params({"bandwith": 1.0})


def test_optuna_study_samples_inside_the_space():
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
    for _ in range(30):
        trial = study.ask()
        suggest(trial)
        study.tell(trial, 0.0)
    for t in study.trials:
        for name, p in SPACE.items():
            v = t.params[name]
            if p.kind == "choice":
                assert v in p.choices
            else:
                assert p.low <= v <= p.high
        assert t.params["q"] <= t.params["p"]  # the Lpq kernel stays positive definite


def test_sklearn_randomized_search_over_the_space():
    from sklearn.model_selection import ParameterSampler, RandomizedSearchCV

    dist = sklearn_distributions()
    for params in ParameterSampler(dist, n_iter=25, random_state=0):
        k = params["kernel"]
        assert 0.5 <= float(k.bandwidth) <= 200 and 0.7 <= k.q <= 1.4 <= k.p <= 2.0
        assert 1e-6 <= params["reg"] <= 10 and 0 <= params["linear_mix"] <= 0.5
    bws = [float(KernelDistribution().rvs(s).bandwidth) for s in range(400)]
    # log-uniform: the median near the geometric mean of the ends, sqrt(0.5 * 200) = 10
    assert 6 < float(np.median(bws)) < 16
    rng = np.random.default_rng(0)
    X = rng.normal(size=(300, 3))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1]
    small = {**dist, "reg": [1e-3], "input_transform": ["identity"], "max_leaf_size": [2000]}
    search = RandomizedSearchCV(
        XRFMRegressor(n_iters=2, random_state=0), small, n_iter=2, cv=2, random_state=0
    )
    search.fit(X, y)
    assert search.best_score_ > 0.8
    assert set(search.best_params_) == set(small)


@pytest.mark.slow
def test_the_readme_sweep_runs_and_reports_the_best_trial(tmp_path):
    """``python train.py -m hparams_search=xrfm_optuna`` on cpu_act, a few trials."""
    out = subprocess.run(
        [
            sys.executable,
            "train.py",
            "-m",
            "hparams_search=xrfm_optuna",
            "hydra.sweeper.n_trials=2",
            "model.leaf.n_iters=2",
            "logger=none",
            "trainer.enable_progress_bar=false",
            f"paths.log_dir={tmp_path}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    (result,) = tmp_path.glob("hparams_search/multiruns/*/optimization_results.yaml")
    best = yaml.safe_load(result.read_text())["best_value"]
    trials = [
        yaml.safe_load(p.read_text())["val/rmse"]
        for p in tmp_path.glob("hparams_search/multiruns/*/*/metrics.yaml")
    ]
    assert len(trials) == 2
    assert best == pytest.approx(min(trials))
