"""Evaluation callbacks and a progress bar for the closed-form fit.

Tree summary, per-leaf metrics, AGOP feature importance and a temperature sweep.

All write into ``dirpath`` (default: the trainer's ``default_root_dir``, the Hydra run dir under
``train.py``). PNG charts need matplotlib (the ``plot`` extra); without it they are skipped with a
warning and the CSV/JSON files are still written.
"""

from __future__ import annotations

import csv
import json
import logging
import math
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback

from xrfm_torch.lit.module import XRFMLitModule
from xrfm_torch.models.contract import is_ensemble
from xrfm_torch.numerics.progress import FitBar
from xrfm_torch.tree.interpret import ImportanceSource

log = logging.getLogger(__name__)


def _module(pl_module: pl.LightningModule) -> XRFMLitModule:
    if not isinstance(pl_module, XRFMLitModule):
        raise TypeError(f"this callback needs an XRFMLitModule, got {type(pl_module).__name__}")
    return pl_module


def _pyplot() -> Any | None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        log.warning("matplotlib is not installed (pip install 'xrfm-torch[plot]'); skipping PNG")
        return None
    return plt


class _FileCallback(Callback):
    def __init__(self, dirpath: str | None = None) -> None:
        super().__init__()
        self.dirpath = dirpath

    def out_dir(self, trainer: pl.Trainer) -> Path:
        path = Path(self.dirpath if self.dirpath is not None else trainer.default_root_dir)
        path.mkdir(parents=True, exist_ok=True)
        return path


def tree_summary(module: XRFMLitModule) -> dict[str, Any]:
    """The module's fitted model as plain data (the contract's ``summary()``).

    One tree: input maps, depth, leaves, fit seconds, t*, bandwidth and sizes per leaf; bags and
    blends add theirs (``"n_bags"``, ``"kernels"``, ``"weights"``) and list their single trees.
    """
    return module.model.summary()


class TreeSummary(_FileCallback):
    """Writes ``tree_summary.json`` and logs a one-line summary once the tree is fitted."""

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        module = _module(pl_module)
        summary = tree_summary(module)
        (self.out_dir(trainer) / "tree_summary.json").write_text(json.dumps(summary, indent=1))
        # one line per single tree, whatever the model's kind (its own summary's layout varies)
        trees = [tree for _, tree in module.model.single_trees()]
        for k, tree in enumerate(trees):
            one = tree.summary()
            sizes = [leaf["n_support"] for leaf in one["leaves"]]
            log.info(
                "xRFM tree%s: %d tree(s) on %s, %d leaves, depth %s, leaf sizes %d..%d, t* %s, "
                "temperature %.3g, fit %.2fs",
                f" (bag {k + 1} of {len(trees)})" if len(trees) > 1 else "",
                one["n_trees"],
                " & ".join(one["input_maps"]),
                one["n_leaves"],
                one["depth"],
                min(sizes),
                max(sizes),
                [leaf["best_iter"] for leaf in one["leaves"]],
                one["temperature"],
                one["fit_seconds"] or 0.0,
            )


class LeafMetrics(_FileCallback):
    """Per-leaf validation and test error table, for every tree (rows routed hard by each).

    Writes ``leaf_metrics_{val,test}.csv`` with columns ``tree, leaf, n_support, n_rows`` and
    ``rmse`` (regression, original units) or ``accuracy`` (classification) of the model's
    predictions on the rows that tree routes to that leaf: each tree's rows add up to the split.
    Cross-fitted bags add a first column ``bag`` (each bag's trees and leaves, scored by the
    averaged model's predictions).
    """

    def __init__(self, dirpath: str | None = None) -> None:
        super().__init__(dirpath)
        self._sums: dict[tuple[int, int, int], list[float]] = {}

    def _reset(self) -> None:
        self._sums = {}

    def _accumulate(self, module: XRFMLitModule, outputs: Any) -> None:
        if not isinstance(outputs, dict):
            return
        x, y, pred = outputs["x"], outputs["y"], outputs["pred"]
        if module.hparams["task"] == "classification":
            err = (pred.argmax(1) == y.long()).double()
        else:
            err = ((pred - y) ** 2).double().reshape(len(x), -1).mean(1)
        xt = module.model_inputs(x)
        for b, bag in enumerate(t for _, t in module.model.single_trees()):
            for tree in range(len(bag.partition_trees())):
                ids = bag.leaf_ids(xt, tree)
                for leaf in ids.unique().tolist():
                    mask = ids == leaf
                    acc = self._sums.setdefault((b, tree, int(leaf)), [0.0, 0])
                    acc[0] += float(err[mask].sum())
                    acc[1] += int(mask.sum())

    def _write(self, trainer: pl.Trainer, module: XRFMLitModule, stage: str) -> None:
        name = "accuracy" if module.hparams["task"] == "classification" else "rmse"
        path = self.out_dir(trainer) / f"leaf_metrics_{stage}.csv"
        with path.open("w", newline="") as fh:
            w = csv.writer(fh)
            # several single trees (bags, or a blend's): the first column says which
            bagged = is_ensemble(module.model)
            w.writerow(["bag"] * bagged + ["tree", "leaf", "n_support", "n_rows", name])
            for b, bag in enumerate(t for _, t in module.model.single_trees()):
                for tree_id, tree in enumerate(bag.partition_trees()):
                    for leaf_id, leaf in enumerate(tree.leaf_list()):
                        total, count = self._sums.get((b, tree_id, leaf_id), [0.0, 0])
                        value = (
                            (total / count if name == "accuracy" else math.sqrt(total / count))
                            if count
                            else ""
                        )
                        row = [tree_id, leaf_id, int(leaf.support_.shape[0]), count, value]
                        w.writerow([b] * bagged + row)

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()

    def on_test_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._reset()

    def on_validation_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        if not trainer.sanity_checking:
            self._accumulate(_module(pl_module), outputs)

    def on_test_batch_end(
        self,
        trainer: pl.Trainer,
        pl_module: pl.LightningModule,
        outputs: Any,
        batch: Any,
        batch_idx: int,
        dataloader_idx: int = 0,
    ) -> None:
        self._accumulate(_module(pl_module), outputs)

    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking:
            self._write(trainer, _module(pl_module), "val")

    def on_test_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._write(trainer, _module(pl_module), "test")


class AGOPFeatureImportance(_FileCallback):
    """Feature importance from the tree (``agop_importance.csv`` + ``agop_importance.png``).

    Args:
        dirpath: Output folder.
        top_k: Features shown in the bar chart.
        source: ``"M"`` (leaf-size-weighted ``diag(M)``, default) or ``"agop"`` (diagonal of the
            tree's size-weighted AGOP, :meth:`xrfm_torch.xRFMTree.agop`).
    """

    def __init__(
        self, dirpath: str | None = None, top_k: int = 20, source: ImportanceSource = "M"
    ) -> None:
        super().__init__(dirpath)
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        if source not in ("M", "agop"):
            raise ValueError(f"source must be 'M' or 'agop', got {source!r}")
        self.top_k = top_k
        self.source = source

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        module = _module(pl_module)
        imp = module.model.feature_importance(self.source).cpu()
        names = list(module.hparams.get("feature_names") or [f"x{i}" for i in range(len(imp))])
        order = torch.argsort(imp, descending=True).tolist()
        out = self.out_dir(trainer)
        with (out / "agop_importance.csv").open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["rank", "feature", "importance"])
            for rank, j in enumerate(order):
                w.writerow([rank + 1, names[j], float(imp[j])])
        plt = _pyplot()
        if plt is None:
            return
        top = order[: self.top_k][::-1]
        fig, ax = plt.subplots(figsize=(6, 0.3 * len(top) + 1))
        ax.barh([names[j] for j in top], [float(imp[j]) for j in top], color="tab:blue")
        what = "diag(M)" if self.source == "M" else "diag(AGOP)"
        ax.set_xlabel(f"size-weighted {what} (sums to 1)")
        ax.set_title("AGOP feature importance")
        fig.tight_layout()
        fig.savefig(out / "agop_importance.png", dpi=100)
        plt.close(fig)


class TemperatureSweep(_FileCallback):
    """Validation error vs soft-routing temperature (``temperature_sweep.csv`` + ``.png``).

    One curve per single tree (``tree``: its place in ``model.single_trees()``; a blend's
    members were all fitted on the training rows and tuned on the validation rows). Cross-fitted
    bags validated on their own folds, of which the validation rows are training rows of the
    other bags: then no sweep is written. Where every tree is a single leaf, routing plays no
    part (the error is the same at every temperature): the callback writes no sweep and logs
    that instead.

    Args:
        dirpath: Output folder.
        grid: Temperatures (default: the trees' tuning grid).
    """

    def __init__(self, dirpath: str | None = None, grid: list[float] | None = None) -> None:
        super().__init__(dirpath)
        self.grid = grid

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        module = _module(pl_module)
        if "val" not in module.fit_data:
            log.warning("TemperatureSweep: the fit had no validation data; nothing to sweep")
            return
        Xv, yv = module.fit_data["val"]
        # honest outputs of other rows than the validation rows (cross-fitted bags: every row)
        honest = len(module.model.honest_outputs().targets)
        if honest != len(Xv):
            log.info(
                "TemperatureSweep: the model's honest outputs score %d rows, not the %d "
                "validation rows (cross-fitted bags score every row out of fold and tune their "
                "temperature each on its own fold: tree_summary.json), so no sweep is written",
                honest,
                len(Xv),
            )
            return
        trees = [t for _, t in module.model.single_trees() if t.n_leaves > len(t.trees)]
        if not trees:
            log.info(
                "TemperatureSweep: every tree is a single leaf, so routing plays no part and "
                "the temperature changes nothing; no sweep written"
            )
            return
        grid = list(self.grid or trees[0].config.temperature_grid)
        errs = [tree.temperature_errors(Xv, yv, grid) for tree in trees]
        out = self.out_dir(trainer)
        with (out / "temperature_sweep.csv").open("w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(["tree", "temperature", "val_mse"])
            for k, e in enumerate(errs):
                w.writerows((k, t, v) for t, v in zip(grid, e))
        plt = _pyplot()
        if plt is None:
            return
        fig, ax = plt.subplots(figsize=(5, 3.5))
        for k, (tree, e) in enumerate(zip(trees, errs)):
            name = f"tree {k}" if len(trees) > 1 else "soft routing"
            soft = [(t, v) for t, v in zip(grid, e) if t > 0]
            if soft:
                (line,) = ax.plot(*zip(*soft), "o-", label=name)
                ax.set_xscale("log")
                if float(tree.temperature_) > 0:  # the temperature it chose
                    ax.axvline(float(tree.temperature_), color=line.get_color(), lw=0.8, ls=":")
            hard = [v for t, v in zip(grid, e) if t == 0]
            if hard:
                ax.axhline(hard[0], color="tab:red", ls="--", lw=0.8)
        ax.set_xlabel("temperature T (dashed red: hard routing, T=0)")
        ax.set_ylabel("validation MSE (standardized target)")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / "temperature_sweep.png", dpi=100)
        plt.close(fig)


class FitProgressBar(Callback):
    """A tqdm bar for the closed-form fit, shown when Lightning's bar is.

    It counts leaves and moves with every RFM iteration (:class:`~xrfm_torch.numerics.progress.FitBar`),
    so a fit of one large leaf shows its iterations instead of standing still.
    """

    def __init__(self) -> None:
        super().__init__()
        self._bar = FitBar("xRFM fit")

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        module = _module(pl_module)
        if trainer.progress_bar_callback is None or not trainer.is_global_zero:
            return
        module.fit_progress.append(self._bar.leaf_done)
        module.fit_iterations.append(self._bar.iteration)

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        module = _module(pl_module)
        if self._bar.leaf_done in module.fit_progress:  # bound methods compare equal
            module.fit_progress.remove(self._bar.leaf_done)
        if self._bar.iteration in module.fit_iterations:
            module.fit_iterations.remove(self._bar.iteration)
        self._bar.close()
