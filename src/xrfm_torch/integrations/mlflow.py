"""An MLflow flavour for the estimators: ``save_model``, ``log_model``, ``load_model``.

A fitted ``XRFMRegressor`` / ``XRFMClassifier`` is stored as the estimator file of
:func:`xrfm_torch.save_model` (plain data, column encoding included; never a pickle) inside an
MLflow model directory, with two flavours in its ``MLmodel``:

- ``xrfm_torch``: :func:`load_model` gives the estimator back;
- ``python_function``: ``mlflow.pyfunc.load_model(uri).predict(df)`` takes a pandas DataFrame
  (text categories, missing cells) and returns predictions: values for a regressor, labels for
  a classifier, or with ``params={"output": "proba"}`` the class probabilities (a DataFrame with
  one column per class).

The signature is inferred from ``input_example`` when none is given. Needs MLflow
(``pip install 'xrfm-torch[mlflow]'``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from xrfm_torch.__about__ import __version__
from xrfm_torch.files import load_model as _load_file
from xrfm_torch.files import save_model as _save_file

FLAVOR_NAME = "xrfm_torch"
_DATA = "model.xrfm"
_OUTPUTS = ("predict", "proba")


def _mlflow() -> Any:
    try:
        import mlflow
        import mlflow.pyfunc
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            f"the MLflow flavour needs mlflow ({err.name} is missing): "
            "pip install 'xrfm-torch[mlflow]'"
        ) from err
    return mlflow


def save_model(
    model: Any,
    path: str | os.PathLike[str],
    mlflow_model: Any = None,
    signature: Any = None,
    input_example: Any = None,
) -> None:
    """Write a fitted estimator as an MLflow model directory ``path`` (must not exist).

    Args:
        model: A fitted ``XRFMRegressor`` or ``XRFMClassifier``.
        path: The directory to create.
        mlflow_model: An ``mlflow.models.Model`` to add the flavours to (``log_model`` passes
            its own).
        signature: An ``mlflow.models.ModelSignature``; inferred from ``input_example`` (and the
            model's predictions on it) when ``None``.
        input_example: A few rows (a DataFrame) for the signature.

    Raises:
        FileExistsError: ``path`` exists.
        RuntimeError / TypeError / ValueError: as :func:`xrfm_torch.save_model`.
    """
    mlflow = _mlflow()
    from mlflow.models import Model, infer_signature

    out = Path(path)
    if out.exists():
        raise FileExistsError(f"{os.fspath(path)!r} exists; MLflow model directories are new")
    out.mkdir(parents=True)
    _save_file(model, out / _DATA)
    mlflow_model = Model() if mlflow_model is None else mlflow_model
    if signature is None and input_example is not None:
        signature = infer_signature(
            input_example, _Predictor(model).predict(input_example), params={"output": "predict"}
        )
    if signature is not None:
        mlflow_model.signature = signature
    (out / "requirements.txt").write_text(f"xrfm-torch[sklearn]=={__version__}\n")
    version = ".".join(map(str, sys.version_info[:3]))
    (out / "python_env.yaml").write_text(
        f"python: {version}\nbuild_dependencies:\n  - pip\ndependencies:\n  - -r requirements.txt\n"
    )
    mlflow.pyfunc.add_to_model(
        mlflow_model, loader_module=__name__, data=_DATA, python_env="python_env.yaml"
    )
    mlflow_model.add_flavor(
        FLAVOR_NAME, xrfm_torch_version=__version__, data=_DATA, estimator=type(model).__name__
    )
    mlflow_model.save(str(out / "MLmodel"))


def log_model(
    model: Any,
    name: str | None = None,
    *,
    input_example: Any = None,
    signature: Any = None,
    registered_model_name: str | None = None,
    **kwargs: Any,
) -> Any:
    """Log a fitted estimator to the active run (as ``mlflow.sklearn.log_model`` does).

    Args:
        model: A fitted ``XRFMRegressor`` or ``XRFMClassifier``.
        name: The logged model's name.
        input_example: A few rows (a DataFrame); the signature is inferred from them.
        signature: An explicit ``ModelSignature`` instead.
        registered_model_name: Also register the model under this name.
        **kwargs: Further arguments of ``mlflow.models.Model.log`` (``tags``, ``params``, ...).

    Returns:
        MLflow's ``ModelInfo`` (``model_uri`` loads it).
    """
    _mlflow()
    from mlflow.models import Model

    return Model.log(
        artifact_path=None,
        name=name,
        flavor=sys.modules[__name__],
        registered_model_name=registered_model_name,
        model=model,
        input_example=input_example,
        signature=signature,
        **kwargs,
    )


def load_model(model_uri: str, dst_path: str | None = None) -> Any:
    """The fitted estimator logged or saved at ``model_uri`` (``runs:/...``, ``models:/...``, a path)."""
    mlflow = _mlflow()
    from mlflow.models import Model

    local = Path(mlflow.artifacts.download_artifacts(artifact_uri=model_uri, dst_path=dst_path))
    conf = Model.load(str(local / "MLmodel")).flavors.get(FLAVOR_NAME)
    if conf is None:
        raise ValueError(f"{model_uri!r} has no {FLAVOR_NAME!r} flavour")
    return _load_file(local / str(conf["data"]))


def _load_pyfunc(data_path: str) -> _Predictor:
    """MLflow's ``python_function`` entry: the estimator file at ``data_path``, wrapped."""
    return _Predictor(_load_file(data_path))


class _Predictor:
    """``predict(df, params)``: predictions, labels, or ``params={"output": "proba"}``."""

    def __init__(self, estimator: Any) -> None:
        self.estimator = estimator

    def unwrap_python_model(self) -> Any:
        """The estimator (MLflow's name for reaching the wrapped model)."""
        return self.estimator

    def predict(self, model_input: Any, params: dict[str, Any] | None = None) -> Any:
        output = (params or {}).get("output", "predict")
        if output not in _OUTPUTS:
            raise ValueError(f"params output must be one of {_OUTPUTS}, got {output!r}")
        if output == "predict":
            return self.estimator.predict(model_input)
        if not hasattr(self.estimator, "predict_proba"):
            raise ValueError("output='proba' needs a classifier")
        import pandas as pd

        proba = self.estimator.predict_proba(model_input)
        return pd.DataFrame(proba, columns=[str(c) for c in self.estimator.classes_])
