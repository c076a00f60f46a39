"""Draw a dataset card's plots in a helper process that imported matplotlib ahead of time.

The card's plots (:func:`shardflow.card.draw_plots`) are mostly Python:
importing matplotlib (about 0.5 s here) and building its figures hold the GIL.
In a build's own process they take turns with everything else that does (the
tokenizer's load, Prefect's import and its task runs), and on a small or an
incremental build the card is the last thing the run waits for.

``shardflow build`` starts a :class:`PlotHelper` as it begins: a spawned
process imports matplotlib on the core the build's start-up leaves idle, then
draws the card when the build asks, writing the PNGs where the build's own
process would (the same bytes: the same code and the same matplotlib). If the
helper cannot start, has died, or cannot be reached, the card is drawn in the
build's own process, as without it. An error while drawing is the build's
error, as in-process. ``SHARDFLOW_PLOT_HELPER=0`` turns the helper off.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from importlib.util import find_spec
from pathlib import Path
from typing import Any

__all__ = ["PlotHelper", "HELPER_ENV"]

log = logging.getLogger("shardflow.card")

HELPER_ENV = "SHARDFLOW_PLOT_HELPER"


class PlotHelper:
    """A helper process for the card's plots; :meth:`start` it, hand it to ``card.use_plot_helper``, :meth:`stop` it."""

    def __init__(self, process: Any, conn: Any) -> None:
        self._process = process
        self._conn = conn
        self._lock = threading.Lock()  # one drawing at a time: requests and replies share the pipe
        self._broken = False

    @classmethod
    def start(cls) -> PlotHelper | None:
        """Spawn the helper (it imports matplotlib at once); None when turned off, without matplotlib, or on failure."""
        from .card import CARD_ENV
        from .stats import COLLECT_ENV

        # No statistics or no card (nothing to draw), turned off, or no matplotlib (a text-only card).
        if any(os.environ.get(env, "1") == "0" for env in (COLLECT_ENV, CARD_ENV, HELPER_ENV)) or find_spec("matplotlib") is None:
            return None
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")  # a fresh interpreter: forking a process with threads is unsafe
        try:
            conn, child_conn = ctx.Pipe()
            # A daemon: the interpreter's exit ends it rather than waiting for it.
            process = ctx.Process(target=_serve, args=(child_conn,), name="shardflow-plots", daemon=True)
            # Ctrl-C reaches the terminal's whole process group: the helper, blocked from it from its
            # first instruction, leaves the interruption (and its message) to the build.
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                process.start()
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
            child_conn.close()
        except (OSError, RuntimeError, ValueError) as exc:  # no processes here (a sandbox), or a main thread check
            log.debug("no plot helper (%s): the card is drawn in this process", exc)
            return None
        return cls(process, conn)

    def draw(self, directory: Path | str, manifest: Any, *, parent: Path | None, parent_ref: str | None) -> dict[str, bool] | None:
        """The helper's :func:`shardflow.card.draw_plots`; None when it cannot draw (the caller draws instead)."""
        with self._lock:
            if self._broken:
                return None
            try:
                self._conn.send((str(directory), manifest, None if parent is None else str(parent), parent_ref))
                while True:
                    kind, value = self._conn.recv()
                    if kind != "ready":
                        break
            except (OSError, EOFError, ValueError) as exc:  # it died (killed, out of memory): draw here
                self._broken = True
                log.info("the plot helper is gone (%s): the card is drawn in this process", exc or type(exc).__name__)
                return None
        if kind == "ok":
            return dict(value)
        if kind == "error":
            raise RuntimeError(value)
        return None  # "unavailable": matplotlib would not import there, nor here

    def stop(self) -> None:
        """End the helper now, whatever it is doing."""
        with self._lock:
            self._broken = True
            self._conn.close()
        if self._process.is_alive():
            self._process.terminate()
        self._process.join(timeout=5)


def _serve(conn: Any) -> None:
    """The helper process: import matplotlib, then draw each request until the build closes the pipe."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})  # ignored now: unblocking cannot interrupt
    try:
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401
        import matplotlib.ticker  # noqa: F401

        from shardflow import card
    except ImportError:
        conn.send(("unavailable", None))
        return
    conn.send(("ready", None))
    while True:
        try:
            directory, manifest, parent, parent_ref = conn.recv()
        except (EOFError, OSError):
            return
        try:
            drawn = card.draw_plots_here(directory, manifest, parent=None if parent is None else Path(parent),
                                         parent_ref=parent_ref)
        except Exception as exc:  # the build's error, as if drawn there: its type and message travel back
            conn.send(("error", f"{type(exc).__name__}: {exc}"))
        else:
            conn.send(("ok", drawn))
