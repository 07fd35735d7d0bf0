"""A fit within a time limit: the cheapest competitive model first, better ones while time lasts.

:class:`Anytime` wraps the model a fit without a limit would make (one tree, its bags, or a
kernel blend of either: the *target*) and fits a ladder of candidates that ends at it, cheapest
first (:func:`~xrfm_torch.models.ladder.ladder`):

1. ``quick``: the target's tree (or its bags, after one quick single tree as a fallback) for
   the first kernel (on a small fit of a blend, the single tree takes the Gaussian one,
   :func:`~xrfm_torch.models.ladder.quick_kernel`) with leaves of at most ``quick_leaf_size``
   rows, one tree per input map and smaller split models
   (:func:`~xrfm_torch.models.ladder.quick_tree`; docs/design-use.md, "A time budget: the
   anytime fit"); where no tree splits, the bags come first, without the
   fallback: each bag is one leaf, and a bag's leaf stops iterating at the limit as the
   fallback's would;
2. the target's tree (or bags) once per kernel;
3. with two kernels, their mix (:meth:`KernelBlend.mix <xrfm_torch.models.blend.KernelBlend.mix>`,
   no further fit): the target itself;
4. with one kernel, spares in the time the target left: the same tree (or bags) with the other
   kernel of :data:`~xrfm_torch.models.ladder.SPARE_KERNELS`, then its mix with the target;
5. with two kernels, where the time left stops the line above after a quick candidate (a
   *detour*): that quick candidate with the other kernel, then their mix: the blend, in small;
   where the quick candidate saw the raw inputs, before the line if even its estimate (which
   lacks the full candidates' probes) does not fit in the time left;
6. after a quick single tree's detours, while time is left: *draws*, the quick trees again
   with other split samples (``TreeConfig.draw``: the same held-out rows), one at a time, each
   followed by the mix of all quick trees so far (a kernel's draws share its weight).

A kernel's input maps are chosen once, by its first candidate's probe, and its later candidates
(and a quick single tree's detours) grow on them (:func:`~xrfm_torch.models.ladder.grown_maps`):
the same models without the probe's cost. On fits of 2000 to
:data:`~xrfm_torch.models.ladder.QUICK_PROBE_ROWS` rows the quick candidates see the raw inputs
and each kernel's first full candidate probes.

Each candidate is fitted on the same rows from the same generator state, so their honest outputs
(validation rows of a single tree, out-of-fold rows of the bags) cover common rows, on which
their losses are compared (log-loss or mean squared error, :mod:`xrfm_torch.tree.honest`); the
model kept is the candidate of lowest loss (ties: the cheaper), except that a fitted target is
kept unless that candidate beats it by :data:`~xrfm_torch.models.keep.TARGET_MARGIN` paired
standard errors (:func:`~xrfm_torch.models.keep.choose`): a cheaper candidate's edge on a few
hundred honest rows is mostly noise, and a budget that covers the target promises its loss. A
bagged target's fallback tree is left out of that comparison (it is kept only when no bagged
candidate finished), so the bags are compared on all their out-of-fold rows. A candidate starts
only when its cost, estimated from the ones before (:func:`~xrfm_torch.models.ladder.estimate`),
fits in the time left; it runs under an aborting deadline (:mod:`xrfm_torch.numerics.deadline`)
and is dropped if the limit comes first; the first one, and a single tree whose trees do not
split, under a degrading deadline (its leaves stop iterating), so the fit always ends with a
model and a one-leaf tree's iterations so far are not thrown away. Bags whose every bag is one
leaf run under such a deadline too, and start even where their estimate does not fit: cut
short, they are still a model to mix. What was tried, its loss
and seconds are logged, kept in ``trials_`` (saved) and shown by :meth:`Anytime.summary`.
"""

from __future__ import annotations

import logging
import math
import time
from typing import Any, cast

import torch
from torch import Tensor, nn

from xrfm_torch.inputs.input_map import InputTransform
from xrfm_torch.leaf.data import weighted_rows
from xrfm_torch.models.bagging import BaggedTree
from xrfm_torch.models.blend import KernelBlend, compose
from xrfm_torch.models.contract import Model
from xrfm_torch.models.holder import Selector
from xrfm_torch.models.keep import choose
from xrfm_torch.models.ladder import (
    QUICK_LEAF_SIZE,
    QUICK_PROBE_ROWS,
    Rung,
    check_time_limit,
    climb,
    estimate,
    grown_maps,
    kernel_names,
    ladder,
    one_leaf_each,
    one_leaf_tree,
    quick_family,
    quick_kernel,
    quick_tree,
    quick_twin,
    target_parts,
)
from xrfm_torch.models.xrfm_tree import xRFMTree
from xrfm_torch.numerics import deadline
from xrfm_torch.numerics.checks import check_int
from xrfm_torch.numerics.rng import own_generator
from xrfm_torch.tree.grow import Progress

log = logging.getLogger(__name__)


class Anytime(Selector):
    """The best model found within ``time_limit`` seconds (see the module docstring).

    Args:
        model: The target: the model a fit without a limit would make (its settings are
            held). An ``xRFMTree``, a ``BaggedTree`` or a ``KernelBlend`` of either climbs the
            ladder; any other model (one without a :meth:`~Model.recipe`) is the one candidate,
            fitted under a degrading deadline. Default ``xRFMTree()``.
        time_limit: Seconds the fit may take (> 0). The fit ends within 10 % plus a second of
            it, unless the quickest candidate alone takes longer (then it ends with that one,
            its leaves' iterations cut short, and warns).
        quick_leaf_size: The first candidate's ``max_leaf_size``.

    Attributes:
        members: The chosen candidate, fitted (one model).
        chosen_: Its index in :meth:`rungs`.
        trials_: Per rung ``(honest loss, seconds)``, NaN where not fitted (a skipped or dropped
            candidate; seconds of a dropped one are what it used).
        quick_probe_: Whether the quick candidates probed their input maps (the fit had more
            than ``QUICK_PROBE_ROWS`` rows, or too few for any tree to split) or saw the raw
            inputs.
        quick_kernel_: The index of the quick single tree's kernel among the target's
            (:func:`~xrfm_torch.models.ladder.quick_kernel`: it depends on the fit's rows).
    """

    chosen_: Tensor
    trials_: Tensor
    quick_probe_: Tensor
    quick_kernel_: Tensor
    prototype: Model  # the target's settings (Holder._hold_prototype)

    def __init__(
        self,
        model: Model | None = None,
        *,
        time_limit: float = 60.0,
        quick_leaf_size: int = QUICK_LEAF_SIZE,
    ) -> None:
        super().__init__()
        proto = xRFMTree() if model is None else model
        if not isinstance(proto, Model):
            raise TypeError(
                f"model must be a Model (xRFMTree, BaggedTree, KernelBlend, ...), got {type(proto).__name__}"
            )
        limit = check_time_limit(time_limit)
        if limit is None:
            raise ValueError("time_limit must be a finite number of seconds > 0, got None")
        self.time_limit = limit
        self.quick_leaf_size = check_int(quick_leaf_size, "quick_leaf_size", 4)
        self._hold_prototype(proto)
        self.members = nn.ModuleList()
        self.register_buffer("chosen_", torch.tensor(-1))
        self.register_buffer("trials_", torch.zeros(0, 2, dtype=torch.float64))
        self.register_buffer("quick_probe_", torch.tensor(True))
        self.register_buffer("quick_kernel_", torch.tensor(0))
        self.fit_seconds_: float | None = None

    # ---- settings ------------------------------------------------------------------------------
    def rungs(self) -> list[Rung]:
        """The ladder of candidates of this target (:func:`ladder`)."""
        t = target_parts(self.prototype)
        if t is None:  # a kind the ladder cannot vary: the target alone
            return [Rung("target", 0, 1)]
        return ladder(t.tree, t.kernels, t.n_bags, self.quick_leaf_size, int(self.quick_kernel_))

    def _candidate(self, index: int, maps: InputTransform | None = None) -> Model:
        """Rung ``index`` as an unfitted model (a mix: an empty ``KernelBlend``).

        ``maps``: the input maps an earlier rung of its kernel chose (:func:`grown_maps`; for
        a quick tree's detour, its base quick tree's), to grow on instead of probing again.
        """
        t = target_parts(self.prototype)
        if t is None:
            return type(self.prototype).from_config(self.prototype.get_config())
        rungs = self.rungs()
        rung = rungs[index]
        names = kernel_names(t.tree, t.kernels)
        # quick bags keep the quick tree's size (leaves, split sample): small, and measured so
        quick_bag = {**t.bag, "size_fraction": 1.0}
        probe = bool(self.quick_probe_)
        if rung.mixes:  # (a kernel's draws are one kernel of the blend)
            mixed = list(dict.fromkeys(names[rungs[j].kernel] for j in rung.mixes))
            if rung.quick:
                quick = quick_tree(t.tree, self.quick_leaf_size, probe)
                return compose(quick, rung.bags, mixed, quick_bag, t.blend)
            return compose(t.tree, rung.bags, mixed, t.bag, t.blend)
        own = t.kernels is None and rung.kernel == 0  # the target's tree as it is
        one = t.tree if own else t.tree.with_kernel(names[rung.kernel])
        if maps is not None:
            one = one.with_settings(input_transform=maps)
        if not rung.quick:
            return compose(one, rung.bags, bag=t.bag)
        quick = quick_tree(one, self.quick_leaf_size, probe)
        if rung.draw:
            quick = quick.with_settings(draw=rung.draw)
        return compose(quick, rung.bags, bag=quick_bag)

    def get_config(self) -> dict[str, Any]:
        """Constructor arguments as plain data (the target's settings as a nested config)."""
        return {
            "_target_": f"{type(self).__module__}.{type(self).__qualname__}",
            "model": self.prototype.get_config(),
            "time_limit": self.time_limit,
            "quick_leaf_size": self.quick_leaf_size,
        }

    @property
    def fit_time_limit(self) -> float | None:
        """``time_limit``: this fit is limited."""
        return self.time_limit

    @property
    def distributed(self) -> bool:
        """Whether the candidates spread their work over the default process group's ranks."""
        return self.prototype.distributed

    @distributed.setter
    def distributed(self, value: bool) -> None:
        self.prototype.distributed = value

    def summary(self) -> dict[str, Any]:
        """The choice as plain data: every rung's loss and seconds, and the chosen model's summary.

        ``unused_share``: the share of ``time_limit`` the fit left unused (``None`` for a loaded
        model, whose fit time is not saved).
        """
        self._check_fitted()
        rungs = self.rungs()
        trials = [
            {"candidate": r.name, "honest_loss": _num(loss), "seconds": _num(sec)}
            for r, (loss, sec) in zip(rungs, self.trials_.tolist())
        ]
        spent = self.fit_seconds_
        return {
            "time_limit": self.time_limit,
            "fit_seconds": spent,
            "unused_share": None if spent is None else max(0.0, 1 - spent / self.time_limit),
            "chosen": rungs[int(self.chosen_)].name,
            "trials": trials,
            "n_leaves": self.n_leaves,
            "model": self.chosen().summary(),
        }

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
    ) -> Anytime:
        """Fit the ladder's candidates while the time limit lasts; keep the best (module docstring).

        Arguments as :meth:`xRFMTree.fit`. Rows of weight 0 are left out first (no candidate
        would learn from them), so that every candidate's honest rows are known.
        """
        start = time.perf_counter()
        # an enclosing limit (the estimators': their reading of the table counts) may end earlier
        end = start + min(self.time_limit, deadline.time_left())
        generator = own_generator(generator)
        state = generator.get_state()
        X, y, sample_weight = _positive(X, y, sample_weight, "sample_weight")
        if X_val is not None and y_val is not None:
            X_val, y_val, val_sample_weight = _positive(
                X_val, y_val, val_sample_weight, "val_sample_weight"
            )
        n_rows = len(X) + (0 if X_val is None else len(X_val))
        # where no tree splits, the quick candidate is the full one (its twin, below) and probes
        # for it; other small fits: the quick ones see the raw inputs, the full ones probe
        unsplit, small = self._one_leaf(n_rows), n_rows <= QUICK_PROBE_ROWS
        probe = unsplit or not small
        self.quick_probe_ = torch.tensor(probe)
        t = target_parts(self.prototype)
        first = 0 if t is None else quick_kernel(t.tree, t.kernels, t.n_bags, small)
        self.quick_kernel_ = torch.tensor(first)
        rungs = self.rungs()
        names = [] if t is None else kernel_names(t.tree, t.kernels)
        fitted: dict[int, Model] = {}
        seconds = [math.nan] * len(rungs)
        # what each rung took or would have taken alone: with the input-map probe it reused
        alone = [math.nan] * len(rungs)
        probed = [0.0] * len(rungs)  # the input-map probe's seconds within each of ``alone``
        # per kernel index, the first rung's chosen maps and the seconds its probe took
        grown: dict[int, tuple[InputTransform, float]] = {}

        def attempt(i: int) -> str | None:
            """Fit rung ``i`` (or take its twin's or mix its parts); why to stop, or ``None``."""
            rung, left = rungs[i], end - time.perf_counter()
            if unsplit and rung.fallback:  # each bag is one leaf too: the bags come first
                return None
            twin = quick_twin(rungs, i, fitted) if unsplit else None
            if twin is not None:  # the same model as the quick one: its fit, its seconds
                fitted[i], seconds[i], alone[i] = fitted[twin], seconds[twin], alone[twin]
                probed[i] = probed[twin]
                return None
            if rung.mixes:
                if all(j in fitted for j in rung.mixes):
                    blend = cast(KernelBlend, self._candidate(i))
                    where = [blend.kernels.index(names[rungs[j].kernel]) for j in rung.mixes]
                    fitted[i] = blend.mix([cast(Any, fitted[j]) for j in rung.mixes], where)
                    seconds[i] = sum(seconds[j] for j in rung.mixes)
                return None
            if rung.draw and one_leaf_each(fitted[first_draw(i)]):
                return "skipped"  # a tree of one leaf: every draw of it is the same model
            # a quick tree's detour grows on its base rung's maps: it is what buys the blend
            # where time is short, and the probe is most of a quick tree (not of bags)
            key = rung.kernel
            if key not in grown and rung.detour is not None and rung.bags == 1 and probe:
                key = rungs[rung.detour].kernel
            # bags without validation rows hold them out for their probe from the bags'
            # generator, so growing them on given maps would change their folds: they probe
            shares = key in grown and (rung.bags == 1 or X_val is not None)
            reused = grown[key][1] if shares else 0.0
            # as if alone, less the probe it skips
            # (a draw's estimate is its kernel's first tree already without a probe)
            cost = estimate(rung, rungs, alone, probed, not probe) - (0.0 if rung.draw else reused)
            # bags of one leaf each stop iterating at the limit (below): cut short, they are
            # still a model to mix, where skipped the time left buys nothing
            stretch = unsplit and rung.bags > 1 and left > 0
            if fitted and cost > left:
                if not stretch:
                    log.info("anytime: %s skipped (about %.1fs, %.1fs left)", rung.name, cost, left)
                    return "skipped"
                log.info("anytime: %s started anyway (about %.1fs, %.1fs left): one leaf a bag, "
                         "its leaves stop at the limit", rung.name, cost, left)  # fmt: skip
            model = self._candidate(i, grown[key][0] if shares else None)
            draws = torch.Generator()
            draws.set_state(state)
            began = time.perf_counter()
            # a candidate of one leaf per tree stops iterating at the limit rather than being
            # dropped: its iterations so far are a model, and the next step's estimate bounds it
            abort = bool(fitted) and not (stretch or one_leaf_tree(model, len(X)))
            try:
                with deadline.within(left, abort=abort):
                    model.fit(X, y, X_val, y_val, sample_weight=sample_weight,
                              val_sample_weight=val_sample_weight, generator=draws,
                              progress=progress)  # fmt: skip
            except deadline.TimeLimitError:
                seconds[i] = time.perf_counter() - began
                log.info("anytime: %s dropped at the time limit after %.1fs", rung.name, seconds[i])
                return "dropped"
            seconds[i] = time.perf_counter() - began
            alone[i] = seconds[i] + reused
            probed[i] = reused or model.probe_seconds_
            mapped = probe or not rung.quick  # (a quick rung on the raw inputs chose nothing)
            if mapped and rung.kernel not in grown and (own := grown_maps(model)) is not None:
                grown[rung.kernel] = own
            fitted[i] = model
            return None

        def first_draw(i: int) -> int:
            """The quick single tree of rung ``i``'s kernel that its draws repeat."""
            family = quick_family(rungs, cast(int, rungs[i].detour))
            return next(j for j in family if rungs[j].kernel == rungs[i].kernel)

        def blend_first(i: int, rest: list[int]) -> bool:
            # on raw inputs the quick tree's seconds lack the probe each full candidate adds:
            # where even that low estimate of the line does not fit, the small blend comes first
            if probe or rungs[i].fallback:
                return False
            cost = sum(estimate(rungs[j], rungs, alone, probed, not probe) for j in rest)
            if cost <= end - time.perf_counter():
                return False
            log.info("anytime: the small blend first (the line left about %.1fs)", cost)
            return True

        climb(rungs, attempt, blend_first, fitted)
        losses = self._choose(rungs, fitted)
        self.trials_ = torch.tensor(
            [[losses.get(i, math.nan), s] for i, s in enumerate(seconds)], dtype=torch.float64
        )
        self.fit_seconds_ = time.perf_counter() - start
        over = self.fit_seconds_ - self.time_limit
        if over > 0.1 * self.time_limit + 1.0:
            log.warning("anytime: the quickest candidate alone took %.1fs of a %.1fs time limit",
                        self.fit_seconds_, self.time_limit)  # fmt: skip
        log.info(
            "anytime: kept %s (honest %s %s) in %.1fs of %.1fs",
            rungs[int(self.chosen_)].name,
            "log-loss" if self.task == "classification" else "MSE",
            ", ".join(f"{rungs[i].name} {v:.4g}" for i, v in losses.items()),
            self.fit_seconds_,
            self.time_limit,
        )
        return self

    def _one_leaf(self, n_rows: int) -> bool:
        """Whether no tree of a quick or a full candidate splits a fit of ``n_rows`` rows."""
        t = target_parts(self.prototype)
        if t is None:
            return False
        full = t.tree.config.max_leaf_size
        if t.n_bags > 1:  # a bag's trees are a share of the tree's size
            bags = cast(BaggedTree, compose(t.tree, t.n_bags, bag=t.bag))
            full = int(full * bags.bag_size_fraction)
        return n_rows <= min(self.quick_leaf_size, full)

    def _choose(self, rungs: list[Rung], fitted: dict[int, Model]) -> dict[int, float]:
        """Keep the candidate :func:`~xrfm_torch.models.keep.choose` picks; each one's loss."""
        order = sorted(fitted)
        if len(rungs) == 1:  # a target the ladder cannot vary: nothing to compare
            self.members = nn.ModuleList([fitted[0]])
            self.chosen_ = torch.tensor(0)
            try:  # its honest outputs, where its fit keeps them (the contract's answer)
                self._honest = fitted[0].honest_outputs()
            except RuntimeError:
                self._honest = None
            return {}
        honest = {i: fitted[i].honest_outputs() for i in order}
        best, losses = choose(rungs, honest, self.task)
        self.members = nn.ModuleList([fitted[best]])
        self.chosen_ = torch.tensor(best)
        self._honest = fitted[best].honest_outputs()
        return losses

    # ---- loading into a fresh module (Holder) --------------------------------------------------
    def _empty_members(self, state_dict: dict[str, Any], prefix: str) -> list[Model] | None:
        # the saved choice says which empty candidate to build; it loads its own keys
        index = state_dict.get(prefix + "chosen_")
        if not (isinstance(index, Tensor) and int(index) >= 0):
            return None
        first = state_dict.get(prefix + "quick_kernel_")
        if isinstance(first, Tensor):  # the ladder as it was fitted
            self.quick_kernel_ = first.clone()
        n = len(self.rungs())
        if not int(index) < n:
            raise ValueError(f"the state chose candidate {int(index)}, but this ladder has {n}")
        trials = state_dict.get(prefix + "trials_")
        if isinstance(trials, Tensor):
            self.trials_ = torch.zeros_like(trials)
        probe = state_dict.get(prefix + "quick_probe_")
        if isinstance(probe, Tensor):  # the quick candidates are built as they were fitted
            self.quick_probe_ = probe.clone()
        return [self._candidate(int(index))]

    def _upgrade_state(self, state_dict: dict[str, Any], prefix: str) -> None:
        # a state saved before the small-fit rule (0.15): its quick candidates probed
        state_dict.setdefault(prefix + "quick_probe_", torch.tensor(True))
        # one saved before the quick kernel depended on the rows (0.x): the first kernel's
        state_dict.setdefault(prefix + "quick_kernel_", torch.tensor(0))


def _num(v: float) -> float | None:
    return None if math.isnan(v) else v


def _positive(
    X: Tensor, y: Tensor, w: Tensor | None, name: str
) -> tuple[Tensor, Tensor, Tensor | None]:
    """The rows of positive weight (:func:`~xrfm_torch.leaf.data.weighted_rows`; raw weights).

    Inputs that are not yet tensors pass as they are: the candidates convert and check them.
    """
    if w is None or not isinstance(X, Tensor):
        return X, y, w
    return weighted_rows(X, y, w, name)
