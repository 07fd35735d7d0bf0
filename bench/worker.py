"""One measurement in its own process (so peak RSS belongs to one model): prints a JSON line."""

from __future__ import annotations

import argparse
import json

import numpy as np

from bench.common import fit_predict, peak_rss_mb
from xrfm_torch.data import prepare, read_csv
from xrfm_torch.data.sources import make_synthetic


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--csv", help="dataset file (protocol split)")
    ap.add_argument("--synthetic-n", type=int, help="scaling task with this many training rows")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--options", default="{}", help="JSON keyword arguments for xRFMTree")
    ap.add_argument("--rank", type=int, default=0, help="this process's rank (with --world)")
    ap.add_argument("--world", type=int, default=1, help="processes fitting one model (gloo)")
    ap.add_argument("--rendezvous", help="file the ranks meet at (with --world > 1)")
    a = ap.parse_args()
    options = json.loads(a.options)
    if a.world > 1:
        import torch.distributed as dist

        dist.init_process_group(
            "gloo", init_method=f"file://{a.rendezvous}", rank=a.rank, world_size=a.world
        )
        options["distributed"] = True
    if a.synthetic_n:
        n = a.synthetic_n
        total = int(n / 0.8)
        X, y, _ = make_synthetic(total, 20, 0.1, a.seed)
        # the protocol's scaling split: first n train, next n/8 validation, rest test
        from xrfm_torch.data.protocol import ProtocolData, Standardizer

        tr, va, te = slice(0, n), slice(n, n + n // 8), slice(n + n // 8, total)
        xs, ys = Standardizer.fit(X[tr]), Standardizer.fit(y[tr])
        f = lambda s: xs.transform(X[s]).astype(np.float32)  # noqa: E731
        g = lambda s: ys.transform(y[s]).astype(np.float32)  # noqa: E731
        d = ProtocolData(f(tr), g(tr), f(va), g(va), f(te), g(te), ys, [])
    else:
        X, y, names = read_csv(a.csv, "target")
        d = prepare(X, y, a.seed, feature_names=names)
    pred, fit_s, pred_s, info = fit_predict(a.model, d, a.seed, a.threads, options)
    y_test = d.y_scaler.inverse(d.y_test)
    rmse = float(np.sqrt(np.mean((pred - y_test) ** 2)))
    r2 = float(1 - np.mean((pred - y_test) ** 2) / np.var(y_test))
    print(
        json.dumps(
            {
                "rmse": rmse,
                "r2": r2,
                "fit_s": fit_s,
                "predict_s": pred_s,
                "peak_rss_mb": peak_rss_mb(),
                **info,
            }
        )
    )


if __name__ == "__main__":
    main()
