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

from xrfm_torch.numerics.host import read_scalars

#: A validation criterion (see the module docstring).
Criterion = Literal["mse", "logloss", "error"]
CRITERIA: tuple[Criterion, ...] = ("mse", "logloss", "error")

#: Class scores are clipped to ``[CLIP, 1 - CLIP]`` before renormalizing (as the reference does).
CLIP = 1e-3

#: The softmax replaces clipping only when its validation log-loss is lower by this many paired
#: standard errors (it has a parameter fitted on the same rows).
SOFTMAX_MARGIN = 2.0


#: Scores are floored here before their logarithm in the Platt map (:func:`fit_platt`).
PLATT_FLOOR = 1e-2
#: Ridge on the Platt map's parameters, per validation row's mean log-loss.
PLATT_RIDGE = 1e-4
#: Most Newton steps of :func:`fit_platt` (it stops earlier, once the loss no longer falls).
PLATT_NEWTON_STEPS = 50


def platt_logits(scores: Tensor, platt: Tensor) -> Tensor:
    """``a log(max(s, PLATT_FLOOR)) + b`` with ``platt = [a, b_1 .. b_K]``: logits (n, K)."""
    return platt[0] * scores.clamp_min(PLATT_FLOOR).log() + platt[1:]


def class_probabilities(
    scores: Tensor, softmax_scale: float = 0.0, platt: Tensor | None = None
) -> Tensor:
    """Probabilities (n, K) from class scores, rows summing to 1.

    By default the scores clipped to ``[CLIP, 1 - CLIP]`` and renormalized; with
    ``softmax_scale > 0``, ``softmax(softmax_scale * scores)``; with ``platt`` (K + 1,),
    ``softmax(platt_logits(scores, platt))`` (:func:`fit_platt`). Either is clipped and
    renormalized alike, so one wrong row costs at most about ``-log CLIP`` however confident the
    validation rows made the map.
    """
    if platt is not None and platt.numel():
        p = torch.softmax(platt_logits(scores, platt.to(scores.dtype)), 1)
    else:
        p = torch.softmax(softmax_scale * scores, 1) if softmax_scale > 0 else scores
    p = p.clamp(CLIP, 1 - CLIP)
    return p / p.sum(1, keepdim=True)


def fit_platt(scores: Tensor, labels: Tensor, weights: Tensor | None = None) -> Tensor:
    r"""Platt's map on the log-scores, fitted by validation log-loss: ``platt`` (K + 1,).

    :math:`p = \mathrm{softmax}(a \log \max(s, \epsilon) + b)` with one slope ``a`` and a
    bias per class. The leaves regress on one-hot codes, so their scores are near 0 or 1 and
    their errors are additive: a log-score map with a slope (a power ``s^a``) sharpens or softens
    them, the bias corrects the class balance, and the floor ``epsilon = PLATT_FLOOR`` keeps a
    score at or below 0 from deciding a row alone. The loss (mean cross-entropy plus
    ``PLATT_RIDGE`` times the squared parameters) is strictly convex in the K + 1 parameters, so
    Newton's method from ``a = 1, b = 0`` (float64, halving steps until the loss falls) finds its
    minimum in a few steps, with the gradient and Hessian written out (no autograd or optimizer:
    ``torch.optim`` imports the compiler stack on first use, 1.2 s of a fresh process). Measured
    against clipping and the softmax scale in docs/benchmarks.md.

    Args:
        scores: Validation class scores (n, K).
        labels: Their true classes (n,), long.
        weights: Optional row weights (n,): the weighted mean cross-entropy.
    """
    s = scores.detach().double()
    n, k = s.shape
    rw = (torch.ones(n, dtype=torch.float64, device=s.device) if weights is None
          else relative(weights).double())  # fmt: skip
    rw = rw / n  # the (weighted) mean
    logs = s.clamp_min(PLATT_FLOOR).log()  # (n, K): d logits / d a
    onehot = torch.zeros_like(s).scatter_(1, labels.long()[:, None], 1.0)  # a fill, no copy
    eye = torch.eye(k + 1, dtype=torch.float64, device=s.device)

    def loss(w: Tensor) -> Tensor:  # 0-dim, on the device: read back with what else is due
        z = platt_logits(s, w)
        rows = torch.logsumexp(z, 1) - (z * onehot).sum(1)
        return (rw * rows).sum() + PLATT_RIDGE * (w * w).sum()

    w = torch.zeros(k + 1, dtype=torch.float64, device=s.device)
    w[:1].fill_(1.0)  # a number written on the device (w[0] = 1.0 copies a host scalar there)
    current = float(loss(w))
    for _ in range(PLATT_NEWTON_STEPS):
        p = torch.softmax(platt_logits(s, w), 1)
        r = rw[:, None] * (p - onehot)  # (n, K): weighted d loss / d logits
        grad = torch.cat([(r * logs).sum()[None], r.sum(0)]) + 2 * PLATT_RIDGE * w
        # Hessian: sum_i rw_i J_i^T (diag(p_i) - p_i p_i^T) J_i with J_i = [log s_i | I]
        pl = (p * logs).sum(1)  # (n,)
        h_aa = (rw * ((p * logs * logs).sum(1) - pl * pl)).sum()
        h_ab = (rw[:, None] * p * (logs - pl[:, None])).sum(0)  # (K,)
        h_bb = torch.diag((rw[:, None] * p).sum(0)) - (rw[:, None] * p).T @ p
        H = torch.empty(k + 1, k + 1, dtype=torch.float64, device=s.device)
        H[0, 0], H[0, 1:], H[1:, 0], H[1:, 1:] = h_aa, h_ab, h_ab, h_bb
        step, info = torch.linalg.solve_ex(H + 2 * PLATT_RIDGE * eye, grad)
        # the first trial's loss, the gradient's size and the solve's status in one read back
        t = 1.0
        new, g_max, singular = read_scalars(loss(w - step), grad.abs().max(), info != 0)
        if singular:
            raise torch.linalg.LinAlgError("Platt's Newton system is singular")
        while new > current:  # halve the step until the loss does not rise (t > 1e-8)
            t *= 0.5
            if t <= 1e-8:
                break
            new = float(loss(w - t * step))
        if new > current:  # no step along the Newton direction lowers the loss: at the minimum
            break
        w = w - t * step
        done = current - new < 1e-15 * max(1.0, abs(current))
        current = new
        if done or g_max < 1e-12:
            break
    return w.to(scores.dtype)


def row_logloss(p: Tensor, labels: Tensor) -> Tensor:
    """``-log p[i, labels[i]]`` per row (n,), probabilities floored at 1e-300."""
    return -p.gather(1, labels[:, None])[:, 0].clamp_min(1e-300).log()


def fit_softmax_scale(
    scores: Tensor,
    labels: Tensor,
    low: float = 1e-2,
    high: float = 1e4,
    weights: Tensor | None = None,
) -> float:
    """The ``a`` in ``[low, high]`` minimizing the mean log-loss of ``softmax(a * scores)``.

    The unclipped loss is convex in ``a`` (log-sum-exp of logits linear in ``a``), so a
    golden-section search over ``log a`` finds its minimum to ~1e-6 relative in 60 steps, without
    autograd. It is fitted unclipped although the probabilities are clipped afterwards: with the
    clipping a confident mistake costs the same at any sharper scale, and on validation rows with
    few mistakes the fit then ran to ``high`` (far too sharp on test rows; docs/design.md).

    Args:
        scores: Class scores (n, K).
        labels: True classes (n,), long.
        low: Smallest scale searched.
        high: Largest scale searched.
        weights: Optional row weights (n,): the weighted mean log-loss.
    """
    s = scores.double()
    rw = 1.0 if weights is None else relative(weights).double()

    def loss(log_a: float) -> float:
        return float((rw * row_logloss(torch.softmax(math.exp(log_a) * s, 1), labels)).mean())

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


def choose_softmax_scale(
    scores: Tensor,
    labels: Tensor,
    margin: float = SOFTMAX_MARGIN,
    weights: Tensor | None = None,
) -> float:
    """0 (keep clipping) or the fitted softmax scale, whichever the validation rows support.

    The softmax is taken when its per-row log-loss beats clipping's by ``margin`` paired standard
    errors: ``mean(d) > margin * std(d) / sqrt(n)`` with ``d`` the per-row differences.

    Args:
        scores: Validation class scores (n, K).
        labels: Their true classes (n,), long.
        margin: Paired standard errors the softmax must win by.
        weights: Optional row weights (n,): weighted per-row losses.
    """
    n = scores.shape[0]
    if n < 2:
        return 0.0
    a = fit_softmax_scale(scores, labels, weights=weights)
    s = scores.double()
    d = row_logloss(class_probabilities(s), labels) - row_logloss(class_probabilities(s, a), labels)
    d = d if weights is None else d * relative(weights).double()
    return a if float(d.mean()) > margin * float(d.std()) / math.sqrt(n) else 0.0


def validation_errors(
    pred: Tensor, target: Tensor, criterion: Criterion, weights: Tensor | None = None
) -> tuple[float, Tensor]:
    """``(criterion value, per-row losses (n_val,))`` of predictions against targets (n_val, c).

    With ``weights`` (n_val,), each row's loss is scaled by ``w_i / mean(w)``: the value (their
    mean) is the weighted mean loss, and the paired tests on these rows
    (:func:`~xrfm_torch.leaf.selection.paired_win`) compare weighted losses.
    """
    value, per_row = validation_loss(pred, target, criterion, weights)
    return float(value), per_row


def validation_loss(
    pred: Tensor, target: Tensor, criterion: Criterion, weights: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    """:func:`validation_errors` with the value left on the device: a 0-dim float64 tensor.

    For callers that read it back together with other scalars (one host-device
    synchronization on a GPU instead of one per scalar).
    """
    if criterion == "mse":
        per_row = ((pred - target) ** 2).sum(1)
        per_row = per_row if weights is None else per_row * relative(weights).to(per_row)
        return per_row.mean().double() / pred.shape[1], per_row
    true = target.argmax(1, keepdim=True)
    if criterion == "logloss":
        per_row = row_logloss(class_probabilities(pred), true[:, 0])
    elif criterion == "error":
        per_row = (pred.argmax(1, keepdim=True) != true)[:, 0].to(pred.dtype)
    else:
        raise ValueError(f"criterion must be one of {CRITERIA}, got {criterion!r}")
    per_row = per_row if weights is None else per_row * relative(weights).to(per_row)
    return per_row.mean().double(), per_row


def relative(weights: Tensor) -> Tensor:
    """``w / mean(w)``: weights that average 1 (a weighted mean is then a plain mean)."""
    return weights / weights.mean()
