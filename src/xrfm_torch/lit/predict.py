"""Predict new raw rows from a ``train.py`` run's checkpoint.

The checkpoint holds the fitted model (``XRFMLitModule``) and the datamodule's
:class:`~xrfm_torch.data.rows.RowEncoding` (columns, category levels, standardization, class
labels), so one call turns a CSV file or a DataFrame of new rows into predictions in the
table's own units and labels::

    from xrfm_torch.lit import predict_rows
    predict_rows("outputs/train/runs/.../checkpoints/last.ckpt", "new_rows.csv")

The checkpoint is read with ``weights_only=True``: it runs none of its code.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import torch

from xrfm_torch.data.rows import RowEncoding
from xrfm_torch.lit.datamodule import TabularDataModule
from xrfm_torch.lit.module import XRFMLitModule


def predict_rows(
    checkpoint: str | os.PathLike[str], rows: Any, *, proba: bool = False
) -> np.ndarray:
    """Predictions for raw ``rows`` from a checkpoint of a ``train.py`` (or ``trainer.fit``) run.

    Args:
        checkpoint: A ``.ckpt`` written while fitting with a ``TabularDataModule``.
        rows: A CSV path, a DataFrame (columns by name; extra ones such as the target are
            ignored; text categories and empty cells as in training) or an (n, d) array.
        proba: Classification: class probabilities (n, K) instead of labels.

    Returns:
        Predictions in the target's units (n,) or (n, c); labels (n,) for classification (the
        table's own labels for a text target, else class indices); or probabilities.

    Raises:
        ValueError: The checkpoint holds no row encoding (it was not fitted on a
            ``TabularDataModule``), or the rows lack a column (naming it).
    """
    ckpt = torch.load(checkpoint, map_location="cpu", weights_only=True)
    state = ckpt.get(TabularDataModule.__qualname__, {}) if isinstance(ckpt, dict) else {}
    if "rows" not in state:
        raise ValueError(
            f"{os.fspath(checkpoint)!r} holds no row encoding: it was not written by a fit on a "
            "TabularDataModule (predict the model's own inputs with XRFMLitModule instead)"
        )
    encoding = RowEncoding.from_state(state["rows"])
    module = XRFMLitModule.load_from_checkpoint(
        Path(checkpoint), map_location="cpu", weights_only=True
    )
    module.eval()
    if isinstance(rows, (str, os.PathLike)):
        import pandas as pd  # the tables extra, as dataset=csv needs

        rows = pd.read_csv(Path(rows))
    x = torch.from_numpy(encoding.transform(rows))
    with torch.no_grad():
        out = module.predict_output(x).double().cpu().numpy()
    if module.hparams["task"] != "classification" or proba:
        return out
    index = out.argmax(1)
    return index if encoding.classes is None else np.asarray(encoding.classes)[index]
