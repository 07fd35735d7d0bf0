"""Per-feature input transforms fitted on the training rows (state in buffers).

A Laplace-type kernel on standardized inputs lets a few extreme values dominate the distances of a
heavy-tailed feature: most rows are squeezed into a sliver
of the bandwidth and the leaves cannot resolve them. Mapping every feature through its own empirical
CDF to normal scores spreads the rows evenly; it is monotone per feature, so features keep their
identity (feature importance, AGOP) and tree splits stay meaningful.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
from torch import Tensor

from xrfm_torch.numerics.checks import as_float_matrix
from xrfm_torch.numerics.special import count_sorted, erfinv_poly
from xrfm_torch.numerics.state import ResizableBuffers

#: Beyond the training range: clip to the end points or continue linearly.
Tails = Literal["clip", "linear"]


class QuantileNormal(ResizableBuffers):
    r"""Map each feature to normal scores through its training quantiles.

    With knots :math:`q_{j,0} \le \dots \le q_{j,K-1}` (the feature's training quantiles at
    levels :math:`k / (K - 1)`), the empirical CDF :math:`F_j` interpolates linearly between
    knots; inside a run of tied knots it takes the middle of the run (mean of the left and right
    interpolations, as scikit-learn's ``QuantileTransformer`` does), so a binary feature maps to two
    values. The level is then moved to the plotting position of a sample of ``n`` rows,
    :math:`p = (F_j(x) (n - 1) + 1/2) / n`, so the extreme training rows map to
    :math:`\pm\Phi^{-1}(1 - 1/(2n))` (about 3.9 at n = 10 000), not to an arbitrary clip value, and

    .. math:: z_j = \Phi^{-1}(p) = \sqrt{2}\,\mathrm{erfinv}(2p - 1).

    Beyond the training range, ``tails="clip"`` maps values to the end points (as a tree does);
    ``"linear"`` continues the map with slope 1 / (the feature's training standard deviation).
    Clipping is the default: the map exists for heavy-tailed features, whose new extremes lie far
    out in standardized units (a lognormal feature: a test row twice the training maximum moves the
    linear tail by tens of units and the leaf's prediction with it), and where raw-scale
    extrapolation matters, ``"quantile+raw"`` keeps the raw column. The map is piecewise smooth
    in ``x`` and autograd differentiates it (zero gradient in the clipped tails).

    Args:
        n_quantiles: Knots per feature ``K`` (at most the number of training rows).
        tails: ``"clip"`` or ``"linear"`` beyond the training range.

    Shapes:
        ``knots_``: (K, d); ``scale_``: (d,); ``n_rows_``: () (rows the knots were fitted on).
    """

    knots_: Tensor
    scale_: Tensor
    n_rows_: Tensor

    def __init__(self, n_quantiles: int = 1000, tails: Tails = "clip") -> None:
        super().__init__()
        if int(n_quantiles) != n_quantiles or n_quantiles < 2:
            raise ValueError(f"n_quantiles must be an integer >= 2, got {n_quantiles!r}")
        if tails not in ("linear", "clip"):
            raise ValueError(f"tails must be 'linear' or 'clip', got {tails!r}")
        self.n_quantiles = int(n_quantiles)
        self.tails = tails
        self.register_buffer("knots_", torch.empty(0, 0))
        self.register_buffer("scale_", torch.empty(0))
        self.register_buffer("n_rows_", torch.tensor(0))

    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`fit` has run (or a fitted state was loaded)."""
        return self.knots_.numel() > 0

    @torch.no_grad()
    def fit(self, X: Tensor) -> QuantileNormal:
        """Fit the knots to the training inputs ``X``, shape (n, d), n >= 2."""
        X = as_float_matrix(X, "X")
        n = X.shape[0]
        if n < 2:
            raise ValueError(f"QuantileNormal needs at least 2 rows, got {n}")
        k = min(self.n_quantiles, n)
        # Quantiles by sorting (torch.quantile refuses inputs above 2**24 elements).
        xs = X.sort(dim=0).values
        pos = torch.linspace(0, n - 1, k, dtype=torch.float64, device=X.device)
        lo = pos.floor().long()
        hi = (lo + 1).clamp_max(n - 1)
        w = (pos - lo).to(X.dtype)[:, None]
        # a + (b - a) w is exactly a inside a run of tied values (a (1 - w) + a w is not, in
        # float32), and the running max removes any other rounding step down: sorted knots are
        # what searchsorted and the tie rule below need
        self.knots_ = torch.cummax(xs[lo] + (xs[hi] - xs[lo]) * w, dim=0).values
        self.scale_ = X.std(dim=0).clamp_min(torch.finfo(X.dtype).tiny)
        self.n_rows_ = torch.tensor(n, device=X.device)
        return self

    def levels(self, x: Tensor) -> Tensor:
        """The interpolated empirical CDF ``F_j(x_j)`` in [0, 1], shape (n, d)."""
        q = self.knots_.T.contiguous()  # (d, K): searchsorted works along the last dimension
        xt = x.T.contiguous()
        k = q.shape[1]
        # Right interpolation: hi = number of knots <= x; inside a tie run it gives its last level.
        # Left interpolation: lo = number of knots < x; inside a tie run it gives its first level.
        if torch.compiler.is_exporting():  # ONNX has no searchsorted
            hi = count_sorted(q, xt, right=True)
            lo = count_sorted(q, xt, right=False)
        else:
            hi = torch.searchsorted(q, xt, right=True)
            lo = torch.searchsorted(q, xt, right=False)
        up = self._interpolate(q, xt, hi)
        down = self._interpolate(q, xt, lo)
        return ((up + down) / (2 * (k - 1))).T

    @staticmethod
    def _interpolate(q: Tensor, x: Tensor, idx: Tensor) -> Tensor:
        """Fractional knot index of ``x`` between knots ``idx - 1`` and ``idx`` (0 .. K - 1)."""
        k = q.shape[1]
        i1 = idx.clamp(1, k - 1)
        q0 = q.gather(1, i1 - 1)
        q1 = q.gather(1, i1)
        # Between the bracketing knots q0 < q1 strictly (ties are outside the bracket), except
        # at the ends, where the clamp below decides.
        frac = ((x - q0) / (q1 - q0).clamp_min(torch.finfo(q.dtype).tiny)).clamp(0, 1)
        pos = (i1 - 1).to(x.dtype) + frac
        pos = torch.where(idx == 0, torch.zeros_like(pos), pos)
        return torch.where(idx >= k, torch.full_like(pos, k - 1), pos)

    def forward(self, x: Tensor) -> Tensor:
        """Normal scores of ``x``, shape (n, d) -> (n, d)."""
        if not self.is_fitted:
            raise RuntimeError("QuantileNormal is not fitted; call .fit(X) first")
        if x.ndim != 2 or x.shape[1] != self.knots_.shape[1]:
            raise ValueError(
                f"expected input of shape (n, {self.knots_.shape[1]}), got {tuple(x.shape)}"
            )
        return self.scores(x, float(self.n_rows_))

    def scores(self, x: Tensor, n: float) -> Tensor:
        """:meth:`forward` with the number of training rows ``n`` given as a Python float.

        Without reading ``n_rows_``, the computation is the same for any values, so ``torch.export``
        can trace it.
        """
        p = (self.levels(x) * (n - 1) + 0.5) / n
        # exported graphs use an erfinv from basic operators (ONNX has none)
        erfinv = erfinv_poly if torch.compiler.is_exporting() else torch.erfinv
        z = math.sqrt(2.0) * erfinv(2 * p - 1)
        if self.tails == "clip":
            return z
        lo, hi = self.knots_[0], self.knots_[-1]
        z_lo = -math.sqrt(2.0) * torch.erfinv(torch.tensor(1 - 1 / n, dtype=torch.float64)).item()
        below = (x - lo).clamp_max(0) / self.scale_
        above = (x - hi).clamp_min(0) / self.scale_
        return torch.where(x < lo, z_lo + below, torch.where(x > hi, -z_lo + above, z))


class Standardize(ResizableBuffers):
    """Per-column ``(x - center) / scale`` with training statistics (mean, population std).

    What makes the model scale-free: multiplying a column by any positive constant (or shifting it)
    changes what follows only by float rounding. A constant column gets scale 1 (it maps to 0).
    Missing cells (NaN) are left out of the statistics and stay NaN.

    Shapes:
        ``center_``, ``scale_``: (d,).
    """

    center_: Tensor
    scale_: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("center_", torch.empty(0))
        self.register_buffer("scale_", torch.empty(0))

    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`fit` has run (or a fitted state was loaded)."""
        return self.center_.numel() > 0

    @torch.no_grad()
    def fit(self, X: Tensor) -> Standardize:
        """Fit the statistics to ``X``, shape (n, d) (computed in float64, stored in X's dtype).

        Float64 statistics of float64 data make ``inverse`` return float64 for float32 inputs:
        the model's regression outputs follow its targets' dtype.
        """
        X64 = X.double()
        center = X64.nanmean(0).nan_to_num(0.0)  # a column that is all NaN: 0
        std = ((X64 - center) ** 2).nanmean(0).nan_to_num(0.0).sqrt()
        scale = torch.where(std > 0, std, torch.ones_like(std))
        self.center_ = center.to(X.dtype)
        self.scale_ = scale.to(X.dtype)
        return self

    def _check(self, x: Tensor) -> None:
        if not self.is_fitted:
            raise RuntimeError("Standardize is not fitted; call .fit(X) first")
        if x.shape[-1] != self.center_.shape[0]:
            raise ValueError(
                f"expected {self.center_.shape[0]} columns, got shape {tuple(x.shape)}"
            )

    def forward(self, x: Tensor) -> Tensor:
        """``(x - center) / scale``, shape (n, d) -> (n, d)."""
        self._check(x)
        return (x - self.center_) / self.scale_

    def inverse(self, z: Tensor) -> Tensor:
        """``z * scale + center``: back to the original units, shape (n, d) -> (n, d)."""
        self._check(z)
        return z * self.scale_ + self.center_
