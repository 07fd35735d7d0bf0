"""Hard and soft routing over a tree stored as parallel arrays (pure functions).

Tree layout (``J`` internal nodes, ``L`` leaves; node 0 is the root when ``J > 0``):

- ``vectors`` (J, d) split directions ``v_j``; ``thresholds`` (J,) ``b_j``;
- ``children`` (J, 2) long: child ids, left then right; a leaf ``l`` is encoded as ``-(l + 1)``;
- ``path_sign`` (L, J) int8: +1 if the path to leaf ``l`` goes right at node ``j``, -1 if left, 0 if
  node ``j`` is not on the path.

Soft routing (the seed's SoftRoutePredict): ``z_j = (x . v_j - b_j) / (T sigma_j)`` and

.. math::

    \\log p_l(x) = \\sum_{j \\in \\mathrm{Path}(l)} \\log \\sigma(\\pm z_j), \\qquad
    w(x) = \\operatorname{softmax}_l \\log p_l(x),

with ``+`` for a right turn and ``-`` for a left turn. ``T -> 0`` recovers hard routing.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from xrfm_torch.numerics import host
from xrfm_torch.numerics.deterministic import cumsum


def is_zero(temperature: Tensor | float) -> bool:
    """Whether a temperature means hard routing (reads a tensor without touching its graph)."""
    if isinstance(temperature, Tensor):
        return bool(temperature.detach() == 0)
    return float(temperature) == 0.0


def hard_route(x: Tensor, vectors: Tensor, thresholds: Tensor, children: Tensor) -> Tensor:
    """Leaf index of each row: go left iff ``x . v_j <= b_j``.

    Vectorized over rows; one pass per tree level. On the CPU each pass takes the rows still
    inside the tree (fewer in an unbalanced tree); on a launch-bound device
    (:func:`~xrfm_torch.numerics.host.launch_bound`) every pass takes every row, rows already
    at a leaf staying there, so no pass waits for the device to count the rows left (one read of
    the child table instead of one per level). Each row's projection is the same either way.

    Args:
        x: Inputs, shape (n, d).
        vectors: Split directions, shape (J, d).
        thresholds: Thresholds, shape (J,).
        children: Child table, shape (J, 2).

    Returns:
        Leaf ids, shape (n,), long.
    """
    n = x.shape[0]
    if vectors.shape[0] == 0:
        return torch.zeros(n, dtype=torch.long, device=x.device)
    node = torch.zeros(n, dtype=torch.long, device=x.device)
    if host.launch_bound(x.device):
        for _ in range(tree_depth(children)):
            at = node.clamp(min=0)
            go_right = ((x * vectors[at]).sum(-1) > thresholds[at]).long()
            node = torch.where(node >= 0, children[at, go_right], node)
        return -node - 1
    for _ in range(vectors.shape[0]):
        active = (node >= 0).nonzero().squeeze(1)
        if active.numel() == 0:
            break
        nd = node[active]
        proj = (x[active] * vectors[nd]).sum(-1)
        go_right = (proj > thresholds[nd]).long()
        node[active] = children[nd, go_right]
    return -node - 1


def tree_depth(children: Tensor) -> int:
    """Longest root-to-leaf path of a child table (J, 2) (0 for a single leaf; one read)."""
    table = children.tolist()
    depth, stack = 0, [(0, 1)] if table else []
    while stack:
        node, level = stack.pop()
        depth = max(depth, level)
        stack.extend((child, level + 1) for child in table[node] if child >= 0)
    return depth


def hard_weights(x: Tensor, vectors: Tensor, thresholds: Tensor, path_sign: Tensor) -> Tensor:
    """One-hot leaf weights of :func:`hard_route` as straight-line code, shape (n, L).

    Every node's decision is computed for every row (the projections as in :func:`hard_route`, so
    the same rows go right), and leaf ``l`` gets the rows that agree with all ``len(Path(l))``
    turns of its path. No shape depends on the data, so ``torch.export`` can trace it; it costs
    ``n * J * d`` instead of ``n * depth * d``.
    """
    right = ((x[:, None, :] * vectors[None]).sum(-1) > thresholds).to(x.dtype)  # (n, J)
    go_right = (path_sign > 0).to(x.dtype)  # (L, J)
    go_left = (path_sign < 0).to(x.dtype)
    agree = right @ go_right.mT + (1 - right) @ go_left.mT  # (n, L): turns matched
    return (agree == (go_right + go_left).sum(1)).to(x.dtype)


def path_signs(children: Tensor, n_leaves: int) -> Tensor:
    """Build the (L, J) int8 path-sign table from the child table."""
    n_nodes = children.shape[0]
    sign = torch.zeros(n_leaves, n_nodes, dtype=torch.int8)
    if n_nodes == 0:
        return sign
    ch = children.tolist()
    stack: list[tuple[int, list[tuple[int, int]]]] = [(0, [])]
    while stack:
        node, path = stack.pop()
        for side, s in ((0, -1), (1, 1)):
            child = ch[node][side]
            new_path = [*path, (node, s)]
            if child < 0:
                for j, sj in new_path:
                    sign[-child - 1, j] = sj
            else:
                stack.append((child, new_path))
    return sign.to(children.device)


def soft_log_weights(
    x: Tensor,
    vectors: Tensor,
    thresholds: Tensor,
    scales: Tensor,
    path_sign: Tensor,
    temperature: Tensor | float,
) -> Tensor:
    """Unnormalized leaf log-probabilities ``log p_l(x)``, shape (n, L). Differentiable in all inputs.

    Args:
        x: Inputs, shape (n, d).
        vectors: Split directions, shape (J, d).
        thresholds: Thresholds, shape (J,).
        scales: Per-node temperature factors ``sigma_j > 0``, shape (J,).
        path_sign: Path-sign table, shape (L, J).
        temperature: Global ``T > 0``, or several as a (T, 1, 1) tensor (then (T, n, L)).
    """
    z = (x @ vectors.mT - thresholds) / (temperature * scales)  # (n, J)
    right = (path_sign > 0).to(x.dtype)  # (L, J)
    left = (path_sign < 0).to(x.dtype)
    if torch.compiler.is_exporting():
        # ONNX Runtime's LogSigmoid is log(sigmoid): -inf for z below about -17 in float32, and
        # -inf * 0 in the product below is NaN; log sigma(z) = -softplus(-z) stays finite
        return -F.softplus(-z) @ right.mT - F.softplus(z) @ left.mT
    return F.logsigmoid(z) @ right.mT + F.logsigmoid(-z) @ left.mT  # (n, L)


def truncate_weights(w: Tensor, keep_mass: float = 1.0, max_leaves: int | None = None) -> Tensor:
    """Keep each row's largest weights until ``keep_mass`` is covered (at most ``max_leaves``), renormalize.

    The kept set is chosen without gradient; the kept weights stay differentiable.

    Args:
        w: Mixture weights, shape (n, L) (or (..., n, L): rows along the last dimension), rows
            summing to 1.
        keep_mass: Cumulative weight to keep, in (0, 1]; 1 keeps every leaf with non-zero weight.
        max_leaves: Cap on leaves per row (``None``: no cap).
    """
    if keep_mass >= 1.0 and (max_leaves is None or max_leaves >= w.shape[-1]):
        return w
    with torch.no_grad():
        sorted_w, order = torch.sort(w, dim=-1, descending=True)
        before = cumsum(sorted_w, -1) - sorted_w  # mass of strictly larger leaves
        keep_sorted = before < keep_mass
        if max_leaves is not None:
            keep_sorted[..., max_leaves:] = False
        keep_sorted[..., 0] = True
        keep = torch.zeros_like(keep_sorted).scatter_(-1, order, keep_sorted)
    kept = w * keep
    return kept / kept.sum(-1, keepdim=True)


def soft_weights(
    x: Tensor,
    vectors: Tensor,
    thresholds: Tensor,
    scales: Tensor,
    path_sign: Tensor,
    children: Tensor,
    temperature: Tensor | float,
    *,
    keep_mass: float = 1.0,
    max_leaves: int | None = None,
) -> Tensor:
    """Mixture weights over leaves, shape (n, L); ``temperature == 0`` gives one-hot hard routing."""
    n_leaves = path_sign.shape[0]
    if is_zero(temperature) or vectors.shape[0] == 0:
        ids = hard_route(x, vectors, thresholds, children)
        return F.one_hot(ids, n_leaves).to(x.dtype)
    logp = soft_log_weights(x, vectors, thresholds, scales, path_sign, temperature)
    return truncate_weights(torch.softmax(logp, dim=1), keep_mass, max_leaves)
