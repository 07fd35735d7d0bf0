"""The tree's settings live in one frozen TreeConfig: built from the keyword constructor, read and
replaced through the model, resolved per fit, and defaulted in one place."""

from __future__ import annotations

import dataclasses
import inspect
import warnings

import pytest
import torch

import xrfm_torch
from xrfm_torch import LeafConfig, TreeConfig, xRFMTree
from xrfm_torch.tree.config import DEFAULTS, SETTINGS
from xrfm_torch.tree.splits import AGOPSplit, CARTSplit, PCASplit, Split


def test_the_settings_are_named_once_in_the_config_and_reach_it_as_keywords():
    params = inspect.signature(xRFMTree).parameters
    # no setting is written out again in the model's signature: the config's fields are its
    # keyword settings; besides them only what the model's own modules hold, and the config
    held = {"kernel", "task", "class_coding", "calibration", "missing_values", "uncertainty"}
    assert set(params) == held | {"config", "settings"}
    assert params["settings"].kind is inspect.Parameter.VAR_KEYWORD
    assert not set(params) & set(SETTINGS)
    assert xRFMTree().config == DEFAULTS
    # every field given as a keyword lands in the config, on top of a config given
    base = TreeConfig(max_leaf_size=300, n_trees=3)
    model = xRFMTree(config=base, max_leaf_size=500, keep_mass=0.5)
    assert model.config == base.replace(max_leaf_size=500, keep_mass=0.5)
    assert xRFMTree(config=base).config is base
    # None stands for the default object where a config file wrote it so
    assert xRFMTree(leaf=None, split_rule=None, temperature_grid=None).config == DEFAULTS
    with pytest.raises(TypeError, match=r"unknown tree setting\(s\) \['max_leaf'\]"):
        xRFMTree(max_leaf=3)
    with pytest.raises(TypeError, match="config must be a TreeConfig, got dict"):
        xRFMTree(config={"max_leaf_size": 3})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="max_leaf_size must be an integer >= 4, got 2"):
        xRFMTree(max_leaf_size=2)


def test_the_config_is_saved_whole_and_flat_configs_still_load():
    model = xRFMTree(max_leaf_size=300, leaf=LeafConfig(n_iters=2), uncertainty="gp")
    cfg = model.get_config()
    assert cfg["config"]["_target_"] == "xrfm_torch.tree.config.TreeConfig"
    assert cfg["config"]["max_leaf_size"] == 300 and cfg["uncertainty"] == "gp"
    assert xRFMTree.from_config(cfg).config == model.config
    # configs written before the model took its TreeConfig name the settings beside the kernel
    flat = {k: v for k, v in cfg.items() if k != "config"}
    flat.update({k: v for k, v in cfg["config"].items() if k != "_target_"})
    assert xRFMTree.from_config(flat).config == model.config


def test_the_config_is_frozen_and_validated():
    cfg = TreeConfig(max_leaf_size=500, temperature_grid=[0, 1], categorical_features=[2, 0])
    assert cfg.temperature_grid == (0.0, 1.0) and cfg.categorical_features == (2, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.max_leaf_size = 10  # type: ignore[misc]
    with pytest.raises(ValueError, match="max_leaf_size must be an integer >= 4, got 2"):
        TreeConfig(max_leaf_size=2)
    with pytest.raises(ValueError, match=r"overlap_fraction must be in \[0, 0.4\], got 0.5"):
        cfg.replace(overlap_fraction=0.5)
    with pytest.raises(TypeError, match="leaf must be a LeafConfig, got dict"):
        TreeConfig(leaf={"n_iters": 2})  # type: ignore[arg-type]


def test_settings_read_and_set_through_the_model_replace_the_config():
    model = xRFMTree(max_leaf_size=300, leaf=LeafConfig(n_iters=2), split_rule=CARTSplit())
    before = model.config
    assert model.max_leaf_size == 300 and model.leaf.n_iters == 2
    model.max_soft_leaves = 3
    assert model.config is not before and model.config.max_soft_leaves == 3
    assert before.max_soft_leaves == DEFAULTS.max_soft_leaves  # the old config is unchanged
    assert model.config.max_leaf_size == 300 and isinstance(model.config.split_rule, CARTSplit)
    with pytest.raises(ValueError, match="max_soft_leaves must be an integer >= 1, got 0"):
        model.max_soft_leaves = 0
    # get_config still reads every argument, and rebuilds the same config
    again = xRFMTree.from_config(model.get_config())
    assert again.config.max_soft_leaves == 3 and again.config.leaf == model.config.leaf


def test_a_fit_plan_resolves_the_rules():
    reg = xRFMTree(large_fit_rows=1000, large_fit_iter_rows=50, max_leaf_size=400)
    small, large = reg._plan(900), reg._plan(1001, n_maps=2)
    assert small.config.n_trees == 1 and small.config.leaf.iter_rows is None
    assert small.config.max_leaf_size == 400
    assert large.config.leaf.iter_rows == 50 and large.config.max_leaf_size == 200
    # a large fit's split models fit on at most as many rows as its leaves iterate on
    assert small.config.split_rule == AGOPSplit() and large.config.split_rule == AGOPSplit(
        sample_size=50
    )
    # a large fit's leaves get no overlap rows unless the setting is given
    assert (small.config.overlap_fraction, large.config.overlap_fraction) == (0.1, 0.0)
    given = xRFMTree(overlap_fraction=0.2, large_fit_rows=10)._plan(100)
    assert given.config.overlap_fraction == 0.2
    fewer = xRFMTree(split_rule=AGOPSplit(sample_size=30), large_fit_rows=10)._plan(100)
    assert fewer.config.split_rule.sample_size == 30
    pca = xRFMTree(split_rule=PCASplit(), large_fit_rows=10)._plan(100)
    assert pca.config.split_rule == PCASplit()
    clf = xRFMTree(task="classification", large_fit_rows=1000)
    assert clf._plan(900).config.n_trees == 2 and clf._plan(1001).config.n_trees == 1
    assert xRFMTree(task="classification", n_trees=3)._plan(900).config.n_trees == 3
    # a leaf's own iter_rows wins over the large-fit rule
    own = xRFMTree(leaf=LeafConfig(iter_rows=70), large_fit_rows=10)._plan(100)
    assert own.config.leaf.iter_rows == 70
    assert reg.config.n_trees is None  # resolving does not touch the model's config
    # "auto" may average two maps, but only one in a large fit unless the limit is given
    assert [reg.config.input_maps_limit(n) for n in (1000, 1001)] == [2, 1]
    assert xRFMTree(max_input_maps=2, large_fit_rows=10).config.input_maps_limit(100) == 2
    assert xRFMTree(max_input_maps=3).config.input_maps_limit(10) == 3
    assert xRFMTree(large_fit_rows=None).config.input_maps_limit(10**7) == 2


def test_the_fitted_tree_follows_its_config():
    g = torch.Generator().manual_seed(0)
    X = torch.randn(400, 3, generator=g)
    y = X[:, 0] - X[:, 1] ** 2
    model = xRFMTree(leaf=LeafConfig(n_iters=1), max_leaf_size=150, input_transform="identity")
    model.fit(X, y, generator=g)
    assert model.n_leaves >= 3
    assert all(leaf.config == model.config.leaf for leaf in model.leaves())


def test_split_rule_protocol_is_exported_and_the_split_result_is_not():
    assert "SplitRule" in xrfm_torch.__all__ and "Split" not in xrfm_torch.__all__
    assert Split.__module__ == "xrfm_torch.tree.splits"
    with pytest.raises(AttributeError, match="no attribute 'Split'"):
        xrfm_torch.Split  # noqa: B018 (the 0.14 deprecation has ended)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert xrfm_torch.SplitRule is xrfm_torch.tree.splits.SplitRule


def test_task_is_defined_once():
    from xrfm_torch.data import protocol
    from xrfm_torch.tree import targets

    assert protocol.Task is targets.Task


def test_the_leaf_settings_come_in_named_groups_in_declaration_order():
    from xrfm_torch.leaf.config import GROUPS

    fields = [f.name for f in dataclasses.fields(LeafConfig)]
    assert [n for group in GROUPS.values() for n in group] == fields
    with pytest.raises(TypeError):
        LeafConfig(30)  # type: ignore[misc]  # keyword arguments only
