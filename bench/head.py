"""Encoder + xRFM head vs encoder + linear head vs xRFM on raw inputs (issue: head use).

Task: latent ``z ~ N(0, I_8)``, target ``y = sin(2 z0) + z1 z2 + 0.1 noise``; the model sees
``x = g(R z)`` with a fixed random rotation ``R`` and the elementwise nonlinearity
``g(u) = sign(u) |u|^3``, which no linear feature map can undo.

    python -m bench.head [--epochs 30] [--seed 0]

Prints test MSE (on the standardized target) of the models, all with fixed seeds: the encoder +
xRFM head is trained with the head's own loss (``sgd_loss="head"``) and with the in-batch
closed-form KRR loss (``sgd_loss="batch_krr"``, batches of ``--krr-batch`` rows).
"""

from __future__ import annotations

import argparse
import json
import time

import lightning.pytorch as pl
import numpy as np
import torch
from torch.utils.data import DataLoader, TensorDataset

from xrfm_torch import LeafConfig, xRFMTree
from xrfm_torch.lit import RefitXRFM, XRFMHeadModule, mlp_encoder


def make_task(n: int, d: int = 8, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    R, _ = np.linalg.qr(np.random.default_rng(1234).standard_normal((d, d)))  # fixed rotation
    z = rng.standard_normal((n, d))
    y = np.sin(2 * z[:, 0]) + z[:, 1] * z[:, 2] + 0.1 * rng.standard_normal(n)
    u = z @ R.T
    x = np.sign(u) * np.abs(u) ** 3
    return x, y


class Data(pl.LightningDataModule):
    def __init__(self, x: np.ndarray, y: np.ndarray, batch_size: int = 128) -> None:
        super().__init__()
        n = len(x)
        a, b = int(0.7 * n), int(0.8 * n)
        mu, sd = x[:a].mean(0), x[:a].std(0) + 1e-12
        ym, ys = y[:a].mean(), y[:a].std()
        f = lambda s: torch.tensor((x[s] - mu) / sd, dtype=torch.float32)  # noqa: E731
        g = lambda s: torch.tensor((y[s] - ym) / ys, dtype=torch.float32)  # noqa: E731
        self.splits = {
            k: (f(s), g(s))
            for k, s in {"train": slice(0, a), "val": slice(a, b), "test": slice(b, n)}.items()
        }
        self.batch_size = batch_size

    def loader(self, split: str, shuffle: bool = False) -> DataLoader:
        X, y = self.splits[split]
        ds = TensorDataset(X, y, torch.arange(len(X)))
        gen = torch.Generator().manual_seed(0)
        return DataLoader(
            ds, batch_size=self.batch_size if shuffle else 4096, shuffle=shuffle, generator=gen
        )

    def train_dataloader(self) -> DataLoader:
        return self.loader("train", shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return self.loader("val")

    def test_dataloader(self) -> DataLoader:
        return self.loader("test")


def test_mse(model: torch.nn.Module, dm: Data) -> float:
    X, y = dm.splits["test"]
    with torch.no_grad():
        pred = model(X).reshape(-1)
    return float(((pred - y) ** 2).mean())


def linear_head(dm: Data, epochs: int, seed: int, lr: float) -> float:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(mlp_encoder((64, 64), 16), torch.nn.GELU(), torch.nn.Linear(16, 1))
    X, _y = dm.splits["train"]
    model(X[:2])
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    best, best_state = float("inf"), None
    Xv, yv = dm.splits["val"]
    for _ in range(epochs):
        for xb, yb, _ in dm.train_dataloader():
            opt.zero_grad()
            loss = torch.nn.functional.mse_loss(model(xb)[:, 0], yb)
            loss.backward()
            opt.step()
        with torch.no_grad():
            v = float(((model(Xv)[:, 0] - yv) ** 2).mean())
        if v < best:
            best, best_state = v, {k: t.clone() for k, t in model.state_dict().items()}
    model.load_state_dict(best_state)
    return test_mse(model, dm)


def raw_xrfm(dm: Data, seed: int) -> float:
    X, y = dm.splits["train"]
    Xv, yv = dm.splits["val"]
    tree = xRFMTree(leaf=LeafConfig(diag=False)).fit(
        X, y, Xv, yv, generator=torch.Generator().manual_seed(seed)
    )
    return test_mse(tree, dm)


def xrfm_head(
    dm: Data, epochs: int, seed: int, lr: float, refit_every: int, sgd_loss: str = "head"
) -> float:
    pl.seed_everything(seed, verbose=False)
    tree = xRFMTree(input_transform="identity", temperature=0.0, leaf=LeafConfig(diag=False))
    d = dm.splits["train"][0].shape[1]
    module = XRFMHeadModule(
        tree, hidden=(64, 64), in_features=d, lr=lr, seed=seed, sgd_loss=sgd_loss
    )
    trainer = pl.Trainer(
        max_epochs=epochs,
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        callbacks=[RefitXRFM(every_n_epochs=refit_every)],
        num_sanity_val_steps=0,
    )
    trainer.fit(module, datamodule=dm)
    return test_mse(module.eval(), dm)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=4000)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--refit-every", type=int, default=2)
    ap.add_argument("--krr-epochs", type=int, default=100)
    ap.add_argument("--krr-batch", type=int, default=1024)
    ap.add_argument("--krr-lr", type=float, default=1e-2)
    a = ap.parse_args()
    torch.set_num_threads(2)
    dm = Data(*make_task(a.n, seed=a.seed))
    dm_krr = Data(*make_task(a.n, seed=a.seed), batch_size=a.krr_batch)
    res = {}
    for name, fn in [
        ("xrfm_raw", lambda: raw_xrfm(dm, a.seed)),
        ("encoder_linear", lambda: linear_head(dm, a.epochs, a.seed, a.lr)),
        ("encoder_xrfm", lambda: xrfm_head(dm, a.epochs, a.seed, a.lr, a.refit_every)),
        (
            "encoder_xrfm_batch_krr",
            lambda: xrfm_head(dm_krr, a.krr_epochs, a.seed, a.krr_lr, 10, sgd_loss="batch_krr"),
        ),
    ]:
        s = time.perf_counter()
        res[name] = fn()
        print(f"{name:15s} test MSE {res[name]:.4f}  ({time.perf_counter() - s:.1f}s)", flush=True)
    print(json.dumps(res))


if __name__ == "__main__":
    main()
