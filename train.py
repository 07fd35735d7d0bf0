"""Entry point: ``python train.py dataset=cpu_act`` (configs in ``conf/``, logic in xrfm_torch.pipeline)."""

from __future__ import annotations

import hydra
import torch.distributed as dist
from omegaconf import DictConfig

from xrfm_torch.pipeline import format_metrics, run


@hydra.main(version_base="1.3", config_path="conf", config_name="train")
def main(cfg: DictConfig) -> float | None:
    result = run(cfg)
    test = {k: v for k, v in result["metrics"].items() if k.startswith(("test/", "time/"))}
    if result["is_global_zero"]:  # under trainer=ddp every rank runs this script
        print(f"\nResults ({cfg.dataset.name}, seed {cfg.seed}) in {result['output_dir']}")
        print(format_metrics(test or result["metrics"]))
    if dist.is_available() and dist.is_initialized():
        # Lightning leaves a gloo process group to the interpreter's exit, where destroying it
        # while its threads still run can abort the process ("terminate called without an
        # active exception", seen under trainer=ddp); the ranks end it together instead.
        dist.barrier()
        dist.destroy_process_group()
    value = result["metrics"].get(str(cfg.get("optimized_metric")))
    return None if value is None else float(value)


if __name__ == "__main__":
    main()
