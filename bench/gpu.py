"""GPU timings: xrfm_torch vs the reference xrfm on the regression tables, in one process.

    python -m bench.gpu --data-dir DIR --seeds 0 1 2 --out OUT

For each seed, table by table in one fixed order: our default ``xRFMTree()``, the reference's
defaults (``xrfm_default``) and its XRFM_D configuration (``xrfm_d``), each fitted on the same
protocol split on one CUDA device after a warm-up fit of each (CUDA context, cuBLAS and cuSOLVER
handles stay out of the figures). Fit seconds run from CPU arrays to a fitted model (both models
copy the rows to the device inside the timed region) with the device synchronized at both ends.

Then one fit of each model under :class:`OpTally` (every ATen operation, by the device of its
tensors; synchronizing calls counted with ``torch.cuda.set_sync_debug_mode``) and under
``torch.profiler`` (device time against wall time, the busiest operations): whether the GPU path
leaves work on the CPU. Writes ``results.jsonl``, ``profile.md`` and ``results.md`` into ``--out``
and prints the tables last.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
import traceback
import warnings
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from bench.common import DEFAULT_DATA, XRFM_D_PARAMS
from xrfm_torch.data import prepare, read_csv
from xrfm_torch.numerics.context import watching

MODELS = ["ours", "xrfm_default", "xrfm_d"]
#: Ours under :func:`cpu_rules` (``--models ... ours_cpu_rules``): the before of the GPU changes.
CPU_RULES = "ours_cpu_rules"
#: Extra configurations of ours (``--variant NAME=JSON``): JSON keyword arguments of xRFMTree,
#: ``"leaf"`` given as a dict of LeafConfig fields, ``"blend_kernels"`` (a list of kernel names)
#: fits a KernelBlend of that tree.
VARIANTS: dict[str, dict[str, Any]] = {}


class OpTally(TorchDispatchMode):
    """Counts ATen operations by where their tensors live.

    An operation is a device operation when any tensor among its arguments or results is on a
    non-CPU device, a CPU operation otherwise; for CPU operations the largest tensor's element
    count is kept per operation name, so scalar bookkeeping (a generator's draw of a few indices)
    tells itself apart from real work on the host.
    """

    def __init__(self) -> None:
        super().__init__()
        self.device_ops = 0
        self.cpu_ops: Counter[str] = Counter()
        self.cpu_numel: dict[str, int] = {}

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        tensors = [t for t in tree_flatten((args, kwargs, out))[0] if isinstance(t, torch.Tensor)]
        if tensors:
            if any(t.device.type != "cpu" for t in tensors):
                self.device_ops += 1
            else:
                name = str(func.overloadpacket.__name__)
                self.cpu_ops[name] += 1
                size = max(t.numel() for t in tensors)
                self.cpu_numel[name] = max(self.cpu_numel.get(name, 0), size)
        return out

    def summary(self, top: int = 12) -> dict[str, Any]:
        """Counts, the CPU element total bound and the most frequent CPU operations."""
        big = {n: s for n, s in self.cpu_numel.items() if s > 4096}
        return {
            "device_ops": self.device_ops,
            "cpu_ops": sum(self.cpu_ops.values()),
            "cpu_ops_max_numel": max(self.cpu_numel.values(), default=0),
            "cpu_ops_over_4096_elements": big,
            "cpu_top": [(n, c, self.cpu_numel[n]) for n, c in self.cpu_ops.most_common(top)],
        }


@contextlib.contextmanager
def cpu_rules() -> Iterator[None]:
    """Run a fit with the CPU's cache blocks and CG budget on any device (the GPU path as it was
    before those became device-aware), restored afterwards."""
    from xrfm_torch.kernels import distance
    from xrfm_torch.leaf import iteration

    saved = distance.DEVICE_BLOCK_BYTES, iteration.PCG_ROWS_PER_ITER_DEVICE
    distance.DEVICE_BLOCK_BYTES = distance.CACHE_BLOCK_BYTES
    iteration.PCG_ROWS_PER_ITER_DEVICE = iteration.PCG_ROWS_PER_ITER
    try:
        yield
    finally:
        distance.DEVICE_BLOCK_BYTES, iteration.PCG_ROWS_PER_ITER_DEVICE = saved


def fitter(model: str, d: Any, seed: int, device: str) -> Callable[[], Callable[[Any], Any]]:
    """A closure that fits ``model`` on ``d`` and returns its test-prediction function."""
    t = torch.from_numpy
    if model in ("ours", CPU_RULES) or model in VARIANTS:
        from xrfm_torch import KernelBlend, LeafConfig, xRFMTree

        options = dict(VARIANTS.get(model, {}))
        if isinstance(options.get("leaf"), dict):
            options["leaf"] = LeafConfig(**options["leaf"])
        blend = options.pop("blend_kernels", None)  # a KernelBlend of the tree over these

        def fit() -> Callable[[Any], Any]:
            m: Any = xRFMTree(**options)
            if blend:
                m = KernelBlend(m, kernels=blend)
            dev = [t(a).to(device) for a in (d.X_train, d.y_train, d.X_val, d.y_val)]
            with cpu_rules() if model == CPU_RULES else contextlib.nullcontext():
                m.fit(*dev, generator=torch.Generator().manual_seed(seed))
            return lambda X: m(t(X).to(device))[:, 0]

        return fit
    from xrfm import xRFM

    kw: dict[str, Any] = (
        {} if model == "xrfm_default" else {"rfm_params": XRFM_D_PARAMS, "overlap_fraction": 0.1}
    )

    def fit_ref() -> Callable[[Any], Any]:
        m = xRFM(device=device, verbose=False, random_state=seed, **kw)
        m.fit(t(d.X_train), t(d.y_train[:, None]), t(d.X_val), t(d.y_val[:, None]))
        return lambda X: m.predict(t(X))

    return fit_ref


def synced(fn: Callable[[], Any], device: str) -> tuple[Any, float]:
    """``fn()`` and its wall seconds, the device synchronized before and after."""
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    s = time.perf_counter()
    out = fn()
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    return out, time.perf_counter() - s


def measure(model: str, d: Any, seed: int, device: str) -> dict[str, Any]:
    """Fit, predict and score one model; an error becomes a row with its traceback."""
    try:
        if device.startswith("cuda"):
            torch.cuda.reset_peak_memory_stats()
        predict, fit_s = synced(fitter(model, d, seed, device), device)
        with torch.no_grad():
            out, pred_s = synced(lambda: predict(d.X_test), device)
        pred = out.detach().cpu().numpy() if torch.is_tensor(out) else np.asarray(out)
        pred = d.y_scaler.inverse(pred.ravel())
        y = d.y_scaler.inverse(d.y_test)
        row = {
            "rmse": float(np.sqrt(np.mean((pred - y) ** 2))),
            "fit_s": fit_s,
            "predict_s": pred_s,
        }
        if device.startswith("cuda"):
            row["peak_gpu_mb"] = torch.cuda.max_memory_allocated() / 2**20
        return row
    except Exception:
        return {"error": traceback.format_exc()[-3000:]}


def _site(frames: list[traceback.FrameSummary]) -> str:
    """The innermost frame in a model's own code (ours or the reference's), as ``file:line fn``."""
    own = [f for f in frames if "xrfm_torch" in f.filename or "/xrfm/" in f.filename]
    if not own:
        return "elsewhere"
    f = own[-1]
    path = f.filename.split("xrfm_torch/")[-1].split("/xrfm/")[-1]
    return f"{path}:{f.lineno} {f.name}"


def tally_fit(fit: Callable[[], Any], device: str) -> dict[str, Any]:
    """Run ``fit()`` under :class:`OpTally`, synchronizing calls counted by where they start.

    ``torch.cuda.set_sync_debug_mode("warn")`` warns at each call that makes the host wait for
    the device (a scalar read, a copy to the host, a data-dependent shape); the warning is raised
    in the calling Python frame, so the stack at that moment names the line that asked for it.
    """
    mode = OpTally()
    sites: Counter[str] = Counter()

    def hook(message: Any, category: Any, filename: str, lineno: int, *rest: Any) -> None:
        if "synchroniz" in str(message):
            sites[_site(traceback.extract_stack()[:-1])] += 1

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = hook
        if device.startswith("cuda"):
            torch.cuda.set_sync_debug_mode("warn")
        try:
            with watching(mode):  # the lockstep's leaf threads count too
                fit()
        finally:
            if device.startswith("cuda"):
                torch.cuda.set_sync_debug_mode("default")
    return {
        **mode.summary(),
        "synchronizing_calls": sum(sites.values()),
        "sync_sites": sites.most_common(25),
    }


def tally(model: str, d: Any, seed: int, device: str) -> dict[str, Any]:
    """One fit of ``model`` under :func:`tally_fit`."""
    return tally_fit(fitter(model, d, seed, device), device)


def estimator_tally(path: Path, seed: int, device: str) -> dict[str, Any]:
    """The default estimator (classifier or regressor, by the table) fitted once on ``path``'s
    protocol split under :func:`tally_fit`, with its wall seconds outside the tally."""
    from bench.peers import is_regression, split_table
    from xrfm_torch import XRFMClassifier, XRFMRegressor

    name = f"{path.parent.name}/{path.name.removesuffix('.csv.gz')}"
    parts, ys, _ = split_table(path, seed)
    cls = XRFMRegressor if is_regression(name) else XRFMClassifier

    def fit() -> Any:
        m = cls(random_state=seed, device=device)
        return m.fit(parts[0], ys[0], eval_set=(parts[1], ys[1]))

    _, wall = synced(fit, device)
    return {"table": name, "fit_s": wall, **tally_fit(fit, device)}


def profile(model: str, d: Any, seed: int, device: str) -> tuple[dict[str, Any], str]:
    """One fit under ``torch.profiler``: device time, wall time and the busiest operations."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    acts = [ProfilerActivity.CPU]
    if device.startswith("cuda"):
        acts.append(ProfilerActivity.CUDA)
    fit = fitter(model, d, seed, device)
    with torch_profile(activities=acts) as prof:
        _, wall = synced(fit, device)
    events = prof.key_averages()

    def dev_time(e: Any) -> float:  # microseconds; the attribute was renamed in torch 2.4
        return float(getattr(e, "self_device_time_total", getattr(e, "self_cuda_time_total", 0)))

    # kernels and copies only: an operator's row repeats the device time of the kernels it ran
    device_us = sum(dev_time(e) for e in events if e.device_type != torch.autograd.DeviceType.CPU)
    memcpy = {e.key: e.count for e in events if "memcpy" in e.key.lower() or "Memcpy" in e.key}
    table = ""
    for key in ("self_device_time_total", "self_cuda_time_total", "self_cpu_time_total"):
        try:
            table = events.table(sort_by=key, row_limit=20)
            break
        except (AttributeError, KeyError, ValueError):
            continue
    return {"wall_s": wall, "device_busy_s": device_us / 1e6, "memcpy_events": memcpy}, table


def solver_costs(sizes: list[int], device: str, repeats: int = 5) -> list[dict[str, float]]:
    """Median seconds of a fresh Cholesky solve and of one warm CG step, per system size.

    The Cholesky solve is :func:`~xrfm_torch.numerics.solvers.solve_krr` into a reused workspace
    (copy, factor, two triangular solves, residual check); the CG step is what
    :func:`~xrfm_torch.numerics.warm_solves.pcg_krr` does per iteration (a product with ``K``, two
    triangular solves with the factor, one residual norm read back). ``rows_per_iter`` is
    ``2 n step / solve``: the ``PCG_ROWS_PER_ITER`` that would spend half a factorization on CG.
    """
    from xrfm_torch.numerics.solvers import krr_workspace, solve_krr

    out = []
    for n in sizes:
        g = torch.Generator(device=device).manual_seed(n)
        x = torch.randn(n, 16, device=device, generator=g)
        K = torch.exp(-torch.cdist(x, x) / 4.0)
        y = torch.randn(n, 1, device=device, generator=g)
        W = krr_workspace(n, K.dtype, K.device)
        v = torch.cat([y, y.new_zeros(W.shape[0] - n, 1)])

        def solve(K: Tensor = K, y: Tensor = y, W: Tensor = W) -> None:
            solve_krr(K, y, 1e-3, workspace=W)

        def cg_step(K: Tensor = K, y: Tensor = y, W: Tensor = W, v: Tensor = v) -> None:
            ap = torch.addmm(y, K, y, beta=1e-3)
            z = torch.linalg.solve_triangular(W, v, upper=False)
            z = torch.linalg.solve_triangular(W.mT, z, upper=True)
            (ap - z[: y.shape[0]]).norm().item()

        times = {}
        for name, fn in (("solve", solve), ("cg_step", cg_step)):
            fn()
            runs = []
            for _ in range(repeats):
                runs.append(synced(fn, device)[1])
            times[name] = statistics.median(runs)
        ratio = times["cg_step"] / times["solve"]
        out.append({"n": n, **times, "rows_per_iter": 2 * n * ratio})
        del K, W
    return out


def report(rows: list[dict[str, Any]], names: list[str], models: list[str]) -> str:
    """Markdown: mean RMSE (mean fit s) per table and model, our ratios to the better reference."""
    lines = [
        "| dataset | " + " | ".join(models) + " | ours / better ref. RMSE | ours / its fit s |",
        "|---|" + "---|" * (len(models) + 2),
    ]
    for ds in names:
        cell: dict[str, tuple[float, float]] = {}
        for m in models:
            rs = [r for r in rows if r["dataset"] == ds and r["model"] == m and "rmse" in r]
            if rs:
                cell[m] = (
                    statistics.mean(r["rmse"] for r in rs),
                    statistics.mean(r["fit_s"] for r in rs),
                )
        out = [ds] + [
            f"{cell[m][0]:.5g} ({cell[m][1]:.2f} s)" if m in cell else "—" for m in models
        ]
        refs = [cell[m] for m in ("xrfm_default", "xrfm_d") if m in cell]
        if "ours" in cell and refs:
            best = min(refs)
            out += [f"{cell['ours'][0] / best[0]:.3f}", f"{cell['ours'][1] / best[1]:.2f}"]
        else:
            out += ["—", "—"]
        lines.append("| " + " | ".join(out) + " |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--datasets", nargs="*", help="names (default: every *.csv.gz, smallest first)")
    ap.add_argument("--seeds", nargs="*", type=int, default=[0, 1, 2])
    ap.add_argument("--models", nargs="*", default=MODELS)
    ap.add_argument(
        "--variant",
        action="append",
        default=[],
        help='NAME=JSON: another configuration of ours, e.g. direct=\'{"leaf": {"pcg_tol": null}}\'',
    )
    ap.add_argument("--solver-sizes", nargs="*", type=int, default=[])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--budget", type=float, default=300.0, help="stop starting seeds after (s)")
    ap.add_argument("--profile-dataset", default="house_16H")
    ap.add_argument(
        "--estimator-tables",
        nargs="*",
        type=Path,
        default=[],
        help="table files: the default estimator fitted once on each under the op tally",
    )
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args()
    for spec in a.variant:
        name, _, options = spec.partition("=")
        VARIANTS[name] = json.loads(options)
    unknown = [m for m in a.models if m not in (*MODELS, CPU_RULES) and m not in VARIANTS]
    if unknown:
        ap.error(f"unknown models {unknown}: use {MODELS} or a --variant name")
    files = {p.name.removesuffix(".csv.gz"): p for p in sorted(a.data_dir.glob("*.csv.gz"))}
    names = a.datasets or sorted(files, key=lambda n: files[n].stat().st_size)
    a.out.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    env = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if a.device.startswith("cuda") else "cpu",
    }
    print(json.dumps(env), flush=True)
    tables = {n: read_csv(files[n], "target") for n in names}

    def data(n: str, seed: int) -> Any:
        X, y, cols = tables[n]
        return prepare(X, y, seed, feature_names=cols)

    warm = data(names[0], 0)
    for m in a.models:  # CUDA context, handles and kernels' first loads stay out of the figures
        res = measure(m, warm, 0, a.device)
        print("warm-up", m, res.get("error") or res, flush=True)
    rows: list[dict[str, Any]] = []
    with (a.out / "results.jsonl").open("w") as fh:
        for seed in a.seeds:
            if time.perf_counter() - start > a.budget:
                print(f"budget reached: seeds from {seed} skipped", flush=True)
                break
            for n in names:
                d = data(n, seed)
                for m in a.models:
                    row = {"dataset": n, "seed": seed, "model": m, **env}
                    row.update(measure(m, d, seed, a.device))
                    rows.append(row)
                    fh.write(json.dumps(row) + "\n")
                    fh.flush()
                    brief = row.get("error", "").strip().splitlines()[-1:] or [
                        f"rmse {row['rmse']:.5g} fit {row['fit_s']:.2f}s"
                    ]
                    print(n, seed, m, brief[0], flush=True)
    prof_lines = [f"# Where the work runs ({env['device']}, torch {env['torch']})", ""]
    if a.profile_dataset in tables:
        d = data(a.profile_dataset, 0)
        for m in a.models:
            try:
                t = tally(m, d, 0, a.device)
                p, top = profile(m, d, 0, a.device)
            except Exception:
                prof_lines += [f"## {m}: failed", "```", traceback.format_exc()[-3000:], "```"]
                continue
            brief = {k: v for k, v in {**t, **p}.items() if k != "cpu_top"}
            print(m, json.dumps(brief), flush=True)
            prof_lines += [
                f"## {m} on {a.profile_dataset}, seed 0",
                "",
                "```",
                json.dumps({**t, **p}, indent=1),
                "```",
                "",
                "```",
                top,
                "```",
                "",
            ]
    for path in a.estimator_tables:
        try:
            t = estimator_tally(path, 0, a.device)
        except Exception:
            prof_lines += [f"## {path.name}: failed", "```", traceback.format_exc()[-3000:], "```"]
            continue
        print("estimator", json.dumps({k: v for k, v in t.items() if k != "cpu_top"}), flush=True)
        prof_lines += [
            f"## the default estimator on {t['table']}, seed 0",
            "",
            "```",
            json.dumps(t, indent=1),
            "```",
            "",
        ]
    (a.out / "profile.md").write_text("\n".join(prof_lines))
    if a.solver_sizes:
        costs = solver_costs(a.solver_sizes, a.device)
        (a.out / "solvers.json").write_text(json.dumps(costs, indent=1))
        for c in costs:
            print("solver", json.dumps(c), flush=True)
    md = report(rows, names, a.models)
    (a.out / "results.md").write_text(md + "\n")
    print(md)
    print(f"total {time.perf_counter() - start:.0f} s")


if __name__ == "__main__":
    main()
