"""Draw a dataset card's plots in a helper process that imported matplotlib ahead of time.

The card's plots (:func:`shardflow.card.draw_plots`) are mostly Python:
importing matplotlib (about 0.5 s here) and building its figures hold the GIL.
In a build's own process they take turns with everything else that does (the
tokenizer's load, Prefect's import and its task runs), and on a small or an
incremental build the card is the last thing the run waits for.

``shardflow build`` starts a :class:`PlotHelper` as it begins: a child process
(``python -m shardflow.plot_helper``, in its own session, talking over two
pipes) imports matplotlib on the core the build's start-up leaves idle, then
draws the card when the build asks, writing the PNGs where the build's own
process would (the same bytes: the same code and the same matplotlib). If the
helper cannot start, has died, or cannot be reached, the card is drawn in the
build's own process, as without it. An error while drawing is the build's
error, as in-process. It ends with the command, or with the build's process
if that is killed (Linux; elsewhere at the closed pipe, after the drawing in
hand). ``SHARDFLOW_PLOT_HELPER=0`` turns the helper off, and so does
``SHARDFLOW_FAULT`` (fault injection acts on the build's own process).
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from importlib.util import find_spec
from pathlib import Path
from typing import Any

__all__ = ["PlotHelper", "HELPER_ENV"]

log = logging.getLogger("shardflow.card")

HELPER_ENV = "SHARDFLOW_PLOT_HELPER"


class PlotHelper:
    """A helper process for the card's plots; :meth:`start` it, hand it to ``card.use_plot_helper``, :meth:`stop` it."""

    def __init__(self, process: subprocess.Popen[bytes], requests: Any, replies: Any) -> None:
        self._process = process
        self._requests = requests
        self._replies = replies
        self._lock = threading.Lock()  # one drawing at a time: requests and replies share the pipe
        self._broken = False

    @classmethod
    def start(cls) -> PlotHelper | None:
        """Launch the helper (it imports matplotlib at once); None when turned off, without matplotlib, or on failure."""
        from .card import CARD_ENV
        from .faults import ENV as FAULT_ENV
        from .stats import COLLECT_ENV

        # No statistics or no card (nothing to draw), turned off, or no matplotlib (a text-only card).
        if any(os.environ.get(env, "1") == "0" for env in (COLLECT_ENV, CARD_ENV, HELPER_ENV)) or find_spec("matplotlib") is None:
            return None
        if os.environ.get(FAULT_ENV):  # fault injection (tests) acts on the build's own process, as it names
            return None
        from multiprocessing.connection import Connection

        # A plain subprocess, not multiprocessing's spawn, which would import the caller's __main__
        # again (a script calling shardflow.flows.cli.main() without a __main__ guard would build twice).
        # Its own session: Ctrl-C at the terminal interrupts the build, not the helper. This package's
        # directory goes last on its path (never ahead of the standard library); the helper checks that
        # it imported this very package, and draws nothing otherwise.
        package_root = str(Path(__file__).resolve().parent.parent)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), package_root) if p)}
        requests_r, requests_w = os.pipe()
        replies_r, replies_w = os.pipe()
        try:
            process = subprocess.Popen(
                [sys.executable, "-m", "shardflow.plot_helper", str(requests_r), str(replies_w), str(os.getpid()), package_root],
                pass_fds=(requests_r, replies_w), env=env, stdin=subprocess.DEVNULL, start_new_session=True,
            )
        except OSError as exc:  # no processes here (a sandbox)
            log.debug("no plot helper (%s): the card is drawn in this process", exc)
            for fd in (requests_r, requests_w, replies_r, replies_w):
                os.close(fd)
            return None
        os.close(requests_r)
        os.close(replies_w)
        return cls(process, Connection(requests_w, readable=False), Connection(replies_r, writable=False))

    def draw(self, directory: Path | str, manifest: Any, *, parent: Path | None, parent_ref: str | None) -> dict[str, bool] | None:
        """The helper's :func:`shardflow.card.draw_plots`; None when it cannot draw (the caller draws instead)."""
        with self._lock:
            if self._broken:
                return None
            request = (str(directory), manifest, None if parent is None else str(parent), parent_ref)
            try:
                self._requests.send(request)
                while True:
                    kind, value = self._replies.recv()
                    if kind != "ready":
                        break
            except (OSError, EOFError, ValueError) as exc:  # it died (killed, out of memory): draw here
                return self._gone(f"the plot helper is gone ({exc or type(exc).__name__})")
            except Exception as exc:  # the request does not pickle: nothing was sent, so draw this one here
                log.info("the plot helper cannot take this card (%s): it is drawn in this process", exc)
                return None
            if kind == "unavailable":  # it cannot draw (no matplotlib there, another shardflow), and has ended
                return self._gone(f"the plot helper cannot draw ({value})")
        if kind == "error":
            raise RuntimeError(value)
        return dict(value)

    def _gone(self, why: str) -> None:
        self._broken = True
        log.info("%s: the card is drawn in this process", why)

    def stop(self) -> None:
        """End the helper now, whatever it is doing (a drawing in flight ends as if it had died)."""
        # The process first, without the lock: a thread waiting in draw() for its reply holds the lock,
        # and gets its end of the pipe closed (EOFError: it draws in its own process, or is dropped).
        if self._process.poll() is None:
            self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        with self._lock:
            self._broken = True
            self._requests.close()
            self._replies.close()


def _die_with(parent: int) -> None:
    """End this process when the build's process ends, even killed (Linux): no orphan writes into a rerun's card."""
    try:
        import ctypes
        import signal

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the closed pipe still ends it after the drawing in hand
        pass
    if os.getppid() != parent:  # the build ended before the line above
        os._exit(0)


def _serve(requests: Any, replies: Any, package_root: str) -> None:
    """The helper process: import matplotlib, then draw each request until the build closes its end."""
    try:
        import matplotlib.backends.backend_agg  # noqa: F401
        import matplotlib.figure  # noqa: F401
        import matplotlib.ticker  # noqa: F401

        from shardflow import card
    except ImportError as exc:
        replies.send(("unavailable", f"{type(exc).__name__}: {exc}"))
        return
    if Path(card.__file__).resolve().parent.parent != Path(package_root):
        replies.send(("unavailable", f"it imported another shardflow, {card.__file__}"))
        return
    replies.send(("ready", None))
    while True:
        try:
            directory, manifest, parent, parent_ref = requests.recv()
        except (EOFError, OSError):
            return
        try:
            drawn = card.draw_plots_here(directory, manifest, parent=None if parent is None else Path(parent),
                                         parent_ref=parent_ref)
        except Exception as exc:  # the build's error, as if drawn there: its type and message travel back
            replies.send(("error", f"{type(exc).__name__}: {exc}"))
        else:
            replies.send(("ok", drawn))


if __name__ == "__main__":
    from multiprocessing.connection import Connection

    _die_with(int(sys.argv[3]))
    try:
        _serve(Connection(int(sys.argv[1]), writable=False), Connection(int(sys.argv[2]), readable=False), sys.argv[4])
    except (BrokenPipeError, EOFError, KeyboardInterrupt):  # the build ended first
        pass
