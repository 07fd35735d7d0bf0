"""Validation criteria: what every choice made on validation rows minimizes.

Each criterion gives a per-row loss (n_val,) of predictions against targets, both (n_val, c); the
criterion's value is their mean. The per-row losses also feed the paired significance tests
(:func:`xrfm_torch.leaf.selection.paired_win`), so a choice is made on the same scale it is tested.

- ``"mse"``: squared error (summed over outputs; the value is divided by ``c``). On one-hot class
  codes this is the Brier score.
- ``"logloss"``: ``-log p[true class]`` with ``p`` the scores clipped to ``[CLIP, 1 - CLIP]`` and
  renormalized per row (targets one-hot).
- ``"error"``: 1 where the highest score is not the true class, else 0 (targets one-hot).

Probabilities from class scores: clipped to ``[CLIP, 1 - CLIP]`` and renormalized (the reference's
rule), or, where a validation test says so (:func:`choose_softmax_scale`), ``softmax(a * scores)``
with the scale ``a`` fitted on the validation rows, clipped alike. Clipping the scores charges
``-log(CLIP / (1 + ...))`` (about 7) for every row whose true class scored at or below 0, however
close; with many classes that dominates the log-loss, where the softmax grades such rows by how
far they are off.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

#: A validation criterion (see the module docstring).
Criterion = Literal["mse", "logloss", "error"]
CRITERIA: tuple[Criterion, ...] = ("mse", "logloss", "error")

#: Class scores are clipped to ``[CLIP, 1 - CLIP]`` before renormalizing (as the reference does).
CLIP = 1e-3

#: The softmax replaces clipping only when its validation log-loss is lower by this many paired
#: standard errors (it has a parameter fitted on the same rows).
SOFTMAX_MARGIN = 2.0


def class_probabilities(scores: Tensor, softmax_scale: float = 0.0) -> Tensor:
    """Probabilities (n, K) from class scores, rows summing to 1.

    ``softmax_scale == 0``: scores clipped to ``[CLIP, 1 - CLIP]`` and renormalized; ``> 0``:
    ``softmax(softmax_scale * scores)`` clipped and renormalized alike (so one wrong row costs
    at most about ``-log CLIP`` either way, however confident the validation rows made the scale).
    """
    p = torch.softmax(softmax_scale * scores, 1) if softmax_scale > 0 else scores
    p = p.clamp(CLIP, 1 - CLIP)
    return p / p.sum(1, keepdim=True)


def row_logloss(p: Tensor, labels: Tensor) -> Tensor:
    """``-log p[i, labels[i]]`` per row (n,), probabilities floored at 1e-300."""
    return -p.gather(1, labels[:, None])[:, 0].clamp_min(1e-300).log()


def fit_softmax_scale(
    scores: Tensor, labels: Tensor, low: float = 1e-2, high: float = 1e4
) -> float:
    """The ``a`` in ``[low, high]`` minimizing the mean log-loss of ``softmax(a * scores)``.

    The unclipped loss is convex in ``a`` (log-sum-exp of logits linear in ``a``), so a
    golden-section search over ``log a`` finds its minimum to ~1e-6 relative in 60 steps, without
    autograd. It is fitted unclipped although the probabilities are clipped afterwards: with the
    clipping a confident mistake costs the same at any sharper scale, and on validation rows with
    few mistakes the fit then ran to ``high`` (digits features: test log-loss 0.093 vs 0.029).

    Args:
        scores: Class scores (n, K).
        labels: True classes (n,), long.
        low: Smallest scale searched.
        high: Largest scale searched.
    """
    s = scores.double()

    def loss(log_a: float) -> float:
        return float(row_logloss(torch.softmax(math.exp(log_a) * s, 1), labels).mean())

    a, b = math.log(low), math.log(high)
    ratio = (math.sqrt(5) - 1) / 2
    c, d = b - ratio * (b - a), a + ratio * (b - a)
    fc, fd = loss(c), loss(d)
    for _ in range(60):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - ratio * (b - a)
            fc = loss(c)
        else:
            a, c, fc = c, d, fd
            d = a + ratio * (b - a)
            fd = loss(d)
    return math.exp((a + b) / 2)


def choose_softmax_scale(scores: Tensor, labels: Tensor, margin: float = SOFTMAX_MARGIN) -> float:
    """0 (keep clipping) or the fitted softmax scale, whichever the validation rows support.

    The softmax is taken when its per-row log-loss beats clipping's by ``margin`` paired standard
    errors: ``mean(d) > margin * std(d) / sqrt(n)`` with ``d`` the per-row differences.

    Args:
        scores: Validation class scores (n, K).
        labels: Their true classes (n,), long.
        margin: Paired standard errors the softmax must win by.
    """
    n = scores.shape[0]
    if n < 2:
        return 0.0
    a = fit_softmax_scale(scores, labels)
    s = scores.double()
    d = row_logloss(class_probabilities(s), labels) - row_logloss(class_probabilities(s, a), labels)
    return a if float(d.mean()) > margin * float(d.std()) / math.sqrt(n) else 0.0


def validation_errors(pred: Tensor, target: Tensor, criterion: Criterion) -> tuple[float, Tensor]:
    """``(criterion value, per-row losses (n_val,))`` of predictions against targets (n_val, c)."""
    if criterion == "mse":
        per_row = ((pred - target) ** 2).sum(1)
        return float(per_row.mean()) / pred.shape[1], per_row
    true = target.argmax(1, keepdim=True)
    if criterion == "logloss":
        per_row = row_logloss(class_probabilities(pred), true[:, 0])
    elif criterion == "error":
        per_row = (pred.argmax(1, keepdim=True) != true)[:, 0].to(pred.dtype)
    else:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    return float(per_row.mean()), per_row
