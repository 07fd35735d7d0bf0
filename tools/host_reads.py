"""Where a fit would make a GPU wait, counted on the CPU: host reads by the line that asks.

On a GPU, reading a value back (``float(t)``, ``bool(t)``, ``.item()``, ``.tolist()``) or an
operation whose output size depends on the data (``nonzero``, a boolean mask index,
``unique``) makes the host wait until the device has run everything queued before it. With a
few such waits per solve, the host spends the fit waiting instead of queueing work, so their
number is a figure of the GPU path that a CPU can measure::

    python -m tools.host_reads --table reg_num/house_16H --data-dir DIR
    python -m tools.host_reads --table clf_num/pol --data-dir DIR --estimator

Fits ``xRFMTree()`` (or, with ``--estimator``, the default ``XRFMClassifier`` /
``XRFMRegressor`` on the protocol split) under a dispatch mode that counts those operations by
the innermost line of the package that runs them, with the GPU's rules (its CG budget, its
one-block elementwise passes and its lockstep leaves; ``--one-by-one``: without), so the count is the GPU fit's. It also counts every operation
dispatched (and those that are not views): on a GPU each costs the host some 20 us, and that,
not the device, bounds a fit (docs/benchmarks.md, "On one GPU"). A value read from a tensor just made from a Python
number on the host (e.g. a rounding to the buffer's dtype) is not counted: it never leaves the
host. Prints the total by kind and the busiest lines. The bench tool ``bench.gpu`` counts the
real synchronizations on a GPU.
"""

from __future__ import annotations

import argparse
import traceback
import weakref
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode

from bench.common import DATASETS
from xrfm_torch.numerics.context import watching

#: Operations whose output size depends on the values (the host needs the size to allocate;
#: a GPU's ``bincount`` reads its input's maximum even with ``minlength``).
DATA_SHAPED = {
    "nonzero",
    "masked_select",
    "_unique2",
    "unique_dim",
    "unique_consecutive",
    "bincount",
    "repeat_interleave",
}


def _site() -> str:
    frames = [
        f
        for f in traceback.extract_stack()
        if "xrfm_torch" in f.filename and not f.filename.endswith("numerics/host.py")
    ]  # a joint read (host.read_scalars) is its caller's
    if not frames:
        return "elsewhere"
    f = frames[-1]
    return f"{f.filename.split('xrfm_torch/')[-1]}:{f.lineno} {f.name}"


class HostReads(TorchDispatchMode):
    """Counts value reads and data-shaped operations by kind and by the line that runs them."""

    def __init__(self) -> None:
        super().__init__()
        self.kinds: Counter[str] = Counter()
        self.sites: Counter[str] = Counter()
        self.dispatched = 0  # every operation
        self.computed = 0  # those that are not views (a kernel launch each on a GPU)
        self._host_made: weakref.WeakValueDictionary[int, torch.Tensor] = (
            weakref.WeakValueDictionary()
        )

    def made_here(self, t: torch.Tensor) -> bool:
        """Whether ``t`` was made from a Python number inside the fit (a host value)."""
        return self._host_made.get(id(t)) is t

    def note(self, kind: str) -> None:
        self.kinds[kind] += 1
        self.sites[f"{kind} {_site()}"] += 1

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = func.overloadpacket.__name__
        out = func(*args, **(kwargs or {}))
        self.dispatched += 1
        self.computed += not getattr(func, "is_view", False)
        if name == "lift_fresh":  # torch.tensor(number): made on the host, read there for free
            self._host_made[id(out)] = out
        elif name == "_local_scalar_dense" and not self.made_here(args[0]):
            self.note("read")
        elif name in DATA_SHAPED and (kwargs or {}).get("output_size") is None:
            self.note(name)  # repeat_interleave with its output_size given needs no read
        elif name == "index" and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in args[1] if i is not None
        ):
            self.note("boolean index")
        return out


def _tolist_counted(real: Any) -> Any:
    def tolist(self: torch.Tensor) -> Any:
        mode = _get_current_dispatch_mode()
        if isinstance(mode, HostReads) and not mode.made_here(self):
            mode.note("read")  # .tolist() does not pass the dispatcher on the CPU
        return real(self)

    return tolist


@contextmanager
def counting() -> Iterator[HostReads]:
    """A :class:`HostReads` mode in force, ``.tolist()`` reads counted too (restored after)."""
    real = torch.Tensor.tolist
    torch.Tensor.tolist = _tolist_counted(real)  # type: ignore[method-assign]
    try:
        with watching(HostReads()) as mode:  # the lockstep's leaf threads count too
            yield mode
    finally:
        torch.Tensor.tolist = real  # type: ignore[method-assign]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--table", default="reg_num/house_16H")
    ap.add_argument("--data-dir", type=Path, default=DATASETS)
    ap.add_argument("--estimator", action="store_true", help="the default estimator, not a tree")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument(
        "--one-by-one", action="store_true", help="leaves' steps one by one (no lockstep)"
    )
    a = ap.parse_args()
    from xrfm_torch.kernels import distance
    from xrfm_torch.leaf import iteration
    from xrfm_torch.numerics import host

    iteration.PCG_ROWS_PER_ITER = iteration.PCG_ROWS_PER_ITER_DEVICE  # the GPU's CG budget
    distance.CACHE_BLOCK_BYTES = distance.DEVICE_BLOCK_BYTES  # and its one-block passes
    host.launch_bound = lambda device: not a.one_by_one  # and its launch-bound paths
    if not a.one_by_one:  # the lockstep, which "auto" will switch on where a GPU run shows it pays
        from xrfm_torch.tree.config import TreeConfig

        TreeConfig.steps_batched = lambda self, device: self.batch_steps is not False  # type: ignore[method-assign]
    path = a.data_dir / f"{a.table}.csv.gz"
    if a.estimator:
        from bench.peers import is_regression, split_table
        from xrfm_torch import XRFMClassifier, XRFMRegressor

        parts, ys, _ = split_table(path, 0)
        cls = XRFMRegressor if is_regression(a.table) else XRFMClassifier

        def fit() -> None:
            cls(random_state=0).fit(parts[0], ys[0], eval_set=(parts[1], ys[1]))

    else:
        from xrfm_torch import xRFMTree
        from xrfm_torch.data import prepare, read_csv

        X, y, cols = read_csv(path, "target")
        d = prepare(X, y, 0, feature_names=cols)
        t = torch.from_numpy

        def fit() -> None:
            g = torch.Generator().manual_seed(0)
            xRFMTree().fit(t(d.X_train), t(d.y_train), t(d.X_val), t(d.y_val), generator=g)

    with counting() as mode:
        fit()
    print(f"{a.table}: {sum(mode.kinds.values())} host waits", dict(mode.kinds))
    print(f"{mode.dispatched} operations dispatched, {mode.computed} of them not views")
    for site, n in mode.sites.most_common(a.top):
        print(f"{n:6d}  {site}")


if __name__ == "__main__":
    main()
