"""What each tree sees of an input row.

Standardized numeric columns (raw, log-scaled where zero-inflated, normal scores or both), one-hot
category blocks, and missing-value indicators.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from xrfm_torch.inputs.categories import MAX_LEVELS, CategoryColumns
from xrfm_torch.inputs.levels import ValueLevels, level_columns
from xrfm_torch.inputs.transforms import QuantileNormal, Standardize
from xrfm_torch.numerics.state import ResizableBuffers

#: What a tree sees of the numeric columns (see :class:`InputMap`).
InputMapName = Literal["identity", "quantile", "quantile+raw", "log", "quantile+log"]
#: The ``input_transform`` option: one map, several (a tree set on each), or ``"auto"``.
InputTransform = InputMapName | Literal["auto"] | Sequence[InputMapName]
#: Every map, in the order the ``"auto"`` probe visits them (the log maps are not probed).
INPUT_MAPS: tuple[InputMapName, ...] = get_args(InputMapName)
#: The map with the raw part on a log scale where a column qualifies (:func:`log_columns`).
LOG_MAPS: dict[InputMapName, InputMapName] = {"identity": "log", "quantile+raw": "quantile+log"}
#: The maps ``"auto"`` probes: not the log maps, which only a user chooses. On adult, 2000 probe
#: rows ranked both below their raw versions (seeds 0-2), while the full ``"log"`` model was 3.7 %
#: better in log-loss at seed 0: a probe holds too few of a zero-inflated column's nonzero rows
#: to judge its scale (docs/design.md, input maps).
PROBED_MAPS: tuple[InputMapName, ...] = tuple(m for m in INPUT_MAPS if m not in LOG_MAPS.values())
#: A numeric column gets the ``"log"`` map when at least this share of its training values equal
#: its minimum ...
LOG_ZERO_SHARE = 0.5
#: ... and the others, measured from the minimum, span at least this ratio (two decades).
LOG_SPAN = 100.0
#: Where NaN is accepted in numeric columns: only where the training rows had some, or anywhere.
MissingValues = Literal["seen", "any"]


@dataclass(frozen=True)
class MapLayout:
    """The structure of a fitted :class:`InputMap` as Python values (see :meth:`InputMap.layout`).

    Attributes:
        numeric: Indices of the numeric input columns.
        indicators: Positions in ``numeric`` of the columns that get a missing-value indicator.
        categorical: Indices of the categorical input columns.
        widths: Indicator columns of each categorical column.
        n_rows: Training rows the quantile knots were fitted on.
        levels: Indices of the numeric columns with a value-level block.
        level_widths: Indicator columns of each value-level block.
    """

    numeric: list[int]
    indicators: list[int]
    categorical: list[int]
    widths: list[int]
    n_rows: float
    levels: list[int]
    level_widths: list[int]

    @property
    def numeric_index(self) -> list[int] | slice:
        """``numeric`` as a slice where it is a run of consecutive columns (the usual case).

        Indexing with a slice takes a view; with a list, the indices become a tensor on the host
        that is copied to the data's device each time (a synchronization on a GPU).
        """
        cols = self.numeric
        if cols and cols == list(range(cols[0], cols[-1] + 1)):
            return slice(cols[0], cols[-1] + 1)
        return cols


class InputMap(ResizableBuffers):
    """What each tree sees of an input row ``x`` (d columns), as ``[map(s), c, v, m]``.

    - ``s``: the numeric columns standardized with training statistics (:class:`Standardize`), so
      the model is scale-free. The map of a tree is ``"identity"`` (``s``), ``"quantile"``
      (:class:`QuantileNormal` scores ``z`` of ``s``), ``"quantile+raw"`` (``[s, z]``), so a
      leaf's ``M`` can weigh the raw scale (linear trends, extrapolation) and the rank scale
      (heavy tails) per feature. ``"log"`` and ``"quantile+log"`` are ``"identity"`` and
      ``"quantile+raw"`` with each column that has a spike at its minimum and spans decades
      above it (see :func:`log_columns`) on a log scale before it is standardized.
    - ``c``: the categorical columns' one-hot blocks (:class:`CategoryColumns`).
    - ``v``: for the numeric columns whose values act as codes for the target (zero-inflated
      amounts such as adult's capital-loss, identifiers written as numbers;
      :func:`~xrfm_torch.inputs.levels.level_columns`,
      fitted only when :meth:`fit` gets the targets), a one-hot block of their most frequent
      values (:class:`~xrfm_torch.inputs.levels.ValueLevels`), beside their place in ``s``.
    - ``m``: a 0/1 indicator for each numeric column that had missing cells (NaN) in the training
      rows; there a missing cell becomes the column's training mean (0 in ``s``). NaN in another
      numeric column is an error (``missing_values="seen"``) or also the training mean, without
      an indicator (``"any"``); in a categorical column it lights no indicator.

    Trees of one model may see different maps (an ensemble over maps); the map of each tree is a
    buffer (``maps_``, indices into :data:`INPUT_MAPS`), so a checkpoint restores it.

    Args:
        n_quantiles: Knots per feature of the quantile scores.
        max_levels: Most indicator columns per categorical column (the value levels of numeric
            columns keep their own bound).
        missing_values: ``"seen"`` or ``"any"`` (see above).
    """

    maps_: Tensor
    missing_: Tensor
    numeric_: Tensor
    log_: Tensor
    log_offset_: Tensor
    log_scale_: Tensor

    def __init__(
        self,
        n_quantiles: int = 1000,
        max_levels: int = MAX_LEVELS,
        missing_values: MissingValues = "seen",
    ) -> None:
        super().__init__()
        if missing_values not in ("seen", "any"):
            raise ValueError(f"missing_values must be 'seen' or 'any', got {missing_values!r}")
        self.missing_values: MissingValues = missing_values
        self.standardize = Standardize()
        self.quantile = QuantileNormal(n_quantiles)
        self.categories = CategoryColumns(max_levels)
        self.levels = ValueLevels()
        self.log_standardize = Standardize()  # statistics of the "log" map's columns
        self.register_buffer("maps_", torch.zeros(0, dtype=torch.long))
        self.register_buffer("missing_", torch.zeros(0, dtype=torch.bool))
        self.register_buffer("numeric_", torch.zeros(0, dtype=torch.long))
        self.register_buffer("log_", torch.zeros(0, dtype=torch.bool))
        self.register_buffer("log_offset_", torch.zeros(0))
        self.register_buffer("log_scale_", torch.zeros(0))

    @property
    def n_features(self) -> int:
        """Input columns ``d`` of the fitted map."""
        return int(self.standardize.center_.shape[0])

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the fitted statistics: what the model computes in."""
        return self.standardize.center_.dtype

    @property
    def names(self) -> list[InputMapName]:
        """The map of each tree, names from :data:`INPUT_MAPS`."""
        return [INPUT_MAPS[int(i)] for i in self.maps_]

    def set_maps(self, names: Sequence[str]) -> None:
        """Give tree ``t`` map ``names[t]`` (the quantile maps need :meth:`fit` first)."""
        for name in names:
            if name not in INPUT_MAPS:
                raise ValueError(f"input map must be one of {INPUT_MAPS}, got {name!r}")
        index = [INPUT_MAPS.index(name) for name in names]
        self.maps_ = torch.tensor(index, dtype=torch.long, device=self.maps_.device)

    def fit(
        self,
        X: Tensor,
        *,
        knots: bool = True,
        categorical: Sequence[int] = (),
        y: Tensor | None = None,
        y_rows: Tensor | None = None,
    ) -> InputMap:
        """Fit on the training rows ``X`` (n, d): statistics, category levels, knots (``knots``).

        Args:
            X: Training inputs; NaN marks missing cells.
            knots: Fit the quantile knots (needed by the ``"quantile"`` maps).
            categorical: Indices of the columns holding category codes ``0 .. L-1``.
            y: The training rows' targets as the leaves fit them (n, c): given, the numeric
                columns whose values act as codes for them get a value-level block
                (:func:`~xrfm_torch.inputs.levels.level_columns`); ``None``: no such block.
            y_rows: Which rows' targets that test may read (n,) bool (default: all), so rows
                held out for validation choices do not choose the inputs.
        """
        self.standardize.fit(X)
        self.categories.fit(X, categorical)
        numeric = torch.ones(X.shape[1], dtype=torch.bool, device=X.device)
        numeric[self.categories.columns_] = False
        self.numeric_ = numeric.nonzero().flatten()
        self.missing_ = torch.isnan(X).any(0) & numeric
        chosen: tuple[list[int], list[int]] = ([], [])
        if y is not None:
            rows = slice(None) if y_rows is None else y_rows
            chosen = level_columns(X[rows], y[rows], self.numeric_.tolist())
        self.levels.fit(X, *chosen)
        self.log_, self.log_offset_, self.log_scale_ = log_columns(X, numeric)
        self.log_standardize.fit(self._signed_log(X, slice(None)))
        if knots and self.numeric_.numel() > 0:  # imputed rows: a missing cell at the mean
            self.quantile.fit(self.standardize(X)[:, self.numeric_].nan_to_num(0.0))
        return self

    @property
    def log_columns(self) -> list[int]:
        """Input columns the ``"log"`` map puts on a log scale."""
        return self.log_.nonzero().flatten().tolist()

    def _signed_log(self, x: Tensor, cols: list[int] | slice) -> Tensor:
        """``x`` (n, k), input columns ``cols``, with the qualifying ones through the log map."""
        mask, offset, scale = self.log_[cols], self.log_offset_[cols], self.log_scale_[cols]
        return torch.where(mask, signed_log(x - offset, scale), x)

    @property
    def missing_columns(self) -> list[int]:
        """Numeric columns where the training rows had missing cells (each gets an indicator)."""
        return self.missing_.nonzero().flatten().tolist()

    def layout(self) -> MapLayout:
        """The fitted map's structure as Python values (read from the buffers once)."""
        cols = self.numeric_
        return MapLayout(
            numeric=cols.tolist(),
            indicators=self.missing_[cols].nonzero().flatten().tolist(),
            categorical=self.categories.columns_.tolist(),
            widths=self.categories.widths_.tolist(),
            n_rows=float(self.quantile.n_rows_),
            levels=self.levels.columns_.tolist(),
            level_widths=self.levels.widths_.tolist(),
        )

    def check_missing(self, x: Tensor) -> None:
        """Refuse NaN in a numeric column that had none in training (``missing_values="seen"``)."""
        if self.missing_values != "seen":
            return
        cols = self.numeric_
        nan = torch.isnan(x[:, cols])
        unexpected = nan.any(0) & ~self.missing_[cols]
        if bool(unexpected.any()):
            k = int(unexpected.nonzero()[0])
            i, j = int(nan[:, k].nonzero()[0]), int(cols[k])
            raise ValueError(
                f"x has a missing value (NaN) at row {i}, column {j}, a column that had none "
                f"in the training rows; the model handles NaN only in columns "
                f"{self.missing_columns} (and in categorical columns)"
            )

    def encode(self, x: Tensor, name: InputMapName) -> Tensor:
        """Map ``x`` (n, d) with map ``name``: ``[map(s), c, v, m]``."""
        self.check_missing(x)
        return self.encode_with(x, name, self.layout())

    def encode_many(self, x: Tensor, names: Sequence[InputMapName]) -> dict[InputMapName, Tensor]:
        """:meth:`encode` of ``x`` with each of ``names``, the parts they share computed once.

        The same values as one :meth:`encode` each (the same operations on the same inputs): the
        standardized columns, rank scores, category and level blocks and missing indicators are
        made once and joined per map. On a GPU, fewer launches for the maps a fit probes.
        """
        self.check_missing(x)
        layout = self.layout()
        shared: dict[str, Tensor] = {}
        return {name: self.encode_with(x, name, layout, shared) for name in dict.fromkeys(names)}

    def encode_with(
        self,
        x: Tensor,
        name: InputMapName,
        layout: MapLayout,
        shared: dict[str, Tensor] | None = None,
    ) -> Tensor:
        """:meth:`encode` without the NaN check, with the structure given by ``layout``.

        The same tensor operations for any values of ``x`` (no branch on the data), which is what
        ``torch.export`` needs; a NaN in an unexpected numeric column becomes the column's mean.
        ``shared``: parts made for other maps of the same ``x`` (:meth:`encode_many`), reused
        and added to.
        """
        memo = {} if shared is None else shared

        def part(key: str, make: Callable[[], Tensor]) -> Tensor:
            if key not in memo:
                memo[key] = make()
            return memo[key]

        cols = layout.numeric_index
        xn = part("numeric", lambda: x[:, cols])
        nan = part("nan", lambda: torch.isnan(xn))

        def standardized(values: Tensor, stats: Standardize) -> Tensor:
            s = (values - stats.center_[cols]) / stats.scale_[cols]
            return torch.where(nan, torch.zeros_like(s), s)

        def raw() -> Tensor:
            return part("raw", lambda: standardized(xn, self.standardize))

        parts: list[Tensor] = []
        if name in LOG_MAPS.values():  # the raw part on a log scale (qualifying columns)
            parts.append(
                part("log", lambda: standardized(self._signed_log(xn, cols), self.log_standardize))
            )
        elif name != "quantile":
            parts.append(raw())
        if name.startswith("quantile"):  # rank scores (of the linear part: a log changes no rank)
            parts.append(part("ranks", lambda: self.quantile.scores(raw(), layout.n_rows)))
        if layout.categorical:
            parts.append(
                part(
                    "categories",
                    lambda: self.categories.blocks(x, layout.categorical, layout.widths),
                )
            )
        if layout.levels:
            parts.append(
                part("levels", lambda: self.levels.blocks(x, layout.levels, layout.level_widths))
            )
        if layout.indicators:
            parts.append(part("missing", lambda: nan[:, layout.indicators].to(x.dtype)))
        return parts[0] if len(parts) == 1 else torch.cat(parts, dim=1)

    def forward(self, x: Tensor) -> list[Tensor]:
        """``x`` (n, d) as each tree sees it (each distinct map computed once)."""
        mapped = self.encode_many(x, self.names)
        return [mapped[name] for name in self.names]

    def owners(self, name: InputMapName) -> Tensor:
        """The input column each column of map ``name`` comes from, shape (d',)."""
        numeric = self.numeric_.cpu()
        parts = [numeric, numeric] if name.startswith("quantile+") else [numeric]
        parts += [self.categories.owners().cpu(), self.levels.owners().cpu()]
        parts.append(self.missing_.cpu().nonzero().flatten())
        return torch.cat(parts)

    def fold(self, values: Tensor, name: InputMapName) -> Tensor:
        """Per-column values of map ``name`` (..., d') summed back onto the inputs (..., d).

        A feature gets the values of every column it feeds: its raw and rank columns under
        ``"quantile+raw"``, its category or value-level indicators, its missing indicator.
        """
        owners = self.owners(name).to(values.device)
        out = values.new_zeros(*values.shape[:-1], self.n_features)
        return out.index_add(values.ndim - 1, owners, values)


def signed_log(x: Tensor, scale: Tensor) -> Tensor:
    r"""``sign(x) log(1 + |x| / scale)``: monotone, 0 at 0, the log of ``x`` for ``|x| >> scale``.

    Shapes: ``x`` (n, k), ``scale`` (k,) (positive).
    """
    return torch.sign(x) * torch.log1p(x.abs() / scale)


@torch.no_grad()
def log_columns(X: Tensor, numeric: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    r"""The columns of ``X`` (n, d) the ``"log"`` map puts on a log scale, their offsets and scales.

    Measured from its training minimum ``a`` (so the rule and the map ignore the column's units
    and origin, as :class:`Standardize` does), a column qualifies when it is numeric (``numeric``
    (d,), bool), at least :data:`LOG_ZERO_SHARE` of its observed training values equal ``a``,
    and the others span at least :data:`LOG_SPAN` (``max(x - a) / min(x - a)`` over ``x > a``):
    money or count columns such as capital gains, where standardizing by the standard deviation
    squeezes the small nonzero amounts onto the zeros and a few large ones decide the distances.
    The map is :func:`signed_log` of ``x - a`` with scale ``min(x - a) / LOG_SPAN``: the spike lies
    ``log(1 + LOG_SPAN)`` (about 4.6) below the smallest other value, and other values are apart by
    the log of their ratio (distance from the spike).

    Returns:
        ``mask`` (d,) bool, ``offset`` (d,) (``a``; 0 where the mask is unset) and ``scale`` (d,)
        (1 where the mask is unset).
    """
    observed = ~torch.isnan(X)
    lo = torch.where(observed, X, torch.full_like(X, torch.inf)).amin(0)
    lo = torch.where(lo.isfinite(), lo, torch.zeros_like(lo))  # an all-NaN column
    u = torch.where(observed, X - lo, torch.zeros_like(X))
    above = (u > 0) & observed
    spike = ((u == 0) & observed).sum(0)
    big = torch.where(above, u, torch.zeros_like(u)).amax(0)
    small = torch.where(above, u, torch.full_like(u, torch.inf)).amin(0)
    mask = (
        numeric
        & (spike >= LOG_ZERO_SHARE * observed.sum(0).clamp_min(1))
        & above.any(0)
        & (big >= LOG_SPAN * small)
    )
    offset = torch.where(mask, lo, torch.zeros_like(lo))
    scale = torch.where(mask, small / LOG_SPAN, torch.ones_like(small))
    return mask, offset, scale
