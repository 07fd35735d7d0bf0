"""End-to-end runs of the Hydra pipeline (the function train.py calls) and of the Lightning system."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from test_configs import compose_with
from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.data.protocol import protocol_split
from xrfm_torch.lit import TabularDataModule, XRFMLitModule, predict_rows
from xrfm_torch.models.blend import KernelBlend
from xrfm_torch.pipeline import run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def synthetic_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    cfg = compose_with(
        [
            "dataset=synthetic",
            "dataset.n_samples=3000",
            "dataset.n_features=8",
            "model.max_leaf_size=800",
            "model.leaf.n_iters=2",
            "trainer.enable_progress_bar=false",
        ],
        out,
    )
    return run(cfg), out


def test_beats_mean_predictor(synthetic_run):
    result, _ = synthetic_run
    dm = result["objects"]["datamodule"]
    y_test = dm.data.y_scaler.inverse(dm.data.y_test)
    mean_rmse = float(
        np.sqrt(np.mean((y_test - dm.data.y_scaler.inverse(dm.data.y_train).mean()) ** 2))
    )
    assert result["metrics"]["test/rmse"] < 0.4 * mean_rmse
    assert result["metrics"]["test/r2"] > 0.8
    # one tree: its honest outputs are the validation rows only, so no out-of-fold scores
    assert not [k for k in result["metrics"] if k.startswith("val/oof_")]


def test_checkpoint_reload_gives_identical_predictions(synthetic_run):
    result, _ = synthetic_run
    system = result["objects"]["system"]
    loaded = XRFMLitModule.load_from_checkpoint(result["checkpoint"], weights_only=True)
    x = torch.from_numpy(result["objects"]["datamodule"].data.X_test)
    assert torch.equal(loaded.predict_step((x,), 0), system.predict_step((x,), 0))
    assert loaded.model.n_leaves == system.model.n_leaves


def test_a_checkpoint_written_before_the_model_was_renamed_loads(synthetic_run, tmp_path):
    """Before 0.16 the LightningModule held its model as ``tree``: config key and state prefix."""
    result, _ = synthetic_run
    ckpt = torch.load(result["checkpoint"], weights_only=False)
    ckpt["xrfm_tree_config"] = ckpt.pop("xrfm_model_config")
    ckpt["state_dict"] = {
        ("tree." + k.removeprefix("model.") if k.startswith("model.") else k): v
        for k, v in ckpt["state_dict"].items()
    }
    assert any(k.startswith("tree.") for k in ckpt["state_dict"])
    torch.save(ckpt, tmp_path / "old.ckpt")
    loaded = XRFMLitModule.load_from_checkpoint(tmp_path / "old.ckpt", weights_only=True)
    x = torch.from_numpy(result["objects"]["datamodule"].data.X_test)
    system = result["objects"]["system"]
    assert torch.equal(loaded.predict_step((x,), 0), system.predict_step((x,), 0))


def test_tree_summary_file(synthetic_run):
    result, out = synthetic_run
    model = result["objects"]["system"].model  # the default: a blend of two single trees
    summary = json.loads((out / "tree_summary.json").read_text())
    trees = [t for _, t in model.single_trees()]
    assert summary["n_leaves"] == model.n_leaves == sum(t.n_leaves for t in trees)
    assert summary["kernels"] == [model.kernels[int(i)] for i in model.member_kernels_]
    assert len(summary["bags"]) == len(trees) >= 1
    for one, tree in zip(summary["bags"], trees):
        assert tree.n_leaves >= 4
        assert one["input_maps"] == tree.input_map.names and len(one["input_maps"]) >= 1
        assert [leaf["n_support"] for leaf in one["leaves"]] == [
            int(lf.support_.shape[0]) for lf in tree.leaves()
        ]
        assert [leaf["best_iter"] for leaf in one["leaves"]] == [
            int(lf.best_iter_) for lf in tree.leaves()
        ]
        assert max(leaf["n_support"] for leaf in one["leaves"]) <= 800


def test_agop_importance_ranks_planted_features_first(synthetic_run):
    _, out = synthetic_run
    rows = list(csv.DictReader((out / "agop_importance.csv").open()))
    assert {r["feature"] for r in rows[:6]} == {f"x{i}" for i in range(6)}
    assert abs(sum(float(r["importance"]) for r in rows) - 1) < 1e-6
    assert (out / "agop_importance.png").stat().st_size > 1000


def test_leaf_metrics_files(synthetic_run):
    result, out = synthetic_run
    model = result["objects"]["system"].model
    dm = result["objects"]["datamodule"]
    rows = list(csv.DictReader((out / "leaf_metrics_test.csv").open()))
    assert len(rows) == model.n_leaves  # every single tree's leaves
    # recompute each leaf's RMSE by hand (hard routing under the fitted temperature may differ
    # from the model's soft prediction, so use the system's own predictions)
    system = result["objects"]["system"]
    x = torch.from_numpy(dm.data.X_test)
    pred = system.predict_step((x,), 0)
    y = torch.from_numpy(dm.data.y_scaler.inverse(dm.data.y_test))
    for b, (_, tree) in enumerate(model.single_trees()):
        mine = [r for r in rows if int(r["bag"]) == b]
        n_trees = len(tree.partition_trees())
        assert sum(int(r["n_rows"]) for r in mine) == n_trees * len(dm.data.X_test)
        ids = [tree.leaf_ids(x, t) for t in range(n_trees)]
        for r in mine:
            m = ids[int(r["tree"])] == int(r["leaf"])
            if m.any():
                assert float(r["rmse"]) == pytest.approx(
                    float(((pred[m] - y[m]) ** 2).mean().sqrt()), rel=1e-4
                )


def test_temperature_sweep_file(synthetic_run):
    result, out = synthetic_run
    system = result["objects"]["system"]
    rows = list(csv.DictReader((out / "temperature_sweep.csv").open()))
    trees = [t for _, t in system.model.single_trees()]  # the default: a blend of two trees
    assert len(trees) == 2 and {int(r["tree"]) for r in rows} == {0, 1}
    for k, tree in enumerate(trees):
        mine = [r for r in rows if int(r["tree"]) == k]
        grid = [float(r["temperature"]) for r in mine]
        expected = tree.temperature_errors(*system.fit_data["val"], grid)
        assert [float(r["val_mse"]) for r in mine] == pytest.approx(expected, rel=1e-6)
        best = grid[int(np.argmin([float(r["val_mse"]) for r in mine]))]
        assert float(tree.temperature_) == pytest.approx(best)
    assert (out / "temperature_sweep.png").exists()


def test_run_outputs(synthetic_run):
    result, out = synthetic_run
    metrics_csv = next(out.glob("csv/version_*/metrics.csv"))
    header = metrics_csv.read_text().splitlines()[0].split(",")
    assert {"train/rmse", "val/rmse", "test/rmse", "test/mae", "test/r2", "test/mse"} <= set(header)
    assert Path(result["checkpoint"]).exists()


def test_classification_end_to_end(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1500, 5))
    label = (X[:, 0] + np.sin(2 * X[:, 1]) > 0).astype(int)
    path = tmp_path / "clf.csv"
    np.savetxt(
        path, np.column_stack([X, label]), delimiter=",", header="a,b,c,d,e,label", comments=""
    )
    cfg = compose_with(
        [
            "dataset=csv",
            "dataset.task=classification",
            "dataset.target=label",
            "model.leaf.n_iters=1",
            "callbacks=none",
            "logger=none",
            "trainer.enable_progress_bar=false",
        ],
        tmp_path,
    )
    cfg.dataset.path = str(path)
    metrics = run(cfg)["metrics"]
    assert metrics["test/accuracy"] > 0.85
    assert metrics["test/auroc"] > 0.9
    assert 0 < metrics["test/logloss"] < 0.5


def test_multi_process_trainer_fits_leaves_distributed(monkeypatch):
    """Under a multi-process strategy each rank fits with ``distributed=True`` (its share of the
    leaves); without a process group that is the single-process model (tests/test_parallel.py
    runs two real gloo ranks)."""

    def fitted(world_size: int) -> XRFMLitModule:
        monkeypatch.setattr(pl.Trainer, "world_size", property(lambda self: world_size))
        dm = TabularDataModule("synthetic", n_samples=600, n_features=6)
        system = XRFMLitModule(xRFMTree(leaf=LeafConfig(n_iters=1), max_leaf_size=200))
        trainer = pl.Trainer(
            max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False
        )
        trainer.fit(system, datamodule=dm)
        return system

    many, one = fitted(2), fitted(1)
    assert many.model.distributed and not one.model.distributed
    assert many.model.n_leaves > 1
    Xq = torch.randn(50, 6, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(many.model(Xq), one.model(Xq), rtol=0, atol=0)


def test_plain_dataloaders_without_datamodule():
    dm = TabularDataModule("synthetic", n_samples=600, n_features=6)
    dm.setup()
    system = XRFMLitModule(xRFMTree(leaf=LeafConfig(n_iters=1)), **dm.system_kwargs())
    trainer = pl.Trainer(
        max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False
    )
    trainer.fit(
        system, train_dataloaders=dm.train_dataloader(), val_dataloaders=dm.val_dataloader()
    )
    assert system.model.is_fitted
    for _, tree in system.model.single_trees():  # the default blend's trees: the same rows
        assert len(tree.leaves()[0].support_) == len(dm.datasets["train"])
    # the validation loader reached the fit (no hold-out of training rows)
    assert len(system.fit_data["val"][0]) == len(dm.datasets["val"])


def test_temperature_sweep_says_routing_plays_no_part_in_a_one_leaf_tree(tmp_path, caplog):
    from xrfm_torch.lit import TemperatureSweep

    dm = TabularDataModule("synthetic", n_samples=600, n_features=6)
    system = XRFMLitModule(xRFMTree(leaf=LeafConfig(n_iters=1)))
    trainer = pl.Trainer(
        max_epochs=1,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        callbacks=[TemperatureSweep(dirpath=str(tmp_path))],
    )
    with caplog.at_level("INFO"):
        trainer.fit(system, datamodule=dm)
    assert all(t.n_leaves == 1 for _, t in system.model.single_trees())
    assert "routing plays no part" in caplog.text
    assert not (tmp_path / "temperature_sweep.csv").exists()


@pytest.mark.slow
def test_train_py_multirun(tmp_path):
    cmd = [
        sys.executable,
        str(ROOT / "train.py"),
        "-m",
        "debug=fast",
        "model/kernel=laplace,product_laplace",
        f"paths.log_dir={tmp_path}",
        "trainer.enable_progress_bar=false",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    runs = sorted(tmp_path.glob("debug/multiruns/*/*/metrics.yaml"))
    assert len(runs) == 2
    assert proc.stdout.count("test/rmse") == 2


def test_a_csv_table_with_text_missing_cells_and_text_labels(tmp_path):
    pd = pytest.importorskip("pandas")
    rng = np.random.default_rng(0)
    n = 1500
    color = rng.choice(["red", "green", "blue"], size=n)
    x = rng.normal(size=n)
    score = x + np.select([color == "red", color == "green"], [1.5, -1.5], 0.0)
    label = np.where(score > 0, "yes", "no")
    lines = ["color,x,z,label"]
    for i in range(n):
        c = "" if i % 13 == 0 else color[i]  # empty cells: missing
        z = "" if i % 17 == 0 else f"{rng.normal():.6f}"
        lines.append(f"{c},{x[i]:.6f},{z},{label[i]}")
    path = tmp_path / "data.csv"  # where compose_with points dataset=csv
    path.write_text("\n".join(lines) + "\n")
    cfg = compose_with(
        [
            "dataset=csv",
            f"dataset.path={path}",
            "dataset.target=label",
            "model.leaf.n_iters=2",
            "callbacks=none",
            "logger=none",
            "trainer.enable_progress_bar=false",
        ],
        tmp_path,
    )
    result = run(cfg)
    dm, system = result["objects"]["datamodule"], result["objects"]["system"]
    assert dm.task == "classification" and dm.categorical_features == [0] and dm.has_missing
    # the classification default, as XRFMClassifier's: the two kernels' blend of 5 bags
    assert isinstance(system.model, KernelBlend) and system.model.kernels == ("laplace", "gaussian")
    trees = [tree for _, tree in system.model.single_trees()]
    assert len(trees) in (5, 10)  # a kernel of weight 0 is dropped
    for tree in trees:
        assert tree.config.categorical_features == (0,) and tree.missing_values == "any"
        assert tree.input_map.missing_columns == [2]  # z: missing numbers get an indicator
    assert result["metrics"]["test/accuracy"] > 0.9
    # the checkpoint predicts new raw rows: the CSV's test rows give the run's own predictions
    ckpt = tmp_path / "run.ckpt"
    result["objects"]["trainer"].save_checkpoint(ckpt)
    raw = pd.read_csv(path)
    test_rows = protocol_split(n, 0)[2]
    new = raw.iloc[test_rows].drop(columns="label").iloc[:, ::-1]  # columns by name, any order
    proba = predict_rows(ckpt, new, proba=True)
    with torch.no_grad():
        expected = system.predict_output(torch.from_numpy(dm.data.X_test)).double().numpy()
    assert np.array_equal(proba, expected)
    labels = predict_rows(ckpt, path)  # a CSV path: every row, the table's own labels
    assert labels[test_rows].tolist() == np.array(["no", "yes"])[expected.argmax(1)].tolist()
    assert (labels == raw["label"].to_numpy()).mean() > 0.9
    with pytest.raises(ValueError, match=r"lacks columns .*'color'"):
        predict_rows(ckpt, new.drop(columns="color"))


# Slow tier: two train.py runs of which one launches two DDP processes (~10 s on 2 cores). It
# failed twice in some twenty CI runs, once with its output: rank 0 aborted at exit after its
# results were written ("terminate called without an active exception": Lightning leaves a
# gloo process group to the interpreter's exit); train.py now ends the group on every rank.
# The core's distributed fit is checked bit for bit in the default tier
# (test_parallel.py::test_two_gloo_ranks_fit_the_single_process_model); run this one with
# `pytest -m slow`.
@pytest.mark.slow
def test_train_py_under_ddp_fits_the_one_process_model(tmp_path):
    """``trainer=ddp``: two CPU processes fit the leaves between them and rank 0 reports.

    The ranks run one BLAS thread each, and so does the one-process fit here; the models agree up
    to float rounding (tests/test_parallel.py checks bit equality of the core's fits).
    """
    results = {}
    for trainer in ("ddp", "default"):
        cmd = [
            sys.executable,
            str(ROOT / "train.py"),
            "dataset=synthetic",
            "dataset.n_samples=2000",
            "model.max_leaf_size=400",
            "model.leaf.n_iters=2",
            f"trainer={trainer}",
            "logger=none",
            "callbacks=none",
            "trainer.enable_progress_bar=false",
            f"paths.log_dir={tmp_path / trainer}",
        ]
        # one BLAS thread in every process, as the DDP ranks run: the same float rounding, so
        # the same discrete choices (splits, input maps) in both fits
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        proc = subprocess.run(
            cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.count("Results (synthetic") == 1  # rank 0 alone prints
        (run_dir,) = (tmp_path / trainer).glob("train/runs/*")
        metrics = OmegaConf.load(run_dir / "metrics.yaml")
        # plain data only: the checkpoint loads without unpickling arbitrary objects
        system = XRFMLitModule.load_from_checkpoint(
            run_dir / "checkpoints" / "last.ckpt", weights_only=True
        )
        results[trainer] = (metrics["test/rmse"], system.model)
    (rmse_ddp, tree_ddp), (rmse_one, tree_one) = results["ddp"], results["default"]
    seen = f"ddp: {tree_ddp.n_leaves} leaves, RMSE {rmse_ddp}; one process: {tree_one.n_leaves}, {rmse_one}"
    assert tree_ddp.n_leaves == tree_one.n_leaves > 1, seen
    assert rmse_ddp == pytest.approx(rmse_one, rel=0.01), seen
    Xq = torch.randn(100, 20, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(tree_ddp(Xq), tree_one(Xq), rtol=1e-3, atol=1e-3)


def test_the_fit_log_names_the_kind_of_model(caplog):
    dm = TabularDataModule("synthetic", n_samples=600, n_features=6)
    for kernels, kind in (("auto", "KernelBlend"), (None, "xRFMTree")):
        system = XRFMLitModule(xRFMTree(leaf=LeafConfig(n_iters=1)), blend_kernels=kernels)
        trainer = pl.Trainer(
            max_epochs=1, logger=False, enable_progress_bar=False, enable_checkpointing=False
        )
        caplog.clear()
        with caplog.at_level("INFO", logger="xrfm_torch.lit.module"):
            trainer.fit(system, datamodule=dm)
        assert type(system.model).__name__ == kind
        assert f"fitting {kind} on " in caplog.text
