"""The one fit context: owners replace their own fields for a block, and threads take it along."""

from __future__ import annotations

import contextvars
import threading
from collections import Counter

import pytest

from xrfm_torch.numerics import context, deadline, events, progress


def test_using_replaces_only_its_fields_and_restores_them_even_on_error():
    assert context.current() == context.FitContext()
    seen: list[tuple[int, int]] = []
    with progress.on_iteration(lambda t, tau: seen.append((t, tau))):
        with events.counting() as counts:
            inner = context.current()
            assert inner.events is counts and inner.on_iteration is not None
            progress.report_iteration(1, 5)
            events.count("leaves predict their training mean")

            def failing_fit() -> None:
                with context.using(events=None):
                    assert context.current().on_iteration is inner.on_iteration  # kept
                    events.count("not counted")  # no counter in this block
                    raise RuntimeError("a failing fit")

            with pytest.raises(RuntimeError, match="failing"):
                failing_fit()
            assert context.current() == inner  # restored after the error
        assert context.current().events is None
    assert seen == [(1, 5)] and counts == Counter({"leaves predict their training mean": 1})
    assert context.current() == context.FitContext()


def test_an_unknown_field_is_refused_by_name():
    with pytest.raises(TypeError, match="runner"), context.using(runner=print):
        pass


def test_a_thread_started_from_the_callers_context_takes_it_a_plain_one_does_not():
    got: dict[str, object] = {}

    def look(name: str) -> None:
        got[name] = context.current().deadline

    with deadline.within(60.0):
        outer = context.current().deadline
        copied = threading.Thread(target=contextvars.copy_context().run, args=(look, "copied"))
        plain = threading.Thread(target=look, args=("plain",))
        for t in (copied, plain):
            t.start()
            t.join()
    assert outer is not None and got == {"copied": outer, "plain": None}
    assert deadline.time_left() == float("inf")  # the block ended: no deadline
