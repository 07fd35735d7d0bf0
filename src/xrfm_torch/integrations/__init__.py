"""Where tabular users already work: MLflow and AutoGluon.

:mod:`xrfm_torch.integrations.mlflow` is an MLflow flavour and
:mod:`xrfm_torch.integrations.autogluon` an AutoGluon model. Each imports its package only when
used, and says which extra installs it when it is missing.
"""
