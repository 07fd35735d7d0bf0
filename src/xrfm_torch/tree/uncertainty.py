"""Predictive variances of a fitted tree: leaf Gaussians mixed by the routing, then calibrated.

Each leaf gives, at ``x``, its mean ``mu_l``, the latent GP variance ``v_l`` and the log-noise
estimate ``g_l`` of :mod:`xrfm_torch.leaf.posterior`. Routing weights ``w_l(x)`` (one-hot for hard
routing) mix them like a mixture of Gaussians: ``mu = sum_l w_l mu_l`` and the spread of the
leaves' means ``sum_l w_l (mu_l - mu)^2`` joins the latent variance; trees (several input maps)
are averaged the same way. Two variances are then offered:

- ``"gp"``: the plain Gaussian process of each leaf, ``s_l^2 (v_l + lam_l)`` with the
  marginal-likelihood scale ``s_l^2`` (no validation data used);
- ``"calibrated"``: ``log sigma^2(x) = theta . phi(x)`` with features
  ``phi = [1, log v, g, mu, mu^2]``, ``theta`` fitted by Gaussian NLL on validation rows the leaves
  did not fit. The NLL ``(eta + r^2 e^{-eta}) / 2`` is convex in ``eta = theta . phi``, so Newton's
  method finds ``theta`` in a few steps. The mean terms let the noise follow the level of the
  target (counts, prices); ``g`` lets it follow the input. Features are clamped to their validation
  range, so the variance does not run away on rows unlike any validation row.

All quantities are in the leaves' (standardized) target units; the model rescales.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import torch
from torch import Tensor

from xrfm_torch.numerics.state import ResizableBuffers
from xrfm_torch.tree.partition import PartitionTree

log = logging.getLogger(__name__)

Uncertainty = Literal["none", "gp", "calibrated"]
UNCERTAINTIES: tuple[str, ...] = get_args(Uncertainty)

#: ``[1, log v, g, mu, mu^2]``
N_FEATURES = 5
#: Ridge on the non-intercept coefficients of the calibrated log-variance (per validation row).
COEF_RIDGE = 1e-3
#: Latent variances are floored at this before the log (a row on a support point has v ~ 0).
LATENT_FLOOR = 1e-8


@dataclass
class Moments:
    """Per-row summaries of the mixed leaf Gaussians, each (n, c).

    Attributes:
        mean: Mixture mean.
        latent: Mixed latent variance plus the spread of the mixed means.
        log_noise: Mixed log-noise estimate.
        gp: Mixed plain-GP predictive variance plus the spread of the mixed means.
    """

    mean: Tensor
    latent: Tensor
    log_noise: Tensor
    gp: Tensor


def tree_moments(
    tree: PartitionTree,
    x: Tensor,
    temperature: Tensor | float,
    *,
    keep_mass: float,
    max_leaves: int | None,
) -> Moments:
    """The routing-weighted mixture of one tree's leaf Gaussians at ``x`` (n, d)."""
    w = tree.weights(x, temperature, keep_mass=keep_mass, max_leaves=max_leaves)  # (n, L)
    parts = []  # (rows, weights (r, 1), mu (r, c), [v, g, gp] (3, r, c))
    for leaf_id, leaf in enumerate(tree.leaf_list()):
        rows = (w[:, leaf_id] > 0).nonzero().squeeze(1)
        if rows.numel():
            mu, v, g = leaf.moments(x[rows])
            v = v[:, None].expand_as(mu)
            gp = leaf.gp.signal_var_ * (v + leaf.reg_.to(v.dtype))
            parts.append((rows, w[rows, leaf_id, None], mu, torch.stack([v, g, gp])))
    if not parts:
        raise RuntimeError("no leaf received any weight")
    n, c = x.shape[0], parts[0][2].shape[1]
    mean = x.new_zeros(n, c)
    for rows, wl, mu, _ in parts:
        mean = mean.index_add(0, rows, wl * mu)
    acc, spread = x.new_zeros(3, n, c), x.new_zeros(n, c)
    for rows, wl, mu, vg in parts:
        acc = acc.index_add(1, rows, wl * vg)
        spread = spread.index_add(0, rows, wl * (mu - mean[rows]) ** 2)
    return Moments(mean, acc[0] + spread, acc[1], acc[2] + spread)


def model_moments(
    trees: Sequence[PartitionTree],
    xs: Sequence[Tensor],
    temperature: Tensor | float,
    *,
    keep_mass: float,
    max_leaves: int | None,
) -> Moments:
    """Average of the trees' mixtures (each tree sees its own input map ``xs[t]``)."""
    ms = [
        tree_moments(t, x, temperature, keep_mass=keep_mass, max_leaves=max_leaves)
        for t, x in zip(trees, xs)
    ]
    if len(ms) == 1:
        return ms[0]
    means = torch.stack([m.mean for m in ms])
    mean = means.mean(0)
    spread = ((means - mean) ** 2).mean(0)  # between trees
    return Moments(
        mean,
        torch.stack([m.latent for m in ms]).mean(0) + spread,
        torch.stack([m.log_noise for m in ms]).mean(0),
        torch.stack([m.gp for m in ms]).mean(0) + spread,
    )


def variance_features(m: Moments) -> Tensor:
    """``[1, log v, g, mu, mu^2]`` per row and output, shape (n, c, N_FEATURES)."""
    log_v = torch.log(m.latent.clamp_min(LATENT_FLOOR))
    ones = torch.ones_like(m.mean)
    return torch.stack([ones, log_v, m.log_noise, m.mean, m.mean * m.mean], dim=-1)


def gaussian_nll(mean: Tensor, var: Tensor, y: Tensor) -> Tensor:
    """Per-entry Gaussian negative log-likelihood ``log(2 pi var) / 2 + (y - mean)^2 / (2 var)``."""
    return 0.5 * (torch.log(2 * torch.pi * var) + (y - mean) ** 2 / var)


@torch.no_grad()
def fit_log_variance(
    F: Tensor, r2: Tensor, ridge: float = COEF_RIDGE, max_steps: int = 100
) -> Tensor:
    """``theta`` minimizing ``mean((eta + r2 e^{-eta}) / 2) + ridge |theta[1:]|^2 / 2``, ``eta = F theta``.

    Damped Newton steps (halved until the objective does not rise); the objective is convex.

    Args:
        F: Features, (n, k) (first column the constant).
        r2: Squared residuals, (n,).
        ridge: Penalty on the non-intercept coefficients.
        max_steps: Newton steps at most.

    Returns:
        ``theta``, (k,).
    """
    F, r2 = F.double(), r2.double()
    n, k = F.shape
    pen = torch.full((k,), ridge, dtype=F.dtype, device=F.device)
    pen[0] = 0.0
    theta = torch.zeros(k, dtype=F.dtype, device=F.device)
    theta[0] = torch.log(r2.mean().clamp_min(torch.finfo(F.dtype).tiny))

    def objective(th: Tensor) -> float:
        eta = F @ th
        return float(0.5 * (eta + r2 * torch.exp(-eta)).mean() + 0.5 * (pen * th * th).sum())

    f = objective(theta)
    for _ in range(max_steps):
        wr = r2 * torch.exp(-(F @ theta))  # (n,)
        grad = 0.5 * F.mT @ (1 - wr) / n + pen * theta
        hess = 0.5 * (F.mT * wr) @ F / n + torch.diag(pen)
        hess.diagonal().add_(1e-10)
        step = torch.linalg.solve(hess, grad)
        t = 1.0
        while t > 1e-6:
            new = theta - t * step
            f_new = objective(new)
            if f_new <= f:
                break
            t /= 2
        else:
            break
        theta, f_old, f = new, f, f_new
        if f_old - f < 1e-12 * max(1.0, abs(f)):
            break
    return theta


class VarianceModel(ResizableBuffers):
    """How mixed leaf moments become a predictive variance (see the module docstring).

    Args:
        kind: ``"gp"`` or ``"calibrated"``.

    Buffers (after :meth:`fit`): ``coef_`` (c, N_FEATURES), ``low_`` and ``high_`` (c, N_FEATURES)
    the validation range of each feature (``"calibrated"``; empty for ``"gp"``).
    """

    coef_: Tensor
    low_: Tensor
    high_: Tensor

    def __init__(self, kind: Uncertainty = "calibrated") -> None:
        super().__init__()
        if kind not in UNCERTAINTIES or kind == "none":
            raise ValueError(f"kind must be 'gp' or 'calibrated', got {kind!r}")
        self.kind: Uncertainty = kind
        self.register_buffer("coef_", torch.empty(0, N_FEATURES))
        self.register_buffer("low_", torch.empty(0, N_FEATURES))
        self.register_buffer("high_", torch.empty(0, N_FEATURES))

    @torch.no_grad()
    def fit(self, m: Moments, y: Tensor) -> VarianceModel:
        """Fit on validation moments and codes ``y`` (n_val, c) the leaves did not fit."""
        if self.kind == "gp" or y.shape[0] == 0:
            if self.kind == "calibrated":
                log.warning("no validation rows: the calibrated variance falls back to the GP's")
            self.coef_ = m.mean.new_empty(0, N_FEATURES)
            return self
        F = variance_features(m)  # (n, c, k)
        r2 = (y - m.mean) ** 2
        self.coef_ = torch.stack(
            [fit_log_variance(F[:, j], r2[:, j]) for j in range(F.shape[1])]
        ).to(m.mean.dtype)
        self.low_, self.high_ = F.amin(0), F.amax(0)
        return self

    def forward(self, m: Moments) -> Tensor:
        """Predictive variance (n, c) in the leaves' units (differentiable in the moments)."""
        if self.coef_.shape[0] == 0:
            return m.gp
        F = variance_features(m)
        F = torch.maximum(torch.minimum(F, self.high_), self.low_)
        return torch.exp((F * self.coef_).sum(-1))


def normal_quantile(coverage: float) -> float:
    """``z`` such that ``mean -/+ z std`` holds ``coverage`` of a normal's mass.

    Raises:
        ValueError: ``coverage`` outside (0, 1).
    """
    if not 0.0 < float(coverage) < 1.0:
        raise ValueError(f"coverage must be in (0, 1), got {coverage!r}")
    return float(torch.special.ndtri(torch.tensor(0.5 + float(coverage) / 2, dtype=torch.float64)))


#: Without validation data, a model with uncertainty holds out at least this many training rows
#: to calibrate its variance (10 % of a small table is too few: 90 % intervals fitted on ~35
#: held-out rows of diabetes covered 0.80 of the test rows, 0.88 with an eval set) ...
MIN_CALIBRATION_ROWS = 200
#: ... but never more than this share of them.
MAX_CALIBRATION_FRACTION = 0.3


def calibration_fraction(n_rows: int, val_fraction: float) -> float:
    """Share of ``n_rows`` training rows to hold out for the variance calibration.

    ``val_fraction``, raised to hold ``MIN_CALIBRATION_ROWS`` rows where at most
    ``MAX_CALIBRATION_FRACTION`` of the rows does; a ``UserWarning`` says when fewer remain
    (pass validation rows instead).
    """
    fraction = max(val_fraction, min(MIN_CALIBRATION_ROWS / n_rows, MAX_CALIBRATION_FRACTION))
    if fraction > val_fraction:
        log.info(
            "uncertainty: holding out %d of %d rows to calibrate", round(fraction * n_rows), n_rows
        )
    if round(fraction * n_rows) < MIN_CALIBRATION_ROWS:
        warnings.warn(
            f"uncertainty is calibrated on {round(fraction * n_rows)} held-out rows (fewer than "
            f"{MIN_CALIBRATION_ROWS}): its intervals may cover less than asked; pass validation "
            "rows (X_val, y_val / eval_set) to calibrate on more",
            UserWarning,
            stacklevel=4,
        )
    return fraction


def check_uncertainty(value: object, task: str) -> Uncertainty:
    """``value`` if it names an :data:`Uncertainty` mode the ``task`` has, else ``ValueError``."""
    if value not in UNCERTAINTIES:
        raise ValueError(f"uncertainty must be one of {UNCERTAINTIES}, got {value!r}")
    if value != "none" and task != "regression":
        raise ValueError(f"uncertainty={value!r} needs task='regression'")
    return value  # type: ignore[return-value]


def predictive_mean_std(
    trees: Sequence[PartitionTree],
    xs: Sequence[Tensor],
    temperature: float | Tensor,
    variance: VarianceModel,
    *,
    keep_mass: float,
    max_leaves: int,
) -> tuple[Tensor, Tensor]:
    """Mixed mean and predictive standard deviation (each (n, c), the leaves' units) at ``xs``.

    ``xs`` holds each tree's encoded inputs; leaves without a fitted posterior (a state saved
    before it existed) fit it first.
    """
    for tree in trees:
        for leaf in tree.leaf_list():
            if not leaf.gp.is_fitted:
                leaf.fit_posterior()
    m = model_moments(trees, xs, temperature, keep_mass=keep_mass, max_leaves=max_leaves)
    return m.mean, variance(m).sqrt()


__all__ = [
    "N_FEATURES",
    "UNCERTAINTIES",
    "Moments",
    "Uncertainty",
    "VarianceModel",
    "check_uncertainty",
    "fit_log_variance",
    "gaussian_nll",
    "model_moments",
    "predictive_mean_std",
    "tree_moments",
    "variance_features",
]
