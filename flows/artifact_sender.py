"""Prefect artifact calls made off the build's path: each is a round trip to the server.

The build's progress bar in the UI is one artifact, updated as units and
shards finish, and its end adds the summary, shard table, manifest link, card
and plots. Each is a request to the API that the flow's thread waited for:
284 ms in all on the README's first command against the temporary server,
about a tenth of the run's time after the server answers.

* :class:`LatestOnly` sends progress updates from one background thread, the
  latest only: an update that arrives while another is in flight replaces any
  still waiting, so the bar never goes backwards and the build never waits on
  it. :meth:`LatestOnly.close` sends the last one before the run ends.
* :func:`send_all` makes calls at once, from a few threads, and returns when
  all are made.
* :func:`send_in_order` makes the end-of-run artifacts one after another: the
  server orders a run's artifacts by their creation time, so calls made at
  once would come in any order (``flows/report.py``: summary first).

Both run the calls in a copy of the caller's context, so the artifacts belong
to the same flow run, on the same server, as if the flow made them itself.
"""

from __future__ import annotations

import contextvars
import logging
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

__all__ = ["LatestOnly", "send_all", "send_in_order"]

log = logging.getLogger("shardflow.flows")


class LatestOnly:
    """Calls ``send(*args, **kwargs)`` on a background thread with the latest arguments given to :meth:`put`."""

    def __init__(self, send: Callable[..., Any], *, name: str = "shardflow-progress") -> None:
        self._send = send
        self._cv = threading.Condition()
        self._next: tuple[tuple[Any, ...], dict[str, Any]] | None = None
        self._closing = False
        context = contextvars.copy_context()  # the flow run and the server the caller's calls would use
        self._thread = threading.Thread(target=context.run, args=(self._loop,), name=name, daemon=True)
        self._thread.start()

    def put(self, *args: Any, **kwargs: Any) -> None:
        """Queue a call, replacing one still waiting; never blocks on the call itself."""
        with self._cv:
            self._next = (args, kwargs)
            self._cv.notify()

    def close(self, timeout: float = 10.0) -> None:
        """Send the last queued call, if any, and stop the thread (waiting at most ``timeout`` seconds)."""
        with self._cv:
            self._closing = True
            self._cv.notify()
        self._thread.join(timeout)

    def _loop(self) -> None:
        while True:
            with self._cv:
                while self._next is None and not self._closing:
                    self._cv.wait()
                if self._next is None:
                    return
                (args, kwargs), self._next = self._next, None
            try:
                self._send(*args, **kwargs)
            except Exception:  # a progress bar is a convenience; never fail a build for it
                log.debug("could not send %s", getattr(self._send, "__name__", "an update"), exc_info=True)


def send_all(calls: Sequence[Callable[[], Any]], *, threads: int = 4) -> None:
    """Run ``calls`` concurrently in copies of the caller's context; re-raise the first error once all have run."""
    if not calls:
        return
    with ThreadPoolExecutor(max_workers=min(threads, len(calls)), thread_name_prefix="shardflow-artifacts") as pool:
        futures = [pool.submit(contextvars.copy_context().run, call) for call in calls]
    errors = [f.exception() for f in futures if f.exception() is not None]
    if errors:
        raise errors[0]


def send_in_order(calls: Sequence[Callable[[], Any]]) -> None:
    """Run ``calls`` one after another, each after the last returned; re-raise the first error once all have run."""
    errors = []
    for call in calls:
        try:
            call()
        except Exception as exc:  # the others are still made: one failed artifact hides none of the rest
            errors.append(exc)
    if errors:
        raise errors[0]
