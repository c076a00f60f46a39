"""The build's flow runs still send heartbeats, but their end no longer waits on the heartbeat thread."""

from __future__ import annotations

import inspect
import logging
import threading

import prefect.flow_engine as engine

import shardflow.flows.build  # noqa: F401  (applies the patch, as every process running the flow does)
from shardflow.flows import heartbeats


class _Engine:
    """What Prefect's heartbeat context reads of a flow-run engine: a stand-in that counts the heartbeats."""

    heartbeat_seconds = 30
    flow_run = None
    logger = logging.getLogger("test-heartbeats")

    def __init__(self) -> None:
        self.sent = 0
        self.first = threading.Event()

    def _build_heartbeat_event_template(self):  # noqa: ANN202
        return {}, []

    def _emit_flow_run_heartbeat(self, resource, related) -> None:  # noqa: ANN001
        self.sent += 1
        self.first.set()


def test_patch_is_applied_once_and_keeps_prefects_function() -> None:
    assert engine._send_heartbeats.__shardflow_unjoined__
    wrapped = engine._send_heartbeats
    assert heartbeats.patch() is True
    assert engine._send_heartbeats is wrapped  # idempotent: not wrapped twice
    assert "join_on_exit" in inspect.signature(wrapped.__wrapped__).parameters


def test_heartbeats_are_sent_and_the_run_end_does_not_wait_for_the_thread() -> None:
    fake = _Engine()
    before = set(threading.enumerate())
    with engine._send_heartbeats(fake):
        assert fake.first.wait(10), "the first heartbeat is sent when the run starts"
        (thread,) = [t for t in threading.enumerate() if t not in before]
    # Prefect's thread sleeps in 1 s steps after a heartbeat; the context has ended without joining it.
    assert thread.is_alive()
    thread.join(5)
    assert not thread.is_alive(), "the thread ends by itself at its next step"
    assert fake.sent == 1, "nothing is sent after the run has ended"
