"""The one per-fit context: what the loops deep inside a fit consult, set by what runs the fit.

The leaves' loops run far below the code that decides how they run, and a few decisions reach
them without being passed through every signature between:

- ``deadline``: the time limit the loops check (:mod:`xrfm_torch.numerics.deadline`);
- ``on_iteration``: the progress hook called after each RFM iteration
  (:mod:`xrfm_torch.numerics.progress`);
- ``events``: the counter of numerical fallbacks (:mod:`xrfm_torch.numerics.events`);
- in a lockstep's threads (:mod:`xrfm_torch.leaf.lockstep`): ``lockstep`` (the lockstep and
  this thread's job id) and what runs the thread's RFM steps (``step_runner``), rounds of calls
  (``round_runner``) and post-hoc search candidates (``solve_runner``); ``None`` everywhere
  else: each leaf runs its own, one by one.

They are the fields of one frozen :class:`FitContext` in one ``contextvars`` variable: nothing is
global, nested or concurrent fits each see their own, and a thread started through
``contextvars.copy_context()`` takes its caller's. Each owner changes only its own fields, with
:func:`using`, which puts the context back when its block ends.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Deadline:
    """An absolute ``time.perf_counter()`` time and what to do there (abort or degrade)."""

    at: float
    abort: bool


@dataclass(frozen=True)
class FitContext:
    """What the loops of the fits running in this context consult (see the module docstring).

    Attributes:
        deadline: The time limit in force, or ``None``.
        on_iteration: ``hook(t, tau)`` after iteration ``t`` of a leaf's ``0 .. tau``, or ``None``.
        events: The fallback counter of the enclosing fit, or ``None`` (not counted).
        lockstep: In a lockstep's thread: the lockstep and the thread's job id; else ``None``.
        step_runner: What runs this thread's RFM steps (``None``: ``rfm_step``).
        round_runner: Runs calls as jobs of this thread's lockstep, in the same rounds.
        solve_runner: What runs this thread's post-hoc search candidates (``None``: at once).
    """

    deadline: Deadline | None = None
    on_iteration: Callable[[int, int], None] | None = None
    events: Counter[str] | None = None
    lockstep: tuple[Any, tuple[int, ...]] | None = None
    step_runner: Callable[..., Any] | None = None
    round_runner: Callable[[list[Callable[[], Any]]], list[Any]] | None = None
    solve_runner: Callable[[Any], Any] | None = None


# a frozen dataclass: the shared default cannot be changed in place
_CONTEXT: ContextVar[FitContext] = ContextVar("xrfm_torch_fit_context", default=FitContext())  # noqa: B039


def current() -> FitContext:
    """The context of the running fit (the empty :class:`FitContext` outside any)."""
    return _CONTEXT.get()


@contextmanager
def using(**changes: Any) -> Iterator[FitContext]:
    """Run the block with the current context's ``changes`` fields replaced; yields the new one.

    Raises:
        TypeError: A change names no field of :class:`FitContext`.
    """
    token = _CONTEXT.set(dataclasses.replace(_CONTEXT.get(), **changes))
    try:
        yield _CONTEXT.get()
    finally:
        _CONTEXT.reset(token)
