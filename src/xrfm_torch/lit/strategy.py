"""Lightning DDP for closed-form fits: the process group without the gradient wrapper.

``XRFMLitModule`` has nothing to train by gradient (its tree is fitted in closed form in
``on_fit_start``), and ``DistributedDataParallel`` refuses a module without trainable
parameters. :class:`ClosedFormDDPStrategy` is Lightning's ``DDPStrategy`` (process launch,
process group, samplers, metric syncing) that leaves such a module unwrapped; a module with
trainable parameters (a head with an encoder) is wrapped as usual. Under it, every rank fits its
share of the tree's leaves (``xRFMTree(distributed=True)``, :mod:`xrfm_torch.tree.parallel`).

    python train.py dataset=cpu_act trainer=ddp trainer.devices=2         # 2 CPU processes
    python train.py dataset=cpu_act trainer=ddp trainer.num_nodes=2 ...   # with torchrun, per node
"""

from __future__ import annotations

from lightning.pytorch.strategies import DDPStrategy


class ClosedFormDDPStrategy(DDPStrategy):
    """``DDPStrategy`` that wraps the module only if it has parameters that train by gradient."""

    strategy_name = "xrfm_ddp"

    def configure_ddp(self) -> None:
        if self.model is not None and any(p.requires_grad for p in self.model.parameters()):
            super().configure_ddp()
