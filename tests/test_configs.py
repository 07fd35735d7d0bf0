"""Every option of every config group composes and instantiates; every YAML key is a real argument."""

from __future__ import annotations

import importlib
import inspect
from pathlib import Path

import hydra
import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf, open_dict

from xrfm_torch import xRFMTree
from xrfm_torch.models.factory import DEFAULT_KERNELS
from xrfm_torch.tree.config import SETTINGS

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = [
    "dataset",
    "model",
    "model/kernel",
    "model/split_rule",
    "model/routing",
    "system",
    "trainer",
    "callbacks",
    "logger",
    "experiment",
    "debug",
]


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


def compose_with(overrides: list[str], tmp_path: Path):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("train", overrides=overrides, return_hydra_config=False)
    with open_dict(cfg):
        cfg.paths.output_dir = str(tmp_path)
        cfg.paths.root_dir = str(tmp_path)
        cfg.paths.log_dir = str(tmp_path)
        if cfg.dataset.name == "csv":
            cfg.dataset.path = str(tmp_path / "data.csv")
        if cfg.dataset.name == "openml":
            cfg.dataset.openml_id = 1
    return cfg


def target_params(target: str) -> set[str]:
    module, _, name = target.rpartition(".")
    obj = getattr(importlib.import_module(module), name)
    params = inspect.signature(obj).parameters
    named = {k for k, p in params.items() if p.kind is not inspect.Parameter.VAR_KEYWORD}
    # the tree's keyword settings are its TreeConfig's fields (xRFMTree(**settings))
    return named | set(SETTINGS) if obj is xRFMTree else named


def walk_targets(node, path="") -> list[tuple[str, str, set[str]]]:
    """(path, target, keys) for every mapping with a _target_."""
    found = []
    if isinstance(node, dict):
        if "_target_" in node:
            keys = {k for k in node if not k.startswith("_") and k != "defaults"}
            found.append((path, node["_target_"], keys))
        for k, v in node.items():
            if k != "defaults":
                found.extend(walk_targets(v, f"{path}.{k}"))
    return found


ALL_YAML = sorted(CONF.rglob("*.yaml"))


@pytest.mark.parametrize("path", ALL_YAML, ids=lambda p: str(p.relative_to(CONF)))
def test_every_yaml_key_is_a_constructor_argument(path):
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    for where, target, keys in walk_targets(data):
        unknown = keys - target_params(target)
        assert not unknown, f"{path.name}{where}: {sorted(unknown)} are not arguments of {target}"
    text = path.read_text()
    if "# @package model" in text:  # routing options set tree arguments directly
        unknown = set(data) - target_params("xrfm_torch.xRFMTree")
        assert not unknown, f"{path.name}: {sorted(unknown)} are not xRFMTree arguments"


@pytest.mark.parametrize(
    ("group", "option"), [(g, o) for g in GROUPS for o in options(g)], ids=lambda v: str(v)
)
def test_every_option_composes_and_instantiates(group, option, tmp_path):
    cfg = compose_with([f"{group}={option}"], tmp_path)
    dm = hydra.utils.instantiate(cfg.dataset)
    tree = hydra.utils.instantiate(cfg.model)
    assert isinstance(tree, xRFMTree)
    system = hydra.utils.instantiate(cfg.system, tree=tree, feature_names=["f0", "f1", "f2"])
    kernels = cfg.system.get("blend_kernels")
    if kernels == "auto":  # the default's kernels, in both tasks
        kernels = DEFAULT_KERNELS
    n_bags = cfg.system.get("n_bags")
    n_bags = 1 if n_bags in (None, "auto") else n_bags  # no rows given: no bags
    if kernels:  # the system fits the tree (or its bags) once per kernel
        assert system.model.kernels == tuple(kernels)
        member = system.model.get_config()["model"]
        if n_bags > 1:
            assert member["tree"] == tree.get_config() and member["n_bags"] == n_bags
        else:
            assert member == tree.get_config()
    elif n_bags > 1:  # the system wraps the configured tree in bags
        assert system.model.get_config()["tree"] == tree.get_config()
        assert system.model.n_bags == cfg.system.n_bags
    else:
        assert system.model is tree
    for sub in ("callbacks", "logger"):
        for _, c in (cfg.get(sub) or {}).items():
            assert hydra.utils.instantiate(c) is not None
    if group == "trainer" and option == "gpu" and not torch.cuda.is_available():
        return  # composing is all a CPU machine can check for the GPU trainer
    trainer = hydra.utils.instantiate(cfg.trainer, logger=False, callbacks=[])
    assert trainer.max_epochs == cfg.trainer.max_epochs
    assert dm.name == cfg.dataset.name


def test_cli_values_reach_the_model(tmp_path):
    cfg = compose_with(
        [
            "model/kernel=lpq",
            "model.kernel.p=1.2",
            "model.leaf.n_iters=3",
            "model.max_leaf_size=2000",
            "model/routing=soft",
            "model.temperature=0.3",
            "model/split_rule=cart",
        ],
        tmp_path,
    )
    tree = hydra.utils.instantiate(cfg.model)
    assert tree.kernel.p == 1.2
    assert tree.leaf.n_iters == 3
    assert tree.max_leaf_size == 2000
    assert tree.temperature == 0.3
    assert type(tree.split_rule).__name__ == "CARTSplit"


def test_the_model_config_and_the_code_have_one_set_of_defaults(tmp_path):
    """The Hydra model config, xRFMTree() and LeafRFM() agree on every setting."""
    from xrfm_torch import LeafConfig, LeafRFM

    cfg = compose_with([], tmp_path)
    from_yaml = hydra.utils.instantiate(cfg.model)
    assert from_yaml.get_config() == xRFMTree().get_config()
    assert from_yaml.leaf == xRFMTree().leaf == LeafRFM().config == LeafConfig()
    # the YAML names a few knobs, not every default
    assert set(OmegaConf.load(CONF / "model" / "xrfm.yaml").leaf) == {
        "_target_",
        "n_iters",
        "diag",
        "reg",
        "linear_mix",
    }


def test_leaf_settings_from_the_command_line_are_validated(tmp_path):
    cfg = compose_with(["model.leaf.n_iters=-2"], tmp_path)
    with pytest.raises(Exception, match="n_iters must be an integer >= 0, got -2"):
        hydra.utils.instantiate(cfg.model)
    cfg = compose_with(["model.leaf.linear_mix=0.25", "+model.n_trees=2"], tmp_path)
    tree = hydra.utils.instantiate(cfg.model)
    assert tree.leaf.linear_mix == 0.25 and tree.n_trees == 2


def default_choices(path: Path) -> dict[str, str]:
    """``{group: option}`` of a config's defaults list (``- group: option`` entries with a file)."""
    out = {}
    data = OmegaConf.to_container(OmegaConf.load(path))
    assert isinstance(data, dict)
    for entry in data.get("defaults", []):
        if not isinstance(entry, dict):
            continue
        ((group, option),) = entry.items()
        if isinstance(option, str) and (path.parent / group / f"{option}.yaml").exists():
            out[(path.parent / group).relative_to(CONF).as_posix()] = option
    return out


# The groups whose objects are ours (the trainer, logger and paths groups configure other
# libraries and deliberately differ from their defaults).
DEFAULT_OPTIONS = {
    g: o
    for g, o in {
        **default_choices(CONF / "train.yaml"),
        **default_choices(CONF / "model" / "xrfm.yaml"),
    }.items()
    if g.split("/")[0] in ("model", "system")
}


def signature_defaults(target: str) -> dict[str, object]:
    module, _, name = target.rpartition(".")
    obj = getattr(importlib.import_module(module), name)
    params = inspect.signature(obj).parameters.items()
    return {k: p.default for k, p in params if p.default is not inspect.Parameter.empty}


def target_nodes(node) -> list[tuple[str, dict]]:
    """(target, mapping) for every mapping with a _target_, at any depth."""
    found = []
    if isinstance(node, dict):
        if "_target_" in node:
            found.append((node["_target_"], node))
        for k, v in node.items():
            if k != "defaults":
                found.extend(target_nodes(v))
    return found


@pytest.mark.parametrize(("group", "option"), sorted(DEFAULT_OPTIONS.items()), ids=str)
def test_default_options_repeat_the_code_defaults(group, option):
    """A group's default option sets nothing but the code's own defaults (one set of defaults).

    Keys that come from the rest of the config (``${...}``) or that the code leaves to the caller
    (no default) are skipped; other options exist to change defaults and are not checked here.
    """
    assert set(DEFAULT_OPTIONS) == {
        "model",
        "model/kernel",
        "model/split_rule",
        "model/routing",
        "system",
    }
    path = CONF / group / f"{option}.yaml"
    data = OmegaConf.to_container(OmegaConf.load(path), resolve=False) or {}
    nodes = [(t, node) for t, node in target_nodes(data)]
    if "# @package model" in path.read_text():  # routing: arguments of the tree itself
        nodes.append(("xrfm_torch.xRFMTree", {k: v for k, v in data.items() if k != "defaults"}))
    assert nodes, f"{path} sets no arguments"
    for target, values in nodes:
        defaults = signature_defaults(target)
        for key, value in values.items():
            if (
                key.startswith("_")
                or isinstance(value, (dict, list))
                or str(value).startswith("${")
            ):
                continue
            if key in defaults:
                assert value == defaults[key], (
                    f"{path.name}: {key}={value!r}, code {defaults[key]!r}"
                )
