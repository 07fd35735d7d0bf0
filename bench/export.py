"""Export cost: a fitted model's eager, torch.export and onnxruntime predictions, times and gaps.

    python -m bench.export --datasets cpu_act pol --out bench-export

For each table (``reg_num`` protocol split, seed 0): fits the default ``xRFMTree`` (float32),
exports it (``export_program``, ``export_onnx``), and reports the export seconds, the prediction
seconds for the test rows in batches of ``--batch`` (best of 3) and the largest absolute gap to
the eager predictions. Writes ``results.jsonl`` and ``results.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from bench.common import DEFAULT_DATA, fit_on_split, write_table


def best_of(fn: Callable[[], object], rounds: int = 3) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def measure(path: Path, batch: int, threads: int, out: Path) -> dict:
    import onnxruntime
    import torch

    from xrfm_torch import export_onnx, export_program, xRFMTree
    from xrfm_torch.data import prepare, read_csv

    torch.set_num_threads(threads)
    X, y, names = read_csv(path, "target")
    d = prepare(X, y, 0, feature_names=names)
    t = torch.from_numpy
    model = xRFMTree()
    fit_on_split(model, d, 0)
    x = t(d.X_test)
    batches = list(torch.split(x, batch))
    start = time.perf_counter()
    program = export_program(model, x[:2]).module()
    export_s = time.perf_counter() - start
    start = time.perf_counter()
    onnx_path = export_onnx(model, out / f"{path.name}.onnx", x[:2])
    onnx_s = time.perf_counter() - start
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(str(onnx_path), options)

    def eager() -> np.ndarray:
        with torch.no_grad():
            return torch.cat([model(b) for b in batches]).numpy()

    def exported() -> np.ndarray:
        with torch.no_grad():
            return torch.cat([program(b) for b in batches]).numpy()

    def ort() -> np.ndarray:
        return np.concatenate([session.run(None, {"x": b.numpy()})[0] for b in batches])

    want = eager()  # the same batches: eager float32 results move with the batch composition
    scale = float(np.abs(want).max())
    return {
        "rows": len(x),
        "leaves": model.n_leaves,
        "temperature": float(model.temperature_),
        "maps": model.input_map.names,
        "export_s": export_s,
        "onnx_export_s": onnx_s,
        "eager_s": best_of(eager),
        "program_s": best_of(exported),
        "onnxruntime_s": best_of(ort),
        "program_gap": float(np.abs(exported() - want).max()) / scale,
        "onnxruntime_gap": float(np.abs(ort() - want).max()) / scale,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--datasets", nargs="+", default=["cpu_act", "pol"])
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("bench-export"))
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    lines = [
        "| dataset | test rows | leaves, T | export s (torch / ONNX) | predict s: eager | "
        "exported | onnxruntime | max gap / max abs (exported, ONNX) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    with (a.out / "results.jsonl").open("a") as fh:
        for name in a.datasets:
            r = measure(a.data_dir / f"{name}.csv.gz", a.batch, a.threads, a.out)
            r["dataset"] = name
            fh.write(json.dumps(r) + "\n")
            print(json.dumps(r), flush=True)
            lines.append(
                f"| {name} | {r['rows']} | {r['leaves']}, {r['temperature']:.3g} | "
                f"{r['export_s']:.1f} / {r['onnx_export_s']:.1f} | {r['eager_s']:.3f} | "
                f"{r['program_s']:.3f} | {r['onnxruntime_s']:.3f} | "
                f"{r['program_gap']:.1e}, {r['onnxruntime_gap']:.1e} |"
            )
    for f in a.out.glob("*.onnx"):
        f.unlink()  # model files hold training rows and are large; the table is what we keep
    write_table(a.out, "bench.export", lines)


if __name__ == "__main__":
    main()
