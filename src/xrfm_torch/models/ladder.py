"""The candidates of an anytime fit: the ladder, the quick tree, cost estimates.

What :class:`~xrfm_torch.models.anytime.Anytime` fits, in which order and at what expected
cost (:mod:`~xrfm_torch.models.keep` says which one it keeps); the class itself holds the fit.
docs/design-use.md, "A time budget: the anytime fit", says why each choice.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Container, Mapping
from dataclasses import dataclass
from typing import Any, cast

from xrfm_torch.inputs.choice import PROBE_ROWS, PROBE_VAL_ROWS
from xrfm_torch.inputs.input_map import InputTransform
from xrfm_torch.kernels import KERNELS
from xrfm_torch.models.bagging import BaggedTree
from xrfm_torch.models.contract import Model, Recipe
from xrfm_torch.models.xrfm_tree import xRFMTree
from xrfm_torch.tree.splits import with_sample_at_most

#: The first candidate's largest leaf (``quick_leaf_size``; measured in docs/design-use.md).
QUICK_LEAF_SIZE = 2000
#: The quick candidate's split models fit on at most this many rows (:func:`quick_tree`).
QUICK_SPLIT_ROWS = 1000
#: Fits of more rows than this (training plus validation) give the quick candidates an input-map
#: probe; smaller ones that the quick tree splits give them the raw inputs (:func:`quick_tree`).
#: It is the most rows a probe reads: below it the probe costs about what the quick tree does.
QUICK_PROBE_ROWS = PROBE_ROWS + PROBE_VAL_ROWS
#: The first full tree's cost as a multiple of the quick tree's, before either was timed on the
#: table (leaves of up to 5x the rows, two trees per map for classification).
TREE_COST = 3.0
#: The same where the quick tree saw the raw inputs (fits of at most ``QUICK_PROBE_ROWS`` rows):
#: the full one adds the input-map probe the quick one skipped (on the design half's budget fits
#: where both were timed, a median 5.4x, 2.2-6.3x).
RAW_TREE_COST = 5.0
#: The kernels a single-kernel target's ladder goes on with once the target is fitted and time
#: is left: the same tree (or bags) with each other kernel, then their mix with the target.
SPARE_KERNELS = ("laplace", "gaussian")
#: Draws of each kernel's quick single tree a blended target's fit may average
#: (:attr:`Rung.draw`): where the main line stops with time left, the quick trees again with
#: other draws, mixed with those before (:func:`ladder`).
QUICK_DRAWS = 4
#: The kernel of a blended target's quick single tree (a single-tree target's quick candidate, a
#: bagged one's fallback) on fits of at most :data:`QUICK_PROBE_ROWS` rows (:func:`quick_kernel`).
SMALL_QUICK_KERNEL = "gaussian"


@dataclass(frozen=True)
class Rung:
    """One candidate of the ladder.

    Attributes:
        name: ``"quick laplace"``, ``"tree gaussian"``, ``"mix trees"``, ``"bags laplace"``, ...
        kernel: Index into the kernels (``-1`` for a mix).
        bags: ``n_bags`` of the candidate (1: a single tree).
        quick: The small-leaf first candidate.
        mixes: For a mix, the indices of the rungs it blends; else empty.
        fallback: Not of the target's kind (the quick single tree of a bagged target): kept
            only when no candidate of the target's kind finished.
        spare: After the target: another kernel, or its mix with the target, fitted only with
            the time the target left.
        detour: For a quick candidate of a further kernel, or the mix of the quick candidates,
            the index of the quick rung of the first kernel it goes with; fitted only when a
            candidate of the ladder's main line does not fit in the time left. Else ``None``.
        draw: For a further draw of a quick single tree (``TreeConfig.draw``; a detour of its
            quick rung), its number (1, 2, ...), and for the mix of the draws so far the
            number of the last; fitted only after the detours, while time is left. Else 0.
    """

    name: str
    kernel: int
    bags: int
    quick: bool = False
    mixes: tuple[int, ...] = ()
    fallback: bool = False
    spare: bool = False
    detour: int | None = None
    draw: int = 0


#: What an anytime fit aims at: the target's :class:`~xrfm_torch.models.contract.Recipe` (its
#: tree, kernels and bags, and their own settings, so each candidate is built as the target is).
Target = Recipe


def target_parts(model: Model) -> Target | None:
    """The :class:`Target` of an anytime fit of ``model`` (its :meth:`Model.recipe`).

    ``None`` where ``model`` is not made of one tree's bags and kernels (a kind the ladder cannot
    vary): its anytime fit is the model itself, cut short at the limit.
    """
    return model.recipe()


def quick_tree(tree: xRFMTree, leaf_size: int, probe: bool = True) -> xRFMTree:
    """``tree`` made quick: small leaves, one tree per map, split models on fewer rows.

    Leaves of at most ``leaf_size`` rows, one tree per input map, and an ``AGOPSplit``'s models
    on at most ``QUICK_SPLIT_ROWS`` rows. Small leaves make the leaves cheap (a solve grows as its
    rows cubed) and the tree deeper, so the split models then dominate; on 1000 rows they cost
    about a third, at the same test loss. ``probe=False``: where ``tree`` would probe its input
    maps (``input_transform="auto"``), the quick tree sees the raw inputs (``"identity"``), as
    on fits of at most :data:`QUICK_PROBE_ROWS` rows that it splits: there the probe costs about
    what the quick tree does, and where a quick candidate is all a budget buys, a probe cut
    short by the limit left too little for the tree. (Where it does not split, the quick tree
    is the full one and probes for it.)
    """
    split = with_sample_at_most(tree.config.split_rule, QUICK_SPLIT_ROWS)
    leaf = min(tree.config.max_leaf_size, leaf_size)
    maps = tree.config.input_transform
    if maps == "auto" and not probe:
        maps = "identity"
    return tree.with_settings(max_leaf_size=leaf, n_trees=1, split_rule=split, input_transform=maps)


def quick_kernel(tree: xRFMTree, kernels: list[str] | None, n_bags: int, small: bool) -> int:
    """The index (into :func:`kernel_names`) of the kernel of the ladder's quick single tree.

    :data:`SMALL_QUICK_KERNEL` for a target that blends it with other kernels, on a ``small``
    fit (of at most :data:`QUICK_PROBE_ROWS` rows, training plus validation); else the first
    kernel (0). The quick single tree is the quick candidate of a single-tree target and the
    fallback of a bagged one (whose quick bags keep the first kernel, :func:`ladder`). On such
    fits it is often all a budget buys, and there its Gaussian tree had the lower test loss on
    more design tables than its Laplace one; on larger fits (where the quick trees probe their
    input maps) the Laplace tree led, and so did the Laplace quick bags on small fits.
    """
    names = kernel_names(tree, kernels)
    if kernels and small and SMALL_QUICK_KERNEL in names:
        return names.index(SMALL_QUICK_KERNEL)
    return 0


def ladder(
    tree: xRFMTree, kernels: list[str] | None, n_bags: int, quick_leaf: int, first: int = 0
) -> list[Rung]:
    """The candidates of an anytime fit, cheapest first: up to the target model, then spares.

    The candidates are of the target's kind (single trees, or ``n_bags`` cross-fitted bags), so
    their honest losses are alike; a bagged target starts with one quick single tree as a
    fallback, kept only when no bagged candidate finished in time. A single tree's validation
    rows also chose its iterations, ridge and calibration, and on small tables its loss there is
    far below its bags' out-of-fold loss on the same rows (breast_cancer: 0.003 against
    0.03-0.05, test 0.31 against 0.12), so a comparison across kinds would pick the overfitted
    one. The quick rungs are left out where they would be the target's tree itself; the mix
    where there is one kernel. A target of one kernel is followed by the :data:`SPARE_KERNELS`
    it lacks and their mix with it (``Rung.kernel`` indexes :func:`kernel_names`).

    A target that blends kernels ends with detours (:attr:`Rung.detour`): for each quick rung,
    the same quick candidate with the further kernels and their mix with it. A quick tree's
    detours grow on its input maps (the anytime fit), so they cost it less its probe; where the
    budget stops the main line after a quick candidate, it buys the blend in small form instead
    of nothing. They come last so that the rungs before them keep their indices. A quick single
    tree's detours end with its draws (:attr:`Rung.draw`): each kernel's quick tree with
    ``QUICK_DRAWS - 1`` further draws, one at a time, each followed by the mix of every quick
    single tree so far (a kernel's draws share its weight): the same blend in small, averaged
    over more split samples, in time the main line cannot use.

    ``first``: the index of the quick single tree's kernel (:func:`quick_kernel`), a single-tree
    target's quick candidate or a bagged target's fallback; quick bags take the first kernel.
    Their detours take the other kernels. The full candidates keep the kernels' order.
    """
    names = kernel_names(tree, kernels)
    spare = not kernels  # one kernel: the names after the first (and their mix) are spares
    what = "tree" if n_bags == 1 else "bags"
    if not 0 <= first < len(names):
        raise ValueError(f"first must index one of the kernels {names}, got {first}")
    rungs: list[Rung] = []
    if n_bags > 1:
        rungs.append(Rung(f"quick tree {names[first]}", first, 1, quick=True, fallback=True))
    if tree.config.max_leaf_size > quick_leaf or (tree.config.n_trees or 1) > 1:
        own = first if n_bags == 1 else 0  # quick bags: the first kernel's
        rungs.append(Rung(f"quick {what} {names[own]}", own, n_bags, quick=True))
    full = len(rungs)  # the first full rung
    rungs.extend(Rung(f"{what} {k}", i, n_bags, spare=spare and i > 0) for i, k in enumerate(names))
    if len(names) > 1:
        mixed = tuple(range(full, len(rungs)))
        rungs.append(Rung(f"mix {what}", -1, n_bags, mixes=mixed, spare=spare))
    if spare:
        return rungs
    for base in [j for j, r in enumerate(rungs) if r.quick]:
        q = rungs[base]
        kind, start = "tree" if q.bags == 1 else "bags", len(rungs)
        rungs.extend(
            Rung(f"quick {kind} {k}", i, q.bags, quick=True, fallback=q.fallback, detour=base)
            for i, k in enumerate(names)
            if i != q.kernel
        )
        mixed = (base, *range(start, len(rungs)))
        mix = Rung(f"mix quick {kind}", -1, q.bags, True, mixed, q.fallback, detour=base)
        rungs.append(mix)
    singles = [j for j, r in enumerate(rungs) if r.quick and r.bags == 1 and r.detour is None]
    for base in singles:
        family = quick_family(rungs, base)
        drawn: list[int] = []  # the draws so far, each mixed with the family and those before
        for d in range(1, QUICK_DRAWS):
            for j in family:
                r = rungs[j]
                drawn.append(len(rungs))
                rungs.append(Rung(f"quick tree {names[r.kernel]} draw {d + 1}", r.kernel, 1, True,
                                  fallback=r.fallback, detour=base, draw=d))  # fmt: skip
                mixed = (*family, *drawn)
                rungs.append(Rung(f"mix {len(mixed)} quick trees", -1, 1, True, mixed,
                                  r.fallback, detour=base, draw=d))  # fmt: skip
    return rungs


def target_index(rungs: list[Rung]) -> int:
    """The index of the target itself: the last rung of the main line that is not a spare.

    (The mix of the kernels of a blended target, else the target's tree or bags.)
    """
    return max(i for i, r in enumerate(rungs) if r.detour is None and not r.spare)


def detours(rungs: list[Rung], base: int | None, draws: bool = False) -> list[int]:
    """The indices of the rungs whose :attr:`Rung.detour` is ``base`` (``None``: the main line).

    ``draws``: those of its further draws (:attr:`Rung.draw`) instead.
    """
    return [i for i, r in enumerate(rungs) if r.detour == base and bool(r.draw) == draws]


def quick_family(rungs: list[Rung], base: int) -> list[int]:
    """The quick single tree ``base`` and its detours' trees: one quick tree per kernel."""
    return [base, *(j for j in detours(rungs, base) if not rungs[j].mixes)]


def climb(
    rungs: list[Rung],
    attempt: Callable[[int], str | None],
    blend_first: Callable[[int, list[int]], bool],
    fitted: Container[int],
) -> None:
    """Try the rungs in the anytime fit's order: the main line, and the detours where it stops.

    Args:
        rungs: The ladder.
        attempt: Fits rung ``i`` (or skips it); returns why the line stops (``"skipped"``,
            ``"dropped"``) or ``None``.
        blend_first: Whether the detours of the quick rung ``i``, just fitted, go before the
            rest of the main line (the indices given).
        fitted: The rungs fitted so far (read after each attempt).

    Where the main line stops on a skipped rung, the last fitted quick rung's detours follow
    (the blend in small), unless they went first, and then, for a quick single tree whose
    detours were all fitted, its draws, until one stops.
    """
    main, taken = detours(rungs, None), set[int]()
    stop: str | None = None

    def detour(base: int, its: list[int]) -> None:
        taken.add(base)
        for i in its:
            if attempt(i):
                break

    for k, i in enumerate(main):
        if stop := attempt(i):
            break
        if rungs[i].quick and (its := detours(rungs, i)) and blend_first(i, main[k + 1 :]):
            detour(i, its)
    if stop == "skipped":
        line = [j for j in main if j in fitted and rungs[j].quick]  # (not a detour's)
        base = max(line, default=-1)
        its = detours(rungs, base) if base >= 0 else []
        if its and base not in taken:
            detour(base, its)
        if its and all(i in fitted for i in its):
            detour(base, detours(rungs, base, draws=True))


def quick_twin(rungs: list[Rung], index: int, fitted: Mapping[int, Model]) -> int | None:
    """The fitted quick rung that rung ``index`` equals on a fit too small to split, or ``None``.

    ``fitted``: the rungs fitted so far, by index.

    Where no tree of either can split (every fit row fits one leaf of both), the quick candidate
    and the full candidate of the same kernel and bags are the same model, bit for bit (the
    same draws, one leaf, and a one-leaf tree's count of trees stops at one), so the ladder
    takes the quick one's fit for the full one's instead of fitting it again. Only a quick fit
    whose every tree is one leaf stands in: a set of input maps grows trees of a share of the
    leaf size (``TreeConfig.set_leaf_fraction``), which the quick tree's smaller leaves may split
    where the full tree's do not.
    """
    rung = rungs[index]
    if rung.quick or rung.mixes:
        return None
    for j, model in fitted.items():
        twin = rungs[j]
        if (
            twin.quick
            and not twin.fallback
            and (twin.kernel, twin.bags) == (rung.kernel, rung.bags)
            and one_leaf_each(model)
        ):
            return j
    return None


def one_leaf_each(model: Model) -> bool:
    """Whether every tree of ``model`` (a tree, or its bags) is a single leaf."""
    trees = list(model.members) if isinstance(model, BaggedTree) else [model]
    return all(isinstance(t, xRFMTree) and t.n_leaves == len(t.trees) for t in trees)


def kernel_names(tree: xRFMTree, kernels: list[str] | None) -> list[str]:
    """The kernels of a ladder's rungs: the target's, then for a single kernel the spare ones."""
    if kernels:
        return list(kernels)
    own = kernel_name(tree)
    return [own, *(k for k in SPARE_KERNELS if k != own)]


def check_time_limit(time_limit: Any) -> float | None:
    """``time_limit`` as float seconds, or ``None`` (no limit).

    Raises:
        ValueError: It is not ``None`` nor a finite number > 0 (the message names it).
    """
    if time_limit is None:
        return None
    if isinstance(time_limit, bool) or not isinstance(time_limit, (int, float)):
        try:  # numpy scalars and the like
            time_limit = float(time_limit.__float__())
        except (AttributeError, TypeError, ValueError):
            raise ValueError(
                f"time_limit must be a number of seconds or None, got {time_limit!r}"
            ) from None
    if not (math.isfinite(time_limit) and time_limit > 0):
        raise ValueError(f"time_limit must be a finite number of seconds > 0, got {time_limit!r}")
    return float(time_limit)


def kernel_name(tree: xRFMTree) -> str:
    """The registered name of ``tree``'s kernel (its class name if it has none)."""
    kind = type(tree.kernel)
    return next((n for n, c in KERNELS.items() if c is kind), kind.__name__)


def estimate(
    rung: Rung,
    rungs: list[Rung],
    seconds: list[float],
    probes: list[float] | None = None,
    raw: bool = False,
) -> float:
    """Seconds ``rung`` should take, from the measured ``seconds`` of the rungs before it.

    ``seconds``: what each rung took or would have taken alone, with its input-map probe (NaN
    where not fitted); ``probes``: the probe's seconds within each (none if not given). The
    anytime fit subtracts the probe a rung reuses. A mix costs nothing; a further kernel what
    the candidate of the same kind (quick or not, bags) took with another kernel; the first full
    candidate ``TREE_COST`` times the quick one (``RAW_TREE_COST`` where the quick candidates saw
    the raw inputs, ``raw``: their seconds lack the probe a full candidate adds); the first bags
    ``n_bags`` quick single trees without their probe, and the probe once (the bags grow on one
    choice of maps); a further draw what its kernel's first quick single tree took without a
    probe (draws grow on its maps; infinite where none was fitted).
    """
    if rung.mixes:
        return 0.0
    probes = probes or [0.0] * len(rungs)
    done = [(r, s, p) for r, s, p in zip(rungs, seconds, probes) if math.isfinite(s)]
    done = [(r, s, p) for r, s, p in done if not r.mixes and not r.draw]
    if rung.draw:
        first = [s - p for r, s, p in done if r.quick and r.bags == 1 and r.kernel == rung.kernel]
        return first[0] if first else math.inf
    kind = (rung.quick, rung.bags, rung.fallback)
    same = [
        s for r, s, _ in done if (r.quick, r.bags, r.fallback) == kind and r.kernel != rung.kernel
    ]
    if same:
        return same[0]
    full = [s for r, s, _ in done if not r.quick and not r.fallback]
    if full:
        return full[0]
    quick = [s for r, s, _ in done if r.quick and not r.fallback]
    if quick:
        return (RAW_TREE_COST if raw else TREE_COST) * quick[0]
    single = [(s, p) for r, s, p in done if r.fallback]
    if not single:
        return 0.0
    tree, probe = single[0]
    return probe + rung.bags * (tree - probe)


def grown_maps(model: Model) -> tuple[InputTransform, float] | None:
    """The input maps a fitted candidate grew on, and the seconds its probe took.

    The choice depends on the kernel, the leaf settings and the rows, which an anytime fit's
    rungs of one kernel share, and the probe draws from its own generator; so the later rungs
    of that kernel grow on it as given: the same models without the probe's cost (most of a
    quick tree's on a few thousand rows). ``None`` for a model of another kind.
    """
    if isinstance(model, BaggedTree):
        tree = cast(xRFMTree, model.members[0])
    elif isinstance(model, xRFMTree):
        tree = model
    else:
        return None
    names = list(dict.fromkeys(tree.input_map.names))  # (a map grows n_trees trees)
    return (names[0] if len(names) == 1 else tuple(names)), model.probe_seconds_


def one_leaf_tree(model: Model, n_rows: int) -> bool:
    """Whether ``model`` is one tree (per input map) that ``n_rows`` training rows do not split.

    Such a candidate's fit is a probe and one leaf's iterations, each a model: the anytime fit
    lets it stop iterating at the limit instead of dropping it.
    """
    return isinstance(model, xRFMTree) and n_rows <= model.config.max_leaf_size
