"""xRFM as a head: ``encoder -> xRFMTree``, the encoder trained by SGD, the head in closed form.

With ``sgd_loss="head"`` the tree's leaves are fitted in closed form on encoder features of a fixed
*support* share of the training rows; SGD minimizes the loss on the *other* rows (a support row's
own prediction nearly interpolates its target, so its gradient would only pull the encoder back to
stale features). :class:`RefitXRFM` re-fits the tree on the current features every few epochs.
With ``sgd_loss="linear"`` the encoder is trained through a linear layer (softmax cross-entropy for
classes) on every training row, and the closed-form head replaces that layer when training ends:
the features are those of the usual network, the head is fitted to them
(``docs/design-use.md``, "Head use").
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import Tensor, nn

from xrfm_torch.data.protocol import Task
from xrfm_torch.kernels import Kernel
from xrfm_torch.lit.module import XRFMLitModule, collect, collect_indexed
from xrfm_torch.models import xRFMTree
from xrfm_torch.numerics.state import ResizableBuffers

log = logging.getLogger(__name__)

#: What SGD minimizes: the fitted head's loss, that of a KRR solved inside each batch, or that of
#: a linear layer the closed-form head replaces at the end.
SgdLoss = Literal["head", "batch_krr", "linear"]
SGD_LOSSES: tuple[SgdLoss, ...] = ("head", "batch_krr", "linear")


def mlp_encoder(hidden: Sequence[int] = (64, 64), out_features: int = 16) -> nn.Sequential:
    """A GELU MLP whose first layer infers its input width (``nn.LazyLinear``)."""
    if not hidden:
        return nn.Sequential(nn.LazyLinear(out_features))
    layers: list[nn.Module] = [nn.LazyLinear(hidden[0]), nn.GELU()]
    for a, b in itertools.pairwise(hidden):
        layers += [nn.Linear(a, b), nn.GELU()]
    layers.append(nn.Linear(hidden[-1], out_features))
    return nn.Sequential(*layers)


def batch_krr_loss(h: Tensor, y: Tensor, kernel: Kernel, reg: float) -> Tensor:
    """Mean squared error of a kernel ridge regression fitted in closed form inside the batch.

    The first half of the rows is the support set: ``alpha = (K(h_s, h_s) + reg I)^{-1} y_s``; the loss
    is measured on the second half, ``mean((K(h_q, h_s) alpha - y_q)^2)``. The solve is a
    differentiable Cholesky, so the gradient reaches ``h`` through the coefficients as well: the
    encoder learns features on which a freshly solved kernel machine generalizes, which is what the
    closed-form head does with them.

    Args:
        h: Features, shape (b, k), b >= 4.
        y: Targets, shape (b, c).
        kernel: Kernel (identity ``M``: the head's leaves learn their own ``M`` afterwards).
        reg: Ridge ``lambda``.
    """
    half = h.shape[0] // 2
    hs, hq, ys, yq = h[:half], h[half:], y[:half], y[half:]
    K = kernel(hs, hs)
    K = K + reg * torch.eye(half, dtype=K.dtype, device=K.device)
    alpha = torch.cholesky_solve(ys, torch.linalg.cholesky(K))
    return torch.nn.functional.mse_loss(kernel(hq, hs) @ alpha, yq)


class ResidualMLP(nn.Module):
    """``h = x + MLP(x)`` with the last layer zero-initialized: starts as the identity map.

    As an encoder in front of an xRFM head it starts from "xRFM on the raw inputs" and SGD only
    has to learn the correction.

    Args:
        in_features: Input (and output) width ``d``.
        hidden: Hidden widths of the MLP.
    """

    def __init__(self, in_features: int, hidden: Sequence[int] = (64, 64)) -> None:
        super().__init__()
        widths = [in_features, *hidden]
        layers: list[nn.Module] = []
        for a, b in itertools.pairwise(widths):
            layers += [nn.Linear(a, b), nn.GELU()]
        last = nn.Linear(widths[-1], in_features)
        nn.init.zeros_(last.weight)
        nn.init.zeros_(last.bias)
        self.mlp = nn.Sequential(*layers, last)

    def forward(self, x: Tensor) -> Tensor:
        return x + self.mlp(x)


class XRFMHeadModule(ResizableBuffers, XRFMLitModule):
    """Encoder + xRFM head, trained jointly: SGD outside the leaves, closed form inside.

    SGD trains the encoder (and, with ``tree.trainable_routing``, the split vectors, thresholds and
    temperature); the leaves are fitted in closed form (their coefficients are buffers, no optimizer
    touches them).

    Args:
        tree: The head, with ``input_transform="identity"`` (default: ``xRFMTree`` so set). Use
            ``temperature > 0`` or ``trainable_routing=True`` for gradients through the routing;
            leaf kernels pass gradients to the encoder either way.
        encoder: Any module mapping inputs (n, d) to features (n, k). Default: a
            :class:`ResidualMLP` (``residual=True``, needs ``in_features`` or ``feature_names``) or
            :func:`mlp_encoder`.
        hidden: Hidden widths of the default encoder.
        residual: Default encoder is a :class:`ResidualMLP` (identity at initialization).
        in_features: Input width for the residual encoder (default: ``len(feature_names)``).
        out_features: Feature width of the default non-residual encoder.
        lr: Adam learning rate.
        weight_decay: Adam weight decay.
        support_fraction: Share of training rows the leaves are fitted on during SGD (seeded by
            ``seed``). When training ends, the head is re-fitted once on all training rows.
        sgd_loss: ``"head"``: the loss of the fitted tree's predictions on non-support rows (leaf
            coefficients fixed between refits; trains trainable routing too). ``"batch_krr"``:
            :func:`batch_krr_loss` with the tree's kernel and ``reg`` (coefficients re-solved in
            every batch, differentiably; needs batches of a few hundred rows or more; the tree
            only serves validation and the final fit). ``"linear"``: a linear layer on the
            features (attribute ``probe``) trained with the encoder on all training rows (mean
            squared error, or cross-entropy for classes); the tree serves validation and, fitted
            on all training rows when training ends, replaces it.
        task, num_classes, target_mean, target_std, seed, feature_names: As in
            :class:`~xrfm_torch.lit.XRFMLitModule`.
        weighted: Must be ``False``: the head does not take sample weights yet (a clear error
            instead of a silently unweighted fit).
    """

    #: Which training rows the leaves fit; sized by the training rows, so a fresh module takes
    #: a checkpoint's mask through ``ResizableBuffers``.
    support_mask: Tensor
    #: One tree (a head refits its leaves on new features; no cross-fitted bags).
    model: xRFMTree  # the head: one tree

    def __init__(
        self,
        tree: xRFMTree | None = None,
        *,
        encoder: nn.Module | None = None,
        hidden: Sequence[int] = (64, 64),
        residual: bool = True,
        in_features: int | None = None,
        out_features: int = 16,
        lr: float = 1e-3,
        weight_decay: float = 0.0,
        support_fraction: float = 0.5,
        sgd_loss: SgdLoss = "head",
        task: Task = "regression",
        num_classes: int | None = None,
        target_mean: float | Sequence[float] = 0.0,
        target_std: float | Sequence[float] = 1.0,
        seed: int = 0,
        feature_names: Sequence[str] | None = None,
        weighted: bool = False,
        n_fit_rows: int | None = None,
        rarest_class_rows: int | None = None,
    ) -> None:
        # n_fit_rows, rarest_class_rows: the datamodule's facts for an ensemble; a head is one
        # tree (kept as arguments: save_hyperparameters reads them from this frame)
        if weighted:
            raise ValueError(
                "XRFMHeadModule does not take sample weights yet (a dataset weight column); "
                "use XRFMLitModule, or drop dataset.weight"
            )
        # Quantile knots fitted on the first features would not follow the encoder, and the batch
        # KRR loss sees the features themselves: a head's tree maps nothing. The caller's tree is
        # used as given, so it must say so itself.
        tree = tree if tree is not None else xRFMTree(input_transform="identity")
        if tree.config.input_transform != "identity":
            raise ValueError(
                "a head's tree must see the encoder features as they are: pass "
                f"xRFMTree(input_transform='identity'), got input_transform={tree.config.input_transform!r}"
            )
        super().__init__(
            tree,
            task=task,
            num_classes=num_classes,
            target_mean=target_mean,
            target_std=target_std,
            seed=seed,
            feature_names=feature_names,
            n_bags=1,  # a head refits one tree's leaves on new features
            blend_kernels=None,
        )
        if not 0 < support_fraction < 1:
            raise ValueError(f"support_fraction must be in (0, 1), got {support_fraction!r}")
        if lr <= 0:
            raise ValueError(f"lr must be positive, got {lr!r}")
        if sgd_loss not in SGD_LOSSES:
            raise ValueError(f"sgd_loss must be one of {SGD_LOSSES}, got {sgd_loss!r}")
        if encoder is None and residual:
            d = in_features if in_features is not None else len(feature_names or [])
            if d < 1:
                raise ValueError("the residual encoder needs in_features or feature_names")
            encoder = ResidualMLP(d, list(hidden))
        self.encoder = encoder if encoder is not None else mlp_encoder(list(hidden), out_features)
        if sgd_loss == "linear":
            outputs = (
                num_classes if task == "classification" else torch.as_tensor(target_mean).numel()
            )
            self.probe: nn.Module = nn.LazyLinear(int(outputs or 1))
        self.automatic_optimization = True
        self.register_buffer("support_mask", torch.empty(0, dtype=torch.bool))
        self.raw_data: dict[str, tuple[Tensor, Tensor]] = {}

    def forward(self, x: Tensor) -> Tensor:
        return self.model(self.encoder(x))

    def model_inputs(self, x: Tensor) -> Tensor:
        return self.features(x)

    # ---- closed-form part ----------------------------------------------------------------------
    def setup(self, stage: str) -> None:
        # Fit before configure_optimizers, so the tree's trainable parameters exist by then.
        if stage != "fit" or self.model.is_fitted:
            return
        train_loader, val_loader = self._fit_sources()
        X, y, rows = collect_indexed(train_loader, self.device)
        g = torch.Generator().manual_seed(int(self.hparams["seed"]))
        n_support = max(4, round(self.hparams["support_fraction"] * len(X)))
        chosen = torch.zeros(len(X), dtype=torch.bool, device=self.device)
        chosen[torch.randperm(len(X), generator=g)[:n_support].to(self.device)] = True
        if rows is None:
            log.warning("training batches carry no row index: SGD also sees the support rows")
        else:  # mask over dataset row indices (the loader may shuffle)
            mask = torch.zeros(int(rows.max()) + 1, dtype=torch.bool, device=self.device)
            mask[rows[chosen]] = True
            self.support_mask = mask
        if self.hparams["sgd_loss"] == "linear":
            self.probe(self.features(X[:2]))  # materialize the lazy layer before the optimizer
        self.raw_data = {
            "support": (X[chosen], self.encode_targets(y[chosen])),
            "all": (X, self.encode_targets(y)),
        }
        if val_loader is not None and not (isinstance(val_loader, list) and not val_loader):
            Xv, yv = collect(val_loader, self.device)
            self.raw_data["val"] = (Xv, self.encode_targets(yv))
        self.refit_tree(full=True)

    def on_fit_start(self) -> None:  # the tree was fitted in setup(); only the process check stays
        if self.trainer.world_size > 1:
            raise RuntimeError("XRFMHeadModule fits the tree in one process; use devices=1")

    @torch.no_grad()
    def features(self, x: Tensor) -> Tensor:
        """Encoder features in eval mode, without gradients."""
        was_training = self.encoder.training
        self.encoder.eval()
        try:
            return self.encoder(x)
        finally:
            self.encoder.train(was_training)

    def on_train_end(self) -> None:
        # the encoder is trained: the final closed-form fit may use every training row
        self.refit_tree(full=not self.model.config.trainable_routing, rows="all")

    @torch.no_grad()
    def refit_tree(
        self, *, full: bool = False, rows: Literal["support", "all"] = "support"
    ) -> None:
        """Closed-form re-fit of the head on current encoder features.

        Args:
            full: Rebuild the whole tree. Otherwise, with trainable routing only the leaves are
                re-fitted, so the routing parameters the optimizer holds stay the same objects.
            rows: ``"support"`` (the SGD-time support rows) or ``"all"`` training rows.
        """
        X, y = self.raw_data[rows]
        H = self.features(X)
        data = {"train": (H, y)}
        if "val" in self.raw_data:
            Xv, yv = self.raw_data["val"]
            data["val"] = (self.features(Xv), yv)
        if full or not self.model.config.trainable_routing:
            self.fit_tree(data)
        else:
            g = torch.Generator().manual_seed(int(self.hparams["seed"]))
            val = data.get("val")
            self.model.refit_leaves(
                H, y, None if val is None else val[0], None if val is None else val[1], generator=g
            )

    # ---- SGD part ------------------------------------------------------------------------------
    def sgd_targets(self, y: Tensor) -> Tensor:
        """What SGD regresses on: the targets (n, c), or one-hot class rows (n, K)."""
        if self.hparams["task"] == "classification":
            return torch.nn.functional.one_hot(y.long(), self.hparams["num_classes"]).float()
        return y.float().reshape(len(y), -1)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor | None:  # type: ignore[override]
        x, y = batch[0], batch[1]
        if self.hparams["sgd_loss"] == "linear":
            out = self.probe(self.encoder(x))
            if self.hparams["task"] == "classification":
                loss = torch.nn.functional.cross_entropy(out, y.long())
            else:
                loss = torch.nn.functional.mse_loss(out, y.to(out.dtype).reshape(len(y), -1))
            self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=len(x))
            return loss
        if self.hparams["sgd_loss"] == "batch_krr":
            if len(x) < 4:
                return None
            t = self.sgd_targets(y).to(x.dtype)
            loss = batch_krr_loss(self.encoder(x), t, self.model.kernel, self.model.config.leaf.reg)
            self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=len(x))
            return loss
        if len(batch) > 2 and self.support_mask.numel():  # drop support rows (see module doc)
            keep = ~self.support_mask[batch[2]]
            x, y = x[keep], y[keep]
        if len(x) == 0:
            return None
        raw = self(x)
        loss = torch.nn.functional.mse_loss(raw, self.sgd_targets(y).to(raw.dtype))
        self.log("train/loss", loss, on_step=False, on_epoch=True, batch_size=len(x), prog_bar=True)
        pred = raw.detach()
        if self.hparams["task"] == "classification":
            pred = self.model.targets.probabilities(pred)
        self.train_metrics.update(self.to_output(pred), self.original_targets(y))
        self.log_dict(self.train_metrics, on_step=False, on_epoch=True, batch_size=len(x))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:  # type: ignore[override]
        params = [p for p in self.parameters() if p.requires_grad]
        return torch.optim.Adam(
            params, lr=self.hparams["lr"], weight_decay=self.hparams["weight_decay"]
        )


class RefitXRFM(Callback):
    """Re-fit the head in closed form on current encoder features every ``every_n_epochs`` epochs.

    Args:
        every_n_epochs: Refit after every this many training epochs (>= 1).
    """

    def __init__(self, every_n_epochs: int = 1) -> None:
        super().__init__()
        if every_n_epochs < 1:
            raise ValueError(f"every_n_epochs must be >= 1, got {every_n_epochs!r}")
        self.every_n_epochs = every_n_epochs
        self.refits = 0

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not isinstance(pl_module, XRFMHeadModule):
            raise TypeError(f"RefitXRFM needs an XRFMHeadModule, got {type(pl_module).__name__}")
        if (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            pl_module.refit_tree()
            self.refits += 1
            log.info("refitted the xRFM head after epoch %d", trainer.current_epoch)
