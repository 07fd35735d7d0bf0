"""Classification and mixed-type tables: our estimators beside the GBDTs, RealMLP and the reference.

    python -m bench.peers --data-dir PATH/TO/datasets --seeds 0 1 2
    python -m bench.peers --tables clf_num/pol mixed/adult --models ours xgboost realmlp

One run, one protocol (``design`` notes: seeded 70/10/20 split, numeric columns standardized with
training statistics, log-loss objective, early stopping on the validation rows). Each model gets
the tables as its authors intend:

- ``ours``: ``XRFMClassifier`` / ``XRFMRegressor`` (defaults) on the raw DataFrame (text columns,
  missing cells), validation rows as ``eval_set``; ``ours_single`` / ``ours_bag5``: the same with
  ``n_bags=1`` / ``5``; ``--options '{"diag": false}'`` passes keyword arguments to these three
  (the other models ignore it; ``"compress": N`` calls ``compress(N)`` after the fit, timed
  with the fit);
- ``xgboost`` / ``lightgbm``: pandas ``category`` columns (training categories; unseen → missing);
  ``catboost``: ``cat_features`` with a missing cell as its own text value. 2000 trees (CatBoost
  3000), learning rate 0.05, early stopping 100;
- ``realmlp``: pytabkit's ``RealMLP_TD_Classifier`` / ``_Regressor`` with default settings, category
  columns by name, numeric missing cells mean-imputed plus one indicator per such column (it refuses
  NaN);
- ``xrfm_default`` / ``xrfm_d``: the reference ``xrfm`` (defaults / XRFM_D with
  ``classification_mode="prevalence"``) on one-hot training categories (missing or unseen = all
  zeros) plus the imputed numeric columns and indicators.

Scores on the test rows: log-loss (probabilities clipped to [1e-15, 1], renormalized), accuracy and
AUROC (binary), or RMSE. Each (table, seed, model) runs in its own process. Needs the ``bench`` extra
and ``pytabkit``. Writes ``results.jsonl`` and ``results.md`` (means over seeds) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.common import DATASETS, XRFM_D_PARAMS, load_library, run_module_child, write_table

MODELS = [
    "ours",
    "ours_single",
    "ours_bag5",
    "xgboost",
    "lightgbm",
    "catboost",
    "realmlp",
    "xrfm_default",
    "xrfm_d",
]
TABLES = [
    "clf_num/pol",
    "clf_num/house_16H",
    "clf_num/california",
    "clf_num/electricity",
    "mixed/adult",
    "mixed/ames",
]
REGRESSION = {"mixed/ames"}
#: Rows of each part in a ``--warm-up`` fit.
WARM_UP_ROWS = 300
#: What a fit reports beside its scores (the candidate an anytime fit kept), for ``measure``.
INFO: dict[str, Any] = {}


def is_regression(name: str) -> bool:
    """Whether table ``name`` (``folder/table``) is a regression task: ames, ``reg_num/*`` and
    the evaluation base's ``base_reg/*`` (``bench.base``)."""
    return name in REGRESSION or name.startswith(("reg_num/", "base_reg/"))


def clipped(p: np.ndarray) -> np.ndarray:
    """Probabilities clipped to [1e-15, 1] and renormalized (every model scored alike)."""
    p = np.clip(p, 1e-15, 1)
    return p / p.sum(1, keepdims=True)


def logloss(p: np.ndarray, y: np.ndarray) -> float:
    """Mean negative log-probability of labels ``y`` under :func:`clipped` ``p``."""
    p = clipped(p)
    return float(-np.log(p[np.arange(len(y)), y]).mean())


def split_table(path: Path, seed: int):
    """Protocol split of ``path``: (X_train, y_train, X_val, y_val, X_test, y_test), text columns."""
    import pandas as pd

    from xrfm_torch.data import protocol_split

    df = pd.read_csv(path)
    X, y = df.drop(columns="target"), df["target"].to_numpy()
    text = [c for c in X.columns if not pd.api.types.is_numeric_dtype(X[c])]
    num = [c for c in X.columns if c not in text]
    tr, va, te = protocol_split(len(df), seed)
    parts = [X.iloc[tr].copy(), X.iloc[va].copy(), X.iloc[te].copy()]
    mean, std = parts[0][num].mean(), parts[0][num].std(ddof=0) + 1e-12
    for p in parts:
        p[num] = (p[num] - mean) / std
    return parts, (y[tr], y[va], y[te]), text


def class_codes(ys: tuple) -> tuple:
    """Each part's labels as codes ``0 .. K-1`` of the training part's (``ys[0]``) classes."""
    classes = np.unique(ys[0])
    return tuple(np.searchsorted(classes, y) for y in ys)


def as_categories(parts: list, text: list[str]) -> list:
    """pandas ``category`` columns with the training rows' categories (others become missing)."""
    out = [p.copy() for p in parts]
    for c in text:
        levels = sorted(parts[0][c].dropna().unique())
        for p in out:
            p[c] = p[c].astype("category").cat.set_categories(levels)
    return out


def impute(parts: list, text: list[str], one_hot: bool) -> list:
    """Numeric missing cells → training mean + indicator; text → one-hot (``one_hot``) or a value."""
    import pandas as pd

    num = [c for c in parts[0].columns if c not in text]
    holes = [c for c in num if parts[0][c].isna().any()]
    mean = parts[0][num].mean()
    out = []
    for p in parts:
        q = p[num].fillna(mean)
        for c in holes:
            q[f"{c}__missing"] = p[c].isna().astype(float)
        if one_hot:
            for c in text:
                for level in sorted(parts[0][c].dropna().unique()):
                    q[f"{c}={level}"] = (p[c] == level).astype(float)
        else:
            q = pd.concat([q, p[text].fillna("__missing__").astype(str)], axis=1)
        out.append(q)
    return out


def fit_peer(
    model: str,
    parts: list,
    ys: tuple,
    text: list[str],
    classify: bool,
    seed: int,
    options: dict | None = None,
):
    """Fit ``model``; returns (test scores: probabilities (n, K) or predictions (n,), fit s,
    prediction seconds per 1000 test rows: the best of three predictions of all test rows).

    ``options``: keyword arguments for our estimators (the ``ours*`` models only).
    """
    if options and not model.startswith("ours"):
        raise ValueError(f"--options applies to the ours* models only, not {model!r}")
    import torch

    ytr, yva, _ = ys
    load_library(model)  # a first import is not fit time
    start = time.perf_counter()
    if model in ("ours", "ours_single", "ours_bag5"):
        from xrfm_torch import XRFMClassifier, XRFMRegressor

        kw = {"ours_single": {"n_bags": 1}, "ours_bag5": {"n_bags": 5}}.get(model, {})
        kw = {**kw, **(options or {})}
        compress = kw.pop("compress", None)  # not an argument: the lighter predictor, after fit
        m = (XRFMClassifier if classify else XRFMRegressor)(random_state=seed, **kw)
        m.fit(parts[0], ytr, eval_set=(parts[1], yva))
        if compress is not None:
            m.compress(int(compress))
        if getattr(m, "time_limit", None) is not None:  # an anytime fit: what it kept
            summary = m.model_.summary()
            INFO["chosen"] = summary["chosen"]
            INFO["trials"] = {t["candidate"]: t["seconds"] for t in summary["trials"]}
    elif model in ("xgboost", "lightgbm"):
        cat = as_categories(parts, text)
        if model == "xgboost":
            import xgboost as xgb

            cls = xgb.XGBClassifier if classify else xgb.XGBRegressor
            m = cls(
                n_estimators=2000,
                learning_rate=0.05,
                early_stopping_rounds=100,
                n_jobs=2,
                random_state=seed,
                enable_categorical=True,
            )
            m.fit(cat[0], ytr, eval_set=[(cat[1], yva)], verbose=False)
        else:
            import lightgbm as lgb

            cls = lgb.LGBMClassifier if classify else lgb.LGBMRegressor
            m = cls(n_estimators=2000, learning_rate=0.05, n_jobs=2, random_state=seed, verbose=-1)
            m.fit(cat[0], ytr, eval_set=[(cat[1], yva)], callbacks=[lgb.early_stopping(100, False)])
        parts = cat
    elif model == "catboost":
        import catboost as cb

        parts = [p.copy() for p in parts]
        for p in parts:
            p[text] = p[text].fillna("__missing__").astype(str)
        cls = cb.CatBoostClassifier if classify else cb.CatBoostRegressor
        m = cls(
            iterations=3000,
            learning_rate=0.05,
            thread_count=2,
            random_seed=seed,
            verbose=False,
            early_stopping_rounds=100,
            allow_writing_files=False,
            cat_features=text,
        )
        m.fit(parts[0], ytr, eval_set=(parts[1], yva))
    elif model == "realmlp":
        from pytabkit import RealMLP_TD_Classifier, RealMLP_TD_Regressor

        parts = impute(parts, text, one_hot=False)
        cls = RealMLP_TD_Classifier if classify else RealMLP_TD_Regressor
        m = cls(n_threads=2, device="cpu", random_state=seed)
        m.fit(parts[0], ytr, parts[1], yva, cat_col_names=text)
    elif model in ("xrfm_default", "xrfm_d"):
        from xrfm import xRFM

        parts = impute(parts, text, one_hot=True)
        kw: dict = (
            {}
            if model == "xrfm_default"
            else {
                "rfm_params": XRFM_D_PARAMS,
                "overlap_fraction": 0.1,
                "classification_mode": "prevalence",
            }
        )
        m = xRFM(device="cpu", verbose=False, random_state=seed, n_threads=2, **kw)
        t = lambda a: torch.as_tensor(np.asarray(a, dtype=np.float32))  # noqa: E731
        mu, sd = (0.0, 1.0) if classify else (float(np.mean(ytr)), float(np.std(ytr)))
        # regression targets standardized as in bench.run (the reference has no intercept)
        yt = (
            (lambda a: torch.as_tensor(a).long())
            if classify
            else (lambda a: t((a - mu) / sd)[:, None])
        )
        m.fit(t(parts[0]), yt(ytr), t(parts[1]), yt(yva))
        if not classify:
            fit_s = time.perf_counter() - start
            pred, per_1000 = timed(lambda: m.predict(t(parts[2])), len(ys[2]))
            return np.asarray(pred).ravel() * sd + mu, fit_s, per_1000
        parts = [t(p) for p in parts]
    else:
        raise ValueError(f"unknown model {model!r}")
    fit_s = time.perf_counter() - start
    predict = m.predict_proba if classify else m.predict
    out, per_1000 = timed(lambda: predict(parts[2]), len(ys[2]))
    out = out.cpu().numpy() if torch.is_tensor(out) else np.asarray(out)
    return out.reshape(len(ys[2]), -1) if classify else out.ravel(), fit_s, per_1000


def timed(predict: Any, n_rows: int) -> tuple[Any, float]:
    """``predict()``'s output and its seconds per 1000 rows, the best of three calls."""
    best, out = float("inf"), None
    for _ in range(3):
        start = time.perf_counter()
        out = predict()
        best = min(best, time.perf_counter() - start)
    return out, 1000 * best / max(n_rows, 1)


def measure(
    path: Path,
    seed: int,
    model: str,
    threads: int,
    options: dict | None = None,
    warm_up: bool = False,
) -> dict:
    """Fit and score one (table, seed, model) in this process.

    ``warm_up``: first fit the same model on the first :data:`WARM_UP_ROWS` rows of each part,
    untimed, so that a GPU's one-off costs (its context, library handles, the first load of each
    kernel) stay out of the timed fit.
    """
    import torch

    torch.set_num_threads(threads)
    name = f"{path.parent.name}/{path.name.removesuffix('.csv.gz')}"
    classify = not is_regression(name)
    INFO.clear()
    parts, ys, text = split_table(path, seed)
    if classify:  # labels 0 .. K-1 for every peer (string labels are the estimators' own test)
        ys = class_codes(ys)
    if warm_up:
        few = [p.iloc[:WARM_UP_ROWS] for p in parts]
        try:
            fit_peer(model, few, tuple(y[:WARM_UP_ROWS] for y in ys), text, classify, seed, options)
        except Exception as err:  # e.g. a class missing from the few rows: the fit is timed cold
            print(f"warm-up failed ({type(err).__name__}: {err}); the fit is timed without it")
        INFO.clear()
    out, fit_s, predict_s = fit_peer(model, parts, ys, text, classify, seed, options)
    yt = ys[2]
    row: dict = {"fit_s": fit_s, "predict_s_per_1000": predict_s, **INFO}
    if warm_up:
        row["warm_up"] = True
    if classify:
        p = clipped(out)
        row["logloss"] = logloss(out, yt)
        row["accuracy"] = float((p.argmax(1) == yt).mean())
        if p.shape[1] == 2:
            from sklearn.metrics import roc_auc_score

            row["auroc"] = float(roc_auc_score(yt, p[:, 1]))
    else:
        row["rmse"] = float(np.sqrt(np.mean((out - yt) ** 2)))
    return row


def summary(rows: list[dict], tables: list[str], models: list[str]) -> list[str]:
    """Markdown: mean log-loss (accuracy) or RMSE, and mean fit seconds, per table and model."""
    lines = ["| table | " + " | ".join(models) + " |", "|---|" + "---|" * len(models)]
    for tab in tables:
        cells = []
        for m in models:
            rs = [r for r in rows if r["table"] == tab and r["model"] == m and "error" not in r]
            if not rs:
                cells.append("—")
                continue
            fit = statistics.mean(r["fit_s"] for r in rs)
            if "logloss" in rs[0]:
                ll = statistics.mean(r["logloss"] for r in rs)
                acc = 100 * statistics.mean(r["accuracy"] for r in rs)
                cells.append(f"{ll:.4f} ({acc:.2f} %, {fit:.1f} s, n={len(rs)})")
            else:
                rmse = statistics.mean(r["rmse"] for r in rs)
                cells.append(f"{rmse:.4f} ({fit:.1f} s, n={len(rs)})")
        lines.append(f"| {tab} | " + " | ".join(cells) + " |")
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DATASETS)
    ap.add_argument("--tables", nargs="+", default=TABLES)
    ap.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    ap.add_argument("--seeds", nargs="+", type=int, default=[0])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--options", default="{}", help="JSON keyword arguments for the ours* models")
    ap.add_argument("--out", type=Path, default=Path("bench-peers"))
    ap.add_argument(
        "--warm-up",
        action="store_true",
        help="fit each model once on a few rows before the timed fit (a GPU's one-off costs)",
    )
    ap.add_argument("--one", nargs=3, metavar=("PATH", "SEED", "MODEL"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    options = json.loads(a.options)
    if a.one:
        row = measure(Path(a.one[0]), int(a.one[1]), a.one[2], a.threads, options, a.warm_up)
        print(json.dumps(row))
        return
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    with (a.out / "results.jsonl").open("a") as fh:
        for seed in a.seeds:
            for tab in a.tables:
                for model in a.models:
                    path = a.data_dir / f"{tab}.csv.gz"
                    args = ["--one", str(path), str(seed), model, "--threads", str(a.threads)]
                    args += ["--warm-up"] if a.warm_up else []
                    row = {"table": tab, "seed": seed, "model": model}
                    if model.startswith("ours") and options:
                        args += ["--options", a.options]
                        row["options"] = options
                    try:
                        row.update(run_module_child("bench.peers", args))
                    except SystemExit as err:  # one failing peer does not end the run
                        row["error"] = str(err)[-600:]
                    rows.append(row)
                    fh.write(json.dumps(row) + "\n")
                    fh.flush()
                    print(json.dumps(row), flush=True)
    write_table(a.out, "bench.peers", summary(rows, a.tables, a.models))


if __name__ == "__main__":
    main()
