"""Where tabular users already work: an MLflow flavour (:mod:`xrfm_torch.integrations.mlflow`).

Each integration imports its package only when used, and says which extra installs it when it
is missing.
"""
