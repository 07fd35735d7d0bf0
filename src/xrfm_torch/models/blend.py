"""Kernel blends: one model's settings fitted once per kernel, mixed by weights on honest outputs.

Which kernel suits a table is a property of the table. On the classification suite (``docs/benchmarks.md``) the Gaussian kernel beats the Laplace kernel by 1-30 % log-loss on about
half the tables and loses by 13-81 % on others (diamonds, california, electricity), and no
cheap probe ranks them reliably. So :class:`KernelBlend` fits the model once per kernel on the
same rows with the same draws (same splits, same folds), and chooses mixing weights, multiples
of ``1 / weight_steps`` summing to 1, that minimize the loss of the mixed honest outputs
(:mod:`xrfm_torch.tree.honest`: out-of-fold outputs of a ``BaggedTree``, validation outputs of a
single tree): log-loss of the mixed probabilities, or the squared error of the mixed
predictions. Ties go to the earlier kernels. Members of weight 0 are dropped, so a table where
one kernel wins keeps one model. The cost is one fit per kernel.

Predictions are the weighted means of the members' (probabilities for ``predict_proba``,
scores or targets for ``forward``); ``return_std`` is the weighted mixture's.
"""

from __future__ import annotations

import functools
import itertools
import logging
import time
from collections.abc import Sequence
from typing import Any, cast

import torch
from torch import Tensor, nn

from xrfm_torch.kernels import KERNELS
from xrfm_torch.leaf.criteria import relative
from xrfm_torch.leaf.lockstep import fit_together
from xrfm_torch.leaf.selection import paired_win
from xrfm_torch.models.bagging import BaggedTree
from xrfm_torch.models.contract import Model, Recipe
from xrfm_torch.models.ensemble import Ensemble
from xrfm_torch.models.xrfm_tree import xRFMTree
from xrfm_torch.numerics.checks import check_bool, check_int, check_positive
from xrfm_torch.numerics.host import read_scalars
from xrfm_torch.numerics.rng import own_generator
from xrfm_torch.tree.grow import Progress
from xrfm_torch.tree.honest import (
    HonestOutputs,
    check_same_rows,
    mean_loss,
    row_losses,
)
from xrfm_torch.tree.memory import budget_bytes, tree_step_bytes
from xrfm_torch.tree.parallel import world

log = logging.getLogger(__name__)

#: The models a blend may hold: single trees or cross-fitted bags.
Member = xRFMTree | BaggedTree


def weight_grid(n_kernels: int, steps: int) -> Tensor:
    """Every weight vector with entries in ``{0, 1/steps, ..., 1}`` summing to 1, (g, n_kernels).

    Rows run from the first kernel alone down (lexicographically by decreasing weights), so the
    first minimum of a loss over the rows favours the earlier kernels.
    """
    rows = [c for c in itertools.product(range(steps, -1, -1), repeat=n_kernels) if sum(c) == steps]
    return torch.tensor(rows, dtype=torch.float64) / steps


def compose(
    tree: xRFMTree,
    n_bags: int = 1,
    kernels: Sequence[str] | None = None,
    bag: dict[str, Any] | None = None,
    blend: dict[str, Any] | None = None,
) -> xRFMTree | BaggedTree | KernelBlend:
    """``tree``, as ``n_bags`` cross-fitted bags (1: itself), fitted once per kernel and blended.

    ``kernels=None``: the tree's kernel alone; ``bag`` and ``blend``: further keyword arguments
    of the ``BaggedTree`` and the ``KernelBlend``. The composition behind
    :func:`~xrfm_torch.models.factory.build_model` and the anytime fit's candidates.
    """
    member: xRFMTree | BaggedTree = tree
    if n_bags > 1:
        member = BaggedTree(tree, n_bags=n_bags, distributed=tree.config.distributed, **(bag or {}))
    return KernelBlend(member, kernels=list(kernels), **(blend or {})) if kernels else member


class KernelBlend(Ensemble):
    """A model fitted once per kernel, its members mixed by weights chosen on honest outputs.

    Args:
        model: The prototype of every member (an ``xRFMTree`` or ``BaggedTree``; a copy of its
            settings is held, and each member is its ``with_kernel(k)`` for ``k`` in
            ``kernels``, which keeps the prototype kernel's bandwidth). Default ``xRFMTree()``.
        kernels: Names of at least two distinct kernels (:data:`~xrfm_torch.kernels.KERNELS`).
        weight_steps: The weights are multiples of ``1 / weight_steps`` (4: 0, 0.25, ..., 1).
        race_margin: Race bagged members: after each kernel's first bag (fitted ahead of the
            others from ``PLAN_MIN_ROWS`` pooled rows), a kernel that one weight step would make
            worse on the first fold by this many paired standard errors fits no further bags and
            gets weight 0 (``fit``'s ``_race``). ``None``: every member is fitted whole.

    Attributes:
        members: The fitted models of non-zero weight.
        weights_: Their weights (sum 1).
        member_kernels_: Each member's index in ``kernels``.
        honest_losses_: The honest loss of every weight vector tried (not saved).
        raced_: The kernels dropped after their first bag, with the first fold's loss increase
            of one weight step to them (not saved).

    Example:
        >>> blend = KernelBlend(xRFMTree(task="classification"), kernels=("laplace", "gaussian"))
        >>> blend.get_config()["kernels"]
        ['laplace', 'gaussian']
    """

    weights_: Tensor
    member_kernels_: Tensor
    prototype: Member  # the members' settings (Ensemble._hold_prototype)

    def __init__(
        self,
        model: Member | None = None,
        *,
        kernels: Sequence[str] = ("laplace", "gaussian"),
        weight_steps: int = 4,
        race_margin: float | None = 2.0,
    ) -> None:
        super().__init__()
        proto = xRFMTree() if model is None else model
        if not isinstance(proto, (xRFMTree, BaggedTree)):
            raise TypeError(f"model must be an xRFMTree or BaggedTree, got {type(proto).__name__}")
        names = [kernels] if isinstance(kernels, str) else list(kernels)
        unknown = [k for k in names if not isinstance(k, str) or k not in KERNELS]
        if unknown:
            raise ValueError(f"unknown kernel {unknown[0]!r}; choose from {sorted(KERNELS)}")
        if len(names) < 2 or len(set(names)) != len(names):
            raise ValueError(f"kernels must name at least 2 distinct kernels, got {names}")
        self.kernels = tuple(names)
        self.weight_steps = check_int(weight_steps, "weight_steps", 1)
        self.race_margin = (
            None if race_margin is None else check_positive(race_margin, "race_margin")
        )
        self._hold_prototype(proto)
        self.members = nn.ModuleList()
        self.register_buffer("weights_", torch.zeros(0))
        self.register_buffer("member_kernels_", torch.zeros(0, dtype=torch.long))
        self.honest_losses_: dict[tuple[float, ...], float] = {}
        self.raced_: dict[str, float] = {}
        self.fit_seconds_: float | None = None

    # ---- settings ------------------------------------------------------------------------------
    def summary(self) -> dict[str, Any]:
        """The blend as plain data: its kernels, weights and single trees.

        ``"kernels"`` and ``"weights"`` of the members kept, and as ``"bags"`` every single tree
        of every member (``"bag_weights"``: their weights in the prediction).
        """
        pairs = self.single_trees()
        return {
            "kernels": [self.kernels[int(i)] for i in self.member_kernels_.tolist()],
            "weights": self.weights_.tolist(),
            "n_bags": len(pairs),
            "n_leaves": self.n_leaves,
            "fit_seconds": self.fit_seconds_,
            "raced": dict(self.raced_),
            "bag_weights": [w for w, _ in pairs],
            "bags": [tree.summary() for _, tree in pairs],
        }

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments as plain data (the members' settings as a nested config)."""
        return {
            "_target_": f"{type(self).__module__}.{type(self).__qualname__}",
            "model": self.prototype.get_config(),
            "kernels": list(self.kernels),
            "weight_steps": self.weight_steps,
            "race_margin": self.race_margin,
        }

    def recipe(self) -> Recipe:
        """The prototype's recipe with these kernels and blend settings (:class:`Recipe`)."""
        own = {
            k: v for k, v in self.get_config().items() if k not in ("_target_", "model", "kernels")
        }
        return self.prototype.recipe()._replace(kernels=list(self.kernels), blend=own)

    def _new_member(self, index: int) -> Member:
        """The prototype with the kernel ``kernels[index]``, unfitted (its ``with_kernel``).

        Each member chooses its own input maps (``"auto"``): the probe's choice depends on the
        kernel (on pol the Gaussian kernel's bags pick a set of two maps, the Laplace kernel's
        the raw inputs; one shared choice cost 2-6 % log-loss there).
        """
        return self.prototype.with_kernel(self.kernels[index])

    @property
    def distributed(self) -> bool:
        """Whether the members spread their work over the default process group's ranks.

        A bagged member spreads its bags, a single tree its leaves.
        """
        return self.prototype.distributed

    @distributed.setter
    def distributed(self, value: bool) -> None:
        self.prototype.distributed = check_bool(value, "distributed")

    @property
    def is_fitted(self) -> bool:
        """Whether the blend holds its fitted members."""
        return (
            len(self.members) > 0
            and len(self.members) == self.weights_.numel()
            and all(m.is_fitted for m in self.models())
        )

    @property
    def oof_(self) -> Tensor:
        """Out-of-fold outputs of the pooled rows, mixed by the weights (bagged members only).

        As :attr:`BaggedTree.oof_` (probabilities for classification); not saved.

        Raises:
            RuntimeError: The members are single trees, or the blend was not fitted in this
                session (a RuntimeError, not an AttributeError, which ``nn.Module`` would
                replace by a message without the reason).
        """
        if not (len(self.members) and self.prototype.recipe().n_bags > 1):
            raise RuntimeError("oof_ needs a fitted blend of BaggedTrees (n_bags > 1)")
        if self._honest is None:
            raise RuntimeError("oof_ needs a blend fitted in this session (.fit)")
        return self._honest.outputs

    def models(self) -> list[Member]:
        """The members of non-zero weight."""
        return [cast(Member, m) for m in self.members]

    def member_weights(self) -> list[float]:
        """``weights_`` as floats."""
        return [float(w) for w in self.weights_.tolist()]

    def combine(self, parts: Sequence[Tensor]) -> Tensor:
        """The weights' mean of one tensor per member."""
        return cast(Tensor, sum(w * p for w, p in zip(self.member_weights(), parts)))

    # ---- fitting -------------------------------------------------------------------------------
    @torch.no_grad()
    def fit(
        self,
        X: Tensor,
        y: Tensor,
        X_val: Tensor | None = None,
        y_val: Tensor | None = None,
        *,
        sample_weight: Tensor | None = None,
        val_sample_weight: Tensor | None = None,
        generator: torch.Generator | None = None,
        progress: Progress | None = None,
    ) -> KernelBlend:
        """Fit one member per kernel (same rows, same draws), then choose the weights.

        Arguments as the members' ``fit`` (:meth:`xRFMTree.fit`, :meth:`BaggedTree.fit`); every
        member starts from the state ``generator`` has at the call, so each is the model its
        kernel alone would give with that seed. Bagged members whose first bag is fitted ahead
        of the others race (``race_margin``): each fits its first bag, then only the kernels
        that may get a weight fit the rest.
        """
        start = time.perf_counter()
        self.raced_ = {}
        generator = own_generator(generator)
        state = generator.get_state()
        members = [self._new_member(i) for i in range(len(self.kernels))]
        # staged fits race (a member whose fit has no first stage fits whole in begin_fit)
        race = self.race_margin is not None and world(self.distributed)[1] == 1  # one choice
        cfg = self.prototype.recipe().tree.config
        # the members are independent fits: in lockstep where batched steps pay
        batched = cfg.steps_batched(X.device) and world(self.distributed)[1] == 1

        def fit(member: Member) -> None:
            draws = torch.Generator()
            draws.set_state(state)
            (member.begin_fit if race else member.fit)(
                X,
                y,
                X_val,
                y_val,
                sample_weight=sample_weight,
                val_sample_weight=val_sample_weight,
                generator=draws,
                progress=progress,
            )

        held = len(members) * tree_step_bytes(cfg.max_leaf_size, X.shape[0], X.element_size())
        limit = budget_bytes(cfg.memory_budget, X.device)
        fit_together(
            [functools.partial(fit, m) for m in members],
            batched=batched,
            held_bytes=held,
            limit=limit,
        )
        keep = list(range(len(members)))
        if race:
            keep = self._race(members)
            fit_together([members[i].finish_fit for i in keep], batched=batched)
        self.mix([members[i] for i in keep], keep)
        self.fit_seconds_ = time.perf_counter() - start
        return self

    def _race(self, members: Sequence[Member]) -> list[int]:
        """The kernels worth fitting whole, judged on the first bags' outputs on their fold.

        On the first fold (the same rows for every member: same draws), the weight vector of
        lowest loss ``w*`` is found on the grid; a kernel ``k`` with ``w*_k = 0`` is dropped if
        moving one grid step of weight to it (from the largest weight) raises the per-row loss
        by more than ``race_margin`` paired standard errors. The loss of a mixture is convex in
        its weights, so a step that loses means every larger share loses too. Where no first
        bag was fitted ahead (small pooled tables), every kernel is kept.
        """
        parts = [m.first_fold_outputs() for m in members]
        if any(p is None for p in parts):
            return list(range(len(members)))
        outs = [cast(HonestOutputs, p) for p in parts]
        check_same_rows(outs)
        _, grid, per_row, means = self._grid_losses(outs)
        best = min(range(len(means)), key=lambda i: means[i])
        w_best = grid[best]
        rows_w = outs[0].weights  # the paired test on per-row losses scaled to the weighted mean
        if rows_w is not None:
            per_row = per_row * relative(rows_w.double())
        keep = []
        for k in range(len(outs)):
            if w_best[k] > 0:
                keep.append(k)
                continue
            step = w_best.clone()
            step[int(w_best.argmax())] -= 1.0 / self.weight_steps
            step[k] += 1.0 / self.weight_steps
            i = int((grid - step).abs().sum(1).argmin())
            if paired_win(per_row[best], per_row[i], cast(float, self.race_margin)):
                gap = means[i] - means[best]
                self.raced_[self.kernels[k]] = gap
                log.info(
                    "kernel blend: %s dropped after its first bag (a %.2f share raises the "
                    "first fold's honest loss by %.4g)", self.kernels[k],
                    1.0 / self.weight_steps, gap,
                )  # fmt: skip
            else:
                keep.append(k)
        return keep

    def _grid_losses(
        self, parts: Sequence[HonestOutputs]
    ) -> tuple[Tensor, Tensor, Tensor, list[float]]:
        """The honest outputs ``parts`` mixed by every weight vector of the grid, scored.

        Returns:
            The stacked outputs (k, n, c) in float64, the grid (g, k), the per-row losses
            (g, n) and their (weighted) means, read back together.
        """
        outputs = torch.stack([p.outputs for p in parts]).double()
        grid = weight_grid(len(parts), self.weight_steps)
        targets, weights = parts[0].targets, parts[0].weights
        per_row = torch.stack(
            [row_losses(torch.einsum("k,knc->nc", w.to(outputs), outputs), targets, self.task)
             for w in grid]
        )  # fmt: skip
        return outputs, grid, per_row, read_scalars(*(mean_loss(r, weights) for r in per_row))

    def mix(self, fitted: Sequence[Member], indices: Sequence[int] | None = None) -> KernelBlend:
        """Choose the weights of fitted members and keep them.

        The members must have been fitted in this session on the same rows with the same draws
        (their honest outputs are compared row by row). ``fit`` ends here; an anytime fit
        (:class:`~xrfm_torch.models.anytime.Anytime`) mixes members it already has.

        Args:
            fitted: The members, one per entry of ``indices``.
            indices: Their kernels' places in ``kernels`` (default: all, in order; a race
                leaves some out). A kernel named more than once has several members, draws of
                one model (``TreeConfig.draw``): they share its weight equally, so the grid
                still weighs kernels, and the members kept are grouped by kernel.

        Raises:
            ValueError: Not one member per index, or honest outputs of different rows.
        """
        index = list(range(len(self.kernels))) if indices is None else [int(i) for i in indices]
        if len(fitted) != len(index) or not fitted:
            raise ValueError(
                f"mix needs one member per kernel of {index}, got {len(fitted)} members"
            )
        parts = [m.honest_outputs() for m in fitted]
        check_same_rows(parts)
        kinds = list(dict.fromkeys(index))  # each kernel once, in order
        draws = [[j for j, k in enumerate(index) if k == kind] for kind in kinds]
        pooled = [
            parts[d[0]]._replace(outputs=torch.stack([parts[j].outputs for j in d]).mean(0))
            for d in draws
        ]
        outputs, grid, _, losses = self._grid_losses(pooled)
        best = min(range(len(losses)), key=lambda i: losses[i])
        chosen = grid[best]
        # (member, weight): a kernel's share split equally among its draws
        keep = [(j, chosen[g] / len(d)) for g, d in enumerate(draws) if chosen[g] > 0 for j in d]
        first = fitted[0].single_trees()[0][1].fitted_temperature_  # the fit's dtype and device
        self.members = nn.ModuleList(fitted[j] for j, _ in keep)
        weights = torch.stack([w for _, w in keep])
        self.weights_ = weights.to(device=first.device, dtype=first.dtype)
        self.member_kernels_ = torch.tensor([index[j] for j, _ in keep], device=first.device)
        full = torch.zeros(len(grid), len(self.kernels), dtype=grid.dtype)
        full[:, kinds] = grid  # the weights of every kernel, 0 for those not fitted
        self.honest_losses_ = {tuple(w.tolist()): v for w, v in zip(full, losses)}
        mixed = torch.einsum("k,knc->nc", chosen.to(outputs), outputs).to(parts[0].outputs)
        self._honest = HonestOutputs(mixed, parts[0].targets, parts[0].weights, parts[0].rows)
        log.info(
            "kernel blend %s (honest %s: %s)",
            " + ".join(f"{float(w):.2f} {self.kernels[k]}" for w, k in zip(chosen, kinds) if w > 0),
            "log-loss" if self.task == "classification" else "MSE",
            ", ".join(f"{tuple(round(v, 2) for v in w)} {v:.4g}" for w, v in zip(full.tolist(), losses)),
        )  # fmt: skip
        return self

    # ---- loading into a fresh module (Holder) --------------------------------------------------
    def _empty_members(self, state_dict: dict[str, Any], prefix: str) -> list[Model] | None:
        # the saved members' kernels say which empty members to build; each loads its own keys
        index = state_dict.get(prefix + "member_kernels_")
        if not isinstance(index, Tensor):
            return None
        picks = [int(i) for i in index.tolist()]
        if any(not 0 <= i < len(self.kernels) for i in picks):
            raise ValueError(
                f"the state names member kernels {picks}, but this blend has "
                f"{len(self.kernels)} kernels {list(self.kernels)}"
            )
        self.member_kernels_ = torch.zeros_like(index)
        weights = state_dict.get(prefix + "weights_")
        if isinstance(weights, Tensor):
            self.weights_ = torch.zeros_like(weights)
        return [self._new_member(i) for i in picks]
