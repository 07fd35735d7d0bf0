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
- ``thread_modes``: torch modes that watch a fit (an operation counter, a
  ``TorchDispatchMode``) and that the fit's worker threads enter too (:func:`watching`): torch
  keeps its modes per thread, and a new thread starts with none.

They are the fields of one frozen :class:`FitContext` in one ``contextvars`` variable: nothing is
global, nested or concurrent fits each see their own, and a thread started through
``contextvars.copy_context()`` takes its caller's. Each owner changes only its own fields, with
:func:`using`, which puts the context back when its block ends.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar


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
        thread_modes: Modes every worker thread of the fit enters (:func:`watching`).
    """

    deadline: Deadline | None = None
    on_iteration: Callable[[int, int], None] | None = None
    events: Counter[str] | None = None
    lockstep: tuple[Any, tuple[int, ...]] | None = None
    step_runner: Callable[..., Any] | None = None
    round_runner: Callable[[list[Callable[[], Any]]], list[Any]] | None = None
    solve_runner: Callable[[Any], Any] | None = None
    thread_modes: tuple[AbstractContextManager[Any], ...] = ()


M = TypeVar("M", bound=AbstractContextManager[Any])

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


@contextmanager
def watching(mode: M) -> Iterator[M]:
    """Enter ``mode`` (a torch dispatch or function mode) here and in the fit's worker threads.

    A mode entered with a plain ``with`` sees only this thread's operations; the leaves a
    lockstep fits run in threads of their own (:mod:`xrfm_torch.leaf.lockstep`), which enter
    every mode of :attr:`FitContext.thread_modes` for as long as they work.
    """
    with using(thread_modes=(*current().thread_modes, mode)), mode:
        yield mode
