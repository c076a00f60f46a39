"""``overlap.ahead``: the next batch read on a thread of its own, the job's order, errors and context kept."""

from __future__ import annotations

import contextvars
import threading
import time

import pytest
from hypothesis import given, settings, strategies as st

from shardflow.overlap import ahead

where: contextvars.ContextVar[str] = contextvars.ContextVar("where", default="unset")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers()), st.integers(min_value=1, max_value=4))
def test_items_come_in_order_and_all_of_them(items: list[int], depth: int) -> None:
    assert list(ahead(iter(items), depth)) == items


def test_reading_runs_on_another_thread_in_the_callers_context_at_most_depth_ahead() -> None:
    produced: list[int] = []
    seen: list[tuple[str, str]] = []

    def source():
        for i in range(6):
            seen.append((threading.current_thread().name, where.get()))
            produced.append(i)
            yield i

    token = where.set("the job's")
    try:
        it = ahead(source(), depth=2)
        assert next(it) == 0
        # Taken: 0; queued: 1, 2; in hand, waiting for a slot: 3. No further, however long it waits.
        deadline = time.monotonic() + 30  # a bounded wait: a loaded machine may be slow to get there
        while len(produced) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        assert produced == [0, 1, 2, 3]
        assert list(it) == [1, 2, 3, 4, 5]
    finally:
        where.reset(token)
    assert {name for name, _ in seen} == {"shardflow-ahead"}
    assert {value for _, value in seen} == {"the job's"}


def test_an_error_in_reading_is_raised_at_the_batch_it_would_have_read() -> None:
    def source():
        yield 1
        yield 2
        raise ValueError("part-3.jsonl line 7: not JSON")

    got = []
    with pytest.raises(ValueError, match="part-3.jsonl line 7: not JSON"):
        for x in ahead(source()):
            got.append(x)
    assert got == [1, 2]


def test_a_consumer_that_stops_early_stops_the_reader_and_closes_its_source() -> None:
    closed = threading.Event()
    threads_before = threading.active_count()

    def source():
        try:
            for i in range(10**9):
                yield i
        finally:
            closed.set()

    with pytest.raises(RuntimeError, match="a full disk"):
        for x in ahead(source()):
            if x == 3:
                raise RuntimeError("a full disk")
    assert closed.is_set()  # the reader's generator ran its cleanup (its open file) before the job went on
    assert threading.active_count() == threads_before


def test_reading_starts_before_the_first_item_is_asked_for_and_stops_if_it_never_is() -> None:
    started, closed = threading.Event(), threading.Event()
    threads_before = threading.active_count()

    def source():
        try:
            started.set()
            for i in range(10**9):
                yield i
        finally:
            closed.set()

    it = ahead(source())
    assert started.wait(30)  # read while the caller does something else (tokenize.py: the encoder's set-up)
    del it  # never iterated: its reader stops at its next item and closes its source
    assert closed.wait(30)
    deadline = time.monotonic() + 30
    while threading.active_count() > threads_before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == threads_before
