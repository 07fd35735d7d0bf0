"""Shared pieces of the benchmark scripts: model runners, one subprocess per measurement."""

from __future__ import annotations

import importlib
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
#: The folder of benchmark tables (``reg_num/``, ``clf_num/``, ``mixed/``): the environment
#: variable ``XRFM_TORCH_DATASETS``, else a ``shared/datasets`` folder beside the repository.
#: Every script also takes ``--data-dir``.
DATASETS = Path(os.environ.get("XRFM_TORCH_DATASETS") or ROOT.parent / "shared" / "datasets")
DEFAULT_DATA = DATASETS / "reg_num"

XRFM_D_PARAMS = {  # pytabkit XRFM_D (the authors' recommended single configuration)
    "model": {
        "kernel": "l2",
        "bandwidth": 10.0,
        "exponent": 1.0,
        "diag": True,
        "bandwidth_mode": "constant",
    },
    "fit": {
        "reg": 1e-3,
        "iters": 5,
        "early_stop_rfm": True,
        "early_stop_multiplier": 1.1,
        "return_best_params": True,
        "verbose": False,
    },
}


#: The module a model's fit imports, loaded before its timer starts (:func:`load_library`;
#: a submodule's import loads its package too).
LIBRARIES: dict[str, str] = {
    **dict.fromkeys(("ours", "ours_single", "ours_bag5"), "xrfm_torch.estimators"),
    "xgboost": "xgboost",
    "lightgbm": "lightgbm",
    "catboost": "catboost",
    "realmlp": "pytabkit",
    "xrfm_default": "xrfm",
    "xrfm_d": "xrfm",
}


def load_library(model: str) -> None:
    """Import ``model``'s library (:data:`LIBRARIES`) ahead of its timed fit.

    A measurement runs in a fresh process, so the first import of a library would otherwise
    count as fit time: ``import catboost`` alone takes 0.2-0.4 s, more than CatBoost's whole fit
    of a 3000-row table, and our estimators' first import (scikit-learn's) 0.6-1.0 s. Every
    model's seconds, and the time limits derived from them, are its fit's alone. Unknown names
    load nothing (the runner refuses them).
    """
    if model in LIBRARIES:
        importlib.import_module(LIBRARIES[model])


def fit_on_split(model: Any, d: Any, seed: int) -> float:
    """Fit our ``model`` on the protocol split ``d`` (its validation rows given, generator seeded
    with ``seed``); the fit's wall seconds."""
    import torch

    t = torch.from_numpy
    start = time.perf_counter()
    model.fit(
        t(d.X_train),
        t(d.y_train),
        t(d.X_val),
        t(d.y_val),
        generator=torch.Generator().manual_seed(seed),
    )
    return time.perf_counter() - start


def fit_predict(
    model: str, d: Any, seed: int, threads: int, options: dict[str, Any], device: str = "cpu"
) -> tuple[np.ndarray, float, float, dict[str, Any]]:
    """Fit ``model`` on the protocol data ``d``.

    Returns (test predictions in original units, fit s, predict s, :func:`leaf_summary` of our
    tree or ``{}``).
    """
    import torch

    torch.set_num_threads(threads)
    inv = d.y_scaler.inverse
    if model == "ours":
        from xrfm_torch import LeafConfig, xRFMTree

        t = torch.from_numpy
        from xrfm_torch.models.bagging import BaggedTree

        if isinstance(options.get("leaf"), dict):  # JSON: {"leaf": {"iter_rows": 3000}}
            options = {**options, "leaf": LeafConfig(**options["leaf"])}
        n_bags = int(options.pop("n_bags", 1))  # {"n_bags": 5}: cross-fitted bags
        m = xRFMTree(**options)
        if n_bags > 1:
            m = BaggedTree(m, n_bags=n_bags)
        fit_s = fit_on_split(m, d, seed)
        s = time.perf_counter()
        with torch.no_grad():
            pred = m(t(d.X_test)).numpy()[:, 0]
        summary = leaf_summary(m) if n_bags == 1 else {"n_bags": n_bags, "leaves": m.n_leaves}
        return inv(pred), fit_s, time.perf_counter() - s, summary
    if model in ("xrfm_default", "xrfm_d"):
        from xrfm import xRFM  # (imported before its timer)

        t = torch.from_numpy
        kw = (
            {}
            if model == "xrfm_default"
            else {"rfm_params": XRFM_D_PARAMS, "overlap_fraction": 0.1}
        )
        m = xRFM(device=device, verbose=False, random_state=seed, **kw)
        s = time.perf_counter()
        m.fit(t(d.X_train), t(d.y_train[:, None]), t(d.X_val), t(d.y_val[:, None]))
        fit_s = time.perf_counter() - s
        s = time.perf_counter()
        out = m.predict(t(d.X_test))
        pred = (out.cpu().numpy() if torch.is_tensor(out) else np.asarray(out)).ravel()
        return inv(pred), fit_s, time.perf_counter() - s, {}
    # GBDTs: raw target, 2000 trees (3000 CatBoost), lr 0.05, early stopping 100 on validation
    ytr, yva = inv(d.y_train), inv(d.y_val)
    load_library(model)
    s = time.perf_counter()
    if model == "xgboost":
        import xgboost as xgb

        m = xgb.XGBRegressor(
            n_estimators=2000,
            learning_rate=0.05,
            early_stopping_rounds=100,
            n_jobs=threads,
            random_state=seed,
        )
        m.fit(d.X_train, ytr, eval_set=[(d.X_val, yva)], verbose=False)
    elif model == "lightgbm":
        import lightgbm as lgb

        m = lgb.LGBMRegressor(
            n_estimators=2000, learning_rate=0.05, n_jobs=threads, random_state=seed, verbose=-1
        )
        m.fit(
            d.X_train,
            ytr,
            eval_set=[(d.X_val, yva)],
            callbacks=[lgb.early_stopping(100, verbose=False)],
        )
    elif model == "catboost":
        import catboost as cb

        m = cb.CatBoostRegressor(
            iterations=3000,
            learning_rate=0.05,
            thread_count=threads,
            random_seed=seed,
            verbose=False,
            early_stopping_rounds=100,
            allow_writing_files=False,  # no catboost_info/ in the working directory
        )
        m.fit(d.X_train, ytr, eval_set=(d.X_val, yva))
    elif model == "realmlp":  # pytabkit's RealMLP-TD defaults; it scales the target itself
        from pytabkit import RealMLP_TD_Regressor

        m = RealMLP_TD_Regressor(n_threads=threads, device=device, random_state=seed)
        m.fit(d.X_train, ytr, d.X_val, yva)
    else:
        raise ValueError(f"unknown model {model!r}")
    fit_s = time.perf_counter() - s
    s = time.perf_counter()
    pred = np.asarray(m.predict(d.X_test)).ravel()
    return pred, fit_s, time.perf_counter() - s, {}


def leaf_summary(m: Any) -> dict[str, Any]:
    """Per-leaf figures of a fitted xRFMTree: t*, iterations run, rows and the chosen kernel."""
    leaves = list(m.leaves())
    return {
        "input_maps": m.input_map.names,
        "leaves": m.n_leaves,
        "t_star": [int(leaf.best_iter_) for leaf in leaves],
        "iters": [int(leaf.val_errors_.isfinite().sum()) for leaf in leaves],
        "rows": [leaf.support_.shape[0] for leaf in leaves],
        "q": [leaf.kernel.q for leaf in leaves],
        "bandwidth": [round(leaf.bandwidth, 3) for leaf in leaves],
        "reg": [float(leaf.reg_) for leaf in leaves],
        "temperature": float(m.temperature_),
    }


def peak_rss_mb() -> float:
    """Peak resident set size of this process in MiB."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_isolated(args: list[str], timeout: float, ranks: int = 1) -> dict[str, Any]:
    """Run ``python -m bench.worker ARGS`` in a fresh process; parse its last JSON line.

    With ``ranks > 1``, that many worker processes form a gloo process group (a file rendezvous)
    and fit one distributed model (``xRFMTree(distributed=True)``); the result is rank 0's, with
    ``peak_rss_mb`` the sum over the ranks and ``peak_rss_mb_ranks`` each rank's.
    """
    env = dict(os.environ)
    cmd = [sys.executable, "-m", "bench.worker", *args]
    if ranks == 1:
        try:
            proc = subprocess.run(
                cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT
            )
        except subprocess.TimeoutExpired:
            return {"error": f"timeout after {timeout:.0f}s"}
        return _last_json(proc.returncode, proc.stdout, proc.stderr)
    with tempfile.TemporaryDirectory() as tmp:
        rdv = ["--world", str(ranks), "--rendezvous", str(Path(tmp) / "rendezvous")]
        procs = [
            subprocess.Popen(
                [*cmd, "--rank", str(r), *rdv],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                cwd=ROOT,
            )
            for r in range(ranks)
        ]
        results = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                return {"error": f"timeout after {timeout:.0f}s"}
            results.append(_last_json(p.returncode, out, err))
    for res in results:
        if "error" in res:
            return res
    rss = [res["peak_rss_mb"] for res in results]
    return {**results[0], "peak_rss_mb": sum(rss), "peak_rss_mb_ranks": rss, "ranks": ranks}


def _last_json(returncode: int, stdout: str, stderr: str) -> dict[str, Any]:
    lines = [ln for ln in stdout.splitlines() if ln.startswith("{")]
    if returncode != 0 or not lines:
        return {"error": (stderr or stdout)[-800:]}
    return json.loads(lines[-1])


def run_module_child(module: str, args: list[str]) -> dict[str, Any]:
    """Run ``python -m MODULE ARGS`` from the repository root; its last JSON line, or exit."""
    proc = subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, cwd=ROOT
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.exit(f"python -m {module} {' '.join(args)} failed:\n{proc.stderr[-2000:]}")
    return json.loads(lines[-1])


def write_table(out: Path, module: str, lines: list[str]) -> None:
    """``out/results.md``: the command that made it, then the markdown table ``lines``."""
    command = f"python -m {module} " + " ".join(sys.argv[1:])
    (out / "results.md").write_text(f"Command: `{command}`\n\n" + "\n".join(lines) + "\n")
    print(f"results in {out}")
