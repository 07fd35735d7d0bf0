"""A leaf's hyperparameters, described once: :class:`LeafConfig` holds them and their defaults.

:class:`~xrfm_torch.leaf.LeafRFM` takes a ``LeafConfig``, :class:`~xrfm_torch.xRFMTree` takes one
(``leaf=``) and hands it to every leaf, and the Hydra model config instantiates one (``model.leaf``),
so the defaults below are the only ones. They are the tuned settings; :meth:`LeafConfig.plain` is
the fixed-budget RFM of the paper (used for the split model and the input-map probe).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import torch

from xrfm_torch.leaf.criteria import CRITERIA, Criterion
from xrfm_torch.numerics.checks import check_fraction, check_int, check_positive
from xrfm_torch.numerics.state import as_dtype

#: How a leaf's feature matrix ``M`` is shaped: diagonal (``True``), full (``False``), or chosen
#: per leaf by validation error at the first AGOP update (``"auto"``).
DiagMode = bool | Literal["auto"]
RidgeRule = Literal["validation", "gcv", "auto"]
#: An approximate final solve (:mod:`xrfm_torch.leaf.approx`) and where its centres come from.
Approx = Literal["nystrom", "centroids", "fourier"]
APPROXES: tuple[Approx, ...] = ("nystrom", "centroids", "fourier")
ApproxCentres = Literal["rows", "kmeans"]


#: The settings by group, in declaration order (docs, error messages, tests).
GROUPS: dict[str, tuple[str, ...]] = {
    "iteration": ("n_iters", "diag", "eps", "agop_ridge", "adaptive_bandwidth"),
    "stopping": ("early_stop_multiplier", "patience", "tol", "min_iters"),
    "solve": ("reg", "linear_mix", "solve_dtype", "pcg_tol", "criterion", "val_fraction"),
    "search": (
        "bandwidth_factors",
        "kernel_exponents",
        "reg_factors",
        "ridge_rule",
        "gcv_below",
        "kernel_margin",
    ),
    "approximation": (
        "iter_rows",
        "approx_above",
        "approx",
        "approx_centres",
        "fourier_features",
        "approx_iters",
    ),
}


def _floats(values: Iterable[float] | None, name: str) -> tuple[float, ...] | None:
    if values is None:
        return None
    return tuple(check_positive(v, f"{name} entry") for v in values)


def _optional_int(value: int | None, name: str, low: int) -> int | None:
    return None if value is None else check_int(value, name, low)


@dataclass(frozen=True, kw_only=True)
class LeafConfig:
    """Hyperparameters of one leaf's RFM fit (validated on construction; immutable).

    For ``t = 0 .. tau`` (``tau = n_iters``) a leaf solves
    ``(K_{M_t}(X, X) + c U U^T + reg I) alpha_t = y``, measures the validation MSE ``E_t`` and, for
    ``t < tau``, sets ``M_{t+1} = G_t / (eps + max G_t)`` with ``G_t`` the AGOP of ``f_t``; the
    ``t*`` of lowest ``E_t`` is kept. Then it searches kernel exponents and ridges for that ``M``.

    The settings come in five named groups (:data:`GROUPS`; keyword arguments only, one flat
    level so that ``LeafConfig(n_iters=10)`` and ``model.leaf.iter_rows=3000`` stay short):
    the RFM iteration, when it stops, each solve, the post-hoc search, and large leaves.

    Attributes:
        n_iters: ``tau``, the most AGOP updates (>= 0; 0 is plain kernel ridge regression).
        diag: Diagonal ``M`` (``True``), full (``False``) or ``"auto"``: from ``G_0`` fit both at
            ``t = 1`` and continue with the one of lower validation error (one extra solve).
        eps: Normalization constant in ``G / (eps + max G)``.
        agop_ridge: ``lambda_M``: every update is ``M = G / (eps + max G) + lambda_M I``, which
            penalizes off-diagonal structure (relative to the diagonal) and keeps all directions
            (0: the plain AGOP). The option of the GP-RFM uncertainty paper.
        adaptive_bandwidth: If set, before each solve the bandwidth becomes this multiple of the
            median pairwise distance in the current M-space (2000-row subsample).
        early_stop_multiplier: Stop once ``E_t > multiplier * min_s E_s``; ``None`` never stops.
        patience: Stop after this many iterations without lowering the best validation error by
            more than the relative ``tol`` (``None``: no limit); the best iteration is kept.
        tol: Relative improvement that resets the ``patience`` count.
        min_iters: ``patience`` applies from this iteration on, so slow starters (error flat for a
            few iterations, then falling) still get ``min_iters`` updates.
        reg: Ridge ``lambda`` (absolute).
        linear_mix: Weight ``c`` of a constant + linear part ``c (1 + <S x, S z> / d)`` added to
            the kernel in every solve, prediction and gradient (0: the kernel alone).
        solve_dtype: Dtype of the Cholesky solve (``None``: the input dtype; or ``"float64"``).
        pcg_tol: Target relative residual of the warm solves: an iteration in the layout of the
            last factored learned-``M`` iteration, and a ridge step within 10x of a factored one,
            run conjugate gradients preconditioned with that Cholesky factor and factor afresh
            only if CG does not converge within ``n // 300`` steps (leaves below 1500 rows always
            factor). ``None``: always factor.
        criterion: What every validation choice minimizes (:mod:`xrfm_torch.leaf.criteria`):
            ``"mse"`` (regression, and the Brier score of class codes), ``"logloss"`` or
            ``"error"`` (classification only).
        val_fraction: Share of the rows a leaf holds out for ``t*`` when given no validation data.
        bandwidth_factors: After the iterations, re-solve the chosen ``M`` with the bandwidth times
            each factor and keep the lowest validation error (``None``: off).
        kernel_exponents: Likewise for the exponent ``q`` of ``exp(-(r / L)^q)`` (values above the
            kernel's ``p`` are skipped; the distances are computed once).
        reg_factors: Then a walk over multiples of ``reg`` for the chosen kernel, upwards first,
            while the validation error falls; the chosen ridge is the leaf's ``reg_``.
        ridge_rule: How that ridge is chosen: ``"validation"`` (the walk above), ``"gcv"``:
            the minimizer of generalized cross-validation on the training rows over a log grid
            spanning the same multiples of ``reg`` (:mod:`xrfm_torch.numerics.risk`; one
            eigendecomposition of the leaf's kernel, no validation rows), or ``"auto"``: GCV for
            a leaf with fewer than ``gcv_below`` validation rows, the walk otherwise.
        gcv_below: The validation-row count under which ``"auto"`` takes GCV.
        kernel_margin: A new exponent or bandwidth replaces the iterations' own only if its
            validation MSE is lower by this many paired standard errors (0: any improvement).
        iter_rows: Learn ``M`` on a seeded subsample of at most this many rows, then solve once on
            all rows (``tau + 1`` small solves and one large instead of ``tau + 1`` large).
        approx_above: A final solve on more rows than this, by a leaf whose iterations used at
            most half of them (``iter_rows``), is the approximate solve ``approx`` of the learned
            kernel (``O(n b^2)`` instead of ``O(n^3)``; :mod:`xrfm_torch.leaf.approx`). Not with
            predictive uncertainty (the leaf posterior is the exact GP's). ``None``: off.
        approx: ``"nystrom"`` (KRR over ``b`` centres; the RBF-centroid linear model with the RFM
            kernel), ``"centroids"`` (the RBF-centroid model's pseudoinverse of the centres' features) or
            ``"fourier"`` (KRR on ``fourier_features`` random Fourier features of the learned
            kernel plus its linear part; the random-features kernel limit; Euclidean kernels only).
        approx_centres: The ``b`` centres of ``"nystrom"`` and ``"centroids"``: the iteration
            rows (``"rows"``) or k-means centres of all rows in the learned space, started from
            them (``"kmeans"``).
        fourier_features: ``D``, the number of random Fourier features.
        approx_iters: Where a leaf's final solve is approximate (``approx_above``), run the RFM
            iterations (AGOP included) and the post-hoc exponent and ridge searches on the same
            approximation over all of the leaf's rows too, instead of exactly on the
            ``iter_rows`` subsample (:mod:`xrfm_torch.leaf.approx_iteration`; ``O(n b^2)`` a
            step instead of ``O(b^3)``; the ``"gcv"`` ridge rule falls back to the walk).
    """

    # the RFM iteration (GROUPS["iteration"])
    n_iters: int = 30
    diag: DiagMode = "auto"
    eps: float = 1e-30
    agop_ridge: float = 0.0
    adaptive_bandwidth: float | None = None
    # when it stops (GROUPS["stopping"])
    early_stop_multiplier: float | None = 1.1
    patience: int | None = 3
    tol: float = 1e-3
    min_iters: int = 5
    # each solve and what it is scored by (GROUPS["solve"])
    reg: float = 1e-3
    linear_mix: float = 0.1
    solve_dtype: torch.dtype | None = None  # a config file may give its name
    pcg_tol: float | None = 1e-4
    criterion: Criterion = "mse"
    val_fraction: float = 0.2
    # the post-hoc search after the iterations (GROUPS["search"])
    bandwidth_factors: tuple[float, ...] | None = None
    kernel_exponents: tuple[float, ...] | None = (0.7, 1.0, 1.5)
    reg_factors: tuple[float, ...] | None = (0.1, 10.0, 100.0)
    ridge_rule: RidgeRule = "validation"
    gcv_below: int = 100
    kernel_margin: float = 2.0
    # large leaves: subsampled iterations, approximate solves (GROUPS["approximation"])
    iter_rows: int | None = None
    approx_above: int | None = None
    approx: Approx = "nystrom"
    approx_centres: ApproxCentres = "rows"
    fourier_features: int = 4096
    approx_iters: bool = False

    def __post_init__(self) -> None:
        put = object.__setattr__  # frozen: normalize in place once, here
        put(self, "n_iters", check_int(self.n_iters, "n_iters", 0))
        put(self, "reg", check_positive(self.reg, "reg", allow_zero=True))
        if self.diag not in (True, False, "auto"):
            raise ValueError(f"diag must be True, False or 'auto', got {self.diag!r}")
        put(self, "diag", "auto" if self.diag == "auto" else bool(self.diag))
        put(self, "eps", check_positive(self.eps, "eps", allow_zero=True))
        put(self, "agop_ridge", check_positive(self.agop_ridge, "agop_ridge", allow_zero=True))
        if self.adaptive_bandwidth is not None:
            put(
                self,
                "adaptive_bandwidth",
                check_positive(self.adaptive_bandwidth, "adaptive_bandwidth"),
            )
        mult = self.early_stop_multiplier
        if mult is not None and not float(mult) >= 1.0:
            raise ValueError(f"early_stop_multiplier must be >= 1 or None, got {mult!r}")
        put(self, "early_stop_multiplier", None if mult is None else float(mult))
        put(self, "patience", _optional_int(self.patience, "patience", 1))
        if not 0.0 <= float(self.tol) < 1.0:
            raise ValueError(f"tol must be in [0, 1), got {self.tol!r}")
        put(self, "tol", float(self.tol))
        put(self, "min_iters", check_int(self.min_iters, "min_iters", 0))
        put(self, "solve_dtype", as_dtype(self.solve_dtype, "solve_dtype"))
        if self.ridge_rule not in ("validation", "gcv", "auto"):
            raise ValueError(
                f"ridge_rule must be 'validation', 'gcv' or 'auto', got {self.ridge_rule!r}"
            )
        put(self, "gcv_below", check_int(self.gcv_below, "gcv_below", 0))
        put(self, "val_fraction", check_fraction(self.val_fraction, "val_fraction", high=0.9))
        put(self, "iter_rows", _optional_int(self.iter_rows, "iter_rows", 2))
        put(self, "approx_above", _optional_int(self.approx_above, "approx_above", 1))
        if self.approx not in APPROXES:
            raise ValueError(f"approx must be one of {APPROXES}, got {self.approx!r}")
        if self.approx_centres not in ("rows", "kmeans"):
            raise ValueError(
                f"approx_centres must be 'rows' or 'kmeans', got {self.approx_centres!r}"
            )
        put(self, "fourier_features", check_int(self.fourier_features, "fourier_features", 1))
        if not isinstance(self.approx_iters, bool):
            raise ValueError(f"approx_iters must be True or False, got {self.approx_iters!r}")
        for name in ("bandwidth_factors", "kernel_exponents", "reg_factors"):
            put(self, name, _floats(getattr(self, name), name))
        put(
            self,
            "kernel_margin",
            check_positive(self.kernel_margin, "kernel_margin", allow_zero=True),
        )
        put(self, "linear_mix", check_positive(self.linear_mix, "linear_mix", allow_zero=True))
        if self.pcg_tol is not None and not 0.0 < float(self.pcg_tol) < 1.0:
            raise ValueError(f"pcg_tol must be in (0, 1) or None, got {self.pcg_tol!r}")
        put(self, "pcg_tol", None if self.pcg_tol is None else float(self.pcg_tol))
        if self.criterion not in CRITERIA:
            raise ValueError(f"criterion must be one of {CRITERIA}, got {self.criterion!r}")

    @classmethod
    def plain(cls, **changes: Any) -> LeafConfig:
        """The paper's fixed-budget RFM: 5 AGOP updates, diagonal ``M``, no searches, no linear part.

        Keyword arguments override single settings (e.g. ``LeafConfig.plain(n_iters=1)``).
        """
        base = {
            "n_iters": 5,
            "diag": True,
            "patience": None,
            "min_iters": 0,
            "kernel_exponents": None,
            "reg_factors": None,
            "linear_mix": 0.0,
        }
        return cls(**{**base, **changes})

    def replace(self, **changes: Any) -> LeafConfig:
        """A copy with some settings changed (validated like a new one)."""
        return dataclasses.replace(self, **changes)

    def get_params(self, deep: bool = True) -> dict[str, Any]:
        """The settings as a dict (scikit-learn's convention; ``deep`` has nothing to recurse into)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
