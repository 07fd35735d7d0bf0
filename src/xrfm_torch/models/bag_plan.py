"""How cross-fitted bags divide their rows and share their choices.

The folds, each bag's size and the plan the later bags of a
:class:`~xrfm_torch.models.bagging.BaggedTree` follow.

With ``shared_plan`` (the default; from ``PLAN_MIN_ROWS`` pooled rows on) the later bags follow
the first bag's plan (:func:`first_bag_plan`): they iterate no further than the last iteration any
of its leaves kept, with its feature-matrix shape and exponents and without the warm-up, instead
of searching all of these again. The bags see 3/4 of each other's rows, and their searches agree
(digits: all ten leaves of a blend's bags chose the same exponent, ridge and shape); the searches
were most of a small leaf's solves. The plan passes on a few numbers; the later bags do not start
from the first bag's learned ``M``: the first bag trained on every later bag's validation fold, so
such a start makes their validation errors and out-of-fold outputs optimistic (see
:func:`first_bag_plan`).
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.models.xrfm_tree import xRFMTree
from xrfm_torch.tree.config import TreeConfig, row_share
from xrfm_torch.tree.plan import leaf_plan
from xrfm_torch.tree.splits import AGOPSplit

#: ``shared_plan`` applies from this many pooled rows on. Below it the bags' own searches on their
#: small folds differ, and that difference is what their average gains from (the fits take well
#: under a second there, so following saves nothing worth having).
PLAN_MIN_ROWS = 1000

#: ``size_fraction=None`` of a classifier's bags: each bag's trees split down to this share of
#: ``max_leaf_size`` and fit their split models on this share of ``AGOPSplit.sample_size``. A bag
#: is one member of an average, like a tree of a set of maps (``TreeConfig.set_leaf_fraction``),
#: and a leaf costs ``O(L^3)``: half the size costs a bag a third of its time at a log-loss
#: within seed noise. A single model keeps its size (no average to make up for smaller leaves),
#: and so do regression bags (regression trees want large leaves).
CLASSIFICATION_BAG_SIZE_FRACTION = 0.5


def cross_folds(n: int, k: int, generator: torch.Generator, labels: Tensor | None = None) -> Tensor:
    """Seeded fold index in ``[0, k)`` for each of ``n`` rows, fold sizes within one row.

    With ``labels`` (n,) the folds are stratified: rows are shuffled, ordered by label (stably)
    and dealt out in turn, so each class spreads over the folds as evenly as its count allows
    (a class of ``c >= 2`` rows reaches at least two folds, hence every bag's training rows).

    Returns:
        Long tensor (n,) on the CPU.
    """
    order = torch.randperm(n, generator=generator)
    if labels is not None:
        by_label = torch.sort(labels.detach().cpu()[order], stable=True).indices
        order = order[by_label]
    folds = torch.empty(n, dtype=torch.long)
    folds[order] = torch.arange(n) % k
    return folds


def first_bag_plan(bag: xRFMTree) -> LeafConfig | None:
    """The leaf settings of the later bags: :func:`~xrfm_torch.tree.plan.leaf_plan` of the first.

    The later bags iterate up to the first bag's leaves' last kept iteration, with their
    majority ``M`` shape and exponents, without the warm-up and with patience 2, each leaf from
    the identity. Not from the first bag's learned ``M`` (as a map's later trees start from
    their first tree): the first bag trained on every later bag's validation fold, so that
    start makes the later bags' validation errors, and the out-of-fold outputs that weigh the
    blend and fit the calibration, optimistic.
    """
    return leaf_plan(bag.leaves(), bag.config.leaf, float(bag.kernel.q))


def bag_settings(config: TreeConfig, size_fraction: float) -> TreeConfig:
    """A bag's tree settings: one tree per input map, ``size_fraction`` of the tree's size.

    A bag splits down to ``size_fraction`` of ``max_leaf_size`` and fits its AGOP split models on
    that share of their ``sample_size`` (a member of an average: smaller leaves, split models on
    fewer rows); ``n_trees=None`` becomes 1.
    """
    if config.n_trees is None:
        # the bags already average several trees; a second tree per map in each bag cost
        # 1.3-2.1x the fit for log-loss within one seed sd (pol, house_16H, california;
        # docs/design-use.md, "Where a default fit's time goes")
        config = config.replace(n_trees=1)
    if size_fraction < 1.0:
        rule = config.split_rule
        if isinstance(rule, AGOPSplit):
            rule = replace(rule, sample_size=row_share(rule.sample_size, size_fraction))
        size = row_share(config.max_leaf_size, size_fraction)
        config = config.replace(max_leaf_size=size, split_rule=rule)
    return config
