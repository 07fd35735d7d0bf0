"""The MLflow flavour and the ``logger=mlflow`` config, against MLflow itself (a local SQLite store)."""

from __future__ import annotations

import sys

import numpy as np
import pytest

from test_configs import compose_with
from test_estimator_files import FAST, mixed_table
from xrfm_torch import XRFMClassifier, XRFMRegressor

mlflow = pytest.importorskip("mlflow", reason="the mlflow extra (pip install 'xrfm-torch[mlflow]')")
from xrfm_torch.integrations import mlflow as flavour  # noqa: E402


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # a SQLite store keeps its artifacts in ./mlruns
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    mlflow.set_tracking_uri(uri)
    yield uri
    mlflow.set_tracking_uri(None)


def test_a_logged_classifier_loads_with_equal_predictions(store):
    df, labels, _ = mixed_table(200, seed=5)
    est = XRFMClassifier(**FAST).fit(df, labels)
    with mlflow.start_run():
        info = flavour.log_model(est, name="model", input_example=df[:5])
    # the flavour's own loader: the estimator, predicting the DataFrame bit for bit
    loaded = flavour.load_model(info.model_uri)
    assert isinstance(loaded, XRFMClassifier)
    assert np.array_equal(loaded.predict_proba(df), est.predict_proba(df))
    # the python_function entry: a DataFrame in, labels (or probabilities) out
    pyfunc = mlflow.pyfunc.load_model(info.model_uri)
    assert pyfunc.predict(df).tolist() == est.predict(df).tolist()
    proba = pyfunc.predict(df, params={"output": "proba"})
    assert list(proba.columns) == ["high", "low"]
    assert np.array_equal(proba.to_numpy(), est.predict_proba(df))
    # the inferred signature names the columns; the file inside is the plain-data one
    names = [c.name for c in pyfunc.metadata.get_input_schema().inputs]
    assert names == ["colour", "size", "count", "flag"]
    with pytest.raises(ValueError, match="output must be one of"):
        pyfunc.predict(df, params={"output": "logits"})


def test_a_saved_regressor_directory_loads_as_pyfunc(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    df, _, target = mixed_table(160, seed=6)
    est = XRFMRegressor(**FAST).fit(df, target)
    flavour.save_model(est, tmp_path / "m", input_example=df[:3])
    pyfunc = mlflow.pyfunc.load_model(str(tmp_path / "m"))
    assert np.array_equal(np.asarray(pyfunc.predict(df)), est.predict(df))
    assert (tmp_path / "m" / "requirements.txt").read_text().startswith("xrfm-torch[sklearn]==")
    with pytest.raises(FileExistsError):
        flavour.save_model(est, tmp_path / "m")


def test_logger_mlflow_writes_metrics_a_fresh_client_reads(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    from mlflow.tracking import MlflowClient

    from xrfm_torch.pipeline import run

    cfg = compose_with(
        [
            "dataset=synthetic",
            "dataset.n_samples=600",
            "dataset.n_features=6",
            "model.leaf.n_iters=1",
            "model.max_leaf_size=300",
            "callbacks=none",
            "logger=mlflow",
            "trainer.enable_progress_bar=false",
        ],
        tmp_path,
    )
    result = run(cfg)
    uri = cfg.logger.mlflow.tracking_uri
    assert uri.startswith("sqlite:///")
    client = MlflowClient(tracking_uri=uri)
    (experiment,) = [e for e in client.search_experiments() if e.name == "xrfm_torch"]
    (found,) = client.search_runs([experiment.experiment_id])
    rmse = found.data.metrics["test/rmse"]
    assert rmse == pytest.approx(result["metrics"]["test/rmse"], rel=1e-6)


def test_without_mlflow_the_error_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ModuleNotFoundError, match=r"xrfm-torch\[mlflow\]"):
        flavour.save_model(object(), "unused")
