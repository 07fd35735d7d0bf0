"""Do the same seeds give the same fitted models as another commit? (bit for bit)

Fits ``xRFMTree()`` with its default settings on the protocol split of each dataset, once with the
source tree of ``--against`` (exported with ``git archive``) and once with this checkout's, each in
its own process with the same thread count, and compares every ``state_dict`` tensor and the test
predictions exactly (``torch.equal``)::

    python -m bench.same_models --against HEAD~3 --datasets cpu_act houses house_16H \
        --data-dir PATH/TO/reg_num

Both sides run ``xrfm_torch.xRFMTree().fit(X, y, X_val, y_val, generator=...)``: the call that
every version of the package accepts. Exits 1 when any model differs.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from bench.common import DEFAULT_DATA, ROOT
from xrfm_torch.data import load_dataset, prepare, read_csv

# Run in a child process whose PYTHONPATH points at one source tree.
CHILD = """
import sys, numpy as np, torch
import xrfm_torch
from xrfm_torch import xRFMTree
data, out, seed, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
torch.set_num_threads(threads)
d = {k: torch.from_numpy(v) for k, v in np.load(data).items()}
model = xRFMTree().fit(d["X_train"], d["y_train"], d["X_val"], d["y_val"],
                       generator=torch.Generator().manual_seed(seed))
with torch.no_grad():
    pred = model(d["X_test"])
torch.save({"state": model.state_dict(), "pred": pred, "source": xrfm_torch.__file__}, out)
"""


def load(name: str, data_dir: Path, seed: int) -> dict[str, np.ndarray]:
    """The protocol split of ``name`` (packaged cpu_act, else ``data_dir/name.csv.gz``)."""
    path = data_dir / f"{name}.csv.gz"
    X, y, names = read_csv(path, "target") if path.exists() else load_dataset(name)
    d = prepare(X, y, seed, feature_names=names)
    return {
        "X_train": d.X_train,
        "y_train": d.y_train,
        "X_val": d.X_val,
        "y_val": d.y_val,
        "X_test": d.X_test,
        "y_test": d.y_test,
    }


def fit_in(src: Path, data: Path, out: Path, seed: int, threads: int) -> dict:
    """Fit in a child process importing ``xrfm_torch`` from ``src``; return what it saved."""
    env = {"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-c", CHILD, str(data), str(out), str(seed), str(threads)]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--against", required=True, help="git commit to compare with")
    ap.add_argument("--datasets", nargs="+", default=["cpu_act", "houses", "house_16H"])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--new-keys", action="store_true", help="allow state_dict entries the commit did not have"
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
        for name in a.datasets:
            split = load(name, a.data_dir, a.seed)
            np.savez(tmp / "data.npz", **{k: v for k, v in split.items() if k != "y_test"})
            before = fit_in(old / "src", tmp / "data.npz", tmp / "a.pt", a.seed, a.threads)
            after = fit_in(ROOT / "src", tmp / "data.npz", tmp / "b.pt", a.seed, a.threads)
            n, differ, worst = compare(before, after, a.new_keys)
            same_pred = torch.equal(before["pred"], after["pred"])
            failed |= differ > 0 or not same_pred
            y = split["y_test"]
            rmse = [
                float(np.sqrt(np.mean((s["pred"].numpy()[:, 0] - y) ** 2))) for s in (before, after)
            ]
            rows.append((name, n, differ, worst, same_pred, *rmse))
    print(f"against {a.against}, seed {a.seed}, default xRFMTree(), {a.threads} threads")
    print(
        "| dataset | state_dict entries | differing | max abs diff | test predictions identical | "
        "test RMSE (std. target) before | after |"
    )
    print("|---|---|---|---|---|---|---|")
    for name, n, differ, worst, same, r0, r1 in rows:
        print(
            f"| {name} | {n} | {differ} | {worst:.3g} | {'yes' if same else 'NO'} | {r0:.6g} | {r1:.6g} |"
        )
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
