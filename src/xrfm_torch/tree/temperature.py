"""Soft-routing temperature tuning on validation data."""

from __future__ import annotations

from collections.abc import Sequence
from typing import cast

import torch
from torch import Tensor

from xrfm_torch.leaf.criteria import Criterion, validation_loss
from xrfm_torch.numerics import host
from xrfm_torch.numerics.checks import as_float_targets
from xrfm_torch.numerics.host import read_scalars
from xrfm_torch.tree.partition import PartitionTree

#: 0 (hard routing) plus 20 geometrically spaced values from 0.025 to 4.5 (the reference's grid).
DEFAULT_TEMPERATURE_GRID: list[float] = [0.0] + [
    float(t)
    for t in torch.logspace(torch.log10(torch.tensor(0.025)), torch.log10(torch.tensor(4.5)), 20)
]


#: The most (validation row, leaf support row) pairs :class:`RoutedOutputs` evaluates at once
#: where launches bound a fit (a GPU): 2^28, a gigabyte of float32 kernel values.
DENSE_PAIRS = 2**28

#: The most (temperature, validation row, leaf) weights :meth:`RoutedOutputs.at_once` makes at
#: once: 2^26 (256 MB in float32; its sort takes as much again).
DENSE_WEIGHTS = 2**26


class RoutedOutputs:
    """The averaged ``trees``' outputs (n_val, c) at one temperature after another.

    Each leaf is evaluated once on each validation row, when a temperature first gives it
    weight (kept in (n_val, L, c), zero elsewhere); each later temperature only recomputes the
    mixture weights. With weights truncated to ``max_soft_leaves`` per row this costs
    ``O(n_val * max_soft_leaves * leaf size)``, not ``O(n_val * L * leaf size)``: quadratic in
    ``n`` when the validation rows and the leaves both grow with it. Where launches bound the fit
    (:func:`~xrfm_torch.numerics.host.launch_bound`: a GPU) and the pairs are at most
    :data:`DENSE_PAIRS`, every leaf is evaluated on every row at once instead (one call per
    leaf, not one per leaf and temperature, and no row selections).

    Args:
        trees: Fitted trees (their leaves are used as they are), averaged.
        xs: The validation inputs as each tree sees them (its input map), shapes (n_val, d_t).
        keep_mass: Soft routing keeps each row's top leaves covering this weight mass.
        max_leaves: Soft routing evaluates at most this many leaves per row.
    """

    def __init__(
        self,
        trees: Sequence[PartitionTree],
        xs: Sequence[Tensor],
        *,
        keep_mass: float,
        max_leaves: int,
    ) -> None:
        self.pairs = list(zip(trees, xs))
        self.keep_mass, self.max_leaves = keep_mass, max_leaves
        # launch-bound (a GPU): every leaf on every row at the first temperature, one call per
        # leaf instead of one per leaf and temperature, where the pairs are few enough
        pairs = sum(
            int(x.shape[0]) * sum(int(leaf.support_.shape[0]) for leaf in t.leaf_list())
            for t, x in self.pairs
        )
        self.dense = bool(xs) and host.launch_bound(xs[0].device) and pairs <= DENSE_PAIRS
        self.seen = [  # (the lazy evaluation's: the pairs evaluated so far)
            torch.zeros(x.shape[0], t.n_leaves, dtype=torch.bool, device=x.device)
            for t, x in ([] if self.dense else self.pairs)
        ]
        self.leaf_preds: list[Tensor | None] = [None] * len(self.pairs)

    @torch.no_grad()
    def __call__(self, temperature: float) -> Tensor:
        """The averaged outputs (n_val, c) at ``temperature`` (0 = hard routing)."""
        outs = []
        for k, (tree, x) in enumerate(self.pairs):
            w = tree.weights(x, temperature, keep_mass=self.keep_mass, max_leaves=self.max_leaves)
            if self.dense:
                if self.leaf_preds[k] is None:
                    self.leaf_preds[k] = tree.leaf_predictions(x)
            else:
                new = (w > 0) & ~self.seen[k]
                if bool(new.any()):
                    self.leaf_preds[k] = tree.leaf_predictions(x, new, out=self.leaf_preds[k])
                    self.seen[k] |= new
            outs.append((w[:, :, None] * cast(Tensor, self.leaf_preds[k])).sum(1))
        return torch.stack(outs).mean(0)

    @torch.no_grad()
    def at_once(self, temperatures: Sequence[float]) -> Tensor:
        """The averaged outputs (T, n_val, c) at positive ``temperatures``, computed together.

        Only where every leaf is evaluated on every row (``dense``): the weights of all the
        temperatures come from one pass over the splits, in chunks of at most
        :data:`DENSE_WEIGHTS` weights; the same values as one :meth:`__call__` each, up to
        rounding.
        """
        if not self.dense:
            raise RuntimeError("at_once needs the dense evaluation (a launch-bound device)")
        widest = max(int(x.shape[0]) * tree.n_leaves for tree, x in self.pairs)
        step = max(1, DENSE_WEIGHTS // widest)
        chunks = []
        for start in range(0, len(temperatures), step):
            temps = torch.tensor(temperatures[start : start + step], dtype=torch.float64)
            outs = []
            for k, (tree, x) in enumerate(self.pairs):
                if self.leaf_preds[k] is None:
                    self.leaf_preds[k] = tree.leaf_predictions(x)
                w = tree.weights_at(
                    x, temps.to(x.device), keep_mass=self.keep_mass, max_leaves=self.max_leaves
                )
                # sum over leaves: (T, n, L) x (n, L, c) -> (T, n, c)
                outs.append(torch.einsum("tnl,nlc->tnc", w, cast(Tensor, self.leaf_preds[k])))
            chunks.append(torch.stack(outs).mean(0))
        return torch.cat(chunks)


def temperature_predictions(
    trees: Sequence[PartitionTree],
    xs: Sequence[Tensor],
    grid: Sequence[float],
    *,
    keep_mass: float,
    max_leaves: int,
) -> list[Tensor]:
    """The averaged ``trees``' outputs (n_val, c) at each temperature in ``grid``.

    :class:`RoutedOutputs` at each in turn (the honest validation outputs at a given temperature).
    """
    at = RoutedOutputs(trees, xs, keep_mass=keep_mass, max_leaves=max_leaves)
    return [at(temp) for temp in grid]


def search_temperature(
    trees: Sequence[PartitionTree],
    xs: Sequence[Tensor],
    y_val: Tensor,
    grid: Sequence[float],
    *,
    keep_mass: float,
    max_leaves: int,
    criterion: Criterion = "mse",
    weights: Tensor | None = None,
    patience: int | None = None,
) -> tuple[int, list[float], Tensor]:
    """The grid's best temperature for the averaged ``trees`` on validation data, tried in order.

    0 (hard routing) is tried first, then the positive temperatures from the lowest up, stopping
    once ``patience`` of them in a row have not improved on the best positive one (``None``: the
    whole grid, the errors a model's ``temperature_errors`` reports). The validation error is
    close to unimodal in the temperature (it falls while soft routing smooths the leaves'
    boundaries, then rises as far leaves blur the prediction: on 69 curves of the dev tables,
    every one chose the full grid's temperature with a patience of 2); hard routing is tried on
    its own, as its error is not on that curve. The top of the grid is where a row reaches most
    leaves (all ``max_leaves`` of them), so stopping short of it saves most of the search
    (:class:`RoutedOutputs` evaluates a leaf on a row only once a temperature gives it weight).

    Args:
        trees: Fitted trees, averaged.
        xs: The validation inputs as each tree sees them (its input map), shapes (n_val, d_t).
        y_val: Validation targets (n_val,) or (n_val, c).
        grid: Candidate temperatures (0 = hard routing); ties go to the earlier entry.
        keep_mass: Soft routing keeps each row's top leaves covering this weight mass.
        max_leaves: Soft routing evaluates at most this many leaves per row.
        criterion: The validation criterion (:mod:`xrfm_torch.leaf.criteria`).
        weights: The validation rows' weights (n_val,), or ``None``.
        patience: Positive temperatures without improvement before the search stops.

    Returns:
        The best entry's index in ``grid``, each entry's error (NaN where not tried), and the
        averaged outputs (n_val, c) at the best entry.
    """
    at = RoutedOutputs(trees, xs, keep_mass=keep_mass, max_leaves=max_leaves)
    errors = [float("nan")] * len(grid)
    order = sorted(range(len(grid)), key=lambda j: (grid[j] > 0, grid[j], j))
    known: dict[int, tuple[float, Tensor]] = {}  # outputs made ahead, with their errors
    if at.dense:  # launch-bound: every temperature at once and one read, then the same walk
        hard = [i for i in order if grid[i] <= 0]
        soft = [i for i in order if grid[i] > 0]
        parts = [at(grid[i])[None] for i in hard]
        if soft:
            parts.append(at.at_once([grid[i] for i in soft]))
        stacked = torch.cat(parts)  # (len(grid), n_val, c), in the walk's order
        errs = prediction_errors(stacked, y_val, criterion, weights)
        known = {i: (e, stacked[k]) for k, (i, e) in enumerate(zip(hard + soft, errs))}
    best, best_out, best_positive, since = -1, None, float("inf"), 0
    for i in order:
        if i in known:
            errors[i], out = known[i]
        else:
            out = at(grid[i])
            errors[i] = prediction_errors([out], y_val, criterion, weights)[0]
        if best < 0 or errors[i] < errors[best] or (errors[i] == errors[best] and i < best):
            best, best_out = i, out
        if grid[i] > 0:
            if errors[i] < best_positive:
                best_positive, since = errors[i], 0
            else:
                since += 1
                if patience is not None and since >= patience:
                    break
    return best, errors, cast(Tensor, best_out)


def search_rows(n_val: int, max_rows: int | None) -> Tensor | None:
    """The validation rows the temperature search scores (CPU indices, or ``None``: all).

    All ``n_val`` rows when they are at most ``max_rows`` (or ``max_rows`` is ``None``), else
    ``max_rows`` rows evenly spaced over the validation rows' order (a systematic sample).

    The search is the one step of a fit whose cost grows with ``n_val`` times the leaves a row
    reaches at the grid's largest temperatures (all ``max_soft_leaves`` of them). The sample
    draws nothing from a generator: models fitted on the same rows (a blend's members, an
    anytime fit's candidates) score the same rows whatever their fits drew before, so their
    honest outputs, which are the search's outputs at the chosen temperature, stay comparable
    row by row. Spread over the order, it also covers validation rows given sorted (by time, or
    by target) from end to end.
    """
    if max_rows is None or n_val <= max_rows:
        return None
    return torch.linspace(0, n_val - 1, max_rows, dtype=torch.float64).round().long()


def prediction_errors(
    preds: Sequence[Tensor] | Tensor,
    y_val: Tensor,
    criterion: Criterion = "mse",
    weights: Tensor | None = None,
) -> list[float]:
    """The validation criterion's value of each prediction (n_val, c) against ``y_val``.

    ``preds``: the predictions, or all of them stacked (P, n_val, c). ``weights`` (n_val,): the
    rows' sample weights (the weighted mean loss).
    """
    y_val = as_float_targets(y_val, "y_val", n_rows=preds[0].shape[0], dtype=preds[0].dtype)
    if criterion == "mse" and weights is None and isinstance(preds, Tensor):
        return ((preds - y_val) ** 2).mean((1, 2)).tolist()  # one pass, one read
    if criterion == "mse" and weights is None:  # all entries at once (same value, one pass)
        values = [((pred - y_val) ** 2).mean() for pred in preds]
    else:
        values = [validation_loss(pred, y_val, criterion, weights)[0] for pred in preds]
    return read_scalars(*values)  # read back together: one synchronization on a GPU
