"""LeafRFM: kernel ridge regression with AGOP feature learning (one leaf of the tree)."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import torch
from torch import Tensor

from xrfm_torch._checks import (
    as_float_matrix,
    as_float_targets,
    check_fraction,
    check_positive,
)
from xrfm_torch._state import ResizableBuffers, as_dtype
from xrfm_torch.agop import agop_from_grads
from xrfm_torch.iteration import run_iterations
from xrfm_torch.kernels import Kernel, chain_rule, make_kernel, transform
from xrfm_torch.linear import features_or_none, linear_grad, summed_predict
from xrfm_torch.selection import Candidate
from xrfm_torch.solvers import solve_bordered, solve_krr
from xrfm_torch.validation import fit_data


class LeafRFM(ResizableBuffers):
    """Recursive Feature Machine fitted in closed form on one leaf's data.

    For ``t = 0 .. tau`` (``tau = n_iters``): solve ``(K_{M_t}(X, X) + reg I) alpha_t = y``, measure the
    validation MSE ``E_t``, and (for ``t < tau``) set ``M_{t+1} = G_t / (eps + max G_t)`` with ``G_t``
    the AGOP of ``f_t`` at the training points (full or diagonal). The ``t*`` with the lowest ``E_t``
    is kept (the fit after the last AGOP update counts). ``tau = 0`` is plain kernel ridge regression.

    Args:
        kernel: Kernel prototype (copied, so each leaf owns its bandwidth), a name from
            :data:`xrfm_torch.kernels.KERNELS`, or ``None`` for Laplace with bandwidth 10.
        n_iters: ``tau``, the number of AGOP updates (>= 0).
        reg: Ridge ``lambda`` (absolute).
        diag: Learn a diagonal ``M`` (a vector, ``True``), a full matrix (``False``), or ``"auto"``:
            from ``G_0`` fit both at ``t = 1`` and continue with the one of lower validation error.
        eps: Normalization constant in ``G / (eps + max G)``.
        adaptive_bandwidth: If set, before each solve the bandwidth becomes this multiple of the median
            pairwise distance in the current M-space (2000-row subsample).
        early_stop_multiplier: Stop iterating once ``E_t > multiplier * min_s E_s``; ``None`` never stops.
        patience: Stop iterating after this many consecutive iterations that did not lower the best
            validation error by more than the relative ``tol`` (``None``: no limit). With a large
            ``n_iters`` the leaf keeps iterating while the error still falls and stops soon after it
            levels off. The lowest error is kept either way.
        tol: Relative improvement that resets the ``patience`` count (``E_t < (1 - tol) * best``).
        min_iters: ``patience`` applies only from this iteration on, so slow starters (error flat
            for a few iterations, then falling) still get the first ``min_iters`` updates.
        solve_dtype: Dtype of the Cholesky solve (``None`` = input dtype, or ``"float64"``).
        val_fraction: Share of the rows held out for ``t*`` selection when no validation data is given.
        iter_rows: Learn ``M`` on at most this many rows: with more training rows, the iterations and
            the ``t*`` selection run on a seeded random subsample of this size, and the chosen ``M``
            and bandwidth then get one solve on all rows. The cost of a leaf of ``n`` rows becomes
            ``(tau + 1)`` solves of size ``iter_rows`` plus one of size ``n`` instead of ``tau + 1``
            of size ``n``. ``None``: always iterate on all rows.
        bandwidth_factors: After the iterations, re-solve the selected ``M`` with the bandwidth
            multiplied by each of these factors and keep the lowest validation error (``None``: the
            kernel's bandwidth only).
        kernel_exponents: Likewise for the kernel exponent ``q`` (``exp(-(r / L)^q)``): each value
            competes with the kernel's own ``q`` (values above the kernel's ``p`` are skipped). One
            solve per candidate pair ``(q, factor)``, the distance matrix computed once; the
            iterations themselves (``M``, ``t*``) use the kernel's own ``q`` and bandwidth.
        reg_factors: Likewise for the ridge: multiples of ``reg`` for the selected ``M`` and kernel
            (after the exponent and bandwidth choice), searched from ``reg`` outwards while the
            validation error falls (upwards first). The chosen value is ``reg_``, used by
            :meth:`refit`.
        kernel_margin: The exponent / bandwidth grid's lowest validation MSE replaces the
            iterations' own kernel only if it is lower by at least this many paired standard
            errors of the per-row squared errors (:func:`xrfm_torch.selection.beats`): a kernel
            chosen on a few outlying validation rows does not carry over. ``0``: any improvement.
        linear_mix: Weight ``c`` of a constant + linear part in the leaf kernel,
            ``k(x, z) + c (1 + <S x, S z> / d)`` (:mod:`xrfm_torch.linear`), used in every solve,
            prediction and gradient of the leaf. Away from the training rows the leaf then follows
            the linear trend instead of falling back to the mean. ``0``: the kernel alone.
        pcg_tol: Target relative residual (CG's recursive estimate) of the warm solves: an
            iteration in the layout of the last factored learned-``M`` iteration, and a ridge
            step within 10x of a factored ridge, are solved by conjugate gradients
            preconditioned with that Cholesky factor (:func:`xrfm_torch.solvers.pcg_krr`),
            falling back to a fresh factorization when they do not get there within
            ``n // 300`` steps. Once ``M`` settles this replaces an ``O(n^3)`` factorization by
            a few ``O(n^2)`` passes; the solution differs from the factored one at the level of
            float32 rounding. Leaves below 1500 rows always factor. ``None``: always factor.

    Buffers (after ``fit``):
        ``support_`` (n, d), ``alpha_`` (n, c), ``sqrt_m_`` (d,) or (d, d), ``best_iter_`` (),
        ``val_errors_`` (tau + 1,) with NaN for iterations not run, ``reg_`` () the ridge in use;
        the bandwidth is ``kernel.bandwidth``.
    """

    support_: Tensor
    alpha_: Tensor
    sqrt_m_: Tensor
    best_iter_: Tensor
    val_errors_: Tensor
    reg_: Tensor

    def __init__(
        self,
        kernel: Kernel | str | None = None,
        *,
        n_iters: int = 5,
        reg: float = 1e-3,
        diag: bool | str = True,
        eps: float = 1e-30,
        adaptive_bandwidth: float | None = None,
        early_stop_multiplier: float | None = 1.1,
        patience: int | None = None,
        tol: float = 1e-3,
        min_iters: int = 0,
        solve_dtype: torch.dtype | str | None = None,
        val_fraction: float = 0.2,
        iter_rows: int | None = None,
        bandwidth_factors: Sequence[float] | None = None,
        kernel_exponents: Sequence[float] | None = None,
        reg_factors: Sequence[float] | None = None,
        kernel_margin: float = 2.0,
        linear_mix: float = 0.0,
        pcg_tol: float | None = 1e-4,
    ) -> None:
        super().__init__()
        if int(n_iters) != n_iters or n_iters < 0:
            raise ValueError(f"n_iters must be a non-negative integer, got {n_iters!r}")
        self.kernel = copy.deepcopy(make_kernel(kernel))
        # the prototype's exponent and bandwidth: every fit starts from these, whatever an
        # earlier fit selected (bandwidth_factors, kernel_exponents, adaptive_bandwidth)
        self._kernel_start = (self.kernel.q, float(self.kernel.bandwidth))
        self.n_iters = int(n_iters)
        self.reg = check_positive(reg, "reg", allow_zero=True)
        if diag not in (True, False, "auto"):
            raise ValueError(f"diag must be True, False or 'auto', got {diag!r}")
        self.diag: bool | str = diag
        self._chosen_diag = diag is not False
        self.eps = check_positive(eps, "eps", allow_zero=True)
        self.adaptive_bandwidth = (
            None
            if adaptive_bandwidth is None
            else check_positive(adaptive_bandwidth, "adaptive_bandwidth")
        )
        if early_stop_multiplier is not None and float(early_stop_multiplier) < 1.0:
            raise ValueError(
                f"early_stop_multiplier must be >= 1 or None, got {early_stop_multiplier!r}"
            )
        self.early_stop_multiplier = early_stop_multiplier
        if patience is not None and (int(patience) != patience or patience < 1):
            raise ValueError(f"patience must be a positive integer or None, got {patience!r}")
        self.patience = None if patience is None else int(patience)
        if not 0.0 <= float(tol) < 1.0:
            raise ValueError(f"tol must be in [0, 1), got {tol!r}")
        self.tol = float(tol)
        if int(min_iters) != min_iters or min_iters < 0:
            raise ValueError(f"min_iters must be a non-negative integer, got {min_iters!r}")
        self.min_iters = int(min_iters)
        self.solve_dtype = as_dtype(solve_dtype, "solve_dtype")
        self.val_fraction = check_fraction(val_fraction, "val_fraction", high=0.9)
        if iter_rows is not None and (int(iter_rows) != iter_rows or iter_rows < 2):
            raise ValueError(f"iter_rows must be an integer >= 2 or None, got {iter_rows!r}")
        self.iter_rows = None if iter_rows is None else int(iter_rows)
        self.bandwidth_factors = (
            None
            if bandwidth_factors is None
            else tuple(check_positive(f, "bandwidth_factors entry") for f in bandwidth_factors)
        )
        self.kernel_exponents = (
            None
            if kernel_exponents is None
            else tuple(check_positive(q, "kernel_exponents entry") for q in kernel_exponents)
        )
        self.reg_factors = (
            None
            if reg_factors is None
            else tuple(check_positive(f, "reg_factors entry") for f in reg_factors)
        )
        self.kernel_margin = check_positive(kernel_margin, "kernel_margin", allow_zero=True)
        self.linear_mix = check_positive(linear_mix, "linear_mix", allow_zero=True)
        if pcg_tol is not None and not 0.0 < float(pcg_tol) < 1.0:
            raise ValueError(f"pcg_tol must be in (0, 1) or None, got {pcg_tol!r}")
        self.pcg_tol = None if pcg_tol is None else float(pcg_tol)
        self.register_buffer("support_", torch.empty(0, 0))
        self.register_buffer("alpha_", torch.empty(0, 0))
        self.register_buffer("sqrt_m_", torch.empty(0))
        self.register_buffer("best_iter_", torch.tensor(-1))
        self.register_buffer("val_errors_", torch.empty(0))
        self.register_buffer("reg_", torch.tensor(self.reg, dtype=torch.float64))

    # ---- state ---------------------------------------------------------------------------------
    @property
    def is_fitted(self) -> bool:
        """Whether ``fit`` (or a state-dict load of a fitted leaf) has happened."""
        return self.support_.numel() > 0

    def _check_fitted(self) -> None:
        if not self.is_fitted:
            raise RuntimeError("LeafRFM is not fitted; call .fit(X, y) first")

    @property
    def M(self) -> Tensor:
        """The learned feature matrix: shape (d,) for diagonal ``M`` or (d, d)."""
        self._check_fitted()
        s = self.sqrt_m_
        return s * s if s.ndim == 1 else s @ s

    @property
    def bandwidth(self) -> float:
        """The bandwidth used by the selected model."""
        return float(self.kernel.bandwidth)

    # ---- fitting -------------------------------------------------------------------------------
    def fit(
        self,
        X: Tensor,
        y: Tensor,
        X_val: Tensor | None = None,
        y_val: Tensor | None = None,
        *,
        generator: torch.Generator | None = None,
        final_solve: bool = True,
        extra: tuple[Tensor, Tensor] | None = None,
    ) -> LeafRFM:
        """Run the RFM iterations and keep the iteration with the lowest validation MSE.

        Args:
            X: Training inputs, shape (n, d).
            y: Targets, shape (n,) or (n, c).
            X_val: Validation inputs, shape (n_val, d); if ``None`` a seeded ``val_fraction`` of the
                rows is held out (they are then added back by a final refit with the chosen ``M``).
            y_val: Validation targets, shape (n_val,) or (n_val, c).
            generator: CPU random generator for the hold-out, ``iter_rows`` and bandwidth subsamples.
            final_solve: Re-solve on all of ``X`` when the iterations saw fewer rows (a hold-out or
                the ``iter_rows`` subsample). ``False`` leaves that solve to the caller (the tree
                does one solve per leaf that also adds borrowed validation rows).
            extra: ``(X_extra, y_extra)``: rows that join only the final solve (the tree's overlap
                and borrowed rows); the support becomes the fitted rows followed by these. When
                the post-hoc search leaves the chosen model's factorization at hand, that solve
                continues it (:func:`xrfm_torch.solvers.solve_bordered`, ``O(n^2 b)`` for ``b``
                extra rows) instead of factoring ``n + b`` rows afresh. Only without a hold-out
                or ``iter_rows`` subsample (whose rows would need the same final solve).

        Returns:
            ``self``.
        """
        data = fit_data(
            X, y, X_val, y_val, val_fraction=self.val_fraction, generator=generator, min_rows=1
        )
        X_all, y_all = data.X, data.y
        X, y = X_all, y_all
        if data.holdout is not None:
            X, y = X[~data.holdout], y[~data.holdout]
        if self.iter_rows is not None and X.shape[0] > self.iter_rows:
            keep = torch.randperm(X.shape[0], generator=generator)[: self.iter_rows].to(X.device)
            X, y = X[keep], y[keep]
        if extra is not None and X.shape[0] < X_all.shape[0]:
            raise ValueError("extra rows need a fit on all of X (validation data, no iter_rows)")
        best, self.val_errors_, self._chosen_diag, factored = run_iterations(
            self, X, y, data.X_val, data.y_val, generator
        )
        self._store(X, best)
        if extra is not None and extra[0].shape[0] > 0:
            X_b = as_float_matrix(extra[0], "extra X", n_features=X.shape[1]).to(X)
            y_b = as_float_targets(extra[1], "extra y", n_rows=X_b.shape[0], dtype=X.dtype)
            self._extend(X, y, X_b, y_b.reshape(X_b.shape[0], -1), factored)
        elif final_solve and X.shape[0] < X_all.shape[0]:
            self.refit(X_all, y_all)
        return self

    @torch.no_grad()
    def _extend(
        self, X: Tensor, y: Tensor, X_b: Tensor, y_b: Tensor, factored: tuple[Tensor, Tensor] | None
    ) -> None:
        """Final solve on ``X`` then ``X_b``: continue the chosen model's factor when at hand."""
        X_all, y_all = torch.cat([X, X_b]), torch.cat([y, y_b])
        alpha = None
        if factored is not None:
            K_ss, F = factored
            xs, xb = transform(X, self.sqrt_m_), transform(X_b, self.sqrt_m_)
            K_sb = self.kernel.from_distance(self.kernel.distance(xs, xb))  # (n, b)
            K_bb = self.kernel.from_distance(self.kernel.distance(xb, xb))  # (b, b)
            U = features_or_none(torch.cat([xs, xb]), self.linear_mix)
            alpha = solve_bordered(F, K_ss, K_sb, K_bb, y_all, float(self.reg_), features=U)
        if alpha is None:
            self.refit(X_all, y_all)
            return
        self.alpha_ = alpha
        self.support_ = X_all.detach().clone()

    def _store(self, X: Tensor, best: Candidate) -> None:
        d = X.shape[1]
        sqrt_m = best.sqrt_m
        if sqrt_m is None:  # t* = 0: identity, in the same layout as the learned M
            diag = self._chosen_diag
            sqrt_m = torch.ones(d, dtype=X.dtype) if diag else torch.eye(d, dtype=X.dtype)
        self.kernel.bandwidth.fill_(best.bandwidth)
        self.support_ = X.detach().clone()
        self.alpha_ = best.alpha.detach()
        self.reg_ = torch.tensor(best.reg, dtype=torch.float64, device=X.device)
        self.sqrt_m_ = sqrt_m.detach().to(device=X.device, dtype=X.dtype)
        self.best_iter_ = torch.tensor(best.t, device=X.device)

    @torch.no_grad()
    def refit(self, X: Tensor, y: Tensor) -> LeafRFM:
        """Re-solve ``alpha`` on new rows with the selected ``M`` and bandwidth (one KRR solve).

        Used to add validation rows that were borrowed from training back into the fit.

        Args:
            X: Inputs, shape (n, d).
            y: Targets, shape (n,) or (n, c).
        """
        self._check_fitted()
        X = as_float_matrix(X, "X", n_features=self.support_.shape[1])
        y = as_float_targets(y, "y", n_rows=X.shape[0], dtype=X.dtype)
        xs = transform(X, self.sqrt_m_)
        R = self.kernel.distance(xs, xs)  # (n, n); the kernel values overwrite it: one buffer
        K = self.kernel.from_distance(R, out=R)
        self.alpha_ = solve_krr(
            K,
            y,
            float(self.reg_),
            solve_dtype=self.solve_dtype,
            features=features_or_none(xs, self.linear_mix),
        )
        self.support_ = X.detach().clone()
        return self

    def _support_linear_grad(self) -> Tensor | float:
        """Input gradient of the fitted leaf's linear part, (1, c, d), or 0 when it is off."""
        s = self.sqrt_m_
        g = linear_grad(transform(self.support_, s), self.alpha_, self.linear_mix)
        return 0.0 if g is None else chain_rule(g, s)

    # ---- prediction and interpretation ---------------------------------------------------------
    def _check_input(self, x: Tensor) -> None:
        self._check_fitted()
        if x.ndim != 2 or x.shape[1] != self.support_.shape[1]:
            raise ValueError(
                f"expected input of shape (n, {self.support_.shape[1]}), got {tuple(x.shape)}"
            )
        if x.dtype != self.support_.dtype:
            raise TypeError(
                f"input dtype {x.dtype} does not match the model dtype {self.support_.dtype}; "
                "cast the input or call .to(dtype) on the model"
            )

    def forward(self, x: Tensor) -> Tensor:
        """Predict ``K(S x, S X_support) alpha``.

        Args:
            x: Inputs, shape (n, d).

        Returns:
            Predictions, shape (n, c).
        """
        self._check_input(x)
        s = self.sqrt_m_
        xs, zs = transform(x, s), transform(self.support_, s)
        return summed_predict(self.kernel, xs, zs, self.alpha_, self.linear_mix)

    def get_grads(self, x: Tensor) -> Tensor:
        """Input gradients of the leaf predictor, shape (n, c, d) (no autograd needed)."""
        self._check_input(x)
        g = self.kernel.function_grads(x, self.support_, self.alpha_, self.sqrt_m_)
        return g + self._support_linear_grad()

    def agop(self, x: Tensor | None = None, *, diag: bool = False) -> Tensor:
        """AGOP of the fitted predictor at ``x`` (default: its support points, self-terms excluded).

        Returns:
            Shape (d, d), or (d,) when ``diag``.
        """
        self._check_fitted()
        if x is None:
            g = self.kernel.function_grads(
                self.support_, self.support_, self.alpha_, self.sqrt_m_, exclude_self=True
            )
            g = g + self._support_linear_grad()
        else:
            g = self.get_grads(x)
        return agop_from_grads(g, diag=diag)
