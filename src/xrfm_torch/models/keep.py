"""Which fitted candidate an anytime fit keeps: its honest losses on common rows.

:func:`choose` compares the candidates :mod:`~xrfm_torch.models.ladder` lists on the rows they
all scored (:func:`common_rows`) and keeps the target unless one clearly beats it;
docs/design-use.md, "The target unless clearly beaten", says why.
"""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

from xrfm_torch.leaf.criteria import relative
from xrfm_torch.leaf.selection import paired_win
from xrfm_torch.models.ladder import Rung, target_index
from xrfm_torch.tree.honest import HonestOutputs, mean_loss, row_losses

#: Paired standard errors by which a candidate's honest loss must beat the target's, where the
#: target was fitted, to be kept instead (:func:`choose`).
TARGET_MARGIN = 2.0


def choose(
    rungs: list[Rung], honest: dict[int, HonestOutputs], task: str, margin: float = TARGET_MARGIN
) -> tuple[int, dict[int, float]]:
    """The fitted rung to keep, and each fitted rung's honest loss (on the rows it is judged on).

    Args:
        rungs: The ladder.
        honest: Per fitted rung, its honest outputs (:meth:`Model.honest_outputs`).
        task: ``"classification"`` (log-loss) or ``"regression"`` (mean squared error).
        margin: Paired standard errors a candidate must win by to replace a fitted target.

    The target's kind comes first: a fallback (a single tree of a bagged target) is kept only
    when nothing else finished. So the candidates that can be kept are compared on the rows
    *they* share (:func:`common_rows`; the bags' out-of-fold rows), not narrowed to a
    fallback's validation rows (about a tenth of them); a fallback's loss is its own, on its own
    rows, as is a further draw's (:attr:`Rung.draw`), which is kept only within its mixes. The
    candidate of lowest loss is kept (ties: the cheaper), except that a fitted target
    (:func:`target_index`) is replaced only by one whose per-row losses beat its own by
    ``margin`` paired standard errors (:func:`~xrfm_torch.leaf.selection.paired_win`; weighted
    rows scaled so that their mean is the weighted mean): a cheaper candidate's edge on a few
    hundred honest rows is mostly noise, and a budget that covers the target promises its loss.
    """
    order = sorted(honest)
    # a further draw alone is a part of its mix, not a candidate: its edge is its split sample's
    # luck on the validation rows (house_16H, 3x CatBoost's time: kept alone, RMSE +4.9 %)
    whole = [i for i in order if not (rungs[i].draw and not rungs[i].mixes)]
    pool = [i for i in whole if not rungs[i].fallback] or whole
    losses: dict[int, float] = {}
    per_row: dict[int, Tensor] = {}
    for group in (pool, [i for i in order if i not in pool]):
        if not group:
            continue
        for i, p in zip(group, common_rows([honest[i] for i in group])):
            rows = row_losses(p.outputs.double(), p.targets, task)
            losses[i] = float(mean_loss(rows, p.weights))
            if group is pool:  # (a fallback's rows only report its loss)
                w = p.weights
                per_row[i] = rows if w is None else rows * relative(w.double())
    best = min(pool, key=lambda i: (losses[i], i))
    target = target_index(rungs)
    if target in pool and best != target:  # a fitted target: kept unless clearly beaten
        best = best if paired_win(per_row[best], per_row[target], margin) else target
    return best, dict(sorted(losses.items()))


def common_rows(parts: list[HonestOutputs]) -> list[HonestOutputs]:
    """Each model's honest outputs restricted to the rows all of them scored, in one order.

    Raises:
        ValueError: A model's rows are unknown, or the models scored no row in common.
    """
    if any(p.rows is None for p in parts):
        raise ValueError("an anytime fit needs honest outputs with known rows")
    rows = [cast(Tensor, p.rows).cpu() for p in parts]
    size = int(max(int(r.max()) for r in rows)) + 1
    shared = torch.ones(size, dtype=torch.bool)
    for r in rows:
        mask = torch.zeros(size, dtype=torch.bool)
        mask[r] = True
        shared &= mask
    keep = shared.nonzero().squeeze(1)
    if keep.numel() == 0:
        raise ValueError("the candidates' honest outputs share no rows")
    out = []
    for p, r in zip(parts, rows):
        where = torch.full((size,), -1, dtype=torch.long)
        where[r] = torch.arange(r.numel())
        take = where[keep].to(p.outputs.device)
        w = None if p.weights is None else p.weights[take]
        out.append(HonestOutputs(p.outputs[take], p.targets[take], w, keep))
    return out
