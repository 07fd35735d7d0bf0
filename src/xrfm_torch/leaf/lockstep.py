"""Fit several leaves in lockstep: their RFM steps run together as batched steps.

Each leaf's fit (``LeafRFM.fit``, its decisions unchanged) runs in its own thread, and its RFM
steps go through :meth:`Lockstep.step` instead of :func:`~xrfm_torch.leaf.iteration.rfm_step`.
The threads only take turns: one lock is held by whichever thread runs, and a thread gives it up
only while it waits for its step. When every leaf still fitting is waiting, the round's steps run
(:func:`run_round`): those that batch together (:func:`~xrfm_torch.leaf.batched_step.batch_key`)
as one batched step, the others one by one. A round holds the steps of all the live leaves,
sorted by leaf, so the results do not depend on how the threads were scheduled, and no two leaves'
work ever runs at once (memory as one leaf's fit plus the batch).

Why threads, not a rewrite of the iterations as a generator: the step is called deep inside a
leaf's fit (its iterations, between its input checks and its final solve), and a thread keeps
that code as it is, run one by one on a CPU and in lockstep on a GPU.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import math
import threading
from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch
from torch import Tensor
from torch.overrides import _get_current_function_mode_stack
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from xrfm_torch.kernels import Kernel
from xrfm_torch.leaf.batched_step import (
    StepRequest,
    StepResult,
    batch_bytes,
    batch_key,
    batch_rows,
    batched_rfm_step,
)
from xrfm_torch.leaf.config import LeafConfig
from xrfm_torch.leaf.iteration import StepRunner
from xrfm_torch.numerics import deadline
from xrfm_torch.numerics.events import count

log = logging.getLogger(__name__)

#: Device memory one batched step may take (:func:`~xrfm_torch.leaf.batched_step.batch_bytes`);
#: a larger group of steps runs as several batches.
BATCH_BYTES = 4 * 2**30


def lockstep_pays(device: torch.device) -> bool:
    """Whether batched steps pay on ``device``: off the CPU (there they are no faster)."""
    return device.type != "cpu"


def fit_together(jobs: Sequence[Callable[[StepRunner | None], object]], *, batched: bool) -> None:
    """Run ``jobs[k](step)``: in lockstep if ``batched``, else one by one (``step`` ``None``).

    One by one also under a time limit, where the jobs' order decides which of them the
    remaining time goes to.
    """
    if batched and len(jobs) > 1 and deadline.time_left() == math.inf:
        Lockstep().run(jobs)
        return
    for job in jobs:
        job(None)


class CancelledError(RuntimeError):
    """Raised in a leaf's thread when another leaf of the same lockstep fit failed."""


class Lockstep:
    """Runs leaf fits in threads that take turns, their RFM steps batched round by round.

    Args:
        batch_bytes: Device memory one batched step may take.

    Example:
        >>> lock = Lockstep()
        >>> lock.run([lambda step: None, lambda step: None])  # jobs that take no step
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
        self._pending: dict[int, StepRequest] = {}
        self._results: dict[int, StepResult | BaseException] = {}
        self._live = 0
        self._failed = False
        # padded rows by batch membership: (the leaves' training inputs, their rows)
        self._rows: dict[tuple[int, ...], tuple[tuple[Tensor, ...], Any]] = {}

    def run(self, jobs: Sequence[Callable[[StepRunner], object]]) -> None:
        """Run ``jobs[k](step)`` for every ``k`` in lockstep; ``step`` replaces ``rfm_step``.

        Raises:
            The first job's error (by job order) if any job failed; the other jobs are cancelled
            at their next step.
        """
        errors: dict[int, BaseException] = {}
        self._live = len(jobs)
        self._failed = False

        enter_caller_state = _caller_state()

        def body(k: int, job: Callable[[StepRunner], object]) -> None:
            with self._cond, contextlib.ExitStack() as state:  # runs only holding the lock
                try:
                    enter_caller_state(state)
                    job(lambda *args, **kwargs: self._step(k, *args, **kwargs))
                except BaseException as err:  # reported by run, in the caller's thread
                    errors[k] = err
                    self._failed = True
                finally:
                    self._live -= 1
                    self._maybe_round()

        threads = [
            threading.Thread(
                target=contextvars.copy_context().run,  # deadlines and counters go along
                args=(body, k, job),
                name=f"xrfm-leaf-{k}",
                daemon=True,
            )
            for k, job in enumerate(jobs)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self._rows.clear()
        real = {k: e for k, e in errors.items() if not isinstance(e, CancelledError)}
        if real or errors:
            k = min(real or errors)
            raise (real or errors)[k]
        log.debug(
            "lockstep: %d leaves, %d rounds, %d steps batched, %d alone",
            len(jobs),
            self.rounds,
            self.batched,
            self.alone,
        )

    def _step(
        self,
        k: int,
        kernel: Kernel,
        X: Tensor,
        y: Tensor,
        X_val: Tensor,
        y_val: Tensor,
        sqrt_m: Tensor | None,
        buffers: tuple[Tensor, Tensor, Tensor],
        cfg: LeafConfig,
        *,
        agop: bool,
        diag: bool,
        generator: torch.Generator | None,
        warm: tuple[float, int] | None = None,
        weights: tuple[Tensor | None, Tensor | None] = (None, None),
    ) -> StepResult:
        """Leaf ``k``'s step: wait (the lock given up) until its round has run it."""
        if self._failed:
            raise CancelledError("another leaf of this lockstep fit failed")
        self._pending[k] = StepRequest(
            kernel, X, y, X_val, y_val, sqrt_m, buffers, cfg, agop, diag, generator, warm, weights
        )
        self._maybe_round()
        while k not in self._results:
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

    def run_round(
        self, pending: Sequence[tuple[int, StepRequest]]
    ) -> dict[int, StepResult | BaseException]:
        """Each request's result: batched by :func:`batch_key` within ``batch_bytes``, else alone."""
        self.rounds += 1
        groups: dict[Hashable, list[tuple[int, StepRequest]]] = defaultdict(list)
        out: dict[int, StepResult | BaseException] = {}
        alone: list[tuple[int, StepRequest]] = []
        for k, r in pending:
            key = batch_key(r)
            if key is None:
                alone.append((k, r))
            else:
                groups[key].append((k, r))
        for group in groups.values():
            for batch in _split(group, self.batch_bytes):
                if len(batch) == 1:
                    alone.extend(batch)
                    continue
                reqs = [r for _, r in batch]
                try:
                    results = batched_rfm_step(reqs, self._batch_rows(reqs))
                except Exception as err:  # a batch that fails: each step alone decides
                    log.debug("batched step of %d leaves failed (%s); one by one", len(batch), err)
                    alone.extend(batch)
                    continue
                self.batched += len(batch)
                count("RFM steps batched")
                out.update((k, res) for (k, _), res in zip(batch, results))
        for k, r in alone:
            self.alone += 1
            try:
                out[k] = r.run()
            except Exception as err:  # raised in leaf k's own thread
                out[k] = err
        return out

    def _batch_rows(self, reqs: Sequence[StepRequest]) -> Any:
        """The batch's padded rows, made once per set of leaves (kept for later rounds)."""
        inputs = tuple(r.X for r in reqs)
        members = tuple(id(x) for x in inputs)
        held = self._rows.get(members)
        if held is None or any(a is not b for a, b in zip(held[0], inputs)):
            held = self._rows[members] = (inputs, batch_rows(reqs))
        return held[1]


def _caller_state() -> Callable[[contextlib.ExitStack], None]:
    """What enters the calling thread's torch state in a leaf's thread.

    Grad mode, the current CUDA stream and the torch-function and dispatch modes (a
    ``torch.device`` block, an operation counter) are per thread; the leaves' threads work as if in the caller's.
    """
    grad = torch.is_grad_enabled()
    functions = _get_current_function_mode_stack()
    dispatches = _get_current_dispatch_mode_stack()
    # the current CUDA stream is per thread too: the leaves' work queues behind the caller's
    stream = torch.cuda.current_stream() if torch.cuda.is_initialized() else None

    def enter(stack: contextlib.ExitStack) -> None:
        stack.enter_context(torch.set_grad_enabled(grad))
        if stream is not None:
            stack.enter_context(torch.cuda.stream(stream))
        for mode in [*functions, *dispatches]:
            stack.enter_context(mode)

    return enter


def _split(
    group: list[tuple[int, StepRequest]], budget: int
) -> list[list[tuple[int, StepRequest]]]:
    """Consecutive batches of ``group`` whose :func:`batch_bytes` stay within ``budget``."""
    batches: list[list[tuple[int, StepRequest]]] = []
    for item in group:
        if batches and batch_bytes([r for _, r in batches[-1]] + [item[1]]) <= budget:
            batches[-1].append(item)
        else:
            batches.append([item])
    return batches
