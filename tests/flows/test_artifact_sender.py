"""flows/artifact_sender.py: progress updates sent off the flow's path (latest only), end-of-run artifacts at once."""

from __future__ import annotations

import contextvars
import threading

import pytest

from shardflow.flows.artifact_sender import LatestOnly, send_all

WHO = contextvars.ContextVar("WHO", default="nobody")


def test_latest_only_never_blocks_skips_stale_updates_and_sends_the_last_on_close() -> None:
    sent: list[tuple[int, str]] = []
    in_flight = threading.Event()
    release = threading.Event()

    def send(n: int, *, note: str) -> None:
        sent.append((n, note))
        if n == 1:
            in_flight.set()
            assert release.wait(10)

    sender = LatestOnly(send)
    sender.put(1, note="first")
    assert in_flight.wait(10)
    for n in range(2, 50):  # while the first is in flight: each replaces the one waiting, none blocks
        sender.put(n, note=f"n{n}")
    release.set()
    sender.close()
    assert sent == [(1, "first"), (49, "n49")]
    assert not sender._thread.is_alive()


def test_latest_only_runs_in_the_callers_context_and_survives_a_failing_call() -> None:
    seen: list[str] = []

    def send(n: int) -> None:
        seen.append(WHO.get())
        if n == 1:
            raise RuntimeError("server away")

    token = WHO.set("flow run 42")
    try:
        sender = LatestOnly(send)
    finally:
        WHO.reset(token)
    sender.put(1)
    sender.close()  # the failure is logged, not raised
    sender2 = LatestOnly(send)
    sender2.close()  # nothing queued: nothing sent
    assert seen == ["flow run 42"]


def test_send_all_makes_every_call_in_the_callers_context_and_raises_the_first_error() -> None:
    seen: list[str] = []
    lock = threading.Lock()

    def call(i: int) -> None:
        with lock:
            seen.append(f"{WHO.get()}:{i}")

    WHO.set("the flow")
    send_all([lambda i=i: call(i) for i in range(7)])
    assert sorted(seen) == sorted(f"the flow:{i}" for i in range(7))

    def fail() -> None:
        raise ValueError("artifact refused")

    seen.clear()
    with pytest.raises(ValueError, match="artifact refused"):
        send_all([lambda: call(0), fail, lambda: call(1)])
    assert sorted(seen) == ["the flow:0", "the flow:1"]  # the others were still made
    send_all([])
