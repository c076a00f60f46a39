"""The flow run's heartbeats, without the wait for their thread at the end of every run.

Against a real server Prefect sends a heartbeat event for a running flow run
every ``PREFECT_FLOWS_HEARTBEAT_FREQUENCY`` seconds (180 by default), so that
the server can mark a crashed run. Its heartbeat thread sleeps in one-second
steps, and the synchronous flow engine joins it when the run ends: a build
waits, after its last task, for the rest of that second, 0.5 s on average and
up to 1 s (measured with py-spy on an incremental build, where it was 0.86 s
of 4.8 s; prefect 3.8.8, ``prefect.flow_engine._send_heartbeats``).

Prefect's own asynchronous engine does not join that thread
(``join_on_exit=False``), and neither does the build's: the thread is a
daemon, it checks its stop flag before every heartbeat and after every step
of its sleep, and it sends nothing once the run has ended, so the heartbeats
a server sees are the same. :func:`patch` makes the change, once, where
Prefect's function takes that argument; otherwise it leaves Prefect as is.
"""

from __future__ import annotations

import contextlib
import inspect
from typing import Any, Iterator

__all__ = ["patch"]


def patch() -> bool:
    """Stop joining the flow-run heartbeat thread at the end of a run; True if Prefect's engine was changed."""
    import prefect.flow_engine as engine

    original = engine._send_heartbeats
    if getattr(original, "__shardflow_unjoined__", False):
        return True
    if "join_on_exit" not in inspect.signature(original).parameters:
        return False  # another Prefect: keep its behaviour

    @contextlib.contextmanager
    def _send_heartbeats(run_engine: Any, join_on_exit: bool = True) -> Iterator[None]:
        with original(run_engine, join_on_exit=False):
            yield

    _send_heartbeats.__shardflow_unjoined__ = True  # type: ignore[attr-defined]
    _send_heartbeats.__wrapped__ = original  # type: ignore[attr-defined]
    engine._send_heartbeats = _send_heartbeats
    return True
