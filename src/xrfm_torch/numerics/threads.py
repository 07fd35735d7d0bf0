"""Threads on a busy machine: say so before a fit that would wait on itself.

torch runs each large operation on ``torch.get_num_threads()`` threads (by default one per core)
and every operation ends when its slowest thread ends. When other programs keep some cores busy,
a thread that lost its core holds the others up at every operation, and a kernel fit (thousands
of operations, each short) becomes several times slower than with fewer threads. torch cannot
know this, so a fit checks once: how many tasks the kernel reports runnable right now besides
this one (``/proc/loadavg``), against the cores this process may use. When threads plus those
tasks exceed the cores, it logs a warning once per process that names the threads to set. The
threads are the user's to set (``torch.set_num_threads``): a library that changed them behind
the caller's back would change every other torch computation in the process too.
"""

from __future__ import annotations

import logging
import os
import time

import torch

log = logging.getLogger(__name__)

_warned = False


def available_cores() -> int:
    """Cores this process may run on (its CPU affinity where the system tells, else all)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return max(1, os.cpu_count() or 1)


def other_running(loadavg: str | None = None) -> int | None:
    """Tasks runnable now besides the calling thread (``None`` where the system does not tell).

    Read from ``/proc/loadavg``'s fourth field, ``running/total``.

    Args:
        loadavg: The file's text (read from ``/proc/loadavg`` when ``None``).
    """
    if loadavg is None:
        try:
            with open("/proc/loadavg") as fh:
                loadavg = fh.read()
        except OSError:
            return None
    fields = loadavg.split()
    if len(fields) < 4 or "/" not in fields[3]:
        return None
    try:
        running = int(fields[3].split("/")[0])
    except ValueError:
        return None
    return max(0, running - 1)  # the calling thread is one of them


def suggested_threads(threads: int, cores: int, others: int) -> int | None:
    """Threads to use instead of ``threads``, or ``None`` when ``threads + others`` fits.

    The cores the ``others`` leave free, at least one and fewer than ``threads``.
    """
    if threads <= 1 or threads + others <= cores:
        return None
    return max(1, min(threads - 1, cores - others))


def check_threads(
    device: torch.device | str = "cpu", samples: int = 5, interval: float = 0.002
) -> int | None:
    """Warn (once per process) when torch's threads oversubscribe the cores left free now.

    Args:
        device: The fit's device; only a CPU fit runs on torch's threads (else nothing is read).
        samples: Reads of the runnable tasks, ``interval`` seconds apart; the fewest counts (a
            task that runs for a moment, such as a shell command, is no busy core), so the reads
            stop at the first one that leaves the threads their cores.
        interval: Seconds between reads.

    Returns:
        The suggested thread count when the machine is oversubscribed, else ``None``.
    """
    global _warned
    if torch.device(device).type != "cpu":
        return None
    threads, cores = torch.get_num_threads(), available_cores()
    reads: list[int] = []
    for i in range(samples):
        if i:
            time.sleep(interval)
        read = other_running()
        if read is None:
            return None
        reads.append(read)
        if suggested_threads(threads, cores, read) is None:
            return None  # the fewest reads count: one that fits settles it (no more waits)
    others = min(reads)
    best = suggested_threads(threads, cores, others)
    if best is not None and not _warned:
        _warned = True
        log.warning(
            "%d torch threads on %d cores while %d other tasks are running: threads that wait "
            "for each other on busy cores can make this fit several times slower; call "
            "torch.set_num_threads(%d) (or set OMP_NUM_THREADS=%d) before fitting",
            threads,
            cores,
            others,
            best,
            best,
        )
    return best
