"""Validation criteria: what every choice made on validation rows minimizes.

Each criterion gives a per-row loss (n_val,) of predictions against targets, both (n_val, c); the
criterion's value is their mean. The per-row losses also feed the paired significance tests
(:func:`xrfm_torch.leaf.selection.paired_win`), so a choice is made on the same scale it is tested.

- ``"mse"``: squared error (summed over outputs; the value is divided by ``c``). On one-hot class
  codes this is the Brier score.
- ``"logloss"``: ``-log p[true class]`` with ``p`` the scores clipped to ``[CLIP, 1 - CLIP]`` and
  renormalized per row (targets one-hot).
- ``"error"``: 1 where the highest score is not the true class, else 0 (targets one-hot).
"""

from __future__ import annotations

from typing import Literal

from torch import Tensor

#: A validation criterion (see the module docstring).
Criterion = Literal["mse", "logloss", "error"]
CRITERIA: tuple[Criterion, ...] = ("mse", "logloss", "error")

#: Class scores are clipped to ``[CLIP, 1 - CLIP]`` before renormalizing (as the reference does).
CLIP = 1e-3


def class_probabilities(scores: Tensor) -> Tensor:
    """Probabilities (n, K) from class scores: clipped to ``[CLIP, 1 - CLIP]``, rows sum to 1."""
    p = scores.clamp(CLIP, 1 - CLIP)
    return p / p.sum(1, keepdim=True)


def validation_errors(pred: Tensor, target: Tensor, criterion: Criterion) -> tuple[float, Tensor]:
    """``(criterion value, per-row losses (n_val,))`` of predictions against targets (n_val, c)."""
    if criterion == "mse":
        per_row = ((pred - target) ** 2).sum(1)
        return float(per_row.mean()) / pred.shape[1], per_row
    true = target.argmax(1, keepdim=True)
    if criterion == "logloss":
        per_row = -class_probabilities(pred).gather(1, true)[:, 0].log()
    elif criterion == "error":
        per_row = (pred.argmax(1, keepdim=True) != true)[:, 0].to(pred.dtype)
    else:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    return float(per_row.mean()), per_row
