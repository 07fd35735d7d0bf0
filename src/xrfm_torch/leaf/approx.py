"""Approximate final solves of a leaf: Nyström, centroid features, random Fourier features.

A large leaf learns ``M``, the exponent and the ridge on a subsample of ``b`` rows
(``LeafConfig.iter_rows``); its final solve on all ``n`` rows is ``O(n^3)`` exactly. With
``LeafConfig(approx_above=...)`` it is instead one of these ``O(n b^2)`` solves of the same
learned kernel ``k_tot = k_M + c (1 + <S x, S z> / d)`` (the leaf's kernel and linear part):

- ``"nystrom"``: ``f(x) = k_tot(x, C) w`` with ``(Phi^T Phi + reg K_CC) w = Phi^T y``,
  ``Phi = k_tot(X, C)``: the exact KRR restricted to the span of the centres ``C``.
- ``"centroids"``: seed ``002_…``'s RBF-centroid linear model, the same features with
  ``w = Phi^+ y`` (the pseudoinverse: singular values below ``PINV_RTOL`` of the largest cut,
  the seed's "automatic regularization with SVD"; no ridge).
- ``"fourier"``: ``f(x) = [phi(S x), U(S x)] w`` with ``phi`` ``D`` random Fourier features of
  ``k_M`` (:mod:`xrfm_torch.kernels.fourier`) and ``U`` the linear part's features, and
  ``(F^T F + reg I) w = F^T y``: the KRR of the approximate kernel ``F F^T``, whose ridge means
  what the leaf's ``reg_`` means. Prediction costs ``O(D d)`` a row, whatever ``n``.

The centres are the iteration rows (``"rows"``) or ``b`` k-means centres of all rows in the
learned space (``"kmeans"``, Lloyd's iterations from the iteration rows).
"""

from __future__ import annotations

import torch
from torch import Tensor

from xrfm_torch.kernels import Kernel, chain_rule, transform
from xrfm_torch.kernels.fourier import fourier_features, fourier_frequencies, fourier_grads
from xrfm_torch.kernels.linear import linear_features
from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.numerics.solvers import solve_nystrom

#: Singular values below this share of the largest are cut in the ``"centroids"`` pseudoinverse.
PINV_RTOL = 1e-6
#: Lloyd's iterations of the ``"kmeans"`` centres.
KMEANS_ITERS = 10


def approx_width(config: LeafConfig, n_fit: int, n_final: int, d: int) -> int | None:
    """The width of a leaf's approximate final solve, or ``None`` where it solves exactly.

    Approximate above ``approx_above`` rows, after iterations on at most half of them: ``b =
    n_fit`` centres, or ``D + d + 1`` Fourier and linear features (d input columns). A leaf kept
    for a posterior always solves exactly; that is the caller's to add.
    """
    above = config.approx_above
    if above is None or n_final <= above or 2 * n_fit > n_final:
        return None
    return config.fourier_features + d + 1 if config.approx == "fourier" else n_fit


def kmeans_centres(
    x: Tensor, start: Tensor, sqrt_m: Tensor | None, n_iters: int = KMEANS_ITERS
) -> Tensor:
    """Lloyd's k-means in the learned space ``S x``, from ``start`` (b, d): the centres (b, d).

    Rows are assigned by distances between ``S x`` and ``S c``; a centre is the mean of its
    rows in input coordinates (``S`` is linear, so that is also their mean in the learned space,
    and a singular ``S`` needs no inverse). A centre that loses all its rows stays where it is.
    Distances in row blocks of 4096, so the (n, b) matrix is never formed whole.
    """
    centres = start.clone()
    for _ in range(n_iters):
        cs = transform(centres, sqrt_m)
        sums = torch.zeros_like(centres)
        counts = torch.zeros(centres.shape[0], dtype=x.dtype, device=x.device)
        for i in range(0, x.shape[0], 4096):
            block = x[i : i + 4096]
            nearest = torch.cdist(transform(block, sqrt_m), cs).argmin(1)
            sums.index_add_(0, nearest, block)
            counts.index_add_(0, nearest, torch.ones_like(nearest, dtype=x.dtype))
        moved = counts > 0
        centres[moved] = sums[moved] / counts[moved, None]
    return centres


def centre_features(kernel: Kernel, xs: Tensor, cs: Tensor, c: float) -> Tensor:
    """``k_tot(X, C)`` (n, b) of transformed rows and centres (kernel plus linear part)."""
    Phi = kernel.from_distance(kernel.distance(xs, cs))
    if c > 0:
        Phi = Phi + linear_features(xs, c) @ linear_features(cs, c).T
    return Phi


def nystrom_weights(
    kernel: Kernel,
    xs: Tensor,
    cs: Tensor,
    y: Tensor,
    reg: float,
    c: float,
    weights: Tensor | None = None,
) -> Tensor:
    """``w`` (b, c_out) of ``(Phi^T W Phi + reg K_CC) w = Phi^T W y`` (``"nystrom"``).

    ``W = diag(weights)``, the rows' sample weights (default ``I``).
    """
    return solve_nystrom(
        centre_features(kernel, xs, cs, c), centre_features(kernel, cs, cs, c), y, reg, weights
    )


def centroid_weights(
    kernel: Kernel, xs: Tensor, cs: Tensor, y: Tensor, c: float, weights: Tensor | None = None
) -> Tensor:
    """``w = Phi^+ y`` (b, c_out) over the centres' features (``"centroids"``), in float64.

    With ``weights``, the weighted least squares: ``Phi`` and ``y`` rows scaled by ``sqrt(w)``.

    Through the eigendecomposition of the (b, b) Gram ``Phi^T Phi = V diag(s^2) V^T``:
    ``w = V_k diag(1 / s_k^2) V_k^T Phi^T y`` over the singular values ``s_k`` above ``PINV_RTOL``
    times the largest, which is the pseudoinverse's solution with that cut at ``O(n b^2)``
    (products) instead of an SVD of the (n, b) matrix.
    """
    Phi, Y = centre_features(kernel, xs, cs, c).double(), y.double()
    if weights is not None:
        root = weights.double().sqrt()[:, None]
        Phi, Y = Phi * root, Y * root
    s2, V = torch.linalg.eigh(Phi.T @ Phi)
    keep = s2 > (PINV_RTOL**2) * s2[-1].clamp_min(torch.finfo(torch.float64).tiny)
    Vk = V[:, keep]
    w = Vk @ ((Vk.T @ (Phi.T @ Y)) / s2[keep, None])
    return w.to(xs.dtype)


def fourier_design(xs: Tensor, w: Tensor, b: Tensor, c: float) -> Tensor:
    """``F = [phi(xs), U(xs)]``: (n, D) random features, then the linear part's (n, d + 1)."""
    F = fourier_features(xs, w, b)
    return torch.cat([F, linear_features(xs, c)], 1) if c > 0 else F


def fourier_solve(
    kernel: Kernel,
    xs: Tensor,
    y: Tensor,
    reg: float,
    c: float,
    n_features: int,
    generator: torch.Generator,
    weights: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Frequencies (d, D), phases (D,) and weights (D [+ d + 1], c_out) of a ``"fourier"`` solve.

    ``(F^T W F + reg I) coef = F^T W y`` with ``W = diag(weights)`` (default ``I``).

    Raises:
        ValueError: For a kernel with ``p != 2`` (its spectral measure is not drawn here).
    """
    if float(kernel.p) != 2.0:
        raise ValueError(
            f"random Fourier features need a Euclidean kernel (p=2), got p={kernel.p}; "
            "use approx='nystrom' or 'centroids'"
        )
    w, b = fourier_frequencies(
        xs.shape[1],
        n_features,
        float(kernel.q),
        float(kernel.bandwidth),
        generator=generator,
        dtype=xs.dtype,
    )
    w, b = w.to(xs.device), b.to(xs.device)
    F = fourier_design(xs, w, b, c)
    eye = torch.eye(F.shape[1], dtype=F.dtype, device=F.device)
    coef = solve_nystrom(F, eye, y, reg, weights)  # (F^T W F + reg I) coef = F^T W y
    return w, b, coef


def fourier_predict(xs: Tensor, w: Tensor, b: Tensor, coef: Tensor, c: float) -> Tensor:
    """``[phi(xs), U(xs)] coef``: (n, c_out)."""
    return fourier_design(xs, w, b, c) @ coef


def fourier_input_grads(
    x: Tensor, sqrt_m: Tensor | None, w: Tensor, b: Tensor, coef: Tensor, c: float
) -> Tensor:
    """Gradients of :func:`fourier_predict` with respect to the original input: (n, c_out, d)."""
    xs = transform(x, sqrt_m)
    D, d = w.shape[1], xs.shape[1]
    g = fourier_grads(xs, w, b, coef[:D])
    if c > 0:  # U = sqrt(c) [1, xs / sqrt(d)]: a constant gradient sqrt(c / d) coef_lin
        g = g + (c / d) ** 0.5 * coef[D + 1 :].mT[None]
    return chain_rule(g, sqrt_m)
