"""Fit several leaves in lockstep: their RFM steps and search candidates run as batches.

Each leaf's fit (``LeafRFM.fit``, its decisions unchanged) runs in its own thread, and its RFM
steps and post-hoc search candidates go to the lockstep instead of being solved at once (the
thread's fit context, :mod:`xrfm_torch.numerics.context`: ``step_runner`` and
``solve_runner``). A job may run jobs of its own in the same
lockstep (:func:`fit_together`: a blend's members, a member's bags, a tree's input maps, a tree's
leaves), so the solves of every leaf being fitted anywhere in the model batch together.

The threads only take turns: one lock is held by whichever thread runs, and a thread gives it up
only while it waits for a solve or for its own jobs. When every live job waits for a solve, the
round runs (:meth:`Lockstep.run_round`): the requests that batch together (same kind and key:
:func:`~xrfm_torch.leaf.batched_step.batch_key`, :func:`~xrfm_torch.leaf.batched_search.solve_key`)
as one batch, the others one by one. A round holds the requests of all the live jobs, sorted by
job id, so the results do not depend on how the threads were scheduled (same seed, same model),
and no two jobs' own work ever runs at once. The live jobs' step buffers are held together:
:func:`fit_together` reserves them against the memory budget.

Why threads, not a rewrite of the iterations as generators: the solves are asked for deep inside
a leaf's fit (its iterations and its search, between its input checks and its final solve), and
a thread keeps that code as it is, run one by one on a CPU and in lockstep on a GPU.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import logging
import math
import threading
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, TypeVar, cast

import torch
from torch import Tensor

from xrfm_torch.leaf.batch_ops import BatchRows, batch_rows
from xrfm_torch.leaf.batched_search import batched_solve, solve_key
from xrfm_torch.leaf.batched_step import (
    StepRequest,
    StepResult,
    batch_bytes,
    batch_key,
    batched_rfm_step,
)
from xrfm_torch.leaf.solve_request import SolveRequest, SolveResult
from xrfm_torch.numerics import context, deadline
from xrfm_torch.numerics.events import count

log = logging.getLogger(__name__)

T = TypeVar("T")

#: What a job waits for: an RFM step or a post-hoc search candidate.
Request = StepRequest | SolveRequest
#: A job's id and its request.
_Pending = tuple[tuple[int, ...], Request]
#: A request's result, or the error it raised (raised again in its job's thread).
Outcome = StepResult | SolveResult | BaseException

#: Device memory one batched step may take (:func:`~xrfm_torch.leaf.batched_step.batch_bytes`);
#: a larger group of steps runs as several batches.
BATCH_BYTES = 4 * 2**30


#: A lockstep's job: a fit whose RFM steps (``run_iterations``) the lockstep runs.
Job = Callable[[], object]


def fit_together(
    jobs: Sequence[Job],
    *,
    batched: bool,
    held_bytes: int = 0,
    limit: int | None = None,
) -> None:
    """Run every job: in lockstep if ``batched`` (each in a thread), else one by one.

    Inside a job of a lockstep (a tree's fit in a bag fitted in lockstep), the jobs join that
    lockstep: their steps batch with every other job's. ``held_bytes``: the device memory the
    jobs hold at once when run together (their step buffers); where that and one batch would
    exceed ``limit`` beside what the lockstep's other jobs hold, the jobs run one by one (their
    steps still in the lockstep's rounds). One by one also under a time limit, where the jobs'
    order decides which of them the remaining time goes to.
    """
    active = context.current().lockstep
    if active is not None:
        lock, me = active
        if batched and len(jobs) > 1 and lock.reserve(held_bytes, limit):
            try:
                lock.fork(me, jobs)
            finally:
                lock.release(held_bytes)
            return
        for job in jobs:  # in this job's thread: their steps still join the rounds
            job()
        return
    if batched and len(jobs) > 1 and deadline.time_left() == math.inf:
        lock = Lockstep()
        if lock.reserve(held_bytes, limit):
            lock.run(jobs)
            return
    for job in jobs:
        job()


def in_one_round(calls: Sequence[Callable[[], T]]) -> list[T]:
    """Each call's result, the calls run as jobs of the active lockstep (:func:`fit_together`).

    Their requests wait in the same rounds, so independent steps of one leaf batch together.
    """
    slots: list[list[T]] = [[] for _ in calls]
    fit_together(
        [functools.partial(_into, slot, call) for slot, call in zip(slots, calls)], batched=True
    )
    return [slot[0] for slot in slots]


def _into(slot: list[T], call: Callable[[], T]) -> None:
    slot.append(call())


class CancelledError(RuntimeError):
    """Raised in a leaf's thread when another leaf of the same lockstep fit failed."""


class Lockstep:
    """Runs fits in threads that take turns, their RFM steps batched round by round.

    Args:
        batch_bytes: Device memory one batched step may take.

    Example:
        >>> lock = Lockstep()
        >>> lock.run([lambda: None, lambda: None])  # jobs that take no step
        >>> lock.rounds
        0
    """

    def __init__(self, batch_bytes: int = BATCH_BYTES) -> None:
        if int(batch_bytes) <= 0:
            raise ValueError(f"batch_bytes must be positive, got {batch_bytes!r}")
        self.batch_bytes = int(batch_bytes)
        self.rounds = 0  # rounds run
        self.batched = 0  # steps that ran in a batch of two or more
        self.alone = 0  # steps that ran one by one
        self._cond = threading.Condition(threading.Lock())
        self._pending: dict[tuple[int, ...], Request] = {}
        self._results: dict[tuple[int, ...], Outcome] = {}
        self._live = 0  # jobs running or waiting for a step (not those waiting for their jobs)
        self._failed = False
        self._stopped = False  # the caller was interrupted: waiting jobs give up
        self._reserved = 0  # device memory the running jobs hold (fit_together's held_bytes)
        # padded rows by batch membership: (the leaves' training inputs, their rows)
        self._rows: dict[tuple[int, ...], tuple[tuple[Tensor, ...], BatchRows]] = {}

    def reserve(self, nbytes: int, limit: int | None) -> bool:
        """Count ``nbytes`` more held, if they and a batch fit in ``limit`` (``None``: no limit)."""
        if limit is not None and self._reserved + nbytes + self.batch_bytes > limit:
            return False
        self._reserved += nbytes
        return True

    def release(self, nbytes: int) -> None:
        """The jobs that held ``nbytes`` are done."""
        self._reserved -= nbytes

    def run(self, jobs: Sequence[Job]) -> None:
        """Run every job in its own thread, in lockstep (their RFM steps batched round by round).

        Raises:
            The first job's error (by job order) if any job failed; the other jobs are cancelled
            at their next step.
        """
        errors: dict[tuple[int, ...], BaseException] = {}
        with self._cond:
            self._live += len(jobs)
        threads = self._start(jobs, (), errors, None)
        try:
            for t in threads:
                t.join()
        except BaseException:  # an interrupt in the caller: the jobs stop at their next request
            with self._cond:
                self._failed = self._stopped = True
                self._cond.notify_all()
            raise
        self._rows.clear()
        _raise_first(errors)
        log.debug(
            "lockstep: %d jobs, %d rounds, %d steps batched, %d alone",
            len(jobs),
            self.rounds,
            self.batched,
            self.alone,
        )

    def fork(self, me: tuple[int, ...], jobs: Sequence[Job]) -> None:
        """Job ``me`` runs ``jobs`` in this lockstep and waits for them (called holding the lock).

        The jobs take ``me``'s place among the live jobs while it waits; the last to finish
        gives it back, so no round runs without ``me``'s next step.
        """
        errors: dict[tuple[int, ...], BaseException] = {}
        left = [len(jobs)]
        self._live += len(jobs) - 1
        self._start(jobs, me, errors, left)
        while left[0] > 0:
            self._cond.wait()
        _raise_first(errors)

    def _start(
        self,
        jobs: Sequence[Job],
        parent: tuple[int, ...],
        errors: dict[tuple[int, ...], BaseException],
        left: list[int] | None,
    ) -> list[threading.Thread]:
        """One thread per job, ids ``parent + (k,)``; ``left`` counts a fork's unfinished jobs."""
        enter_caller_state = _caller_state()

        def body(me: tuple[int, ...], job: Job) -> None:
            with self._cond, contextlib.ExitStack() as state:  # runs only holding the lock
                try:
                    with context.using(  # this job's steps, rounds and candidates go here
                        lockstep=(self, me),
                        step_runner=functools.partial(self._step, me),
                        round_runner=in_one_round,
                        solve_runner=functools.partial(self._solve, me),
                    ):
                        enter_caller_state(state)
                        job()
                except BaseException as err:  # reported to the caller, in its thread
                    errors[me] = err
                    self._failed = True
                finally:
                    self._live -= 1
                    if left is not None:
                        left[0] -= 1
                        self._live += left[0] == 0  # the waiting caller's place back
                    self._maybe_round()
                    self._cond.notify_all()

        threads = [
            threading.Thread(
                target=contextvars.copy_context().run,  # deadlines and counters go along
                args=(body, (*parent, k), job),
                name=f"xrfm-lockstep-{'.'.join(map(str, (*parent, k)))}",
                daemon=True,
            )
            for k, job in enumerate(jobs)
        ]
        for t in threads:
            t.start()
        return threads

    def _step(self, k: tuple[int, ...], *args: Any, **kwargs: Any) -> StepResult:
        """Job ``k``'s RFM step (called as :func:`~xrfm_torch.leaf.step.rfm_step`)."""
        return cast(StepResult, self._submit(k, StepRequest.of_call(*args, **kwargs)))

    def _solve(self, k: tuple[int, ...], request: SolveRequest) -> SolveResult:
        """Job ``k``'s post-hoc search candidate, run in its round."""
        return cast(SolveResult, self._submit(k, request))

    def _submit(self, k: tuple[int, ...], request: Request) -> StepResult | SolveResult:
        """Job ``k``'s request: wait (the lock given up) until its round has run it."""
        if self._failed:
            raise CancelledError("another leaf of this lockstep fit failed")
        self._pending[k] = request
        self._maybe_round()
        while k not in self._results:
            if self._stopped:
                raise CancelledError("the lockstep fit was interrupted")
            self._cond.wait()
        result = self._results.pop(k)
        if isinstance(result, BaseException):
            raise result
        return result

    def _maybe_round(self) -> None:
        """Run the round once every live leaf waits for a step (called with the lock held)."""
        if not self._pending or len(self._pending) < self._live:
            return
        pending = sorted(self._pending.items())
        self._pending.clear()
        if self._failed:
            self._results.update((k, CancelledError("another leaf failed")) for k, _ in pending)
        else:
            self._results.update(self.run_round(pending))
        self._cond.notify_all()

    def run_round(self, pending: Sequence[_Pending]) -> dict[tuple[int, ...], Outcome]:
        """Each request's result: batched by kind and key within ``batch_bytes``, else alone.

        The kinds: RFM steps (:func:`~xrfm_torch.leaf.batched_step.batch_key`) and post-hoc
        search candidates (:func:`~xrfm_torch.leaf.batched_search.solve_key`).
        """
        self.rounds += 1
        used: set[tuple[int, ...]] = set()  # this round's batches, by their leaves' inputs
        groups: dict[Hashable, list[_Pending]] = defaultdict(list)
        out: dict[tuple[int, ...], Outcome] = {}
        alone: list[_Pending] = []
        for k, r in pending:
            key = batch_key(r) if isinstance(r, StepRequest) else solve_key(r)
            if key is None:
                alone.append((k, r))
            else:
                groups[(type(r), key)].append((k, r))
        for group in groups.values():
            for batch in _split(group, self.batch_bytes):
                if len(batch) == 1:
                    alone.extend(batch)
                    continue
                reqs = [r for _, r in batch]
                used.add(_members(reqs))
                try:
                    rows = self._batch_rows(reqs)
                    results: Sequence[StepResult | SolveResult] = (
                        batched_rfm_step(cast(list[StepRequest], reqs), rows)
                        if isinstance(reqs[0], StepRequest)
                        else batched_solve(cast(list[SolveRequest], reqs), rows)
                    )
                except Exception as err:  # a batch that fails: each step alone decides
                    log.debug("batched step of %d leaves failed (%s); one by one", len(batch), err)
                    alone.extend(batch)
                    continue
                self.batched += len(batch)
                count("leaf solves batched")
                out.update((k, res) for (k, _), res in zip(batch, results))
        # keep only this round's padded rows (a search's cached distances are (B, N, N)); a set
        # of leaves that comes back later is padded again
        self._rows = {k: v for k, v in self._rows.items() if k in used}
        for k, r in alone:
            self.alone += 1
            try:
                out[k] = r.run()
            except Exception as err:  # raised in leaf k's own thread
                out[k] = err
        return out

    def _batch_rows(self, reqs: Sequence[Request]) -> BatchRows:
        """The batch's padded rows, made once per set of leaves (kept for later rounds)."""
        inputs = tuple(r.X for r in reqs)
        members = _members(reqs)
        held = self._rows.get(members)
        if held is None or any(a is not b for a, b in zip(held[0], inputs)):
            held = self._rows[members] = (inputs, batch_rows(reqs))
        return held[1]


def _caller_state() -> Callable[[contextlib.ExitStack], None]:
    """What enters the calling thread's torch state in a leaf's thread.

    Grad mode, the current CUDA stream and torch's modes are per thread; the leaves' threads
    work as if in the caller's, and enter the modes that watch the fit
    (:func:`~xrfm_torch.numerics.context.watching`).
    """
    grad = torch.is_grad_enabled()
    modes = context.current().thread_modes
    # the current CUDA stream is per thread too: the leaves' work queues behind the caller's
    stream = torch.cuda.current_stream() if torch.cuda.is_initialized() else None

    def enter(stack: contextlib.ExitStack) -> None:
        stack.enter_context(torch.set_grad_enabled(grad))
        if stream is not None:
            stack.enter_context(torch.cuda.stream(stream))
        for mode in modes:
            stack.enter_context(mode)

    return enter


def _raise_first(errors: dict[tuple[int, ...], BaseException]) -> None:
    """Raise the first error by job id, one that is not a cancellation if there is one."""
    real = {k: e for k, e in errors.items() if not isinstance(e, CancelledError)}
    if real or errors:
        raise (real or errors)[min(real or errors)]


def _members(reqs: Sequence[Request]) -> tuple[int, ...]:
    """A batch's key among the padded rows kept: its leaves' training inputs, by identity."""
    return tuple(id(r.X) for r in reqs)


def _split(group: list[_Pending], budget: int) -> list[list[_Pending]]:
    """Consecutive batches of ``group`` whose :func:`batch_bytes` stay within ``budget``."""
    batches: list[list[_Pending]] = []
    for item in group:
        if batches and batch_bytes([r for _, r in batches[-1]] + [item[1]]) <= budget:
            batches[-1].append(item)
        else:
            batches.append([item])
    return batches
