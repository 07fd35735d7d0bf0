"""Model files and state-dict format versions (xrfm_torch.models.io)."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import planted
from xrfm_torch import BaggedTree, KernelBlend, LeafConfig, load_model, save_model, xRFMTree
from xrfm_torch.models.state import STATE_FORMAT_VERSION


@pytest.fixture(scope="module")
def fitted():
    X, y = planted(900, d=4)
    model = xRFMTree(leaf=LeafConfig(n_iters=2), max_leaf_size=300)
    return model.fit(X, y, generator=torch.Generator().manual_seed(0)), X[:50]


def test_saved_model_loads_with_weights_only_and_predicts_the_same(fitted, tmp_path):
    model, Xq = fitted
    path = tmp_path / "model.pt"
    save_model(model, path)
    raw = torch.load(path, weights_only=True)  # plain data: nothing is unpickled as code
    assert raw["format_version"] == STATE_FORMAT_VERSION
    assert raw["state_dict"]["_extra_state"] == {"format_version": STATE_FORMAT_VERSION}
    loaded = load_model(path)
    assert loaded.n_leaves == model.n_leaves > 1
    torch.testing.assert_close(loaded(Xq), model(Xq), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="fitted"):
        save_model(xRFMTree(), tmp_path / "unfitted.pt")


def test_a_state_saved_before_format_versions_loads_as_version_0(fitted):
    model, Xq = fitted
    old = dict(model.state_dict())
    del old["_extra_state"]  # what every state saved before versions looks like
    fresh = xRFMTree(leaf=LeafConfig(n_iters=2), max_leaf_size=300)
    fresh.load_state_dict(old)
    torch.testing.assert_close(fresh(Xq), model(Xq), rtol=0, atol=0)


def test_a_version_1_state_loads_without_offsets_and_platt_maps():
    # version 1 had neither the leaves' mean-predictor offset nor the Platt map of class codings
    X, y = planted(600, d=4)
    labels = (y[:, 0] > y[:, 0].median()).long() if y.ndim == 2 else (y > y.median()).long()
    model = xRFMTree(task="classification", leaf=LeafConfig(n_iters=2), max_leaf_size=300)
    model.fit(X, labels, generator=torch.Generator().manual_seed(0))
    old = {k: v for k, v in model.state_dict().items() if not k.endswith(("offset_", "platt_"))}
    old["_extra_state"] = {"format_version": 1}
    fresh = xRFMTree(task="classification", leaf=LeafConfig(n_iters=2), max_leaf_size=300)
    fresh.load_state_dict(old)
    assert fresh.targets.platt_.numel() == 0 and not any(
        leaf.is_constant for leaf in fresh.leaves()
    )
    torch.testing.assert_close(fresh(X[:50]), model(X[:50]), rtol=0, atol=0)  # same scores
    scores = model(X[:50])
    p = scores.clamp(1e-3, 1 - 1e-3)
    torch.testing.assert_close(fresh.predict_proba(X[:50]), p / p.sum(1, keepdim=True))


def test_a_version_2_state_loads_as_exact_leaves(fitted):
    # version 2 had no approximate final solves: no approx_ (now kind_), fourier_w_, fourier_b_
    model, Xq = fitted
    suffixes = ("kind_", "fourier_w_", "fourier_b_")
    old = {k: v for k, v in model.state_dict().items() if not k.endswith(suffixes)}
    assert len(old) < len(model.state_dict())
    old["_extra_state"] = {"format_version": 2}
    fresh = xRFMTree(leaf=LeafConfig(n_iters=2), max_leaf_size=300)
    fresh.load_state_dict(old)
    assert all(leaf.approximation is None for leaf in fresh.leaves())
    torch.testing.assert_close(fresh(Xq), model(Xq), rtol=0, atol=0)


def as_version_3(state: dict) -> dict:
    """A current state written the way format 3 wrote it: ``approx_`` (0 exact or mean, else 1 +
    the approximation's index), the Gaussian-process buffers on the leaf itself."""
    old: dict = {}
    for key, value in state.items():
        if key.endswith(".kind_"):
            code = int(value)
            old[key.removesuffix("kind_") + "approx_"] = torch.tensor(0 if code == 4 else code)
        elif key == "fitted_temperature_":
            old["temperature_"] = value
        else:
            old[key.replace(".gp.", ".")] = value
    old["_extra_state"] = {"format_version": 3}
    return old


def test_a_version_3_state_loads_with_kinds_and_gp_buffers_in_place():
    X, y = planted(900, d=4)
    cfg = LeafConfig(n_iters=1, iter_rows=150, approx_above=200, approx="fourier")
    approx = xRFMTree(leaf=cfg, max_leaf_size=450).fit(
        X, y, generator=torch.Generator().manual_seed(0)
    )
    assert {leaf.kind for leaf in approx.leaves()} == {"fourier"}
    old = as_version_3(approx.state_dict())
    assert not any(k.endswith("kind_") for k in old) and any(k.endswith("approx_") for k in old)
    assert "temperature_" in old and "fitted_temperature_" not in old
    fresh = xRFMTree(leaf=cfg, max_leaf_size=450)
    fresh.load_state_dict(old)
    assert [leaf.kind for leaf in fresh.leaves()] == [leaf.kind for leaf in approx.leaves()]
    torch.testing.assert_close(fresh(X[:50]), approx(X[:50]), rtol=0, atol=0)
    gp = xRFMTree(leaf=LeafConfig(n_iters=1), max_leaf_size=450, uncertainty="gp")
    gp.fit(X, y, generator=torch.Generator().manual_seed(0))
    old = as_version_3(gp.state_dict())
    assert any(k.endswith("leaves.0.noise_coef_") for k in old)
    fresh, same = (
        xRFMTree(leaf=LeafConfig(n_iters=1), max_leaf_size=450, uncertainty="gp") for _ in "ab"
    )
    fresh.load_state_dict(old)  # strict: every key found its place
    same.load_state_dict(gp.state_dict())
    assert all(leaf.gp.is_fitted for leaf in fresh.leaves())
    # both loaded models factor their leaves again: the same means and standard deviations
    for a, b in zip(fresh(X[:50], return_std=True), same(X[:50], return_std=True)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_a_version_4_state_loads_with_no_column_on_a_log_scale(fitted):
    model, Xq = fitted
    old = {k: v for k, v in model.state_dict().items() if "log_" not in k}
    assert len(old) == len(model.state_dict()) - 5
    old["_extra_state"] = {"format_version": 4}
    fresh = xRFMTree(leaf=LeafConfig(n_iters=2), max_leaf_size=300)
    fresh.load_state_dict(old)  # strict: every buffer found its value
    assert fresh.input_map.log_columns == []
    torch.testing.assert_close(
        fresh.input_map.log_standardize.scale_, model.input_map.standardize.scale_
    )
    torch.testing.assert_close(fresh(Xq), model(Xq), rtol=0, atol=0)


def test_a_newer_format_version_is_refused_naming_both_versions(fitted, tmp_path):
    model, _ = fitted
    state = dict(model.state_dict())
    state["_extra_state"] = {"format_version": STATE_FORMAT_VERSION + 1}
    with pytest.raises(ValueError, match=f"version {STATE_FORMAT_VERSION + 1}.*upgrade"):
        xRFMTree().load_state_dict(state)
    path = tmp_path / "newer.pt"
    save_model(model, path)
    raw = torch.load(path, weights_only=True)
    raw["format_version"] = STATE_FORMAT_VERSION + 1
    torch.save(raw, path)
    with pytest.raises(ValueError, match="format version .* upgrade the package"):
        load_model(path)


def test_truncated_and_foreign_files_give_clear_errors(fitted, tmp_path):
    model, _ = fitted
    path = tmp_path / "model.pt"
    save_model(model, path)
    data = path.read_bytes()
    cut = tmp_path / "cut.pt"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="truncated, corrupted or not a torch file"):
        load_model(cut)
    text = tmp_path / "notes.txt"
    text.write_text("not a model\n")
    with pytest.raises(ValueError, match="not a readable xrfm_torch model file"):
        load_model(text)
    foreign = tmp_path / "other.pt"
    torch.save({"weight": torch.zeros(3)}, foreign)
    with pytest.raises(ValueError, match=r"keys \['weight'\], not an xrfm_torch model"):
        load_model(foreign)
    with pytest.raises(FileNotFoundError):
        load_model(tmp_path / "missing.pt")


def test_configs_naming_the_models_old_modules_still_build():
    """Files saved before the models moved to ``xrfm_torch.models`` name ``xrfm_torch.tree.*``."""
    from xrfm_torch.numerics.config import MOVED_TARGETS, from_config

    cfg = KernelBlend(BaggedTree(xRFMTree(max_leaf_size=123), n_bags=2)).get_config()
    old = {new: old for old, new in MOVED_TARGETS.items()}
    text = json.dumps(cfg)
    for new, name in old.items():
        text = text.replace(f'"{new}"', f'"{name}"')
    assert "xrfm_torch.tree.model.xRFMTree" in text and "xrfm_torch.tree.blend" in text
    model = from_config(json.loads(text))
    assert isinstance(model, KernelBlend)
    assert model.get_config() == cfg


def test_a_file_with_the_old_format_label_loads(tmp_path):
    """Files written before 0.16 carry the label ``xrfm_torch.xRFMTree`` and the old targets."""
    from xrfm_torch.models.io import FILE_FORMAT, OLD_FORMATS

    X, y = planted(n=300, d=3)
    model = xRFMTree(leaf=LeafConfig(n_iters=1)).fit(
        X, y, generator=torch.Generator().manual_seed(0)
    )
    save_model(model, tmp_path / "m.pt")
    obj = torch.load(tmp_path / "m.pt", weights_only=True)
    assert obj["format"] == FILE_FORMAT
    obj["format"] = OLD_FORMATS[0]
    obj["config"]["_target_"] = "xrfm_torch.tree.model.xRFMTree"
    torch.save(obj, tmp_path / "old.pt")
    assert torch.equal(load_model(tmp_path / "old.pt")(X), model(X))
