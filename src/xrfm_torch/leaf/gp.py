"""The Gaussian-process view of a fitted leaf: a module the leaf holds (``leaf.gp``), not a base class.

The numerics (posterior variance, leave-one-out noise model, marginal-likelihood scale) are pure
functions in :mod:`xrfm_torch.leaf.posterior`. :class:`LeafGP` holds what a leaf keeps for them
(its Cholesky factor, cached but not saved, and the noise model's buffers) and reads the leaf's
fitted kernel model (support, coefficients, ``M``, ridge) through the leaf passed to each method,
so ``leaf/model.py`` holds the fit and the prediction of the leaf itself and this view can be
dropped, refitted or left out without touching them.
"""

from __future__ import annotations

import torch
from torch import Tensor

from xrfm_torch.kernels import transform
from xrfm_torch.kernels.distance import row_chunks
from xrfm_torch.leaf.posterior import (
    cholesky_factor,
    loo_residuals,
    moments,
    noise_model,
    signal_variance,
    system_matrix,
)
from xrfm_torch.leaf.view import LeafView
from xrfm_torch.numerics.state import ResizableBuffers


class LeafGP(ResizableBuffers):
    """Posterior factor, noise model and predictive moments of one leaf (module docstring).

    Buffers: ``noise_coef_`` (n, c) and ``noise_mean_`` (c,) of the log-noise model,
    ``signal_var_`` (c,) the marginal-likelihood scale (empty until :meth:`fit`), and ``factor_``
    (n, n), the cached Cholesky factor (not persistent: as large as the kernel matrix).
    """

    noise_coef_: Tensor
    noise_mean_: Tensor
    signal_var_: Tensor
    factor_: Tensor

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("noise_coef_", torch.empty(0, 0))
        self.register_buffer("noise_mean_", torch.empty(0))
        self.register_buffer("signal_var_", torch.empty(0))
        self.register_buffer("factor_", torch.empty(0, 0), persistent=False)

    @property
    def is_fitted(self) -> bool:
        """Whether :meth:`fit` has run for the leaf's current support."""
        return self.noise_coef_.numel() > 0

    def keep(self, workspace: Tensor, n: int) -> None:
        """Cache a solver workspace's factor of an ``n``-row support's system (if it holds one)."""
        if workspace.shape[0] >= n and bool(workspace[0, 0].isfinite()):
            self.factor_ = workspace[:n, :n]

    def drop_factor(self) -> None:
        """Free the cached Cholesky factor (:meth:`factor` recomputes it on use)."""
        self.factor_ = self.factor_.new_empty(0, 0)

    def forget(self) -> None:
        """Drop the factor and noise model (stale once the support or coefficients change)."""
        self.drop_factor()
        self.noise_coef_ = self.noise_coef_.new_empty(0, 0)
        self.noise_mean_ = self.noise_mean_.new_empty(0)
        self.signal_var_ = self.signal_var_.new_empty(0)

    @torch.no_grad()
    def factor(self, leaf: LeafView) -> Tensor:
        """Lower Cholesky factor of ``K + U U^T + reg I`` on the leaf's support (cached), (n, n).

        In the leaf's dtype, or float64 where that factorization fails (a tiny ridge).
        """
        leaf._check_fitted()
        if leaf.approximation is not None:
            raise RuntimeError(
                f"the leaf's final solve is approximate ({leaf.approximation}); its Gaussian-"
                "process view needs the exact solve (fit without approx_above)"
            )
        n = leaf.support_.shape[0]
        if self.factor_.shape != (n, n):
            xs = transform(leaf.support_, leaf.sqrt_m_)
            dtype = leaf.config.solve_dtype or xs.dtype
            reg, c = float(leaf.reg_), leaf.config.linear_mix
            for attempt in (dtype, torch.float64) if dtype != torch.float64 else (dtype,):
                # float64 from the distances on: float32 kernel values of rows close together
                # can be indefinite by more than a tiny ridge
                L = cholesky_factor(system_matrix(leaf.kernel, xs.to(attempt), reg, c))
                if L is not None:
                    break
            if L is None:
                raise RuntimeError(
                    f"the leaf's system matrix (n={n}, reg={reg:g}) is not positive "
                    "definite even in float64; fit with a larger reg"
                )
            self.factor_ = L
        return self.factor_

    @torch.no_grad()
    def fit(self, leaf: LeafView) -> LeafGP:
        """Fit the log-noise model on leave-one-out residuals and the marginal-likelihood scale.

        Costs one inverse from the cached factor (about two more factorizations).
        """
        L = self.factor(leaf)
        loo = loo_residuals(L, leaf.alpha_)
        beta, z_mean = noise_model(L, loo)
        dtype = leaf.alpha_.dtype
        self.noise_coef_, self.noise_mean_ = beta.to(dtype), z_mean.to(dtype)
        self.signal_var_ = signal_variance(L, leaf.alpha_).to(dtype)
        return self

    def moments(self, leaf: LeafView, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Mean (n, c), latent GP variance ``v`` (n,) and log-noise estimate ``g`` (n, c) at ``x``.

        ``v`` is in units of the process scale (``signal_var_`` times it is the GP's latent
        variance); rows are processed in chunks so that no more than the kernel's ``chunk_bytes``
        of (support x rows) intermediates exist at once. Differentiable in ``x``.
        """
        leaf._check_input(x)
        if not self.is_fitted:
            raise RuntimeError("the leaf has no posterior; call .fit_posterior() first")
        L = self.factor(leaf)
        per_row = leaf.support_.shape[0] * x.element_size() * 4
        parts = [
            moments(
                leaf.kernel,
                leaf.sqrt_m_,
                leaf.support_,
                x[rows],
                L,
                leaf.alpha_,
                self.noise_coef_,
                self.noise_mean_,
                leaf.config.linear_mix,
            )
            for rows in row_chunks(x.shape[0], per_row, leaf.kernel.chunk_bytes)
        ]
        mean, v, g = (torch.cat(p) for p in zip(*parts))
        if leaf.kind == "mean":
            mean = mean + leaf.offset_.to(mean.dtype)
        return mean, v, g
