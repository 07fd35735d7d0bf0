from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from xrfm_torch.data import load_dataset, prepare, protocol_split, read_csv
from xrfm_torch.data.sources import load_openml, make_synthetic, parse_arff
from xrfm_torch.lit import TabularDataModule


def test_protocol_split_is_the_documented_formula():
    tr, va, te = protocol_split(8192, 0)
    idx = np.random.default_rng(0).permutation(8192)
    assert np.array_equal(tr, idx[:5734])
    assert np.array_equal(va, idx[5734:6553])
    assert np.array_equal(te, idx[6553:])


def test_prepare_standardizes_with_train_statistics():
    X, y, _ = load_dataset("cpu_act")
    d = prepare(X, y, 0)
    tr, _, te = protocol_split(len(X), 0)
    np.testing.assert_allclose(d.X_train.mean(0), 0, atol=1e-4)
    np.testing.assert_allclose(
        d.X_test,
        ((X[te] - X[tr].mean(0)) / (X[tr].std(0) + 1e-12)).astype(np.float32),
        rtol=1e-5,
        atol=1e-5,
    )
    np.testing.assert_allclose(d.y_scaler.inverse(d.y_test), y[te], rtol=1e-5, atol=1e-4)


def test_csv_loader(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,b,price\n1,2,3\n4,5,6\n")
    X, y, names = read_csv(path, "price")
    assert names == ["a", "b"]
    np.testing.assert_array_equal(X, [[1, 2], [4, 5]])
    np.testing.assert_array_equal(y, [3, 6])
    with pytest.raises(ValueError, match="no column named 'cost'"):
        read_csv(path, "cost")
    bad = tmp_path / "bad.csv"
    bad.write_text("a,b\n1,nan\n")
    with pytest.raises(ValueError, match="non-finite value at row 0, column 'b'"):
        read_csv(bad)


def test_openml_from_prepared_cache(tmp_path):
    with gzip.open(tmp_path / "123.csv.gz", "wt") as fh:
        fh.write("f1,f2,goal\n" + "\n".join(f"{i},{2 * i},{3 * i}" for i in range(20)))
    (tmp_path / "123.json").write_text(json.dumps({"id": 123, "name": "toy", "target": "goal"}))
    table = load_openml(123, tmp_path)
    assert table.names == ["f1", "f2"] and table.categorical == []
    np.testing.assert_array_equal(table.y, 3 * np.arange(20))
    dm = TabularDataModule("openml", openml_id=123, cache_dir=str(tmp_path))
    dm.prepare_data()  # cached: no network needed
    dm.setup()
    assert len(dm.datasets["train"]) == 14
    with pytest.raises(FileNotFoundError, match="not cached"):
        load_openml(999, tmp_path)


def test_parse_arff_reads_numeric_and_nominal_attributes():
    text = (
        "% comment\n@RELATION t\n@ATTRIBUTE x NUMERIC\n@ATTRIBUTE 'y' REAL\n"
        "@ATTRIBUTE colour {'dark red', blue}\n@ATTRIBUTE class {'>50K','<=50K'}\n@DATA\n"
        "1,2,'dark red','>50K'\n3,?,blue,'<=50K'\n5,6,?,'>50K'\n"
    )
    names, nominal, rows = parse_arff(text)
    assert names == ["x", "y", "colour", "class"] and nominal == [False, False, True, True]
    assert rows == [
        ["1", "2", "dark red", ">50K"],
        ["3", "", "blue", "<=50K"],
        ["5", "6", "", ">50K"],
    ]
    with pytest.raises(ValueError, match="unsupported type 'date'"):
        parse_arff("@ATTRIBUTE c date\n@DATA\n1\n")
    with pytest.raises(ValueError, match="has 1 cells for 2 attributes"):
        parse_arff("@ATTRIBUTE a NUMERIC\n@ATTRIBUTE b NUMERIC\n@DATA\n1\n")


def test_openml_cache_with_nominal_attributes_reads_as_a_table(tmp_path):
    pytest.importorskip("pandas")
    import csv
    import io

    names, _, rows = parse_arff(
        "@ATTRIBUTE x NUMERIC\n@ATTRIBUTE colour {red, blue}\n@ATTRIBUTE class {no, yes}\n@DATA\n"
        + "\n".join(
            f"{i},{'red' if i % 2 else 'blue'},{'yes' if i % 3 else 'no'}" for i in range(30)
        )
        + "\n1,?,no\n"
    )
    buf = io.StringIO()
    csv.writer(buf).writerows([names, *rows])  # what download_openml caches
    with gzip.open(tmp_path / "7.csv.gz", "wt") as fh:
        fh.write(buf.getvalue())
    (tmp_path / "7.json").write_text(json.dumps({"id": 7, "target": "class"}))
    table = load_openml(7, tmp_path)
    assert table.categorical == [1] and list(table.classes) == ["no", "yes"]
    assert np.isnan(table.X[-1, 1])  # the missing nominal cell
    dm = TabularDataModule("openml", openml_id=7, cache_dir=str(tmp_path))
    dm.setup()
    assert dm.task == "classification" and dm.categorical_features == [1] and dm.num_classes == 2


def test_synthetic_is_the_protocol_task():
    X, y, names = make_synthetic(500, 8, noise=0.0, seed=3)
    expected = (
        np.sin(2 * X[:, 0]) + X[:, 1] ** 2 - X[:, 2] * X[:, 3] + 0.5 * np.tanh(X[:, 4] + X[:, 5])
    )
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)
    assert names[-1] == "x7"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"name": "nope"}, "unknown dataset 'nope'"),
        ({"name": "csv"}, "needs path"),
        ({"name": "openml"}, "needs openml_id"),
        ({"task": "ranking"}, "task must be"),
    ],
)
def test_datamodule_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TabularDataModule(**kwargs)


def test_a_csv_without_task_says_how_its_numeric_target_was_read(tmp_path, caplog):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 2))
    labels = (X[:, 0] > 0).astype(int)  # 0/1 labels written as numbers
    path = tmp_path / "t.csv"
    lines = ["a,b,label"] + [f"{a:.4f},{b:.4f},{c}" for (a, b), c in zip(X, labels)]
    path.write_text("\n".join(lines) + "\n")
    with caplog.at_level("INFO", logger="xrfm_torch.lit.datamodule"):
        dm = TabularDataModule("csv", path=str(path), target="label")
        dm.setup()
    assert dm.task == "regression"
    warned = [r for r in caplog.records if r.levelname == "WARNING"]
    assert len(warned) == 1 and "dataset.task=classification" in warned[0].getMessage()
    assert "the whole values 0, 1" in warned[0].getMessage()
    caplog.clear()
    with caplog.at_level("INFO", logger="xrfm_torch.lit.datamodule"):  # given: nothing to say
        TabularDataModule("csv", path=str(path), target="label", task="classification").setup()
    assert not [r for r in caplog.records if "dataset.task" in r.getMessage()]
    path.write_text("\n".join(["a,b,y"] + [f"{a:.4f},{b:.4f},{a + b:.4f}" for a, b in X]) + "\n")
    caplog.clear()
    with caplog.at_level("INFO", logger="xrfm_torch.lit.datamodule"):  # real numbers: info only
        TabularDataModule("csv", path=str(path), target="y").setup()
    said = [r for r in caplog.records if "dataset.task" in r.getMessage()]
    assert [r.levelname for r in said] == ["INFO"] and "so a regression" in said[0].getMessage()
