"""End-to-end quality on cpu_act with the benchmark protocol (seed 0) and default settings."""

from __future__ import annotations

import hashlib
import time

import numpy as np
import pytest
import torch

from conftest import SHARED_DATASETS, needs_shared_datasets
from xrfm_torch import xRFMTree
from xrfm_torch.data import load_dataset, prepare
from xrfm_torch.data.registry import read_csv


@pytest.mark.slow
def test_cpu_act_default_rmse():
    X, y, _ = load_dataset("cpu_act")
    d = prepare(X, y, seed=0)
    t = torch.from_numpy
    start = time.perf_counter()
    model = xRFMTree().fit(
        t(d.X_train),
        t(d.y_train),
        t(d.X_val),
        t(d.y_val),
        generator=torch.Generator().manual_seed(0),
    )
    seconds = time.perf_counter() - start
    pred = d.y_scaler.inverse(model(t(d.X_test)).numpy()[:, 0])
    rmse = float(np.sqrt(np.mean((pred - d.y_scaler.inverse(d.y_test)) ** 2)))
    print(f"cpu_act test RMSE {rmse:.4f}, fit {seconds:.1f}s")
    assert rmse <= 2.35  # reference xrfm 0.4.5 default: 2.349, XRFM_D: 2.121


@needs_shared_datasets()
def test_packaged_cpu_act_is_the_shared_file():
    from importlib import resources

    packaged = resources.files("xrfm_torch.data") / "files" / "cpu_act.csv.gz"
    shared = SHARED_DATASETS / "reg_num" / "cpu_act.csv.gz"
    assert (
        hashlib.sha256(packaged.read_bytes()).hexdigest()
        == hashlib.sha256(shared.read_bytes()).hexdigest()
    )
    X, y, names = read_csv(shared, "target")
    assert X.shape == (8192, 21) and names[0] == "lread" and names[-1] == "freeswap"
