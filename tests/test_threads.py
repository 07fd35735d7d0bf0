"""Threads on a busy machine: the count read from the system and the warning a fit logs."""

from __future__ import annotations

import logging

import pytest
import torch

from xrfm_torch.numerics import threads


def test_other_running_reads_the_running_field_less_the_caller():
    assert threads.other_running("0.50 0.40 0.30 3/412 12345\n") == 2
    assert threads.other_running("0.50 0.40 0.30 1/412 12345\n") == 0
    assert threads.other_running("0.50 0.40 0.30 0/412 12345\n") == 0  # never negative
    assert threads.other_running("garbage") is None
    assert threads.other_running("0.5 0.4 0.3 x/412 1") is None


@pytest.mark.parametrize(
    ("n_threads", "cores", "others", "expected"),
    [
        (2, 2, 0, None),  # fits: nothing to say
        (2, 2, 1, 1),  # one core busy: one thread
        (8, 8, 3, 5),  # the free cores
        (8, 8, 20, 1),  # at least one
        (1, 2, 5, None),  # one thread cannot wait on another
        (4, 8, 4, None),  # 4 + 4 <= 8
    ],
)
def test_suggested_threads_are_the_free_cores(n_threads, cores, others, expected):
    assert threads.suggested_threads(n_threads, cores, others) == expected


def test_a_busy_machine_is_named_once_per_process(monkeypatch, caplog):
    monkeypatch.setattr(threads, "_warned", False)
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    busy = iter([3, 1, 2, 4, 1])  # the fewest of the reads counts
    monkeypatch.setattr(threads, "other_running", lambda: next(busy))
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    with caplog.at_level(logging.WARNING, logger="xrfm_torch.numerics.threads"):
        assert threads.check_threads(interval=0.0) == 1
        monkeypatch.setattr(threads, "other_running", lambda: 1)
        assert threads.check_threads(interval=0.0) == 1  # still busy, but said already
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1
    assert "2 torch threads on 2 cores while 1 other tasks" in msgs[0]
    assert "torch.set_num_threads(1)" in msgs[0]


def test_a_quiet_machine_or_an_unknown_one_says_nothing(monkeypatch, caplog):
    monkeypatch.setattr(threads, "_warned", False)
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    reads = iter([1, 0, 1])  # a moment's task is no busy core
    monkeypatch.setattr(threads, "other_running", lambda: next(reads))
    with caplog.at_level(logging.WARNING):
        assert threads.check_threads(samples=3, interval=0.0) is None
        monkeypatch.setattr(threads, "other_running", lambda: None)
        assert threads.check_threads(samples=2, interval=0.0) is None
        # a fit off the CPU does not run on torch's threads: nothing is read
        monkeypatch.setattr(threads, "other_running", lambda: 1 / 0)
        assert threads.check_threads("meta", interval=0.0) is None
    assert not caplog.records


def test_an_estimator_fit_checks_the_threads(monkeypatch, caplog):
    pytest.importorskip("sklearn")
    from xrfm_torch import XRFMRegressor

    monkeypatch.setattr(threads, "_warned", False)
    monkeypatch.setattr(threads, "other_running", lambda: 64)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    monkeypatch.setattr(threads, "available_cores", lambda: 2)
    X = torch.randn(60, 3, generator=torch.Generator().manual_seed(0)).numpy()
    with caplog.at_level(logging.WARNING, logger="xrfm_torch.numerics.threads"):
        XRFMRegressor(n_bags=1, max_leaf_size=100, random_state=0).fit(X, X[:, 0])
    assert any("other tasks are running" in r.getMessage() for r in caplog.records)


def test_the_reads_stop_at_the_first_quiet_one(monkeypatch):
    """The fewest reads count, so a read that leaves the threads their cores settles it: a fit on
    a quiet machine does not wait out the other samples."""
    monkeypatch.setattr(threads, "available_cores", lambda: 4)
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    reads = [3, 2, 1, 0, 3]
    taken: list[int] = []
    monkeypatch.setattr(
        threads, "other_running", lambda: taken.append(reads[len(taken)]) or taken[-1]
    )
    monkeypatch.setattr(threads.time, "sleep", lambda s: None)
    assert threads.check_threads(samples=5, interval=1.0) is None
    assert taken == [3, 2]  # 2 threads + 2 others fit 4 cores: the third read is not needed
