"""Random generators: every random draw of a fit goes through one explicit ``torch.Generator``."""

from __future__ import annotations

import torch


def own_generator(generator: torch.Generator | None) -> torch.Generator:
    """``generator``, or a new CPU generator seeded with ``torch.initial_seed()``.

    A fit without a generator thus follows ``torch.manual_seed`` (the same seed gives the same
    model) but never draws from, or resets, the global generator.
    """
    if generator is not None:
        return generator
    return torch.Generator().manual_seed(torch.initial_seed())


def redraw(generator: torch.Generator, draw: int) -> None:
    """Move ``generator`` to draw number ``draw`` of its stream (0: leave it as it is).

    Reseeds it from its next value plus ``draw``: fits that take the same generator state and
    call this at the same point draw the same values before it (the held-out rows) and others
    after it (split samples, ...). The same state and ``draw`` give the same values.
    """
    if draw:
        generator.manual_seed(int(torch.randint(1 << 62, (1,), generator=generator)) + draw)
