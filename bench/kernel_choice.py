"""Which kernel a classifier should use on a table: each kernel's model, scored honestly.

    python -m bench.kernel_choice --data-dir PATH/TO/tables --tables clf_suite/hi mixed/adult \
        --seeds 0 1 2 --kernels laplace gaussian --out OUT

For every (table, seed) of the peers' protocol split (:func:`bench.peers.split_table`) and every
kernel, the default ``XRFMClassifier`` with that kernel (everything else its default) is fitted,
and three sets of probabilities are kept: the test rows', and the rows each model could score
without having trained on them: the out-of-fold predictions of the pooled training + validation
rows where the model is bagged (``tree_.oof_``), else the validation rows (used only to choose
settings). From these, rules that pick or mix kernels per table are scored without refitting:

- ``best_val``: the kernel of lowest honest log-loss (the first listed on a tie);
- ``mean``: the average of the kernels' probabilities;
- ``blend``: :class:`~xrfm_torch.tree.blend.KernelBlend`'s rule (the classifier's default since
  0.15): weights in ``{0, 1/4, ..., 1}`` of lowest honest log-loss of the mixed probabilities.

Writes ``OUT/rows-SHARD.jsonl`` (one row per table, seed and model, rules included, with the
columns of :mod:`bench.peers`) and ``OUT/arrays-SHARD.npz`` (every probability set, for other
rules). ``--shard i/n`` takes every n-th (table, seed) job from the i-th, so that n processes
can share one device. ``--rescore ROWS ARRAYS`` fits nothing: it scores the rules again from a
run's saved rows (fit seconds) and arrays, into ``OUT/rows-rescored.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bench.common import DATASETS
from bench.peers import clipped, logloss, split_table


def scores(p: np.ndarray, y: np.ndarray) -> dict:
    """Test log-loss, accuracy and (binary) AUROC of probabilities ``p`` (n, K), as bench.peers."""
    row = {"logloss": logloss(p, y), "accuracy": float((clipped(p).argmax(1) == y).mean())}
    if p.shape[1] == 2:
        from sklearn.metrics import roc_auc_score

        row["auroc"] = float(roc_auc_score(y, clipped(p)[:, 1]))
    return row


def fit_kernel(
    parts: list, ys: tuple, seed: int, kernel: str, device: str, options: dict | None = None
) -> dict:
    """One kernel's model: fit seconds, test probabilities, honest probabilities and their labels."""
    import torch

    from xrfm_torch import XRFMClassifier
    from xrfm_torch.tree.bagging import BaggedTree

    start = time.perf_counter()
    m = XRFMClassifier(kernel=kernel, random_state=seed, device=device, **(options or {}))
    m.fit(parts[0], ys[0], eval_set=(parts[1], ys[1]))
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    fit_s = time.perf_counter() - start
    test = np.asarray(m.predict_proba(parts[2]))
    if isinstance(m.tree_, BaggedTree):
        honest, labels = m.tree_.oof_.cpu().numpy(), np.concatenate([ys[0], ys[1]])
    else:
        honest, labels = np.asarray(m.predict_proba(parts[1])), ys[1]
    return {"fit_s": fit_s, "test": test, "honest": honest, "labels": labels}


def blend_weights(fits: dict[str, dict], steps: int = 4) -> np.ndarray:
    """KernelBlend's weights: the grid row of lowest honest log-loss (its own functions)."""
    import torch

    from xrfm_torch.tree.blend import weight_grid
    from xrfm_torch.tree.honest import row_losses

    outs = torch.stack([torch.as_tensor(f["honest"]) for f in fits.values()]).double()
    labels = torch.as_tensor(next(iter(fits.values()))["labels"])
    grid = weight_grid(len(fits), steps)
    losses = [
        float(row_losses(torch.einsum("k,knc->nc", w, outs), labels, "classification").mean())
        for w in grid
    ]
    return grid[int(np.argmin(losses))].numpy()


def rules(fits: dict[str, dict]) -> dict[str, tuple[np.ndarray, list[str]]]:
    """Each rule's test probabilities and the kernels it used (see the module docstring)."""
    names = list(fits)
    honest = {k: logloss(f["honest"], f["labels"]) for k, f in fits.items()}
    best = min(names, key=lambda k: (honest[k], names.index(k)))
    mean = sum(f["test"] for f in fits.values()) / len(fits)
    w = blend_weights(fits)
    blend = sum(wk * f["test"] for wk, f in zip(w, fits.values()))
    used = [f"{k}={wk:g}" for k, wk in zip(names, w) if wk > 0]
    return {"best_val": (fits[best]["test"], [best]), "mean": (mean, names), "blend": (blend, used)}


def run_job(
    path: Path, seed: int, kernels: list[str], device: str, options: dict | None = None
) -> tuple[list[dict], dict]:
    """Rows and arrays of one (table, seed)."""
    tab = f"{path.parent.name}/{path.name.removesuffix('.csv.gz')}"
    parts, ys, _ = split_table(path, seed)
    classes = np.unique(ys[0])
    ys = tuple(np.searchsorted(classes, y) for y in ys)
    fits = {k: fit_kernel(parts, ys, seed, k, device, options) for k in kernels}
    rows, arrays = [], {f"{tab}|{seed}|y_test": ys[2]}
    for k, f in fits.items():
        honest = logloss(f["honest"], f["labels"])
        rows.append(
            {"table": tab, "seed": seed, "model": f"ours_{k}", "fit_s": f["fit_s"],
             "honest_logloss": honest, "honest_rows": len(f["labels"]), **scores(f["test"], ys[2])}
        )  # fmt: skip
        for part in ("test", "honest", "labels"):
            arrays[f"{tab}|{seed}|{k}|{part}"] = f[part]
    rows.extend(rule_rows(tab, seed, fits, ys[2]))
    return rows, arrays


def rule_rows(tab: str, seed: int, fits: dict[str, dict], y_test: np.ndarray) -> list[dict]:
    """One row per rule (fit seconds: all the kernels' fits)."""
    rows = []
    fit_s = sum(f["fit_s"] for f in fits.values())
    for name, (p, used) in rules(fits).items():
        rows.append(
            {"table": tab, "seed": seed, "model": f"ours_{name}", "kernels": used,
             "fit_s": fit_s, **scores(p, y_test)}
        )  # fmt: skip
    return rows


def rescore(rows_path: Path, arrays_path: Path, kernels: list[str]) -> list[dict]:
    """The rule rows of a finished run, from its rows (fit seconds) and arrays."""
    arrays = np.load(arrays_path)
    rows = [json.loads(line) for line in rows_path.read_text().splitlines()]
    fit_s = {(r["table"], r["seed"], r["model"]): r["fit_s"] for r in rows}
    out = []
    for tab, seed in sorted({(r["table"], r["seed"]) for r in rows}):
        fits = {
            k: {
                "fit_s": fit_s[(tab, seed, f"ours_{k}")],
                **{part: arrays[f"{tab}|{seed}|{k}|{part}"] for part in ("test", "honest", "labels")},
            }
            for k in kernels
        }  # fmt: skip
        out += [r for r in rows if (r["table"], r["seed"]) == (tab, seed) and
                r["model"] in {f"ours_{k}" for k in kernels}]  # fmt: skip
        out += rule_rows(tab, seed, fits, arrays[f"{tab}|{seed}|y_test"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DATASETS)
    ap.add_argument("--tables", nargs="+", default=[])
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--kernels", nargs="+", default=["laplace", "gaussian"])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--shard", default="0/1", help="i/n: every n-th job from the i-th")
    ap.add_argument(
        "--done", type=Path, help="rows file of an earlier run: skip its (table, seed)s"
    )
    ap.add_argument("--options", default="{}", help="JSON keyword arguments of every model")
    ap.add_argument("--rescore", nargs=2, type=Path, metavar=("ROWS", "ARRAYS"))
    ap.add_argument("--out", type=Path, default=Path("bench-kernel-choice"))
    a = ap.parse_args()
    if a.rescore:
        a.out.mkdir(parents=True, exist_ok=True)
        rows = rescore(*a.rescore, a.kernels)
        (a.out / "rows-rescored.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return
    import torch

    torch.set_num_threads(a.threads)
    i, n = (int(v) for v in a.shard.split("/"))
    done = set()
    if a.done is not None:
        done = {(r["table"], r["seed"]) for r in map(json.loads, a.done.read_text().splitlines())}
    jobs = [(s, t) for s in a.seeds for t in a.tables if (t, s) not in done][i::n]
    a.out.mkdir(parents=True, exist_ok=True)
    arrays: dict = {}
    with (a.out / f"rows-{i}.jsonl").open("a") as fh:
        for seed, tab in jobs:
            rows, arr = run_job(
                a.data_dir / f"{tab}.csv.gz", seed, a.kernels, a.device, json.loads(a.options)
            )
            arrays.update(arr)
            for row in rows:
                fh.write(json.dumps(row) + "\n")
                print(json.dumps(row), flush=True)
            fh.flush()
            # rewritten after every job, so a run stopped early keeps what it finished
            np.savez_compressed(a.out / f"arrays-{i}.npz", **arrays)


if __name__ == "__main__":
    main()
