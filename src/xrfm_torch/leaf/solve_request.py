"""One candidate of a leaf's post-hoc search as a request: solve at a ridge, score on validation.

The search (:func:`~xrfm_torch.leaf.selection.select_kernel`) asks for each candidate's solve
through :func:`solve_candidate`: run at once, or, in a lockstep's thread (the fit context's ``solve_runner``),
batched with the candidates other leaves ask for in the same round
(:mod:`xrfm_torch.leaf.batched_search`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from torch import Tensor

from xrfm_torch.kernels import Kernel
from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.leaf.criteria import validation_loss
from xrfm_torch.numerics import context
from xrfm_torch.numerics.host import read_scalars
from xrfm_torch.numerics.solvers import first_krr_solve

#: ``(alpha (n, c), validation error, per-row losses (n_val,), whether the first attempt failed
#: its check (the caller then runs the retries), whether the workspace holds the factor)``.
SolveResult = tuple[Tensor, float, Tensor, bool, bool]


@dataclass
class SolveRequest:
    """A candidate: ``(K + U U^T + lam W^{-1}) alpha = y``, then its validation error.

    ``X`` and ``X_val`` are the leaf's rows in its M-space (``S x``), ``K`` (n, n) the kernel
    values at the candidate's exponent and bandwidth (the kernel holds them), ``features`` the
    linear part's ``U`` (or ``None``), ``predict(alpha)`` the validation predictions (n_val, c),
    ``one_block`` whether the validation rows' kernel block is small enough to make whole.
    """

    kernel: Kernel
    K: Tensor
    X: Tensor
    y: Tensor
    X_val: Tensor
    y_val: Tensor
    lam: float
    features: Tensor | None
    workspace: Tensor
    cfg: LeafConfig
    weights: tuple[Tensor | None, Tensor | None]
    predict: Callable[[Tensor], Tensor]
    one_block: bool

    def run(self) -> SolveResult:
        """The candidate on its own: the first attempt of the solve, scored, read once."""
        w, w_val = self.weights
        alpha, unsure = first_krr_solve(
            self.K,
            self.y,
            self.lam,
            solve_dtype=self.cfg.solve_dtype,
            workspace=self.workspace,
            features=self.features,
            weights=w,
        )
        err_t, sq = validation_loss(self.predict(alpha), self.y_val, self.cfg.criterion, w_val)
        err, retry = read_scalars(err_t, unsure)
        return alpha, err, sq, bool(retry), True


def solve_candidate(request: SolveRequest) -> SolveResult:
    """``request`` run at once, or by the lockstep this thread belongs to."""
    runner = context.current().solve_runner
    return request.run() if runner is None else runner(request)
