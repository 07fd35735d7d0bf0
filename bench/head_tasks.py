"""The head benchmark's tasks and encoders (``python -m bench.head``).

- ``cubic``: latent ``z ~ N(0, I_8)``, ``y = sin(2 z0) + z1 z2 + 0.1 noise``, seen as
  ``x = g(R z)`` with a fixed rotation ``R`` and ``g(u) = sign(u)|u|^3`` per feature: a per-feature
  quantile map undoes ``g``, so the plain model should win here.
- ``mixing``: the same latent and target seen through a map that mixes features non-linearly,
  ``x = A tanh(B z)`` (``B`` 8→16, ``A`` 16→16, fixed random), so no per-feature map exposes
  ``z``; an encoder can learn to.
- ``digits``: scikit-learn's bundled 8×8 digit images (1797 rows, 10 classes), pixels / 16.

Rows are split 70/10/20 with the seed (the protocol split); regression targets are standardized
with training statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from xrfm_torch.data import protocol_split


@dataclass
class Task:
    """A split task: float32 inputs, targets (standardized floats or int64 labels)."""

    name: str
    classes: int  # 0: regression
    splits: dict[str, tuple[torch.Tensor, torch.Tensor]]

    @property
    def in_features(self) -> int:
        return int(self.splits["train"][0].shape[1])


def latent(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``z ~ N(0, I_8)`` and ``y = sin(2 z0) + z1 z2 + 0.1 noise``."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((n, 8))
    return z, np.sin(2 * z[:, 0]) + z[:, 1] * z[:, 2] + 0.1 * rng.standard_normal(n)


def make_task(name: str, seed: int, n: int = 4000) -> Task:
    """The task ``name`` with its rows split by ``seed``."""
    fixed = np.random.default_rng(1234)  # the task's maps do not depend on the seed
    if name == "cubic":
        z, y = latent(n, seed)
        R, _ = np.linalg.qr(fixed.standard_normal((8, 8)))
        u = z @ R.T
        x = np.sign(u) * np.abs(u) ** 3
    elif name == "mixing":
        z, y = latent(n, seed)
        B = fixed.standard_normal((16, 8)) / np.sqrt(8)
        A = fixed.standard_normal((16, 16)) / 4
        x = np.tanh(1.5 * z @ B.T) @ A.T
    elif name == "digits":
        from sklearn.datasets import load_digits

        x, y = load_digits(return_X_y=True)
        x = x / 16.0
    else:
        raise ValueError(f"unknown task {name!r}")
    tr, va, te = protocol_split(len(x), seed)
    classes = 10 if name == "digits" else 0
    if not classes:
        mu, sd = x[tr].mean(0), x[tr].std(0) + 1e-12
        x = (x - mu) / sd
        y = (y - y[tr].mean()) / y[tr].std()
    ty = torch.long if classes else torch.float32
    splits = {
        k: (torch.tensor(x[s], dtype=torch.float32), torch.tensor(y[s], dtype=ty))
        for k, s in {"train": tr, "val": va, "test": te}.items()
    }
    return Task(name, classes, splits)


class DigitsEncoder(nn.Module):
    """A small conv net for 8×8 images given as 64 columns: two 3×3 convs, pooling, 32 features."""

    def __init__(self, out_features: int = 32) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Unflatten(1, (1, 8, 8)),
            nn.Conv2d(1, 16, 3, padding=1),
            nn.GELU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.GELU(),
            nn.MaxPool2d(2),
            nn.Flatten(),
            nn.Linear(32 * 4 * 4, out_features),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


def make_encoder(task: Task) -> nn.Module:
    """The task's encoder (fresh weights from torch's global generator)."""
    from xrfm_torch.lit import mlp_encoder

    if task.name == "digits":
        return DigitsEncoder()
    return mlp_encoder((64, 64), 16)
