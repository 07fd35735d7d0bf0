"""Numerical fallbacks counted per fit, for one summary line instead of a warning per leaf.

A leaf that predicts its training mean, a Cholesky factorization that needed jitter, a float32
solve repeated in float64: each is a correct, deliberate fallback, logged at DEBUG where it
happens and counted with :func:`count`. A model's ``fit``, decorated with
:func:`summarize_fallbacks`, counts inside :func:`counting` and logs the counts once at INFO
(``"3 leaves predict their training mean"``). The counter is part of the fit's context
(:mod:`xrfm_torch.numerics.context`), so nested fits (a bag's trees) each count their own.
"""

from __future__ import annotations

import functools
import logging
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast

from xrfm_torch.numerics import context

F = TypeVar("F", bound=Callable[..., Any])


@contextmanager
def counting() -> Iterator[Counter[str]]:
    """Count the events of the fit run inside this block; yields the counter."""
    counts: Counter[str] = Counter()
    with context.using(events=counts):
        yield counts


def count(event: str) -> None:
    """Count one ``event`` (a phrase such as ``"leaves predict their training mean"``)."""
    counts = context.current().events
    if counts is not None:
        counts[event] += 1


def summary(counts: Counter[str]) -> str:
    """``"3 leaves predict their training mean, 1 solves needed jitter"`` (most frequent first)."""
    return ", ".join(f"{n} {event}" for event, n in counts.most_common())


def summarize_fallbacks(log: logging.Logger) -> Callable[[F], F]:
    """Decorate a ``fit``: run it inside :func:`counting`, then log the counts once on ``log``."""

    def wrap(fit: F) -> F:
        @functools.wraps(fit)
        def counted(*args: Any, **kwargs: Any) -> Any:
            with counting() as notes:
                out = fit(*args, **kwargs)
            if notes:
                log.info(
                    "numerical fallbacks in this fit (probe leaves included): %s", summary(notes)
                )
            return out

        return cast(F, counted)

    return wrap
