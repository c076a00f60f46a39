"""The temporary server's application: Prefect's API as its own temporary server runs it, for ``uvicorn --factory``.

``create_app(ephemeral=True)`` is Prefect's public switch for a server that
serves one client briefly: the API only, no UI and no background services
(Prefect's own temporary server uses it).

The server also watches the build it serves (:data:`LIFELINE_ENV`): its stdin is
the read end of a pipe whose only write end the build holds, so it reads EOF
when the build ends, however it ends (``kill -9`` of the build's whole process
group takes its watcher too, ``flows/watcher.py``); it then stops itself. It
also stops if the build's pid is gone. Only public interfaces: a pipe,
``select``, ``os.kill``.
"""

from __future__ import annotations

import os
import select
import signal
import threading
import time
from typing import Any

__all__ = ["app", "LIFELINE_ENV", "watch_build"]

LIFELINE_ENV = "SHARDFLOW_SERVER_LIFELINE"
"""Set by the build (``flows/server.py``) to its pid: the server's stdin is its lifeline."""

STOP_GRACE = 4.0
"""Seconds the server is given to stop on its own SIGTERM before it exits regardless."""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process: it exists
        return True
    return True


def _watch(fd: int, pid: int) -> None:
    while _alive(pid):
        ready = select.select([fd], [], [], 1.0)[0]
        if ready and not os.read(fd, 1):
            break  # EOF: every write end is closed, the build is gone
    os.kill(os.getpid(), signal.SIGTERM)  # uvicorn's graceful stop (or, while still starting, the default: exit)
    time.sleep(STOP_GRACE)
    os._exit(0)


def watch_build(fd: int = 0) -> None:
    """Stop this process when the build named by :data:`LIFELINE_ENV` ends (``fd``: the lifeline's read end)."""
    pid = os.environ.get(LIFELINE_ENV, "")
    if not pid.isdigit():
        return  # run by hand: nothing to watch
    threading.Thread(target=_watch, args=(fd, int(pid)), name="shardflow-lifeline", daemon=True).start()


def app() -> Any:
    watch_build()  # first: a build that dies while the server starts stops it too
    from prefect.server.api.server import create_app

    return create_app(ephemeral=True, final=True)
