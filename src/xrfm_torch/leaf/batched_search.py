"""Several leaves' post-hoc search candidates as one batched solve.

In lockstep (:mod:`xrfm_torch.leaf.lockstep`) the leaves' searches ask for their candidates'
solves together: each round's candidates (one per leaf, each at its own exponent, bandwidth and
ridge) run here as one batched Cholesky on (B, N, N) kernels, scored on the validation rows with
one read back. A leaf's rows do not change during its search (its ``M`` is fixed), so their
distances are made once per set of leaves and kept with the padded rows; only the kernel values
change between candidates. The result is :meth:`SolveRequest.run`'s up to float rounding; the
batched factor is not kept (the leaf's final solve factors afresh), and a candidate whose
first attempt fails its check is solved alone.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from xrfm_torch.leaf.batch_ops import (
    BatchRows,
    distances,
    kernel_params,
    shared_key,
    solve_and_score,
)
from xrfm_torch.leaf.solve_request import SolveRequest, SolveResult


def solve_key(r: SolveRequest) -> Hashable | None:
    """Candidates with equal keys can be solved as one batch; ``None``: this one runs alone.

    :func:`~xrfm_torch.leaf.batch_ops.shared_key`, where the validation block is made whole.
    Not in the key: the exponent, bandwidth and ridge (one per leaf in a batch).
    """
    tensors = [r.K, r.X, r.y, r.X_val, r.y_val]
    shared = shared_key(r.kernel, r.cfg, r, ("distance", "from_distance"), tensors)
    return shared if r.one_block else None


def batched_solve(requests: Sequence[SolveRequest], rows: BatchRows) -> list[SolveResult]:
    """:meth:`SolveRequest.run` for each request, as one batched solve.

    Args:
        requests: Candidates with equal :func:`solve_key`, in batch order.
        rows: Their padded rows (:func:`~xrfm_torch.leaf.batch_ops.batch_rows`); the training
            and validation distances are kept in ``rows.cache`` for the next rounds.
    """
    if "R" not in rows.cache:  # the leaves' rows in their M-spaces: fixed during their searches
        rows.cache["R"], rows.cache["Rv"] = distances(rows.X, rows.Xv, rows)
    q, bandwidth = kernel_params([r.kernel for r in requests], rows.X)
    lams = [r.lam for r in requests]
    lam = lams[0] if len(set(lams)) == 1 else rows.X.new_tensor(lams, dtype=torch.float64)
    _, alpha, _, unsure, err, per_row = solve_and_score(
        rows.cache["R"], rows.cache["Rv"], rows.X, rows.Xv, q, bandwidth, lam, rows, requests[0].cfg
    )
    B = len(requests)
    values = torch.cat([err, unsure]).tolist()  # one read back (float64: cat promotes the flags)
    results: list[SolveResult] = []
    for i, r in enumerate(requests):
        if values[B + i]:  # the first attempt failed or was useless: the leaf's own solve
            results.append(r.run())
            continue
        sq = per_row[i, : rows.m[i]]
        results.append((alpha[i, : rows.n[i]], values[i], sq, False, False))
    return results
