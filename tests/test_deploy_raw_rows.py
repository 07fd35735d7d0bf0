"""A classifier fitted on a DataFrame deploys on raw rows: text columns and missing cells.

From one fitted ``XRFMClassifier``, the saved estimator file, the ``torch.export`` program and
the ONNX file each predict the DataFrame's rows as ``predict_proba`` does; the encoding between
the DataFrame and the graph is one documented step (``estimator.encode``).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from test_estimator_files import FAST, mixed_table
from xrfm_torch import XRFMClassifier, export_onnx, export_program, load_model, save_model


@pytest.fixture(scope="module")
def fitted():
    df, labels, _ = mixed_table(300, seed=3)
    est = XRFMClassifier(**FAST).fit(df, labels)
    return est, df, est.predict_proba(df)


def test_encode_gives_the_rows_the_model_reads(fitted):
    est, df, proba = fitted
    x = est.encode(df)
    assert x.dtype == torch.float32 and tuple(x.shape) == (300, 4)
    with torch.no_grad():
        p = est.model_.predict_proba(x).double()
    assert np.array_equal((p / p.sum(1, keepdim=True)).numpy(), proba)  # renormalized in float64
    # a text cell becomes the index of its level among the training levels; missing: NaN
    levels = est.encoder_.levels[0].tolist()
    assert levels == ["blue", "green", "red"]
    colour = df["colour"].to_numpy()
    seen = df["colour"].notna().to_numpy()
    assert x[seen, 0].tolist() == [float(levels.index(c)) for c in colour[seen]]
    assert x[~seen, 0].isnan().all()


def test_the_saved_file_predicts_the_raw_rows_exactly(fitted, tmp_path):
    est, df, proba = fitted
    save_model(est, tmp_path / "clf.pt")
    assert np.array_equal(load_model(tmp_path / "clf.pt").predict_proba(df), proba)


def test_the_exported_program_takes_raw_rows_as_its_example(fitted):
    est, df, proba = fitted
    program = export_program(est, df[:2])  # a DataFrame: encoded as the estimator encodes
    out = program.module()(est.encode(df))
    np.testing.assert_allclose(out.double().numpy(), proba, rtol=0, atol=1e-6)


@pytest.mark.slow
def test_the_onnx_file_predicts_the_raw_rows(fitted, tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="the onnx extra runs ONNX files")
    est, df, proba = fitted
    path = export_onnx(est, tmp_path / "clf.onnx", df[:2])
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"x": est.encode(df).numpy()})
    # float32 kernel sums in onnxruntime's order (its float64 kernels lack soft routing's
    # Softplus): within about 1e-5 of predict_proba, not 1e-6 as the exported program is
    np.testing.assert_allclose(out.astype(np.float64), proba, rtol=0, atol=3e-5)
