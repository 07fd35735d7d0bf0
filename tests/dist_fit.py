"""Worker for tests/test_parallel.py: one rank of a distributed (gloo) fit, or a plain fit.

    python tests/dist_fit.py RANK WORLD_SIZE OUT_DIR [--differ] [--uncertainty] [--fail] [--budget]
        [--bagged]

With ``WORLD_SIZE`` 1 no process group is created (the single-process reference). Each rank saves
its state dict and its predictions on fixed query rows to ``OUT_DIR/rank{RANK}.pt``; with
``--differ`` rank 1 is given one changed target (the fit must refuse); with ``--fail`` rank 1's
leaf posteriors raise (every rank's fit must fail, none hang); with ``--budget`` the last rank
(the only one, in a plain fit) has a memory budget its exact leaves exceed and the others none
(every rank must plan against it); with ``--bagged`` the model is a ``BaggedTree`` of 3 bags spread
over the ranks (its trees not distributed themselves). A refused or failed fit saves its error message instead.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from xrfm_torch import BaggedTree, LeafConfig, LeafRFM, xRFMTree
from xrfm_torch.tree.memory import LEAF_OVERHEAD

FITS = [0]  # leaf fits run in this process
_fit = LeafRFM.fit


def _counted_fit(self: LeafRFM, *args: object, **kwargs: object) -> LeafRFM:
    FITS[0] += 1
    return _fit(self, *args, **kwargs)  # type: ignore[arg-type]


LeafRFM.fit = _counted_fit  # type: ignore[method-assign]


def main() -> None:
    rank, size, out = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3])
    torch.set_num_threads(1)  # the same kernels (and float rounding) on every rank
    if size > 1:
        dist.init_process_group(
            "gloo", init_method=f"file://{out / 'rendezvous'}", rank=rank, world_size=size
        )
    g = torch.Generator().manual_seed(0)
    X = torch.randn(1800, 5, generator=g)
    y = torch.sin(2 * X[:, 0]) + X[:, 1] * X[:, 2] + 0.05 * torch.randn(1800, generator=g)
    if "--differ" in sys.argv and rank == 1:
        y[0] += 1.0
    if "--fail" in sys.argv and rank == 1:  # a leaf job that fails on one rank only

        def broken(self: LeafRFM) -> LeafRFM:
            raise FloatingPointError("injected")

        LeafRFM.fit_posterior = broken  # type: ignore[method-assign]
    model = xRFMTree(
        leaf=LeafConfig(n_iters=2),
        max_leaf_size=300,
        min_leaf_val=40,
        uncertainty="calibrated" if "--uncertainty" in sys.argv else "none",
        large_fit_rows=1000,  # iterations on subsamples: each leaf draws from its generator
        large_fit_iter_rows=150,
        overlap_fraction=0.1,  # a large fit has none by default; the budget below counts it
        input_transform="identity",  # no input-map choice: every leaf fit is a tree leaf
        distributed="--bagged" not in sys.argv,
        # exact leaves of ~300 rows need ~1.5 MB beyond the overhead, approximate ones < 1 MB
        memory_budget=LEAF_OVERHEAD + 1_200_000
        if "--budget" in sys.argv and rank == size - 1
        else None,
    )
    if "--bagged" in sys.argv:
        model = BaggedTree(model, n_bags=3, distributed=True)  # type: ignore[assignment]
    try:
        model.fit(X, y, generator=torch.Generator().manual_seed(1))
    except (ValueError, RuntimeError) as err:
        torch.save({"error": str(err)}, out / f"rank{rank}.pt")
        if size > 1:
            dist.destroy_process_group()
        return
    Xq = torch.randn(200, 5, generator=torch.Generator().manual_seed(2))
    pred = model(Xq, return_std=True) if model.uncertainty != "none" else (model(Xq),)
    torch.save(
        {
            "state": model.state_dict(),
            "pred": pred,
            "n_leaves": model.n_leaves,
            "fits": FITS[0],
            "approximate": sum(
                leaf.approximation is not None
                for _, tree in model.single_trees()
                for leaf in tree.leaves()
            ),
        },
        out / f"rank{rank}.pt",
    )
    if size > 1:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
