"""Model files and checkpoints from an untrusted source build only the package's own classes.

Each crafted file names ``builtins.open(file=victim, mode="w")`` as a ``_target_`` somewhere in the
tree's config (top level, kernel, leaf settings, split rule, inside a list): building it would
create ``victim``. Every loading path must refuse it with a ``ValueError`` naming the target, and
leave no file behind.
"""

from __future__ import annotations

import copy

import pytest
import torch

from conftest import planted
from test_head import head_setup, quiet_trainer
from xrfm_torch import KERNELS, LeafConfig, load_model, save_model, xRFMTree
from xrfm_torch.lit import TabularDataModule, XRFMLitModule
from xrfm_torch.lit.head import XRFMHeadModule
from xrfm_torch.models import factory
from xrfm_torch.models.bagging import BaggedTree
from xrfm_torch.models.blend import KernelBlend
from xrfm_torch.models.factory import model_from_config
from xrfm_torch.numerics.config import CONFIG_TARGETS, from_config
from xrfm_torch.tree.splits import AGOPSplit, CARTSplit, PCASplit, RandomSplit


def evil(victim) -> dict:
    return {"_target_": "builtins.open", "file": str(victim), "mode": "w"}


PLACES = ["top", "kernel", "config", "leaf", "split_rule", "list"]


def craft(cfg: dict, place: str, victim) -> dict:
    cfg = copy.deepcopy(cfg)
    if place == "top":
        return {**evil(victim), "x": cfg}
    tree = cfg
    while "config" not in tree:  # an ensemble's config holds its tree's
        tree = tree.get("model") or tree["tree"]
    settings = tree["config"]  # the tree's settings, a TreeConfig
    if place == "list":
        settings["temperature_grid"] = [0.0, evil(victim)]
    elif place in ("leaf", "split_rule"):
        settings[place] = evil(victim)
    else:
        tree[place] = evil(victim)
    return cfg


@pytest.fixture(scope="module")
def fitted():
    X, y = planted(600, d=4)
    model = xRFMTree(leaf=LeafConfig(n_iters=1), max_leaf_size=300, input_transform="identity")
    return model.fit(X, y, generator=torch.Generator().manual_seed(0)), X[:40]


@pytest.mark.parametrize("place", PLACES)
def test_load_model_refuses_a_file_whose_config_names_another_class(fitted, tmp_path, place):
    model, _ = fitted
    victim = tmp_path / "written_by_the_file"
    path = tmp_path / "model.pt"
    save_model(model, path)
    raw = torch.load(path, weights_only=True)
    raw["config"] = craft(raw["config"], place, victim)
    torch.save(raw, path)
    with pytest.raises(ValueError, match=r"builtins\.open.*allowed"):
        load_model(path)
    assert not victim.exists()


@pytest.mark.parametrize("place", PLACES)
def test_from_config_checks_every_target_before_building_any(fitted, tmp_path, place):
    victim = tmp_path / "written"
    with pytest.raises(ValueError, match=r"'builtins\.open'"):
        xRFMTree.from_config(craft(fitted[0].get_config(), place, victim))
    assert not victim.exists()
    with pytest.raises(ValueError, match="must be a dict"):
        from_config(["not", "a", "config"])  # type: ignore[arg-type]


def test_a_genuine_file_still_round_trips_bit_identical(fitted, tmp_path):
    model, Xq = fitted
    save_model(model, tmp_path / "m.pt")
    loaded = load_model(tmp_path / "m.pt")
    assert loaded.get_config() == model.get_config()
    assert torch.equal(loaded(Xq), model(Xq))


def test_the_allow_list_is_exactly_what_configs_emit():
    # every class a model's config can name is allowed, and every allowed name is such a class
    emitted: set[str] = set()

    def collect(cfg):
        if isinstance(cfg, dict):
            if "_target_" in cfg:
                emitted.add(cfg["_target_"])
            for v in cfg.values():
                collect(v)

    rules = [AGOPSplit(), PCASplit(), RandomSplit(), CARTSplit()]
    for name in KERNELS:
        for rule in rules:
            cfg = xRFMTree(name, split_rule=rule).get_config()
            collect(cfg)
            assert xRFMTree.from_config(cfg).get_config() == cfg
    bagged = BaggedTree(xRFMTree(), n_bags=3).get_config()
    collect(bagged)
    assert model_from_config(bagged).get_config() == bagged
    blend = KernelBlend(BaggedTree(xRFMTree(), n_bags=3), kernels=["laplace", "gaussian"])
    collect(blend.get_config())
    assert model_from_config(blend.get_config()).get_config() == blend.get_config()
    # the parts are CONFIG_TARGETS; the models are the registered classes (Anytime's config is
    # emitted by a time-limited fit; the tests of the anytime fit round-trip it)
    models = {n for n in factory.MODEL_CLASSES if not n.endswith(".Anytime")}
    assert emitted == set(CONFIG_TARGETS) | models
    assert not set(CONFIG_TARGETS) & set(factory.MODEL_CLASSES)  # each name in one list


def test_a_crafted_target_inside_a_bagged_config_is_refused(tmp_path):
    victim = tmp_path / "victim"
    cfg = BaggedTree(xRFMTree(), n_bags=2).get_config()
    cfg["tree"]["kernel"] = {"_target_": "builtins.open", "file": str(victim), "mode": "w"}
    with pytest.raises(ValueError, match="builtins.open"):
        model_from_config(cfg)
    assert not victim.exists()


def _crafted_checkpoint(path, place, victim):
    raw = torch.load(path, weights_only=True)
    raw["xrfm_model_config"] = craft(raw["xrfm_model_config"], place, victim)
    torch.save(raw, path)


@pytest.mark.parametrize("place", ["kernel", "leaf", "top"])
def test_lightning_checkpoint_with_a_crafted_tree_config_is_refused(tmp_path, place):
    dm = TabularDataModule("synthetic", n_samples=600, n_features=6, seed=0, batch_size=256)
    dm.setup()
    tree = xRFMTree(leaf=LeafConfig(n_iters=1), max_leaf_size=300, input_transform="identity")
    system = XRFMLitModule(tree, **dm.system_kwargs())
    trainer = quiet_trainer(1, limit_val_batches=0)
    trainer.fit(system, datamodule=dm)
    path = tmp_path / "run.ckpt"
    trainer.save_checkpoint(path)
    genuine = XRFMLitModule.load_from_checkpoint(path, weights_only=True)
    x = torch.from_numpy(dm.data.X_test[:20])
    assert torch.equal(genuine.predict_step((x,), 0), system.predict_step((x,), 0))
    victim = tmp_path / "written"
    _crafted_checkpoint(path, place, victim)
    with pytest.raises(ValueError, match=r"builtins\.open"):
        XRFMLitModule.load_from_checkpoint(path, weights_only=True)
    assert not victim.exists()


def test_head_module_checkpoint_with_a_crafted_tree_config_is_refused(tmp_path):
    dm, module = head_setup(False)
    trainer = quiet_trainer(1, limit_train_batches=2, limit_val_batches=0)
    trainer.fit(module, datamodule=dm)
    path = tmp_path / "head.ckpt"
    trainer.save_checkpoint(path)
    victim = tmp_path / "written"
    _crafted_checkpoint(path, "kernel", victim)
    with pytest.raises(ValueError, match=r"builtins\.open"):
        XRFMHeadModule.load_from_checkpoint(path, weights_only=True)
    assert not victim.exists()
