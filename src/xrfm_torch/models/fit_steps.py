"""A fit's first steps, shared by ``xRFMTree.fit``, ``refit_leaves`` and ``choose_input_maps``.

:func:`fit_rows` checks the rows and weights (holding out validation rows where none are given);
:func:`prepare_fit` then codes the targets, fits the input map and chooses the maps the trees
grow on (the probe of ``input_transform="auto"``). After the trees are fitted,
:func:`honest_outputs` turns their validation outputs into the model's honest outputs
(calibrating a classifier's probabilities on them).
"""

from __future__ import annotations

import logging
import time

import torch
from torch import Tensor

from xrfm_torch.inputs.choice import choose_maps
from xrfm_torch.inputs.input_map import InputMapName
from xrfm_torch.leaf.data import FitData, fit_data
from xrfm_torch.models.routed_trees import RoutedTrees
from xrfm_torch.numerics.rng import redraw
from xrfm_torch.tree.honest import HonestOutputs
from xrfm_torch.tree.parallel import check_same_data
from xrfm_torch.tree.uncertainty import calibration_fraction

log = logging.getLogger(__name__)


def prepare_fit(
    model: RoutedTrees,
    X: Tensor,
    y: Tensor,
    X_val: Tensor | None,
    y_val: Tensor | None,
    sample_weight: Tensor | None,
    val_sample_weight: Tensor | None,
    generator: torch.Generator,
) -> tuple[FitData, Tensor, Tensor | None, list[InputMapName]]:
    """A fit's first steps: checked rows, target coding, input map, the maps to grow on.

    Returns the coded data, the validation targets and weights before the coding, and the
    maps.
    """
    data = fit_rows(model, X, y, X_val, y_val, sample_weight, val_sample_weight, generator)
    redraw(generator, model.config.draw)  # (after the held-out rows: the same for every draw)
    weights = [t for t in (data.w, data.w_val) if t is not None]
    check_same_data(model.config.distributed, data.X, data.y, data.X_val, data.y_val, *weights)
    raw_y_val, raw_w_val = data.y_val, data.w_val  # before the targets' coding
    data = model.targets.fit(data.y, data.w, data.y_val).encode_data(data)
    model.input_map.fit(
        data.X,
        knots=model.config.input_transform != "identity",
        categorical=model.config.categorical_features or (),
        y=data.y if model.config.value_levels else None,
        y_rows=None if data.holdout is None else ~data.holdout,
    )
    # only categorical columns: nothing for a quantile map to map
    spec = "identity" if model.input_map.numeric_.numel() == 0 else model.config.input_transform
    began = time.perf_counter()
    maps = choose_maps(
        spec,
        model.input_map,
        data,
        kernel=model.kernel,
        leaf=model.config.leaf,
        max_maps=model.config.input_maps_limit(data.X.shape[0]),
        margin=model.config.input_margin,
        generator=generator,
        batched=model.config.steps_batched(data.X.device),
    )
    model.probe_seconds_ = time.perf_counter() - began  # (an anytime fit's cost estimates)
    return data, raw_y_val, raw_w_val, maps


def fit_rows(
    model: RoutedTrees,
    X: Tensor,
    y: Tensor,
    X_val: Tensor | None,
    y_val: Tensor | None,
    sample_weight: Tensor | None,
    val_sample_weight: Tensor | None,
    generator: torch.Generator,
    n_features: int | None = None,
) -> FitData:
    """Checked rows and relative weights of a fit or refit (``leaf.data.fit_data``)."""
    fraction = model.config.val_fraction
    if model.variance is not None and X_val is None:
        fraction = calibration_fraction(len(X), fraction)
    data = fit_data(
        X,
        y,
        X_val,
        y_val,
        val_fraction=fraction,
        generator=generator,
        n_features=n_features,
        allow_nan=True,
        sample_weight=sample_weight,
        val_sample_weight=val_sample_weight,
        relative_weights=True,
        target_precision=model.task == "regression",
    )
    if model.variance is not None and (data.w is not None or data.w_val is not None):
        raise ValueError(
            f"uncertainty={model.uncertainty!r} cannot be fitted with sample weights yet: the "
            "leaves' Gaussian-process noise model is unweighted (use uncertainty='none')"
        )
    return data


def honest_outputs(
    model: RoutedTrees,
    val_scores: Tensor,
    scored_rows: Tensor | None,
    data: FitData,
    raw_y_val: Tensor,
    raw_w_val: Tensor | None,
) -> HonestOutputs:
    """The fitted model's honest outputs: its validation outputs in the targets' units.

    A classifier calibrates its probabilities (``TargetCoding.calibrate``) on them first.

    Args:
        model: The model just fitted (its target coding).
        val_scores: The trees' outputs (n_scored, c) at the chosen temperature
            (``GrownTrees.val_scores``), in the coded targets' units.
        scored_rows: The validation rows they cover (CPU indices; ``None``: all of them).
        data: The fit's coded data.
        raw_y_val: The validation targets before the coding, (n_val,) or (n_val, c).
        raw_w_val: Their weights (n_val,) or ``None``.
    """
    scores = model.targets.decode(val_scores)
    y_val, w_val, rows = data.y_val, data.w_val, data.val_rows
    if scored_rows is not None:  # the rows a large fit's temperature search scored
        sub = scored_rows.to(scores.device)
        y_val, raw_y_val = y_val[sub], raw_y_val[sub]
        w_val = None if w_val is None else w_val[sub]
        raw_w_val = None if raw_w_val is None else raw_w_val[sub]
        rows = None if rows is None else rows[scored_rows.to(rows.device)]
    if model.task == "classification":
        chosen = model.targets.calibrate(scores, y_val, w_val)
        log.info("probabilities: %s", chosen)
        scores = model.targets.probabilities(scores)
    return HonestOutputs(scores, raw_y_val, raw_w_val, rows)
