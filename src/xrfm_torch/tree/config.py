"""A tree's growth and routing settings, described once: :class:`TreeConfig` holds them and their defaults.

One config object per level: :class:`~xrfm_torch.leaf.config.LeafConfig` for a leaf's RFM fit,
:class:`TreeConfig` (which holds the leaves' ``LeafConfig`` as ``leaf``) for everything the tree
decides: how it grows, how its leaves borrow validation rows, how it routes, which input maps it
sees, how a large fit is cut down, where its leaves are fitted. :class:`~xrfm_torch.xRFMTree`
takes one (``config``, with any field also accepted as a keyword: :func:`tree_config`) and
passes it down whole, so each setting is named here and nowhere else. The objects
with state of their own (kernel, target coding, input map, variance model) are modules of the
tree, not settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

import torch

from xrfm_torch.inputs.choice import check_input_transform
from xrfm_torch.inputs.input_map import PROBED_MAPS, InputTransform
from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.numerics.checks import check_bool, check_fraction, check_int, check_positive
from xrfm_torch.tree.memory import MemoryBudget
from xrfm_torch.tree.splits import AGOPSplit, SplitRule
from xrfm_torch.tree.temperature import DEFAULT_TEMPERATURE_GRID


@dataclass(frozen=True)
class TreeConfig:
    """Settings of an :class:`~xrfm_torch.xRFMTree` fit (validated on construction; immutable).

    :class:`~xrfm_torch.xRFMTree` takes one as ``config``, and each field as a keyword argument
    of the same name (which replaces the config's).
    ``temperature_grid`` and ``categorical_features`` are held as tuples.

    Attributes:
        leaf: Every leaf's settings (:class:`~xrfm_torch.leaf.config.LeafConfig`, default
            ``LeafConfig()``): ``tau = leaf.n_iters``, the stopping rules, ``diag``, the post-hoc
            exponent and ridge searches, the linear part, warm solves.
        max_leaf_size: ``L_max``; a node with more training rows is split.
        split_rule: Split strategy (default :class:`~xrfm_torch.tree.splits.AGOPSplit`).
        overlap_fraction: At each split into two leaves, each leaf's final solve also gets this
            share of the node's rows from the other side nearest the threshold, capped so leaves
            stay within ``max_leaf_size`` (routing is unchanged). ``None``:
            ``OVERLAP_FRACTION`` (0.1), and 0 in a large fit (``large_fit_rows``), where the
            overlap makes the final solves, most of such a fit, 1.7x as costly.
        n_trees: Trees per input map, all averaged (they differ through the split-model
            subsamples). A tree with a single leaf stops the count (more would be identical).
            ``None``: 2 for classification, 1 for regression, in a large fit
            (``large_fit_rows``) and in each bag of a ``BaggedTree``: a second tree pays in the
            log-loss of one classification model, not in bags, which already average, and much
            less in regression RMSE, for twice the time.
        shared_plan: A map's later trees start each leaf from the ``M`` of the first tree's
            leaf that most of its rows route to, and follow the first tree's plan
            (:meth:`~xrfm_torch.tree.plan.FitPlan.following`); ``False``: every tree walks from
            the identity on its own.
        draw: Which draw of the fit's random choices after the validation rows are held out
            (split-model subsamples, leaf subsamples): trees of the same generator state and
            other draws hold out the same rows and differ in the rest
            (:func:`~xrfm_torch.numerics.rng.redraw`; an anytime fit averages draws of its quick
            trees, :mod:`~xrfm_torch.models.ladder`). 0: the generator as given.
        temperature: Soft-routing temperature; ``None`` tunes it on validation data over
            ``temperature_grid`` (0 = hard routing is always a candidate), ``0`` forces hard routing.
        temperature_grid: Candidate temperatures for tuning (default: 0 and 20 values 0.025..4.5).
        keep_mass: Soft routing keeps each row's top leaves covering this weight mass.
        max_soft_leaves: Soft routing evaluates at most this many leaves per row.
        temperature_rows: The temperature search scores at most this many validation rows
            (evenly spaced, :func:`~xrfm_torch.tree.temperature.search_rows`); the model's honest
            outputs are then those rows' outputs at the chosen temperature. ``None``: all rows.
            20 000 rows choose the temperature all rows choose, at a fraction of the cost.
        temperature_patience: The search tries hard routing, then the positive temperatures from
            the lowest up, and stops after this many in a row that do not improve on the best
            (:func:`~xrfm_torch.tree.temperature.search_temperature`). ``None``: the whole grid.
        val_fraction: Share of training rows held out when ``fit`` gets no validation data.
        min_leaf_val: A leaf with fewer validation rows borrows training rows (refill rule).
        max_borrow_fraction: At most this share of a leaf's training rows is borrowed.
        refit_borrowed: After selection, re-solve each leaf on its training rows plus the rows it
            borrowed (or that were held out from training), with the chosen ``M`` and bandwidth.
        trainable_routing: Make split vectors, thresholds and the temperature ``nn.Parameter``s
            (the temperature through ``raw_temperature``, ``T = softplus(raw)``), for training with
            SGD through soft routing. A fitted temperature of 0 then starts at the smallest positive
            grid value. Leaf coefficients always stay buffers.
        input_transform: What the trees see of each input (:class:`~xrfm_torch.inputs.input_map.InputMap`,
            fitted on the training rows): ``"identity"``, ``"quantile"`` (each feature's normal
            scores through its training quantiles), ``"quantile+raw"`` (both, 2d columns),
            ``"log"`` / ``"quantile+log"`` (``"identity"`` / ``"quantile+raw"`` with the columns
            that have a spike at their minimum and span decades above it on a log scale,
            :func:`~xrfm_torch.inputs.input_map.log_columns`), a list of these (``n_trees`` trees
            on each, all averaged) or ``"auto"``: small probe leaves on 2000 training rows pick a
            set of at most ``max_input_maps`` of the first three maps, the raw inputs kept unless
            another set's averaged predictions beat them by ``input_margin`` paired standard
            errors (:mod:`xrfm_torch.inputs.choice`).
            Use ``"identity"`` for a head on learned features (the knots would not follow them).
        input_margin: Significance margin of the ``"auto"`` choice.
        max_input_maps: Most maps ``"auto"`` may average (1: one map). ``None``:
            ``MAX_INPUT_MAPS`` (2), and 1 in a large fit (``large_fit_rows``), where a set's
            halved leaves cost more than the average gains.
        set_leaf_fraction: With several maps, their trees' leaves hold at most this share of
            ``max_leaf_size`` rows (a leaf costs ``O(L^3)``: at 0.5 a pair costs half a fit).
        categorical_features: Columns holding category codes ``0 .. L-1`` (NaN: missing); the
            trees see each as a one-hot block of at most 256 columns
            (:class:`~xrfm_torch.inputs.categories.CategoryColumns`). Missing cells (NaN) of
            numeric columns are handled where the training rows had some
            (:class:`~xrfm_torch.inputs.input_map.InputMap`).
        value_levels: Give the numeric columns whose values act as codes for the target a
            one-hot block of their values beside the number: a spike at one value and repeated
            other amounts where per-value means of the training targets beat smooth bins of the
            values out of fold, or 5-255 values (identifiers written as numbers) whose
            neighbouring values explain little of what their own do
            (:func:`~xrfm_torch.inputs.levels.level_columns`). ``False``: never.
        large_fit_rows: A fit on more training rows than this is a large fit: every leaf whose
            ``LeafConfig`` sets no ``iter_rows`` learns ``M``, t*, the exponent and the ridge on a
            seeded subsample of ``large_fit_iter_rows`` of its rows, then solves once on all of
            them, and an ``AGOPSplit`` fits its split models on at most as many rows. The fit
            then costs about one solve per leaf instead of ``tau`` plus the searches.
            ``None``: never. Smaller fits keep the full iterations, which are more accurate on
            some tables (docs/design-use.md, "Large fits and leaves across processes").
        large_fit_iter_rows: The subsample of a large fit's iterations (a large fit's accuracy
            follows its final solves' size, not its iterations').
        distributed: Fit the leaves across the ranks of the default ``torch.distributed``
            process group (gloo on CPU, NCCL on GPU; :mod:`xrfm_torch.tree.parallel`): every rank
            calls ``fit`` with the same data and seed, grows the same tree top, fits its share of
            the leaves (by cost) and loads the others', so all ranks end with the model one
            process would fit. Without an initialized group of several ranks it does nothing.
        memory_budget: Before any leaf is fitted, each planned leaf's peak memory is
            estimated (:mod:`xrfm_torch.tree.memory`); a leaf above this budget is fitted
            approximately (iterations on ``b`` rows, a Nystrom final solve over ``b`` k-means
            centres, ``b`` the largest of 3000, 1500, ... that fits; one warning counts them), and
            where not even that fits the fit stops with a ``MemoryBudgetError`` naming the sizes
            and the knobs. Bytes, ``"auto"`` (the memory free on the device: available host
            memory, or CUDA's free memory) or ``None`` (no check: every leaf exact).
        batch_steps: Fit the leaves in lockstep (:mod:`xrfm_torch.leaf.lockstep`): a tree's
            leaves, its input maps' trees and the input-map probe's leaves (and, in a
            ``BaggedTree`` or ``KernelBlend`` of such trees, every bag's and member's) each
            fit in a thread, and each round of their RFM steps and post-hoc search candidates
            runs as one batched solve: on a GPU a step's ~110 kernel launches then serve all
            the leaves, not one. The same decisions per leaf; the results equal the one-by-one
            fit's up to float rounding. ``"auto"``: one by one everywhere, until a timed GPU
            run shows the lockstep's wall-clock gain (docs/benchmarks.md, "On one GPU", has
            the command that decides it; on a CPU the batched step is no faster). Not with
            ``distributed``, nor where the leaves' step buffers held at once would exceed
            ``memory_budget`` (those run one by one).
    """

    leaf: LeafConfig = field(default_factory=LeafConfig)
    max_leaf_size: int = 10_000
    split_rule: SplitRule = field(default_factory=AGOPSplit)
    overlap_fraction: float | None = None
    n_trees: int | None = None
    shared_plan: bool = True
    draw: int = 0
    temperature: float | None = None
    temperature_grid: Sequence[float] = tuple(DEFAULT_TEMPERATURE_GRID)
    keep_mass: float = 0.99
    max_soft_leaves: int = 12
    temperature_rows: int | None = 20_000
    temperature_patience: int | None = 3
    val_fraction: float = 0.1
    min_leaf_val: int = 1500
    max_borrow_fraction: float = 0.2
    refit_borrowed: bool = True
    trainable_routing: bool = False
    input_transform: InputTransform = "auto"
    input_margin: float = 2.0
    max_input_maps: int | None = None
    set_leaf_fraction: float = 0.5
    categorical_features: Sequence[int] | None = None
    value_levels: bool = True
    large_fit_rows: int | None = 100_000
    large_fit_iter_rows: int = 2000
    distributed: bool = False
    memory_budget: MemoryBudget = "auto"
    batch_steps: bool | Literal["auto"] = "auto"

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: normalize in place once, here
        if not isinstance(self.leaf, LeafConfig):
            raise TypeError(f"leaf must be a LeafConfig, got {type(self.leaf).__name__}")
        put(self, "max_leaf_size", check_int(self.max_leaf_size, "max_leaf_size", 4))
        # <= 0.4 keeps a leaf's own rows the majority, which is how fit_leaves tells them apart
        if self.overlap_fraction is not None:
            if not 0.0 <= float(self.overlap_fraction) <= 0.4:
                raise ValueError(
                    f"overlap_fraction must be in [0, 0.4], got {self.overlap_fraction!r}"
                )
            put(self, "overlap_fraction", float(self.overlap_fraction))
        if self.n_trees is not None:
            put(self, "n_trees", check_int(self.n_trees, "n_trees", 1))
        put(self, "draw", check_int(self.draw, "draw", 0))
        if self.temperature is not None:
            check_positive(self.temperature, "temperature", allow_zero=True)
        given = self.temperature_grid
        grid = tuple(
            float(check_positive(t, "temperature_grid entry", allow_zero=True)) for t in given
        )
        put(self, "temperature_grid", grid)
        put(self, "keep_mass", check_fraction(self.keep_mass, "keep_mass"))
        put(self, "max_soft_leaves", check_int(self.max_soft_leaves, "max_soft_leaves", 1))
        if self.temperature_rows is not None:
            rows = check_int(self.temperature_rows, "temperature_rows", 1)
            put(self, "temperature_rows", rows)
        if self.temperature_patience is not None:
            patience = check_int(self.temperature_patience, "temperature_patience", 1)
            put(self, "temperature_patience", patience)
        put(self, "val_fraction", check_fraction(self.val_fraction, "val_fraction", high=0.9))
        put(self, "min_leaf_val", check_int(self.min_leaf_val, "min_leaf_val", 0))
        put(
            self,
            "max_borrow_fraction",
            check_fraction(self.max_borrow_fraction, "max_borrow_fraction"),
        )
        put(self, "refit_borrowed", bool(self.refit_borrowed))
        put(self, "value_levels", bool(self.value_levels))
        put(self, "trainable_routing", bool(self.trainable_routing))
        put(self, "input_transform", check_input_transform(self.input_transform))
        put(
            self, "input_margin", check_positive(self.input_margin, "input_margin", allow_zero=True)
        )
        if self.max_input_maps is not None:
            maps = check_int(self.max_input_maps, "max_input_maps", 1, len(PROBED_MAPS))
            put(self, "max_input_maps", maps)
        put(self, "set_leaf_fraction", check_fraction(self.set_leaf_fraction, "set_leaf_fraction"))
        if self.categorical_features is not None:
            cats = tuple(
                check_int(c, "categorical_features entry", 0) for c in self.categorical_features
            )
            put(self, "categorical_features", cats)
        if self.large_fit_rows is not None:
            put(self, "large_fit_rows", check_int(self.large_fit_rows, "large_fit_rows", 1))
        put(
            self,
            "large_fit_iter_rows",
            check_int(self.large_fit_iter_rows, "large_fit_iter_rows", 2),
        )
        check_bool(self.distributed, "distributed")
        check_bool(self.shared_plan, "shared_plan")
        if self.batch_steps != "auto":
            check_bool(self.batch_steps, "batch_steps")
        if self.memory_budget is not None and self.memory_budget != "auto":
            budget = check_int(cast(int, self.memory_budget), "memory_budget", 1)
            put(self, "memory_budget", budget)

    def steps_batched(self, device: torch.device) -> bool:
        """Whether the leaves run in lockstep on ``device`` (``batch_steps``; ``"auto"``: no).

        ``device`` is where the fit runs: a measured gain on a launch-bound device would switch
        ``"auto"`` on there (:func:`~xrfm_torch.numerics.host.launch_bound`).
        """
        return self.batch_steps is True

    def replace(self, **changes: Any) -> TreeConfig:
        """A copy with some settings changed (validated like a new one)."""
        return dataclasses.replace(self, **changes)

    def is_large(self, n_rows: int) -> bool:
        """Whether a fit on ``n_rows`` training rows is a large fit (``large_fit_rows``)."""
        return self.large_fit_rows is not None and n_rows > self.large_fit_rows

    def input_maps_limit(self, n_rows: int) -> int:
        """Most maps ``"auto"`` may average in a fit on ``n_rows`` rows (``max_input_maps``)."""
        if self.max_input_maps is not None:
            return self.max_input_maps
        return 1 if self.is_large(n_rows) else MAX_INPUT_MAPS


def row_share(rows: int, fraction: float) -> int:
    """``fraction`` of a row count ``rows``, rounded, and never below 4.

    Four is the fewest rows a leaf (``max_leaf_size``) or a split model
    (``AGOPSplit.sample_size``) accepts: a set's smaller leaves and a bag's share use it.
    """
    return max(4, round(fraction * rows))


#: ``overlap_fraction=None`` below ``large_fit_rows`` (:meth:`FitPlan.resolve <xrfm_torch.tree.plan.FitPlan.resolve>`).
OVERLAP_FRACTION = 0.1
#: ``max_input_maps=None`` below ``large_fit_rows`` (:meth:`TreeConfig.input_maps_limit`).
MAX_INPUT_MAPS = 2
#: The defaults, for signatures that repeat a setting (the estimators').
DEFAULTS = TreeConfig()
#: The names of the settings (each also a keyword argument of ``xRFMTree``, through ``**settings``).
SETTINGS: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(TreeConfig))
#: Settings whose ``None`` stands for a fresh default object (configs written with ``None``).
_DEFAULT_OBJECTS = ("leaf", "split_rule", "temperature_grid")


def tree_config(
    config: TreeConfig | None = None, settings: Mapping[str, Any] | None = None
) -> TreeConfig:
    """``config`` (``None``: the defaults) with the named ``settings`` replaced, validated.

    What :class:`~xrfm_torch.xRFMTree` does with its ``config`` and keyword settings: the
    settings are named once, as this class's fields, and nowhere else.

    Raises:
        TypeError: ``config`` is not a ``TreeConfig``, or a setting names no field of it.
        ValueError: A setting's value is out of range (:class:`TreeConfig`'s checks).
    """
    given = {k: v for k, v in (settings or {}).items() if not (v is None and k in _DEFAULT_OBJECTS)}
    unknown = sorted(set(given) - set(SETTINGS))
    if unknown:
        raise TypeError(
            f"unknown tree setting(s) {unknown}: the settings are the fields of TreeConfig, "
            f"{sorted(SETTINGS)}"
        )
    if config is None:
        return TreeConfig(**given)
    if not isinstance(config, TreeConfig):
        raise TypeError(f"config must be a TreeConfig, got {type(config).__name__}")
    return config.replace(**given) if given else config
