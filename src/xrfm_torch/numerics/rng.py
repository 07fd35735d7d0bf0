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
