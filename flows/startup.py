"""What ``shardflow build`` does around its flow to cut the fixed cost: start early, exit quickly.

**The temporary server, started at the top.** With no ``PREFECT_API_URL``,
Prefect starts a temporary server (a ``uvicorn`` subprocess of its API on a
free localhost port) the first time a flow needs the API, and waits for it:
about 3 s of its start-up, plus about 1.5 s for this process to import
Prefect's whole server package only to launch it. The command line knows much
earlier that it will need one, so :func:`start_early` launches the same
subprocess, with the same command, environment and database
(``PREFECT_HOME``), before it imports Prefect, and the server starts while
this process imports Prefect and loads the tokenizer. The flow then runs
against it as against any server, so its runs, task runs, logs and artifacts
are the ones Prefect's own temporary server would hold. The early start is a
guess made without importing Prefect (no ``PREFECT_API_URL`` in the
environment or the active profile, no settings file in the working
directory); Prefect's own settings decide once imported
(:meth:`EarlyServer.serve`), and a wrong guess only stops the extra process.

A Prefect server already running on this machine at the default address
(``prefect server start``, port 4200) is used instead, as is: no start-up at
all, and its UI shows the run (``SHARDFLOW_REUSE_LOCAL_SERVER=0`` turns this
off).

**The plan's slow parts, done meanwhile.** :func:`warm_up` loads the tokenizer
and fingerprints the inputs on a thread while Prefect is imported and the flow
run is created (both are cached), so the flow's plan task, which waits for it
(:func:`wait_for_warm_up`), finds them done; then it does the tokenizer
backend's one-time set-up, which the first work unit would otherwise pay, and
starts the build's first work units (``shardflow.build.head_start``: planned,
locked and tokenized on ``--workers`` threads until the flow's tokenize tasks
claim them; :meth:`WarmUp.close` ends it after the flow).

**Imports done while waiting.** The temporary server takes about 3 s to
answer, and this process is ready before it. Whatever the run would import
later (graphviz for Prefect's flows module, and matplotlib for the dataset
card unless the plot helper draws it: about 0.5 s) is imported during that wait
(:func:`preload`) instead of on the run's own path.

**A quick exit.** Once the flow has run, tearing down the interpreter (Prefect's
thousands of objects) takes about a second; :func:`flows.cli.exit_now` runs the exit
handlers (Prefect's drain its logs and events) and ends the process.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from importlib.util import find_spec
from pathlib import Path
from typing import Any, Iterator, Sequence

from shardflow.errors import ShardflowError
from shardflow.flows.watcher import watched

__all__ = ["EarlyServer", "start_early", "running_server", "warm_up", "WarmUp", "preload", "LOCAL_SERVER", "REUSE_ENV", "LATER_IMPORTS", "wait_for_warm_up", "runs_flow_here"]

log = logging.getLogger("prefect")  # Prefect's own temporary server logs its start and stop here


def _prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME", "~/.prefect")).expanduser()


def _active_profile_settings() -> dict[str, Any] | None:
    """The settings of the active Prefect profile (``profiles.toml``); None when unsure (an unreadable file)."""
    import tomllib

    path = Path(os.environ.get("PREFECT_PROFILES_PATH", _prefect_home() / "profiles.toml")).expanduser()
    if not path.exists():
        return {}  # Prefect's built-in profiles: "ephemeral" is the active one
    try:
        profiles = tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return None
    active = os.environ.get("PREFECT_PROFILE") or profiles.get("active") or "ephemeral"
    return dict(profiles.get("profiles", {}).get(active, {}))


def _active_profile_sets_api_url() -> bool:
    """Whether the active Prefect profile sets ``PREFECT_API_URL``; True when unsure."""
    settings = _active_profile_settings()
    return settings is None or "PREFECT_API_URL" in settings


def _blocks_already_registered() -> bool:
    """Whether the temporary server's database, the default one in ``PREFECT_HOME``, holds Prefect's block types.

    Only for Prefect's default database: a database named in the environment
    or the active profile is left to Prefect.
    """
    import sqlite3

    settings = _active_profile_settings()
    named = [k for k in [*os.environ, *(settings or {})] if k.startswith("PREFECT_") and "DATABASE" in k]
    path = _prefect_home() / "prefect.db"
    if settings is None or named or not path.is_file():
        return False
    try:
        with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=0.5)) as db:
            return int(db.execute("SELECT count(*) FROM block_type").fetchone()[0]) > 0
    except sqlite3.Error:
        return False  # not created yet, another schema, locked: Prefect registers them as it would


def _would_use_temporary_server() -> bool:
    """Whether Prefect would start its temporary server: its own answer if already imported, else a guess."""
    if "prefect.settings" in sys.modules:  # main() called in-process: ask Prefect, at no cost
        from prefect.settings import get_current_settings

        settings = get_current_settings()
        return not settings.api.url and settings.server.ephemeral.enabled
    return _guess_before_import()


def _guess_before_import() -> bool:
    """A cheap guess, without importing Prefect, that it would start its temporary server."""
    if os.environ.get("PREFECT_API_URL"):
        return False
    # Settings files in the working directory may set anything: leave those cases to Prefect.
    cwd = Path.cwd()
    if (cwd / "prefect.toml").exists() or (cwd / ".env").exists():
        return False
    pyproject = cwd / "pyproject.toml"
    with contextlib.suppress(OSError):
        if pyproject.exists() and "[tool.prefect" in pyproject.read_text():
            return False
    return not _active_profile_sets_api_url()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EarlyServer:
    """The server a build with no ``PREFECT_API_URL`` will use, found or launched before Prefect is imported.

    ``EarlyServer()`` launches a temporary server; ``EarlyServer(url)`` stands
    for a server already running at ``url`` (see :func:`start_early`). A
    context manager, :meth:`serve`, runs the flow on it.
    """

    def __init__(self, url: str | None = None) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        if url is not None:
            self.url, self.port = url, 0
            return
        spec = find_spec("prefect")
        if spec is None or spec.origin is None:
            raise ImportError("prefect")
        self._app_dir = str(Path(spec.origin).parent.parent)
        self._launch()
        atexit.register(self.stop, quiet=True)  # never outlive this process, whatever fails before serve()

    def _launch(self) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        # The command and environment of prefect.server.api.server.SubprocessASGIServer (prefect 3.8).
        env = {**os.environ, "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
        if _blocks_already_registered():
            # Registering block types at start-up first imports every installed Prefect collection
            # (prefect-dask imports dask and distributed: 0.27 s of the server's start-up) only to find
            # them registered in this database already, by an earlier start. The user's own setting wins.
            env.setdefault("PREFECT_SERVER_REGISTER_BLOCKS_ON_START", "false")
            env.setdefault("PREFECT_SERVER_MEMOIZE_BLOCK_AUTO_REGISTRATION", "false")
        server = [
            sys.executable, "-m", "uvicorn", "--app-dir", self._app_dir,
            "--factory", "prefect.server.api.server:create_app", "--host", "127.0.0.1",
            "--port", str(self.port), "--log-level", "error", "--lifespan", "on",
        ]
        # The server runs under a watcher (flows/watcher.py) that stops it when this process dies, however it
        # dies: kill -9 and kill -TERM run no atexit handler. The watcher reads a pipe whose only write
        # end this process holds; its EOF (or a new parent pid) means the build is gone.
        with contextlib.suppress(AttributeError, OSError):
            os.close(self._lifeline)  # a relaunch (the port was taken): the last watcher has exited
        read_end, self._lifeline = os.pipe()
        try:
            self.process = subprocess.Popen(
                watched(server),
                env=env,
                stdin=read_end,
                stdout=sys.stderr.fileno() if _has_fileno(sys.stderr) else None,  # stdout's last line is the manifest path
            )
        finally:
            os.close(read_end)

    @contextlib.contextmanager
    def serve(self) -> Iterator[bool]:
        """Run the enclosed flow on this server if Prefect agrees it has none configured; stop a temporary one after.

        Yields whether the server is used. Call once Prefect is importable
        (the command line has imported it by then).
        """
        from prefect.settings import PREFECT_API_URL, get_current_settings, temporary_settings

        settings = get_current_settings()
        if settings.api.url or not settings.server.ephemeral.enabled:
            self.stop(quiet=True)  # a real server is configured, or no temporary one is allowed: Prefect decides
            yield False
            return
        if self.process is None:
            log.info("Using the Prefect server already running at %s (set PREFECT_API_URL to use another)",
                     self.url.removesuffix("/api"))
            with temporary_settings(updates={PREFECT_API_URL: self.url}):
                try:
                    yield True
                finally:
                    _drain_prefect_workers()
            return
        try:
            preload()  # the server is still starting: this process would only wait
            self._wait_healthy(settings.server.ephemeral.startup_timeout_seconds)
            # Prefect's words, once the port is final (a taken port means another launch).
            log.info("Starting temporary server on http://127.0.0.1:%d", self.port)
            # No flow-run heartbeats: they let a server notice a crashed run, and this server ends with
            # the process. (Ending the heartbeat thread costs up to a second at the end of every run.)
            with temporary_settings(updates={PREFECT_API_URL: self.url, "flows.heartbeat_frequency": None}):
                try:
                    yield True
                finally:
                    _drain_prefect_workers()  # queued logs and events go out while the server is still up
        finally:
            self.stop()

    def _wait_healthy(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while True:
            if self.process is not None and self.process.poll() == 3:
                self._launch()  # uvicorn's "address already in use": the free port was taken meanwhile (as Prefect does)
                continue
            if self.process is None or self.process.poll() is not None:
                code = None if self.process is None else self.process.returncode
                raise ShardflowError(
                    f"Prefect's temporary server exited with status {code} while starting (see the lines above); "
                    "run 'prefect server start' and set PREFECT_API_URL, or build with --no-prefect"
                )
            with contextlib.suppress(OSError):
                with urllib.request.urlopen(f"{self.url}/health", timeout=1) as resp:
                    if resp.status == 200:
                        return
            if time.monotonic() > deadline:
                self.stop(quiet=True)
                raise ShardflowError(
                    f"Prefect's temporary server did not answer on {self.url} within {timeout:.0f} s "
                    "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS); run 'prefect server start' and set "
                    "PREFECT_API_URL, or build with --no-prefect"
                )
            time.sleep(0.01)  # a refused connection costs nothing; every poll interval is added to the run

    def stop(self, *, quiet: bool = False) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if not quiet:
            log.info("Stopping temporary server on http://127.0.0.1:%d", self.port)
        process.terminate()  # the watcher stops the server, then exits
        with contextlib.suppress(OSError):
            os.close(self._lifeline)
        try:
            _wait_exit(process, timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_exit(process: subprocess.Popen[bytes], timeout: float) -> None:
    """``process.wait(timeout)``, woken the moment it exits (a pidfd on Linux) rather than by polling.

    ``Popen.wait`` with a timeout polls at up to 50 ms intervals: on average 25 ms added to every
    build that stops a temporary server.
    """
    import select

    try:
        fd = os.pidfd_open(process.pid)
    except (AttributeError, OSError):  # not Linux 5.3+, or already reaped
        process.wait(timeout=timeout)
        return
    try:
        if not select.select([fd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired(process.args, timeout)
    finally:
        os.close(fd)
    process.wait()


# Imported by a run only once it is under way: by Prefect's flows module (graphviz) and by the dataset
# card. (FastAPI no longer: flows.build.BuildFlow; pandas no longer: shardflow._arrow.)
_LATER = ("prefect.utilities.visualization",)
_CARD = ("matplotlib.figure", "matplotlib.backends.backend_agg", "matplotlib.ticker")
LATER_IMPORTS = _LATER + _CARD
"""Modules a build imports once under way (also what ``shardflow serve``'s fork server preloads)."""


def preload() -> None:
    """Import the modules a build imports later on its way, now, while this process would wait for the server."""
    import importlib

    from shardflow.card import card_wanted, plots_drawn_elsewhere

    names = _LATER + (_CARD if card_wanted() and not plots_drawn_elsewhere() else ())
    for name in names:
        with contextlib.suppress(ImportError):  # an optional one (matplotlib) missing: the run does without it
            importlib.import_module(name)


def _has_fileno(stream: object) -> bool:
    try:
        stream.fileno()  # type: ignore[attr-defined]
        return True
    except (AttributeError, OSError, ValueError):
        return False  # pytest's captured streams


def _drain_prefect_workers() -> None:
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    with contextlib.suppress(Exception):
        APILogWorker.drain_all(timeout=5)
        EventsWorker.drain_all(timeout=5)


LOCAL_SERVER = "http://127.0.0.1:4200/api"
"""Where ``prefect server start`` listens by default."""
REUSE_ENV = "SHARDFLOW_REUSE_LOCAL_SERVER"
"""Set to 0 to always start a temporary server, even when one is running at :data:`LOCAL_SERVER`."""


def running_server(url: str = LOCAL_SERVER, timeout: float = 0.25) -> bool:
    """Whether a Prefect server answers its health check at ``url`` (an API URL) right away."""
    with contextlib.suppress(OSError, ValueError):
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return resp.status == 200 and resp.read().strip() == b"true"
    return False


def runs_flow_here(words: Sequence[str]) -> bool:
    """Whether the command line ``words`` are a build that runs its flow on this machine's threads.

    Decided from the words alone, before the option parser is built (its
    choices import numpy and the trainer targets): ``build`` without
    ``--no-prefect``, ``--runner dask`` or ``--help``. A wrong guess (the options
    fail to parse, Prefect has a server configured) only stops the extra server.
    """
    words = list(words)
    if not words or words[0] != "build" or {"--no-prefect", "-h", "--help"} & set(words):
        return False
    return "--runner=dask" not in words and not any(a == "--runner" and b == "dask" for a, b in zip(words, words[1:]))


def start_early() -> EarlyServer | None:
    """The server for a build with no ``PREFECT_API_URL``, before Prefect is imported; None if one is configured.

    The server skips what a one-shot build does not need: Prefect's block
types are registered at its start only if its database (Prefect's default,
in ``PREFECT_HOME``) holds none yet (an earlier start registered them); the
check otherwise imports every installed Prefect collection (0.27 s with
prefect-dask) to find them there.

A server already running on this machine at the default address
    (``prefect server start``) is used as is: no start-up, and its UI shows
    the run. Otherwise Prefect's temporary server is launched now.
    """
    if not _would_use_temporary_server():
        return None
    if os.environ.get(REUSE_ENV, "1").strip() not in ("0", "false", "no") and running_server(LOCAL_SERVER):
        return EarlyServer(LOCAL_SERVER)
    try:
        return EarlyServer()
    except (ImportError, OSError):
        return None  # Prefect will start its own, as before


class WarmUp:
    """What :func:`warm_up` started: :meth:`wait` for the tokenizer and the fingerprints; the backend's set-up may still run."""

    def __init__(self, thread: threading.Thread, ready: threading.Event) -> None:
        self.thread = thread
        self._ready = ready
        self._lock = threading.Lock()
        self._closed = False
        self._flow_waiting = False
        self.head_start: Any = None
        """The build's head start (``shardflow.build.head_start``), once ready; None if there is none."""

    def wait(self) -> None:
        """Block until the tokenizer is loaded and the inputs fingerprinted (or that failed: the plan task says why).

        A flow already waiting here gets no head start: it plans and tokenizes at once itself (a head
        start would only delay its plan: a first build against a running server, where hashing the
        inputs takes longer than Prefect's start-up).
        """
        self._flow_waiting = True
        self._ready.wait()

    def join(self) -> None:
        """Block until everything is done, the backend's set-up included."""
        self.thread.join()

    def close(self) -> None:
        """After the flow: stop the head start (its running units end, its lock is released).

        Does not wait for a warm-up still under way (a flow that failed early, Ctrl-C while a large
        corpus is hashed): that thread then starts no head start.
        """
        with self._lock:
            self._closed = True
            head_start, self.head_start = self.head_start, None
        if head_start is not None:
            head_start.close()

    def _adopt(self, head_start: Any) -> None:
        """Keep the head start the thread began, or close it at once if the build is over already."""
        with self._lock:
            if not self._closed:
                self.head_start = head_start
                return
        if head_start is not None:
            head_start.close()


_pending: WarmUp | None = None
"""The warm-up the command line started, until the flow's plan task is about to run."""


def wait_for_warm_up() -> None:
    """Block until the command line's warm-up (if any) has loaded the tokenizer and fingerprinted the inputs.

    The flow calls this right before its plan task, not the command line before
    the flow: a first build hashes every input (1000 MB: about a second, longer
    than this process's import of Prefect), and the flow run is created over
    HTTP meanwhile instead of after.
    """
    global _pending
    pending, _pending = _pending, None
    if pending is not None:
        pending.wait()


def warm_up(config: Any, data_root: str | None, *, catalog: str | None = None, workers: int = 0) -> WarmUp:
    """Load ``config``'s tokenizer and fingerprint its inputs on a thread; wait for it before the flow plans.

    Both are what the plan task does first, and both are cached per process
    (the tokenizer) or on disk (the inputs' SHA-256, keyed by their stat), so
    the plan task then finds them done. Errors are left for the plan task to
    report, with its own message. Then the same thread does the tokenizer
    backend's one-time set-up (``Tokenizer.warm``) and, with ``workers``, gives
    the build its head start (``shardflow.build.head_start``): it plans the
    build, takes its lock and tokenizes the first work units on ``workers``
    threads while Prefect is imported, the flow run is created and a temporary
    server starts; the flow's tokenize tasks claim them. The plan task waits
    for that plan (it is the same one), not for the units; :meth:`WarmUp.close`
    ends the head start after the flow.
    """
    # Imported here, not on the thread: two threads importing the same modules at once can deadlock.
    from shardflow.build.head_start import HeadStart
    from shardflow.catalog import default_data_root
    from shardflow.sources import discover_inputs, fingerprint_inputs
    from shardflow.tokenizers import load_tokenizer

    ready = threading.Event()
    warming: WarmUp

    def load() -> None:
        tokenizer = None
        try:
            with contextlib.suppress(Exception):
                tokenizer = load_tokenizer(config.tokenizer, backend=config.backend)
            if not any("://" in s for s in config.sources):  # URL sources are planned by the flow
                with contextlib.suppress(Exception):
                    fingerprint_inputs(discover_inputs(config.sources), cache_dir=default_data_root(data_root) / config.name)
                if tokenizer is not None and workers > 0 and not (warming._closed or warming._flow_waiting):
                    with contextlib.suppress(Exception):
                        tokenizer.warm()
                        tokenizer = None  # warm already
                        warming._adopt(HeadStart.begin(config, data_root=data_root, catalog=catalog, workers=workers))
        finally:
            ready.set()
        if tokenizer is not None:
            with contextlib.suppress(Exception):
                tokenizer.warm()

    global _pending
    thread = threading.Thread(target=load, name="shardflow-warm-up", daemon=True)
    warming = _pending = WarmUp(thread, ready)
    thread.start()
    return warming
