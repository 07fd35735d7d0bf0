"""The Gaussian-process view of a fitted leaf, as a mixin of :class:`~xrfm_torch.leaf.LeafRFM`.

The numerics (posterior variance, leave-one-out noise model, marginal-likelihood scale) are pure
functions in :mod:`xrfm_torch.leaf.posterior`; this class holds what a leaf keeps for them (its
Cholesky factor, cached but not saved, and the noise model's buffers) and the methods that use
them, so that ``leaf/model.py`` holds the fit and the prediction of the leaf itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeVar

import torch
from torch import Tensor

from xrfm_torch.kernels import Kernel, transform
from xrfm_torch.kernels.distance import row_chunks
from xrfm_torch.leaf.posterior import (
    cholesky_factor,
    loo_residuals,
    moments,
    noise_model,
    signal_variance,
    system_matrix,
)
from xrfm_torch.numerics.state import ResizableBuffers

if TYPE_CHECKING:
    from xrfm_torch.leaf.config import LeafConfig

_View = TypeVar("_View", bound="LeafGPView")


class LeafGPView(ResizableBuffers):
    """Posterior factor, noise model and predictive moments of a leaf (see the module docstring).

    Buffers: ``noise_coef_`` (n, c) and ``noise_mean_`` (c,) of the log-noise model,
    ``signal_var_`` (c,) the marginal-likelihood scale (empty until :meth:`fit_posterior`), and
    ``factor_`` (n, n), the cached Cholesky factor (not persistent: as large as the kernel matrix).
    """

    # provided by LeafRFM
    config: LeafConfig
    kernel: Kernel
    support_: Tensor
    alpha_: Tensor
    sqrt_m_: Tensor
    reg_: Tensor
    noise_coef_: Tensor
    noise_mean_: Tensor
    signal_var_: Tensor
    factor_: Tensor
    if TYPE_CHECKING:

        @property
        def approximation(self) -> str | None: ...
        def _check_fitted(self) -> None: ...
        def _check_input(self, x: Tensor) -> None: ...
        def _offset(self, pred: Tensor) -> Tensor: ...

    def drop_factor(self) -> None:
        """Free the cached Cholesky factor (:meth:`posterior_factor` recomputes it on use)."""
        self.factor_ = self.factor_.new_empty(0, 0)

    def _forget_posterior(self) -> None:
        """Drop the factor and noise model (stale once the support or coefficients change)."""
        self.drop_factor()
        self.noise_coef_ = self.noise_coef_.new_empty(0, 0)
        self.noise_mean_ = self.noise_mean_.new_empty(0)
        self.signal_var_ = self.signal_var_.new_empty(0)

    @property
    def has_posterior(self) -> bool:
        """Whether :meth:`fit_posterior` has run for the current support."""
        return self.noise_coef_.numel() > 0

    @torch.no_grad()
    def posterior_factor(self) -> Tensor:
        """Lower Cholesky factor of ``K + U U^T + reg I`` on the support (cached), (n, n).

        In the leaf's dtype, or float64 where that factorization fails (a tiny ridge).
        """
        self._check_fitted()
        if self.approximation is not None:
            raise RuntimeError(
                f"the leaf's final solve is approximate ({self.approximation}); its Gaussian-"
                "process view needs the exact solve (fit without approx_above)"
            )
        n = self.support_.shape[0]
        if self.factor_.shape != (n, n):
            xs = transform(self.support_, self.sqrt_m_)
            dtype = self.config.solve_dtype or xs.dtype
            for attempt in (dtype, torch.float64) if dtype != torch.float64 else (dtype,):
                # float64 from the distances on: float32 kernel values of rows close together
                # can be indefinite by more than a tiny ridge
                A = system_matrix(
                    self.kernel, xs.to(attempt), float(self.reg_), self.config.linear_mix
                )
                L = cholesky_factor(A)
                if L is not None:
                    break
            if L is None:
                raise RuntimeError(
                    f"the leaf's system matrix (n={n}, reg={float(self.reg_):g}) is not positive "
                    "definite even in float64; fit with a larger reg"
                )
            self.factor_ = L
        return self.factor_

    @torch.no_grad()
    def fit_posterior(self: _View) -> _View:
        """Fit the log-noise model on leave-one-out residuals and the marginal-likelihood scale.

        Costs one inverse from the cached factor (about two more factorizations).
        """
        L = self.posterior_factor()
        loo = loo_residuals(L, self.alpha_)
        beta, z_mean = noise_model(L, loo)
        dtype = self.alpha_.dtype
        self.noise_coef_, self.noise_mean_ = beta.to(dtype), z_mean.to(dtype)
        self.signal_var_ = signal_variance(L, self.alpha_).to(dtype)
        return self

    def moments(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Mean (n, c), latent GP variance ``v`` (n,) and log-noise estimate ``g`` (n, c) at ``x``.

        ``v`` is in units of the process scale (``signal_var_`` times it is the GP's latent
        variance); rows are processed in chunks so that no more than the kernel's ``chunk_bytes``
        of (support x rows) intermediates exist at once. Differentiable in ``x``.
        """
        self._check_input(x)
        if not self.has_posterior:
            raise RuntimeError("the leaf has no posterior; call .fit_posterior() first")
        L = self.posterior_factor()
        per_row = self.support_.shape[0] * x.element_size() * 4
        parts = [
            moments(
                self.kernel,
                self.sqrt_m_,
                self.support_,
                x[rows],
                L,
                self.alpha_,
                self.noise_coef_,
                self.noise_mean_,
                self.config.linear_mix,
            )
            for rows in row_chunks(x.shape[0], per_row, self.kernel.chunk_bytes)
        ]
        mean, v, g = (torch.cat(p) for p in zip(*parts))
        return self._offset(mean), v, g
