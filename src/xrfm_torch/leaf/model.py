"""LeafRFM: kernel ridge regression with AGOP feature learning (one leaf of the tree)."""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch
from torch import Tensor

from xrfm_torch.kernels import Kernel, make_kernel
from xrfm_torch.kernels.fourier import fourier_frequencies
from xrfm_torch.leaf.approx import approx_width
from xrfm_torch.leaf.approx_iteration import run_approx_iterations
from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.leaf.data import fit_data, weighted_rows
from xrfm_torch.leaf.gp import LeafGP
from xrfm_torch.leaf.iteration import run_iterations
from xrfm_torch.leaf.kinds import KINDS, SOLVES, KernelSolve, LeafKind, extend_solve, mean_beats
from xrfm_torch.leaf.selection import Candidate
from xrfm_torch.leaf.state import upgrade_leaf_state
from xrfm_torch.numerics.agop import agop_from_grads
from xrfm_torch.numerics.checks import as_float_matrix, as_float_targets, check_all_finite
from xrfm_torch.numerics.rng import own_generator
from xrfm_torch.numerics.state import ResizableBuffers

log = logging.getLogger(__name__)


class LeafRFM(ResizableBuffers):
    """Recursive Feature Machine fitted in closed form on one leaf's data.

    For ``t = 0 .. tau`` (``tau = config.n_iters``): solve ``(K_{M_t}(X, X) + reg I) alpha_t = y``,
    measure the validation MSE ``E_t``, and (for ``t < tau``) set ``M_{t+1} = G_t / (eps + max G_t)``
    with ``G_t`` the AGOP of ``f_t`` at the training points (full or diagonal). The ``t*`` with the
    lowest ``E_t`` is kept (the fit after the last AGOP update counts); then the kernel exponent
    and ridge are searched for that ``M`` (:mod:`xrfm_torch.leaf.selection`).

    Args:
        kernel: Kernel prototype (copied, so each leaf owns its bandwidth), a name from
            :data:`xrfm_torch.kernels.KERNELS`, or ``None`` for Laplace with bandwidth 10.
        config: The leaf's hyperparameters (:class:`~xrfm_torch.leaf.config.LeafConfig`; default:
            the tuned defaults, ``LeafConfig()``).

    Buffers (after ``fit``):
        ``support_`` (n, d), ``alpha_`` (n, c), ``sqrt_m_`` (d,) or (d, d), ``best_iter_`` (),
        ``val_errors_`` (tau + 1,) with NaN for iterations not run, ``reg_`` () the ridge in use;
        the bandwidth is ``kernel.bandwidth``. ``kind_`` () is the index of the final solve's
        kind in :data:`~xrfm_torch.leaf.kinds.KINDS` (:attr:`kind`; each kind's solve and
        prediction are in :mod:`xrfm_torch.leaf.kinds`): ``"exact"``; ``"nystrom"`` or
        ``"centroids"`` (the support holds the centres); ``"fourier"`` (frequencies
        ``fourier_w_`` (d, D) and phases ``fourier_b_`` (D,), ``alpha_`` the feature weights);
        ``"mean"``, the fallback where the leaf's mean beat the fitted model on the validation
        rows (``alpha_`` is 0 and ``offset_`` (c,) holds the mean; never for a leaf fitted for a
        posterior). The Gaussian-process view is the submodule ``gp``
        (:class:`~xrfm_torch.leaf.gp.LeafGP`, after :meth:`fit_posterior`).

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> X = torch.randn(300, 3, generator=g); y = X[:, 0].sin()
        >>> leaf = LeafRFM("laplace", LeafConfig.plain(n_iters=2)).fit(X, y, generator=g)
        >>> int(leaf.best_iter_) in (0, 1, 2), leaf(X[:4]).shape
        (True, torch.Size([4, 1]))
    """

    support_: Tensor
    alpha_: Tensor
    sqrt_m_: Tensor
    best_iter_: Tensor
    val_errors_: Tensor
    reg_: Tensor
    kind_: Tensor
    offset_: Tensor
    fourier_w_: Tensor
    fourier_b_: Tensor

    def __init__(
        self, kernel: Kernel | str | None = None, config: LeafConfig | None = None
    ) -> None:
        super().__init__()
        if config is not None and not isinstance(config, LeafConfig):
            raise TypeError(f"config must be a LeafConfig, got {type(config).__name__}")
        self.config = LeafConfig() if config is None else config
        self.kernel = copy.deepcopy(make_kernel(kernel))
        # the prototype's exponent and bandwidth: every fit starts from these, whatever an
        # earlier fit selected (bandwidth_factors, kernel_exponents, adaptive_bandwidth)
        self._kernel_start = (self.kernel.q, float(self.kernel.bandwidth))
        self._chosen_diag = self.config.diag is not False
        #: Keep the final solve's Cholesky factor for :meth:`fit_posterior` (the tree sets it
        #: when it fits posteriors; otherwise the factor, as large as the kernel matrix, is freed).
        self.keep_factor = False
        self.register_buffer("support_", torch.empty(0, 0))
        self.register_buffer("alpha_", torch.empty(0, 0))
        self.register_buffer("sqrt_m_", torch.empty(0))
        self.register_buffer("best_iter_", torch.tensor(-1))
        self.register_buffer("val_errors_", torch.empty(0))
        self.register_buffer("reg_", torch.tensor(self.config.reg, dtype=torch.float64))
        self.register_buffer("kind_", torch.tensor(0))
        # the kind as Python data too: forward branches on it without reading a tensor (which
        # torch.export could not trace); kept equal to ``kind_`` by _set_kind and loading
        self._kind: LeafKind = "exact"
        self.register_buffer("offset_", torch.empty(0))
        self.register_buffer("fourier_w_", torch.empty(0, 0))
        self.register_buffer("fourier_b_", torch.empty(0))
        #: Seed of the random Fourier features of the final solve (drawn by ``fit``).
        self._fourier_seed = 0
        self.gp = LeafGP()

    def _load_from_state_dict(self, state_dict: dict, prefix: str, *args: Any) -> None:
        upgrade_leaf_state(state_dict, prefix)
        code = int(state_dict[prefix + "kind_"])
        if not 0 <= code < len(KINDS):
            raise ValueError(f"leaf {prefix!r}: kind_ {code} is not one of 0 .. {len(KINDS) - 1}")
        self._kind = KINDS[code]
        self.gp.forget()
        super()._load_from_state_dict(state_dict, prefix, *args)

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

    @property
    def kind(self) -> LeafKind:
        """The kind of the final solve (:data:`~xrfm_torch.leaf.kinds.KINDS`)."""
        return self._kind

    @property
    def approximation(self) -> str | None:
        """The approximate final solve in use (``LeafConfig.approx``), or ``None``."""
        kind = self.kind
        return None if kind in ("exact", "mean") else kind

    @property
    def is_constant(self) -> bool:
        """Whether the leaf fell back to its mean predictor (kind ``"mean"``, ``offset_``)."""
        return self.kind == "mean"

    def _solve(self) -> KernelSolve:
        return SOLVES[self.kind]

    def _set_kind(self, kind: LeafKind) -> None:
        """Record the final solve's kind; drop the buffers of the other kinds and the GP view."""
        self.kind_ = torch.tensor(KINDS.index(kind), device=self.kind_.device)
        self._kind = kind
        if kind != "fourier":
            self.fourier_w_ = self.fourier_w_.new_empty(0, 0)
            self.fourier_b_ = self.fourier_b_.new_empty(0)
        if kind != "mean":
            self.offset_ = self.offset_.new_empty(0)
        self.gp.forget()

    # ---- fitting -------------------------------------------------------------------------------
    def fit(
        self,
        X: Tensor,
        y: Tensor,
        X_val: Tensor | None = None,
        y_val: Tensor | None = None,
        *,
        sample_weight: Tensor | None = None,
        val_sample_weight: Tensor | None = None,
        generator: torch.Generator | None = None,
        final_solve: bool = True,
        extra: tuple[Tensor, Tensor] | None = None,
        extra_weight: Tensor | None = None,
        start_sqrt_m: Tensor | None = None,
        check_input: bool = True,
    ) -> LeafRFM:
        """Run the RFM iterations and keep the iteration with the lowest validation MSE.

        With ``sample_weight`` every solve minimizes ``sum_i w_i (y_i - f(x_i))^2 + reg ||f||^2``
        (ridge ``reg / w_i`` on row ``i``, :func:`~xrfm_torch.numerics.solvers.solve_krr`; integer
        weights fit exactly the rows repeated), the AGOP is the weighted mean over the rows, and
        every validation error is weighted by ``val_sample_weight`` (held-out rows keep their
        own). The weights are used as given (not rescaled: the ridge is absolute). Rows of weight
        0 are dropped.

        Args:
            X: Training inputs, shape (n, d).
            y: Targets, shape (n,) or (n, c).
            X_val: Validation inputs, shape (n_val, d); if ``None`` a seeded ``val_fraction`` of the
                rows is held out (they are then added back by a final refit with the chosen ``M``).
            y_val: Validation targets, shape (n_val,) or (n_val, c).
            sample_weight: Training row weights (n,), finite, non-negative, not all 0.
            val_sample_weight: Validation row weights (n_val,) (needs ``X_val``).
            generator: CPU random generator for the hold-out, ``iter_rows`` and bandwidth subsamples
                (default: a new one seeded with ``torch.initial_seed()``; the global one is untouched).
            final_solve: Re-solve on all of ``X`` when the iterations saw fewer rows (a hold-out or
                the ``iter_rows`` subsample). ``False`` leaves that solve to the caller (the tree
                does one solve per leaf that also adds borrowed validation rows).
            extra: ``(X_extra, y_extra)``: rows that join only the final solve (the tree's overlap
                and borrowed rows); the support becomes the fitted rows followed by these. When
                the post-hoc search leaves the chosen model's factorization at hand, that solve
                continues it (:func:`xrfm_torch.numerics.warm_solves.solve_bordered`, ``O(n^2 b)`` for ``b``
                extra rows) instead of factoring ``n + b`` rows afresh. Only without a hold-out
                or ``iter_rows`` subsample (whose rows would need the same final solve).
            extra_weight: The weights of the ``extra`` rows (b,), given with ``sample_weight``.
            start_sqrt_m: ``sqrt(M)`` of ``t = 0``, (d,) or (d, d), also fixing the layout
                (``None``: the identity); a later bag starts from the first bag's leaves. The
                exact iterations use it (``approx_iters`` start from the identity).
            check_input: ``False`` skips checking the rows' values (finite inputs and targets,
                the extra rows' too) that the caller checked already: a tree checks each input
                map's rows once for all its leaves (each check is a read, a wait on a GPU).
                Shapes, dtypes and weights are checked either way.

        Returns:
            ``self``.
        """
        cfg = self.config
        generator = own_generator(generator)
        data = fit_data(
            X,
            y,
            X_val,
            y_val,
            val_fraction=cfg.val_fraction,
            generator=generator,
            min_rows=1,
            sample_weight=sample_weight,
            val_sample_weight=val_sample_weight,
            check_values=check_input,
        )
        if data.w is not None and self.keep_factor:
            raise ValueError(
                "sample weights and a Gaussian-process posterior (keep_factor, the tree's "
                "uncertainty) cannot be combined: the posterior's noise model is unweighted"
            )
        if (extra_weight is not None) != (extra is not None and data.w is not None):
            raise ValueError(
                "extra_weight must be given exactly when extra rows join a weighted fit"
            )
        X_all, y_all, w_all = data.X, data.y, data.w
        X, y, w = X_rows, y_rows, w_rows = data.learning_rows()  # (those of approx_iters)
        if cfg.iter_rows is not None and X.shape[0] > cfg.iter_rows:
            keep = torch.randperm(X.shape[0], generator=generator)[: cfg.iter_rows].to(X.device)
            X, y, w = X[keep], y[keep], None if w is None else w[keep]
        if extra is not None and X.shape[0] < X_all.shape[0]:
            raise ValueError("extra rows need a fit on all of X (validation data, no iter_rows)")
        if cfg.approx_above is not None and cfg.approx == "fourier":  # (only then: same streams)
            self._fourier_seed = int(torch.randint(2**62, (1,), generator=generator))
        self.kernel.q = self._kernel_start[0]
        self.kernel.bandwidth.fill_(self._kernel_start[1])
        d = X.shape[1]
        if start_sqrt_m is not None:
            if tuple(start_sqrt_m.shape) not in ((d,), (d, d)):
                raise ValueError(
                    f"start_sqrt_m must have shape ({d},) or ({d}, {d}), "
                    f"got {tuple(start_sqrt_m.shape)}"
                )
            start_sqrt_m = start_sqrt_m.to(X)
        if (
            cfg.approx_iters
            and not self.keep_factor
            and approx_width(cfg, X.shape[0], X_rows.shape[0], d) is not None
        ):
            best, self.val_errors_, self._chosen_diag = run_approx_iterations(
                self.kernel,
                cfg,
                X_rows,
                y_rows,
                data.X_val,
                data.y_val,
                X,
                self._fourier_seed,
                weights=(w_rows, data.w_val),
            )
            factored = None
            self._store_approx(X, best)
        else:
            fitted = run_iterations(
                self.kernel,
                cfg,
                X,
                y,
                data.X_val,
                data.y_val,
                generator,
                (w, data.w_val),
                start_sqrt_m,
            )
            best, self.val_errors_, self._chosen_diag, factored = fitted
            self._store(X, best)
        # (not in a leaf kept for a posterior: its Gaussian-process view is the kernel model's)
        criterion = cfg.criterion
        if not self.keep_factor and mean_beats(best, y, data.y_val, w, data.w_val, criterion):
            factored = None
            SOLVES["mean"].solve(self, X, y, w)
        if self.keep_factor and factored is not None:
            self.gp.keep(factored[1], X.shape[0])
        if extra is not None and extra[0].shape[0] > 0:
            X_b = as_float_matrix(extra[0], "extra X", n_features=X.shape[1], finite=False).to(X)
            y_b = as_float_targets(
                extra[1], "extra y", n_rows=X_b.shape[0], dtype=X.dtype, finite=False
            )
            if check_input:
                check_all_finite([(X_b, "extra X", False), (y_b, "extra y", False)])  # one read
            X_b, y_b, w_b = weighted_rows(X_b, y_b, extra_weight, "extra_weight")
            extend_solve(self, X, y, X_b, y_b, factored, w, w_b)
        elif final_solve and X.shape[0] < X_all.shape[0]:
            self.refit(X_all, y_all, w_all, check_input=False)  # rows checked above
        return self

    def _store(self, X: Tensor, best: Candidate) -> None:
        d = X.shape[1]
        sqrt_m = best.sqrt_m
        if sqrt_m is None:  # t* = 0: identity, in the same layout as the learned M
            diag = self._chosen_diag
            sqrt_m = torch.ones(d, dtype=X.dtype) if diag else torch.eye(d, dtype=X.dtype)
        self.kernel.bandwidth.fill_(best.bandwidth)
        self.support_ = X.detach().clone()
        # row-major like a loaded state, so a reloaded leaf predicts bit for bit the same (the
        # solver's column-major layout would change BLAS's summation order for c > 1 outputs)
        self.alpha_ = best.alpha.detach().contiguous()
        # filled on the device (a tensor made from a number would be copied there)
        self.reg_ = torch.full((), best.reg, dtype=torch.float64, device=X.device)
        self.sqrt_m_ = sqrt_m.detach().to(device=X.device, dtype=X.dtype)
        self.best_iter_ = torch.full((), best.t, dtype=torch.long, device=X.device)
        self._set_kind("exact")

    def _store_approx(self, centres: Tensor, best: Candidate) -> None:
        """Keep the approximate iterations' choice, ready to predict before any refit.

        The centres (the iteration rows) as support, its coefficients, and for ``"fourier"`` the
        frequencies and phases drawn again from the leaf's seed (those its solves used).
        """
        cfg = self.config
        self._store(centres, best)
        if cfg.approx == "fourier":
            w, b = fourier_frequencies(
                centres.shape[1],
                cfg.fourier_features,
                float(self.kernel.q),
                float(self.kernel.bandwidth),
                generator=torch.Generator().manual_seed(self._fourier_seed),
                dtype=centres.dtype,
            )
        self._set_kind(cfg.approx)
        if cfg.approx == "fourier":
            self.fourier_w_, self.fourier_b_ = w.to(centres.device), b.to(centres.device)

    @torch.no_grad()
    def refit(
        self,
        X: Tensor,
        y: Tensor,
        sample_weight: Tensor | None = None,
        *,
        check_input: bool = True,
    ) -> LeafRFM:
        """Re-solve ``alpha`` on new rows with the selected ``M`` and bandwidth (one KRR solve).

        Used to add validation rows that were borrowed from training back into the fit.

        Args:
            X: Inputs, shape (n, d).
            y: Targets, shape (n,) or (n, c).
            sample_weight: Row weights (n,) (as in :meth:`fit`; rows of weight 0 are dropped).
            check_input: ``False`` skips checking the values (finite ``X`` and ``y``, valid
                weights, none 0) of rows the caller has checked already: a leaf's own final
                solve, a tree's (each a read back, a wait on a GPU). Shapes and dtypes are
                checked either way; ``sample_weight`` is then used as given.
        """
        self._check_fitted()
        X = as_float_matrix(X, "X", n_features=self.support_.shape[1], finite=check_input)
        y = as_float_targets(y, "y", n_rows=X.shape[0], dtype=X.dtype, finite=check_input)
        w = sample_weight
        if check_input:
            X, y, w = weighted_rows(X, y, sample_weight, "sample_weight")
        if w is not None and self.keep_factor:
            raise ValueError("sample weights and a kept posterior factor cannot be combined")
        n_fit, (n, d) = self.support_.shape[0], X.shape
        kind: LeafKind = "exact"
        if self.is_constant:
            kind = "mean"
        elif not self.keep_factor and approx_width(self.config, n_fit, n, d) is not None:
            log.debug("%s final solve: %d rows over %d", self.config.approx, n, n_fit)
            kind = self.config.approx
        SOLVES[kind].solve(self, X, y, w)
        return self

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
        """Predict with the final solve's kind (``K(S x, S X_support) alpha`` when exact).

        Args:
            x: Inputs, shape (n, d).

        Returns:
            Predictions, shape (n, c).
        """
        self._check_input(x)
        return self._solve().predict(self, x)

    def input_grads(self, x: Tensor) -> Tensor:
        """Input gradients of the leaf predictor, shape (n, c, d) (no autograd needed)."""
        self._check_input(x)
        return self._solve().grads(self, x)

    def agop(self, x: Tensor | None = None, *, diag: bool = False) -> Tensor:
        """AGOP of the fitted predictor at ``x`` (default: its support points, self-terms excluded).

        Returns:
            Shape (d, d), or (d,) when ``diag``.
        """
        self._check_fitted()
        if x is not None:
            self._check_input(x)
        return agop_from_grads(self._solve().grads(self, x), diag=diag)

    # ---- the Gaussian-process view (``gp``) ----------------------------------------------------
    def fit_posterior(self) -> LeafRFM:
        """Fit the leaf's Gaussian-process view (:meth:`LeafGP.fit <xrfm_torch.leaf.gp.LeafGP.fit>`)."""
        self.gp.fit(self)
        return self

    def moments(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Posterior mean, latent variance and log-noise at ``x`` (:meth:`LeafGP.moments`)."""
        return self.gp.moments(self, x)
