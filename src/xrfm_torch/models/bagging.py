"""Cross-fitted bagging: ``n_bags`` xRFMTrees, bag ``k`` validating on fold ``k`` of the rows.

The training and validation rows are pooled and cut into ``K = n_bags`` seeded folds (stratified
by class for classification). Bag ``k`` is an :class:`~xrfm_torch.xRFMTree` fitted on the other
``K - 1`` folds with fold ``k`` as its validation rows, so every choice a tree makes on
validation rows (leaf iterations, exponent, ridge, input maps, temperature, probability
calibration) is made on rows that bag never trained on, and every row is validation for exactly
one bag. Predictions average the bags (probabilities for classification); each row's
prediction by the bag that did not train on it is kept (``oof_``) for stacking and honest scores.

Compared with one tree with a fixed hold-out, each bag trains on ``(K-1)/K`` of all rows
(validation rows included) and the average lowers the variance of the validation-driven choices;
the cost is ``K`` fits (spread over ``torch.distributed`` ranks with ``distributed=True``), each
cheaper where a classifier's bags are trees of half the size (``size_fraction``).

With ``shared_plan`` the later bags follow the first bag's choices instead of searching again
(:mod:`xrfm_torch.models.bag_plan`).
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import torch
from torch import Tensor, nn

from xrfm_torch.inputs.input_map import InputTransform
from xrfm_torch.leaf.lockstep import fit_together
from xrfm_torch.models.bag_plan import (
    CLASSIFICATION_BAG_SIZE_FRACTION,
    PLAN_MIN_ROWS,
    bag_settings,
    cross_folds,
    first_bag_plan,
)
from xrfm_torch.models.contract import Model, Recipe
from xrfm_torch.models.ensemble import Ensemble
from xrfm_torch.models.holder import member_indices
from xrfm_torch.models.xrfm_tree import xRFMTree
from xrfm_torch.numerics.checks import check_bool, check_fraction, check_int
from xrfm_torch.numerics.rng import own_generator
from xrfm_torch.tree.grow import Progress
from xrfm_torch.tree.honest import HonestOutputs
from xrfm_torch.tree.memory import budget_bytes, tree_step_bytes
from xrfm_torch.tree.parallel import assign_by_cost, leaf_seeds, run_leaf_jobs, world

log = logging.getLogger(__name__)


class _Pending(NamedTuple):
    """A fit between :meth:`BaggedTree.begin_fit` and :meth:`BaggedTree.finish_fit`."""

    Xp: Tensor  # the pooled rows (training, then validation)
    yp: Tensor
    w: Tensor | None
    folds: Tensor
    bags: list[xRFMTree]
    jobs: list[Any]
    first: int  # 1 where the first bag is fitted ahead of the others
    start: float  # perf_counter at begin_fit


class BaggedTree(Ensemble):
    """``n_bags`` cross-fitted :class:`~xrfm_torch.xRFMTree` s, averaged (see the module docstring).

    Args:
        tree: The settings of every bag (an unfitted ``xRFMTree``; only its constructor
            arguments are used: each bag is a fresh tree built from them). Default ``xRFMTree()``.
        n_bags: Bags = folds, ``>= 2``.
        distributed: Spread the bags over the ranks of the default ``torch.distributed`` process
            group (each bag fitted whole on one rank, then shared). Without it, a tree built
            with ``distributed=True`` spreads each bag's leaves instead.
        shared_plan: The later bags follow the first bag's leaf choices (:func:`first_bag_plan`)
            instead of making their own searches, on ``PLAN_MIN_ROWS`` pooled rows or more;
            ``False``: every bag searches on its own.
        size_fraction: Each bag's trees are this share of the tree's size (in ``(0, 1]``): they
            split down to this share of ``max_leaf_size`` (a set of maps then halves it again,
            as in a single tree) and fit their split models on this share of the rule's
            ``sample_size``. ``None``: ``CLASSIFICATION_BAG_SIZE_FRACTION`` (0.5) for
            classification, 1 for regression.

    Attributes:
        members: The fitted trees (the bags).
        oof_: Out-of-fold predictions of the pooled rows (training rows, then validation rows):
            each row's prediction by the bag it validated, in the targets' units (regression) or
            probabilities (classification). Not saved in ``state_dict``.
        folds_: Each pooled row's fold (not saved).
    """

    oof_: Tensor
    folds_: Tensor
    prototype: xRFMTree  # the bags' settings (Ensemble._hold_prototype)

    def __init__(
        self,
        tree: xRFMTree | None = None,
        *,
        n_bags: int = 5,
        distributed: bool = False,
        shared_plan: bool = True,
        size_fraction: float | None = None,
    ) -> None:
        super().__init__()
        proto = xRFMTree() if tree is None else tree
        if not isinstance(proto, xRFMTree):
            raise TypeError(f"tree must be an xRFMTree, got {type(proto).__name__}")
        self.n_bags = check_int(n_bags, "n_bags", 2)
        self.distributed = check_bool(distributed, "distributed")
        self.shared_plan = check_bool(shared_plan, "shared_plan")
        if size_fraction is not None:
            size_fraction = check_fraction(size_fraction, "size_fraction")
        self.size_fraction = size_fraction
        self._hold_prototype(proto)
        self.members = nn.ModuleList()
        self.register_buffer("oof_", torch.zeros(0), persistent=False)
        self.register_buffer("folds_", torch.zeros(0, dtype=torch.long), persistent=False)
        self.fit_seconds_: float | None = None
        self._pending: _Pending | None = None

    # ---- settings ------------------------------------------------------------------------------
    @property
    def tree(self) -> xRFMTree:
        """A new unfitted tree with the bags' settings."""
        return xRFMTree.from_config(self.prototype.get_config())

    def with_kernel(self, name: str) -> BaggedTree:
        """Unfitted bags of the prototype tree with the kernel ``name`` (:meth:`xRFMTree.with_kernel`)."""
        return self._like(self.prototype.with_kernel(name))

    def with_settings(self, **changes: Any) -> BaggedTree:
        """Unfitted bags of the prototype tree with some of its arguments changed."""
        return self._like(self.prototype.with_settings(**changes))

    @property
    def bag_size_fraction(self) -> float:
        """``size_fraction`` resolved: a bag's share of the tree's leaf size and split sample."""
        if self.size_fraction is not None:
            return self.size_fraction
        return CLASSIFICATION_BAG_SIZE_FRACTION if self.task == "classification" else 1.0

    def _like(self, tree: xRFMTree) -> BaggedTree:
        return BaggedTree(
            tree,
            n_bags=self.n_bags,
            distributed=self.distributed,
            shared_plan=self.shared_plan,
            size_fraction=self.size_fraction,
        )

    def recipe(self) -> Recipe:
        """The prototype tree in ``n_bags`` bags of these settings (:class:`Recipe`)."""
        bag = {"shared_plan": self.shared_plan, "size_fraction": self.size_fraction}
        return Recipe(self.prototype, None, self.n_bags, bag, {})

    def choose_input_maps(self, *args: Any, **kwargs: Any) -> InputTransform:
        """The input maps of the bags' trees on these rows (:meth:`xRFMTree.choose_input_maps`)."""
        return self.prototype.choose_input_maps(*args, **kwargs)

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments as plain data (the tree's as a nested config)."""
        return {
            "_target_": f"{type(self).__module__}.{type(self).__qualname__}",
            "tree": self.prototype.get_config(),
            "n_bags": self.n_bags,
            "distributed": self.distributed,
            "shared_plan": self.shared_plan,
            "size_fraction": self.size_fraction,
        }

    @property
    def is_fitted(self) -> bool:
        """Whether every bag is fitted."""
        return len(self.members) == self.n_bags and all(b.is_fitted for b in self.models())

    def models(self) -> list[xRFMTree]:
        """The bags."""
        return [cast(xRFMTree, b) for b in self.members]

    def member_weights(self) -> list[float]:
        """``1 / n_bags`` each."""
        return [1.0 / len(self.members)] * len(self.members)

    def combine(self, parts: Sequence[Tensor]) -> Tensor:
        """The plain mean over bags."""
        return torch.stack(list(parts)).mean(0)

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
    ) -> BaggedTree:
        """Fit the bags on the pooled training (+ validation) rows, bag ``k`` validating on fold ``k``.

        Args:
            X: Training inputs (n, d).
            y: Targets (n,) or (n, c), or class labels ``0 .. K-1``.
            X_val: Validation inputs (n_val, d), pooled with ``X`` (optional).
            y_val: Validation targets.
            sample_weight: Training row weights (n,) (as in :meth:`xRFMTree.fit`).
            val_sample_weight: Validation row weights (n_val,).
            generator: CPU generator: draws the folds and each bag's seed (same seed, same model).
            progress: Passed to every bag's fit.

        Raises:
            ValueError: Fewer rows than bags, a class with a single row, or mismatched arguments.
        """
        self.begin_fit(
            X,
            y,
            X_val,
            y_val,
            sample_weight=sample_weight,
            val_sample_weight=val_sample_weight,
            generator=generator,
            progress=progress,
        )
        return self.finish_fit()

    @torch.no_grad()
    def begin_fit(
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
    ) -> BaggedTree:
        """The first part of :meth:`fit`: folds, seeds and (where the others follow it) bag 0.

        :meth:`finish_fit` fits the others; ``fit`` is the two in a row.

        Between them :meth:`first_fold_outputs` gives the first bag's outputs on its fold (a
        :class:`~xrfm_torch.models.blend.KernelBlend` races its kernels on them).
        """
        start = time.perf_counter()
        generator = own_generator(generator)
        if (X_val is None) != (y_val is None):
            raise ValueError("pass both X_val and y_val, or neither")
        if val_sample_weight is not None and X_val is None:
            raise ValueError("val_sample_weight needs X_val")
        Xs, ys = [X], [y]
        if X_val is not None and y_val is not None:
            if y_val.ndim != y.ndim:
                raise ValueError(f"y_val has {y_val.ndim} dims but y has {y.ndim}")
            Xs.append(X_val)
            ys.append(y_val.to(y.dtype))
        Xp, yp = torch.cat(Xs), torch.cat(ys)
        n = Xp.shape[0]
        w = None
        if sample_weight is not None or val_sample_weight is not None:
            parts = [
                torch.ones(len(a), dtype=Xp.dtype, device=Xp.device) if wa is None else wa
                for a, wa in zip(Xs, (sample_weight, val_sample_weight))
            ]
            w = torch.cat([p.to(Xp.dtype) for p in parts])
        if n < 2 * self.n_bags:
            raise ValueError(f"{n} rows are too few for n_bags={self.n_bags} folds")
        labels = None
        if self.task == "classification":
            labels = yp.detach().reshape(-1).round().long().cpu()
            counts = torch.bincount(labels.clamp(min=0))
            single = [c for c, m in enumerate(counts.tolist()) if m == 1]
            if single:
                raise ValueError(
                    f"class {single[0]} has a single row: cross-fitted bags need at least 2 rows "
                    "per class (every bag must train on every class)"
                )
        maps = None  # "auto": the probe runs once, on the rows as given; every bag takes its choice
        began = time.perf_counter()
        if self.prototype.config.input_transform == "auto":
            maps = self.prototype.choose_input_maps(
                X,
                y,
                X_val,
                y_val,
                sample_weight=sample_weight,
                val_sample_weight=val_sample_weight,
                generator=generator,
            )
        self.probe_seconds_ = time.perf_counter() - began
        folds = cross_folds(n, self.n_bags, generator, labels).to(Xp.device)
        seeds = leaf_seeds(generator, self.n_bags)
        bags = [self._new_bag(world(self.distributed)[1] > 1, maps) for _ in range(self.n_bags)]

        def job(k: int) -> Any:
            def fit_bag(bag: xRFMTree) -> None:
                tr, va = folds != k, folds == k
                bag.fit(
                    Xp[tr],
                    yp[tr],
                    Xp[va],
                    yp[va],
                    sample_weight=None if w is None else w[tr],
                    val_sample_weight=None if w is None else w[va],
                    generator=torch.Generator().manual_seed(seeds[k]),
                    progress=progress,
                )
                log.info("bag %d/%d: %d leaves", k + 1, self.n_bags, bag.n_leaves)

            return fit_bag

        jobs = [job(k) for k in range(self.n_bags)]
        first = int(self.shared_plan and n >= PLAN_MIN_ROWS)  # fitted first; the others follow
        if first:
            run_leaf_jobs(bags[:1], jobs[:1], [0], distributed=self.distributed)
            plan = first_bag_plan(bags[0])
            if plan is not None:
                for bag in bags[1:]:
                    bag.config = bag.config.replace(leaf=plan)
        self._pending = _Pending(Xp, yp, w, folds, bags, jobs, first, start)
        return self

    def first_fold_outputs(self) -> HonestOutputs | None:
        """Between :meth:`begin_fit` and :meth:`finish_fit`: the first bag's outputs on its fold.

        ``None`` where the first bag is not fitted ahead of the others (below ``PLAN_MIN_ROWS``
        pooled rows, or ``shared_plan=False``).
        """
        p = self._pending
        if p is None or not p.first:
            return None
        rows = (p.folds == 0).nonzero().squeeze(1)
        out = self._bag_output(p.bags[0], p.Xp[rows], None)
        return HonestOutputs(out, p.yp[rows], None if p.w is None else p.w[rows], rows)

    @torch.no_grad()
    def finish_fit(self) -> BaggedTree:
        """Fit the bags :meth:`begin_fit` left and keep them with their out-of-fold outputs.

        Raises:
            RuntimeError: No :meth:`begin_fit` came before.
        """
        p = self._pending
        if p is None:
            raise RuntimeError("finish_fit needs begin_fit first")
        self._pending = None
        bags, jobs = p.bags[p.first :], p.jobs[p.first :]
        if world(self.distributed)[1] > 1:
            owners = assign_by_cost([1.0] * len(bags), world(self.distributed)[1])
            run_leaf_jobs(bags, jobs, owners, distributed=self.distributed)
        elif bags:  # in lockstep where batched steps pay: every bag's leaves' steps batch together
            cfg, rows = bags[0].config, int((p.folds != 0).sum())
            fit_together(
                [functools.partial(job, bag) for job, bag in zip(jobs, bags)],
                batched=cfg.steps_batched(p.Xp.device),
                held_bytes=len(bags)
                * tree_step_bytes(cfg.max_leaf_size, rows, p.Xp.element_size()),
                limit=budget_bytes(cfg.memory_budget, p.Xp.device),
            )
        widths = {b.n_outputs_ for b in p.bags}
        if len(widths) > 1:  # cannot happen with >= 2 rows a class; a guard for the average
            raise RuntimeError(f"bags fitted different output widths {sorted(widths)}")
        self.members = nn.ModuleList(p.bags)
        self.folds_ = p.folds
        self.oof_ = self._out_of_fold(p.Xp, p.folds)
        n = p.Xp.shape[0]
        self._honest = HonestOutputs(self.oof_, p.yp, p.w, torch.arange(n, device=p.Xp.device))
        self.fit_seconds_ = time.perf_counter() - p.start
        log.info(
            "fitted %d cross-fitted bags (%d leaves) in %.2fs", self.n_bags, self.n_leaves,
            self.fit_seconds_,
        )  # fmt: skip
        return self

    def _new_bag(self, spread_bags: bool, maps: InputTransform | None = None) -> xRFMTree:
        bag = self.tree
        bag.config = bag_settings(bag.config, self.bag_size_fraction)
        if spread_bags:  # a bag is fitted whole on its rank
            bag.config = bag.config.replace(distributed=False)
        if maps is not None:
            bag.config = bag.config.replace(input_transform=maps)
        return bag

    def _out_of_fold(self, X: Tensor, folds: Tensor) -> Tensor:
        out: Tensor | None = None
        for k, bag in enumerate(self.models()):
            rows = (folds == k).nonzero().squeeze(1)
            pred = self._bag_output(bag, X[rows], None)
            if out is None:
                out = pred.new_zeros(X.shape[0], pred.shape[1])
            out[rows] = pred
        return cast(Tensor, out)

    def summary(self) -> dict[str, Any]:
        """``{"n_bags", "n_leaves", "fit_seconds", "bags": [each bag's summary]}``."""
        self._check_fitted()
        return {
            "n_bags": self.n_bags,
            "n_leaves": self.n_leaves,
            "fit_seconds": self.fit_seconds_,
            "bags": [bag.summary() for bag in self.models()],
        }

    # ---- prediction (Ensemble: the mean of the bags) -------------------------------------------
    def _bag_output(self, bag: xRFMTree, x: Tensor, temperature: float | Tensor | None) -> Tensor:
        if self.task == "classification":
            return bag.predict_proba(x, temperature)
        return bag(x, temperature)

    # ---- loading into a fresh module (Holder) --------------------------------------------------
    def _upgrade_state(self, state_dict: dict[str, Any], prefix: str) -> None:
        # the bags were held as ``bags`` before every holder named its models ``members``
        head = prefix + "bags."
        for key in [k for k in state_dict if k.startswith(head)]:
            state_dict[prefix + "members." + key.removeprefix(head)] = state_dict.pop(key)

    def _empty_members(self, state_dict: dict[str, Any], prefix: str) -> list[Model] | None:
        # one empty tree per saved bag; each then rebuilds its own structure from its keys
        found = member_indices(state_dict, prefix)
        if not found or len(self.members) == len(found):
            return None
        return [self._new_bag(False) for _ in range(max(found) + 1)]
