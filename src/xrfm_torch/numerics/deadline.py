"""A fit's time limit: a deadline that the long loops of a fit consult.

A time-limited fit (:class:`~xrfm_torch.models.anytime.Anytime`) runs its candidate models inside
:func:`within`, which sets the deadline of the fit's context (:mod:`xrfm_torch.numerics.context`:
nothing global, nested or concurrent fits each see their own; a nested block never extends an
outer deadline). The loops
that dominate a fit ask it before each piece of work:

- the leaves' RFM iterations (:func:`xrfm_torch.leaf.iteration.iterate`) and their post-hoc
  search call :func:`should_stop` with the cost of the next step (the last step's seconds);
- the leaf loop of a tree calls :func:`check` before each leaf.

Two kinds of deadline: a **degrading** one (the first, cheapest candidate, which must give a
model) stops iterating and searching, so each remaining leaf costs one solve; an **aborting**
one (the later candidates, which may be dropped) raises :class:`TimeLimitError` at the first check past
it (or before a step that would end past it), and the caller discards that candidate.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from xrfm_torch.numerics import context
from xrfm_torch.numerics.context import Deadline

__all__ = [
    "Deadline",
    "TimeLimitError",
    "check",
    "degrading",
    "should_stop",
    "time_left",
    "within",
]


class TimeLimitError(RuntimeError):
    """Raised inside an aborting :func:`within` block when its deadline has passed."""


@contextmanager
def within(seconds: float | None, *, abort: bool = False) -> Iterator[None]:
    """Run the block's fits with a deadline ``seconds`` from now (``None``: no new deadline).

    An enclosing deadline that comes earlier stays in force, and aborts if either block does (a
    candidate the caller may drop is dropped, not cut short, when the outer limit comes first).
    """
    outer = context.current().deadline
    if seconds is None:
        yield
        return
    if not math.isfinite(seconds) and seconds > 0:
        yield
        return
    new = Deadline(time.perf_counter() + seconds, abort)
    if outer is not None and outer.at <= new.at:
        new = Deadline(outer.at, outer.abort or abort)
    with context.using(deadline=new):
        yield


def time_left() -> float:
    """Seconds until the deadline in force (``inf`` without one; negative past it)."""
    d = context.current().deadline
    return math.inf if d is None else d.at - time.perf_counter()


def degrading() -> bool:
    """Whether a degrading deadline is in force (the fit must end with a model)."""
    d = context.current().deadline
    return d is not None and not d.abort


def should_stop(next_cost: float | Callable[[], float] = 0.0) -> bool:
    """Whether work of about ``next_cost`` seconds would end past the deadline.

    ``next_cost`` may be a function, called only under a deadline (an estimate that reads
    device values, a wait on a GPU, costs nothing without one).

    Raises:
        TimeLimitError: It would, and the deadline aborts.
    """
    d = context.current().deadline
    if d is None:
        return False
    cost = next_cost() if callable(next_cost) else next_cost
    if time.perf_counter() + cost <= d.at:
        return False
    if d.abort:
        raise TimeLimitError(f"the time limit was reached ({time.perf_counter() - d.at:+.2f} s)")
    return True


def check() -> None:
    """Raise :class:`TimeLimitError` past an aborting deadline (a degrading one goes on)."""
    d = context.current().deadline
    if d is not None and d.abort and time.perf_counter() > d.at:
        raise TimeLimitError(f"the time limit was reached ({time.perf_counter() - d.at:+.2f} s)")
