"""Do the same seeds give the same fitted models as another commit? (bit for bit)

Fits ``xRFMTree()`` with its default settings on the protocol split of each table, once with the
source tree of ``--against`` (exported with ``git archive``) and once with this checkout's, each in
its own process with the same thread count, and compares every ``state_dict`` tensor and the test
predictions exactly (``torch.equal``; ``--upgrade`` when the commit saved an older state format:
its state is first loaded into this checkout's model, whose loader renames and fills entries)::

    python -m tools.same_models --against HEAD~3 --datasets cpu_act houses house_16H \
        --classification california --uncertainty cpu_act \
        --default-classifier clf_suite/breast_cancer --data-dir DIR

Regression tables come from ``DIR/reg_num`` (cpu_act also ships with the package), the
``--classification`` tables from ``DIR/clf_num`` (``xRFMTree(task="classification")``; the
class scores and probabilities are compared), the ``--uncertainty`` ones from ``DIR/reg_num``
(``xRFMTree(uncertainty="calibrated")``; means and standard deviations compared). Both sides run
``xrfm_torch.xRFMTree(**options).fit(X, y, X_val, y_val, generator=...)``: a call every version of
the package since those options exist accepts. The ``--default-classifier`` tables (paths under
DIR, e.g. ``clf_suite/breast_cancer``) are fitted by ``XRFMClassifier(random_state=seed)`` with
its defaults and the validation rows as ``eval_set`` (a kernel blend of bags on small tables):
its ``model_`` (``tree_`` before 0.16) state and test probabilities are compared. Exits 1 when any model differs.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench.common import DATASETS, ROOT
from xrfm_torch.data import load_dataset, prepare, read_csv

# Run in a child process whose PYTHONPATH points at one source tree.
CHILD = """
import sys, numpy as np, torch
import xrfm_torch
from xrfm_torch import xRFMTree
import json
data, out, seed, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
options = json.loads(sys.argv[5])
torch.set_num_threads(threads)
d = {k: torch.from_numpy(v) for k, v in np.load(data).items()}
if options.get("estimator") == "XRFMClassifier":  # the default classifier: a blend of bags
    from xrfm_torch import XRFMClassifier
    n = {k: v.numpy() for k, v in d.items()}
    est = XRFMClassifier(random_state=seed).fit(
        n["X_train"], n["y_train"], eval_set=(n["X_val"], n["y_val"]))
    model = est.model_ if hasattr(est, "model_") else est.tree_  # tree_ before 0.16
    pred = torch.as_tensor(est.predict_proba(n["X_test"]))
else:
    model = xRFMTree(**options).fit(d["X_train"], d["y_train"], d["X_val"], d["y_val"],
                                    generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        if options.get("uncertainty", "none") != "none":
            pred = torch.cat(model(d["X_test"], return_std=True), 1)
        elif options.get("task") == "classification":
            pred = torch.cat([model(d["X_test"]), model.predict_proba(d["X_test"])], 1)
        else:
            pred = model(d["X_test"])
config = model.get_config() if hasattr(model, "get_config") else None
torch.save({"state": model.state_dict(), "pred": pred, "source": xrfm_torch.__file__,
            "config": config}, out)
"""

#: What each kind of fit passes to ``xRFMTree`` and which folder of DIR its tables come from.
KINDS = {
    "regression": ({}, "reg_num"),
    "classification": ({"task": "classification"}, "clf_num"),
    "uncertainty": ({"uncertainty": "calibrated"}, "reg_num"),
    "default_classifier": ({"estimator": "XRFMClassifier"}, ""),
}


def load(name: str, data_dir: Path, seed: int, regression: bool) -> dict[str, np.ndarray]:
    """The protocol split of ``name`` (``data_dir/name.csv.gz``, else the packaged table)."""
    path = data_dir / f"{name}.csv.gz"
    X, y, names = read_csv(path, "target") if path.exists() else load_dataset(name)
    d = prepare(X, y, seed, regression=regression, feature_names=names)
    return {
        "X_train": d.X_train,
        "y_train": d.y_train,
        "X_val": d.X_val,
        "y_val": d.y_val,
        "X_test": d.X_test,
        "y_test": d.y_test,
    }


def fit_in(src: Path, data: Path, out: Path, seed: int, threads: int, options: dict) -> dict:
    """Fit in a child process importing ``xrfm_torch`` from ``src``; return what it saved."""
    env = {"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-c", CHILD, str(data), str(out), str(seed), str(threads)]
    cmd.append(json.dumps(options))
    subprocess.run(cmd, check=True, env=env)
    saved = torch.load(out, weights_only=False)
    if not str(saved["source"]).startswith(str(src)):
        raise RuntimeError(f"the child imported {saved['source']}, not the tree under {src}")
    return saved


def same_values(x: torch.Tensor, y: torch.Tensor) -> bool:
    """Bitwise-equal values, NaN where the other has NaN (a leaf records NaN for iterations it skipped)."""
    if torch.equal(x, y):
        return True
    if not x.is_floating_point():
        return False
    return torch.equal(x.isnan(), y.isnan()) and torch.equal(x.nan_to_num(0.0), y.nan_to_num(0.0))


def compare(a: dict, b: dict, new_keys: bool = False) -> tuple[int, int, float]:
    """``(entries compared, entries that differ, largest absolute difference)``; keys must match.

    Differing entries are printed by name.
    """
    sa, sb = a["state"], b["state"]
    if new_keys:  # buffers added by the checkout: reported, not compared
        added = sorted(set(sb) - set(sa))
        if added:
            print(f"  new in the checkout: {added}")
        sb = {k: v for k, v in sb.items() if k in sa}
    if sa.keys() != sb.keys():
        only = sorted(set(sa) ^ set(sb))
        raise SystemExit(f"state_dict keys differ: {only[:10]}")
    differ, worst = 0, 0.0
    for key in sa:
        x, y = sa[key], sb[key]
        if not isinstance(x, torch.Tensor):
            if x != y:
                differ += 1
                print(f"  {key}: {x!r} != {y!r}")
            continue
        if x.dtype != y.dtype or x.shape != y.shape or not same_values(x, y):
            differ += 1
            print(f"  {key}: {x.dtype} {tuple(x.shape)} vs {y.dtype} {tuple(y.shape)}")
            if x.shape == y.shape and x.is_floating_point():
                worst = max(
                    worst, float((x.double() - y.double()).abs().nan_to_num(float("inf")).max())
                )
            else:
                worst = float("inf")
    return len(sa), differ, worst


def upgraded(saved: dict, options: dict) -> dict:
    """The saved state of an older layout loaded into this checkout's model, saved again.

    The model is ``xRFMTree(**options)``, or for the default classifier the saved model's config
    built by this checkout. The loader's upgrade renames and fills entries; it copies every value
    exactly, so the comparison still finds any value the refactor changed. Format versions are
    set to this checkout's (the one entry an upgrade must change).
    """
    from xrfm_torch import xRFMTree
    from xrfm_torch.models.factory import model_from_config

    config = saved.get("config")
    model = model_from_config(config) if "estimator" in options and config else xRFMTree(**options)
    model.load_state_dict(saved["state"])
    out = dict(model.state_dict())
    for name, module in model.named_modules():
        if type(module).get_extra_state is not torch.nn.Module.get_extra_state:
            out[f"{name}._extra_state" if name else "_extra_state"] = module.get_extra_state()
    return out


def test_score(kind: str, pred: np.ndarray, y: np.ndarray) -> float:
    """Test RMSE of the mean (standardized target), or log-loss of the probabilities."""
    if kind in ("classification", "default_classifier"):
        proba = pred[:, pred.shape[1] // 2 :] if kind == "classification" else pred
        return float(-np.mean(np.log(proba[np.arange(len(y)), y.astype(int)])))
    return float(np.sqrt(np.mean((pred[:, 0] - y) ** 2)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="git commit to compare with")
    ap.add_argument("--datasets", nargs="*", default=["cpu_act", "houses", "house_16H"])
    ap.add_argument("--classification", nargs="*", default=["california"], help="clf_num tables")
    ap.add_argument("--uncertainty", nargs="*", default=["cpu_act"], help="reg_num tables")
    ap.add_argument(
        "--default-classifier",
        nargs="*",
        default=[],
        help="tables (paths under DIR without .csv.gz, e.g. clf_suite/breast_cancer) fitted by "
        "XRFMClassifier() with its defaults (a kernel blend of bags); probabilities compared",
    )
    ap.add_argument("--data-dir", type=Path, default=DATASETS, help="holds reg_num/, clf_num/")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--new-keys", action="store_true", help="allow state_dict entries the commit did not have"
    )
    ap.add_argument(
        "--upgrade",
        action="store_true",
        help="the commit saved an older state format: load its state into this checkout's model "
        "(the upgrade on load) and compare that model's state; the format version is not compared",
    )
    a = ap.parse_args()
    rows, failed = [], False
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        old = tmp / "old"
        old.mkdir()
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", a.against, "src"], check=True, capture_output=True
        ).stdout
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive, check=True)
        fits = [("regression", n) for n in a.datasets]
        fits += [("classification", n) for n in a.classification]
        fits += [("uncertainty", n) for n in a.uncertainty]
        fits += [("default_classifier", n) for n in a.default_classifier]
        for kind, name in fits:
            options, folder = KINDS[kind]
            regression = kind in ("regression", "uncertainty")
            split = load(name, a.data_dir / folder, a.seed, regression)
            np.savez(tmp / "data.npz", **{k: v for k, v in split.items() if k != "y_test"})
            args = (a.seed, a.threads, options)
            before = fit_in(old / "src", tmp / "data.npz", tmp / "a.pt", *args)
            after = fit_in(ROOT / "src", tmp / "data.npz", tmp / "b.pt", *args)
            if a.upgrade:
                before["state"] = upgraded(before, options)
            n, differ, worst = compare(before, after, a.new_keys)
            same_pred = torch.equal(before["pred"], after["pred"])
            failed |= differ > 0 or not same_pred
            scores = [test_score(kind, s["pred"].numpy(), split["y_test"]) for s in (before, after)]
            rows.append((f"{name} ({kind})", n, differ, worst, same_pred, *scores))
    print(f"against {a.against}, seed {a.seed}, default xRFMTree(**options), {a.threads} threads")
    print(
        "| table (fit) | state_dict entries | differing | max abs diff | test predictions "
        "identical | test score before | after |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, n, differ, worst, same, r0, r1 in rows:
        print(
            f"| {name} | {n} | {differ} | {worst:.3g} | {'yes' if same else 'NO'} | {r0:.6g} | {r1:.6g} |"
        )
    print("test score: RMSE of the standardized target, or log-loss of the probabilities")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
