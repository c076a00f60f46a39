"""The Prefect server that ``shardflow build`` runs its flow on, found or started before Prefect is imported.

In this order:

1. ``PREFECT_API_URL`` set (the environment, the active Prefect profile, or a
   settings file in the working directory): Prefect's choice, used as is.
2. A server already running at Prefect's default address (``prefect server
   start``, ``127.0.0.1:4200``): used, so its UI shows the run
   (``SHARDFLOW_REUSE_LOCAL_SERVER=0`` turns this off).
3. Otherwise a temporary server, as Prefect's own temporary server runs:
   Prefect's API app in ephemeral mode (``create_app(ephemeral=True)``: no UI,
   no background services; ``flows/server_app.py``) under ``uvicorn``, on a free
   loopback port, stopped when the build ends. It is
   launched before this process imports Prefect (docs/PERFORMANCE.md), so the two
   overlap, and until it answers the build runs without Prefect
   (:func:`build_until_answered`); the flow resumes it. It runs under a watcher (``flows/watcher.py``), and
   watches the build itself (``flows/server_app.py``), so a build killed with ``kill -9``, even with its whole
   process group, takes it along. A server that exits while starting is
   reported at once, with its own last line. One that has not answered by the time only validate and
   publish are left, and ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` after its launch, is stopped,
   and the build ends in this process without Prefect (:class:`ServerSilent`, ``flows/launch.py``).

Whichever server it is, a flow run watches it (:func:`watch_server`): one that
stops answering for :data:`GONE_AFTER` seconds ends the run with one line
(:class:`ServerGone`) rather than Prefect's retries and tracebacks; the build's
staging is kept, and a rerun resumes it.

Only public interfaces: Prefect's ``create_app`` and settings, uvicorn's command
line; this process is pointed at the server with ``prefect.settings.temporary_settings``;
a flow's thread is interrupted with ``signal.pthread_kill``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path
from typing import Any, Iterator

from shardflow.errors import ShardflowError
from shardflow.flows.server_app import LIFELINE_ENV
from shardflow.flows.watcher import watched

__all__ = [
    "TemporaryServer", "start_server", "running_server", "answers", "LOCAL_SERVER", "REUSE_ENV", "ServerSilent",
    "ServerGone", "ServerWatch", "watch_server", "gone_server", "silent_server", "ends_with_build", "GONE_AFTER",
    "EXIT_GRACE",
]

log = logging.getLogger("prefect")  # where Prefect's own temporary server logs its start and stop

LOCAL_SERVER = "http://127.0.0.1:4200/api"
"""Where ``prefect server start`` listens by default."""
REUSE_ENV = "SHARDFLOW_REUSE_LOCAL_SERVER"
"""Set to 0 to always start a temporary server, even when one is running at :data:`LOCAL_SERVER`."""

# The temporary server serves one build on loopback: no usage reports to Prefect Cloud (an ERROR
# line on every run where that host cannot be reached), and no registration of block types at its
# start (it imports every installed Prefect collection; a build uses no blocks, and a real server
# on the same database registers them at its own start). The user's own settings win.
SERVER_DEFAULTS = {"PREFECT_SERVER_ANALYTICS_ENABLED": "false", "PREFECT_SERVER_REGISTER_BLOCKS_ON_START": "false"}


def _prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME", "~/.prefect")).expanduser()


def _configured_elsewhere() -> bool:
    """Whether Prefect's settings may name a server: the environment, the active profile, a settings file here.

    Read without importing Prefect (its import takes about as long as the
    server needs to start: docs/PERFORMANCE.md). When unsure, the answer is yes: Prefect decides.
    """
    import tomllib

    if os.environ.get("PREFECT_API_URL"):
        return True
    cwd = Path.cwd()
    if (cwd / "prefect.toml").exists() or (cwd / ".env").exists():
        return True
    with contextlib.suppress(OSError):
        if (cwd / "pyproject.toml").exists() and "[tool.prefect" in (cwd / "pyproject.toml").read_text():
            return True
    path = Path(os.environ.get("PREFECT_PROFILES_PATH", _prefect_home() / "profiles.toml")).expanduser()
    if not path.exists():
        return False  # Prefect's built-in profiles: "ephemeral" is the active one
    try:
        profiles = tomllib.loads(path.read_text())
    except (OSError, ValueError):
        return True
    active = os.environ.get("PREFECT_PROFILE") or profiles.get("active") or "ephemeral"
    return "PREFECT_API_URL" in profiles.get("profiles", {}).get(active, {})


def running_server(url: str = LOCAL_SERVER, timeout: float = 0.25) -> bool:
    """Whether a Prefect server answers its health check at ``url`` (an API URL) right away."""
    with contextlib.suppress(OSError, ValueError):
        with urllib.request.urlopen(f"{url}/health", timeout=timeout) as resp:
            return resp.status == 200 and resp.read().strip() == b"true"
    return False


def answers(url: str, timeout: float) -> bool:
    """Whether anything answers HTTP at ``url`` (an API URL) within ``timeout`` seconds, whatever the status: a
    server that says 404 or 401 to ``/health`` (a proxy, Prefect Cloud) is there; no connection or no answer is not."""
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout):
            return True
    except urllib.error.HTTPError:
        return True
    except (OSError, ValueError):  # refused, reset, timed out (URLError and socket.timeout are OSErrors)
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ServerSilent(ShardflowError):
    """The temporary server has not answered within its startup timeout (it was stopped)."""


class TemporaryServer:
    """Prefect's temporary server on a free loopback port, under a watcher; or, with ``url``, a server found running."""

    def __init__(self, url: str | None = None) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.url = url or ""
        self.launched = time.monotonic()
        if url is None:
            self._launch()

    def _launch(self) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}/api"
        command = [sys.executable, "-m", "uvicorn", "--factory", "shardflow.flows.server_app:app", "--host", "127.0.0.1",
                   "--port", str(port), "--log-level", "error", "--lifespan", "on"]
        # The server stops itself when this process ends (its stdin is the pipe below): flows/server_app.py.
        env = {**SERVER_DEFAULTS, **os.environ, LIFELINE_ENV: str(os.getpid())}
        # Its output is kept for a failed start's message; the build's own output stays clean.
        self._log = tempfile.TemporaryFile()
        # The watcher stops the server when this process dies, however it dies (kill -9 runs no handler):
        # it reads a pipe whose only write end this process holds.
        read_end, self._lifeline = os.pipe()
        try:
            self.process = subprocess.Popen(watched(command), env=env, stdin=read_end, stdout=self._log,
                                            stderr=subprocess.STDOUT)
        finally:
            os.close(read_end)

    def _last_line(self) -> str:
        """The server's own words for why it stopped: the last exception line of its output, else its last line."""
        self._log.seek(0)
        lines = [line.strip() for line in self._log.read().decode(errors="replace").splitlines() if line.strip()]
        errors = [line for line in lines if re.match(r"^[A-Za-z_][\w.]*(Error|Exception|Exit)\b.*: ", line)]
        return (errors or lines or ["no output"])[-1]

    def answering(self) -> bool:
        """Whether the server answers now (or has exited: there is nothing to wait for)."""
        return self.process is None or self.process.poll() is not None or running_server(self.url, timeout=0.05)

    def wait_until_ready(self, timeout: float) -> None:
        """Block until the server answers, ``timeout`` seconds after its launch at most; a server that exits is one
        error line, one that stays silent is stopped and :class:`ServerSilent`."""
        deadline = self.launched + timeout
        while self.process is not None:
            if self.process.poll() is not None:
                raise ShardflowError(
                    f"Prefect's temporary server exited while starting: {self._last_line()}; "
                    "run 'prefect server start' and set PREFECT_API_URL, or build with --no-prefect"
                )
            if running_server(self.url, timeout=1):
                return
            if time.monotonic() > deadline:
                self.stop(said=False)  # it never said it started: the error says it all
                raise ServerSilent(
                    f"Prefect's temporary server did not answer on {self.url} within {timeout:.0f} s "
                    "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS)"
                )
            time.sleep(0.01)  # a refused connection costs nothing; each poll interval is added to the build

    @contextlib.contextmanager
    def serve(self) -> Iterator[bool]:
        """Run the enclosed flow on this server; yields whether it is a temporary one. Stops it after."""
        from prefect.settings import PREFECT_API_URL, PREFECT_FLOWS_HEARTBEAT_FREQUENCY, get_current_settings, temporary_settings

        try:
            if self.process is None:
                log.info("Using the Prefect server already running at %s (set PREFECT_API_URL to use another)",
                         self.url.removesuffix("/api"))
            else:
                # Prefect imports FastAPI's encoder to create the flow run (docs/PERFORMANCE.md): now, while the
                # server starts.
                import fastapi.encoders  # noqa: F401

                self.wait_until_ready(get_current_settings().server.ephemeral.startup_timeout_seconds)
                log.info("Starting temporary server on %s", self.url.removesuffix("/api"))
            # A temporary server ends with the build: no flow-run heartbeats for it to watch (their thread is
            # joined at the end of every run, up to a second). A running server keeps Prefect's default.
            updates: dict = {PREFECT_API_URL: self.url}
            if self.process is not None:
                updates[PREFECT_FLOWS_HEARTBEAT_FREQUENCY] = None
            with temporary_settings(updates=updates):
                try:
                    yield self.process is not None
                finally:
                    if gone_server() is None and silent_server() is None:
                        drain_prefect_workers()  # queued logs and events go out while the server is still up
        finally:
            self.stop()

    def stop(self, *, said: bool = True) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None and said:
            log.info("Stopping temporary server on %s", self.url.removesuffix("/api"))
        # The watcher stops the server (SIGTERM, SIGKILL after 4 s), then exits: not waited for here, the
        # server's shutdown (docs/PERFORMANCE.md) would only delay the command's end.
        process.terminate()
        with contextlib.suppress(OSError):
            os.close(self._lifeline)


def drain_prefect_workers() -> None:
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    with contextlib.suppress(Exception):
        APILogWorker.drain_all(timeout=5)
        EventsWorker.drain_all(timeout=5)


class Handover(Exception):
    """The temporary server answers: the flow takes the build over."""


def build_until_answered(server: TemporaryServer, request: Any, display: Any = None) -> None:
    """While ``server`` starts, the build (a ``BuildRequest``) runs without Prefect: planned, locked, and its
    stages' jobs run on its workers' threads until the server answers (never the manifest and the publish: the
    flow's); then the lock is released and the flow resumes the build.

    The jobs finished here are committed, as those of a run that was stopped: the flow answers them from
    disk (``Stage.done``) without a task run, and their log lines stay out of the run's logs. A bad input
    fails here, before any flow run. The driver is the same (``drive``); only the executor stops it. A build
    to a bucket waits for the flow: its catalog is synced once, there, before it is planned (``run_request``).
    ``display``: the command's progress display, which shows the jobs run here as they finish (the flow's run
    then shows them as found done, and counts them in no rate).
    """
    from shardflow.cli.progress import BuildProgress
    from shardflow.pipeline import ThreadExecutor, drive
    from shardflow.pipeline.run import retrying, stage_retries

    if request.places is not None:
        return
    workers = request.workers

    class UntilAnswered(ThreadExecutor):
        def map(self, stage: Any, plan: Any, jobs: Any, on_done: Any) -> list[Any]:
            if stage.name in ("validate", "publish"):
                raise Handover
            results: dict[int, Any] = {}
            pending: dict[Any, int] = {}
            while len(results) < len(jobs):
                while len(pending) < workers and len(results) + len(pending) < len(jobs) and not server.answering():
                    i = len(results) + len(pending)
                    pending[self.pool.submit(retrying, stage, plan, *jobs[i], retries=stage_retries(stage))] = i
                if not pending:
                    raise Handover  # the server answers: the flow takes the rest
                finished, _ = wait(list(pending), timeout=0.05, return_when=FIRST_COMPLETED)
                for future in finished:
                    i = pending.pop(future)
                    results[i] = future.result()  # a job's error is the build's, here as in the flow
                    on_done(jobs[i], results[i])
            return [results[i] for i in range(len(jobs))]

    class Shown(BuildProgress):
        def stage_started(self, stage: Any, plan: Any, jobs: Any) -> None:
            if stage.name in ("validate", "publish"):
                raise Handover  # the flow's, and its display's
            super().stage_started(stage, plan, jobs)

    events = Shown(request.config.name, display) if display is not None else None
    with contextlib.suppress(Handover), UntilAnswered(workers) as executor:
        drive(request.config, events.watching(executor) if events is not None else executor,
              data_root=request.data_root, catalog=request.catalog, events=events)


def start_server() -> TemporaryServer | None:
    """The server for a build that Prefect's settings leave to us (see the module's text); None: Prefect decides."""
    if "prefect.settings" in sys.modules:  # main() called in a process that has Prefect: ask it, at no cost
        from prefect.settings import get_current_settings

        if get_current_settings().api.url:
            return None
    elif _configured_elsewhere():
        return None
    if os.environ.get(REUSE_ENV, "1").strip() not in ("0", "false", "no") and running_server(LOCAL_SERVER):
        return TemporaryServer(LOCAL_SERVER)
    return TemporaryServer()


# -- a server that stops answering during a flow run ----------------------------------------------------------

GONE_AFTER = 20.0
"""Seconds without any answer from the flow run's server after which it is taken for gone. Polled every
:data:`POLL_EVERY` s, each poll given :data:`POLL_TIMEOUT` s: noticed within 30 s of its last answer."""
POLL_EVERY = 1.0
POLL_TIMEOUT = 5.0
EXIT_GRACE = 15.0
"""Seconds a process that ends with its build (``shardflow build``, a deployment's run) is given, once the server
is gone, to end on its own (Prefect's own calls give up after their retries); then it exits, status
:data:`GONE_STATUS`. Within a minute of the server's last answer, whatever Prefect does."""
GONE_STATUS = 2
"""The exit status of a build whose server is gone: the command line's for one error line (``cli/commands.py``)."""

_gone: list[str] = []  # the server found gone in this process, if any (for ends_with_build and the launch)
_silent: list[str] = []  # the watched server, while its last poll had no answer
_ending = threading.Lock()
_ends_with_build = [0]  # how many ends_with_build blocks are open in this process


class ServerGone(ShardflowError):
    """The flow run's server stopped answering; the build's staging is kept, and a rerun resumes it."""

    def __init__(self, url: str, *, stopped: bool = True) -> None:
        how = "stopped answering" if stopped else "does not answer"  # stopped: it answered this build before
        super().__init__(f"the Prefect server at {url.removesuffix('/api')} {how}; the build is resumable: rerun it, "
                         "or pass --no-prefect")
        self.url = url


def gone_server() -> str | None:
    """The API URL of the server that a flow run of this process found gone, if one did (reset by each watch)."""
    return _gone[-1] if _gone else None


def silent_server() -> str | None:
    """The API URL of the server that the last watch of this process polled last without an answer (it may be
    gone: Prefect's own calls can give up before the watch says so), if it did."""
    return _silent[-1] if _silent else None


@contextlib.contextmanager
def ends_with_build() -> Iterator[None]:
    """This process ends with the build run inside the block (``shardflow build``): if its server goes, the
    process may exit once :data:`EXIT_GRACE` has passed, with :class:`ServerGone`'s line."""
    with _ending:
        _ends_with_build[0] += 1
    try:
        yield
    finally:
        with _ending:
            _ends_with_build[0] -= 1


class ServerWatch(logging.Filter):
    """A thread that polls the server at ``url`` while the block runs (``dedicated``: this process ends with the
    build, as a deployment's run does); once it is gone: interrupts the flow's thread (when that is the main thread)
    with :class:`ServerGone`, once a second (each of Prefect's calls that retries is cut short) until the watched
    block ends, and in a process that ends with its build, exits after :data:`EXIT_GRACE` if it has not ended.

    On Prefect's console (a filter on its handlers): while the server does not answer, Prefect's complaints that
    its events and logs cannot be delivered are left out (``logging.raiseExceptions`` off: the log worker writes
    its own to stderr unless it is); once the server is gone, everything Prefect says, one line says it all.
    """

    SIGNAL = signal.SIGUSR1

    def __init__(self, url: str, *, dedicated: bool) -> None:
        super().__init__()
        self.url, self.dedicated = url, dedicated
        self.answering, self.gone = True, False
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.main = threading.current_thread() is threading.main_thread()
        self.ends_with_build = _ends_with_build[0] > 0  # shardflow build: its end is the process's
        self.previous: Any = None
        self.raise_exceptions = logging.raiseExceptions
        self.handlers: list[Any] = []

    def __enter__(self) -> "ServerWatch":
        from shardflow.flows.console import prefect_console_handlers

        _gone.clear()
        _silent.clear()
        _watches.append(self)
        # Prefect's console, and its internal services' own stream (the logger "prefect._internal").
        self.handlers = [*prefect_console_handlers(), *logging.getLogger("prefect._internal").handlers]
        for handler in self.handlers:
            handler.addFilter(self)
        if self.main:
            self.previous = signal.signal(self.SIGNAL, self.interrupted)
        threading.Thread(target=self.run, name="shardflow-server-watch", daemon=True).start()
        return self

    def __exit__(self, *exc: Any) -> None:
        with self.lock:  # no interrupt after this: the previous handler is back
            self.done.set()
            if self.main:
                signal.signal(self.SIGNAL, self.previous)
        _watches.remove(self)
        if not self.gone:  # once it is gone, Prefect's deliveries fail for the rest of this process: keep quiet
            for handler in self.handlers:
                handler.removeFilter(self)
            logging.raiseExceptions = self.raise_exceptions

    def filter(self, record: logging.LogRecord) -> bool:
        if self.gone:
            return False
        return self.answering or not record.name.startswith(("prefect.events", "prefect._internal"))

    def interrupted(self, signum: int, frame: Any) -> None:
        if self.done.is_set() or (self.ends_with_build and not _ends_with_build[0]):
            return  # the block, or the build, has ended: nothing to interrupt
        if frame is not None and (frame.f_code is ServerWatch.__exit__.__code__
                                  or frame.f_code.co_filename == contextlib.__file__):
            return  # leaving the block: let it leave (the next interrupt, a second later, finds it gone or not)
        raise ServerGone(self.url)

    def run(self) -> None:
        last = time.monotonic()
        while not self.done.wait(POLL_EVERY):
            self.answering = answers(self.url, POLL_TIMEOUT)
            if self.done.is_set():
                return
            logging.raiseExceptions = self.raise_exceptions and self.answering
            _silent[:] = [] if self.answering else [self.url]
            if self.answering:
                last = time.monotonic()
            elif time.monotonic() - last >= GONE_AFTER:
                self.on_gone()
                return

    def on_gone(self) -> None:
        with self.lock:
            if self.done.is_set():
                return  # the flow ended meanwhile
            self.gone = True
            _gone.append(self.url)
        ends = time.monotonic() + EXIT_GRACE
        while time.monotonic() < ends:
            with self.lock:
                if self.main and not self.done.is_set() and (_ends_with_build[0] or not self.ends_with_build):
                    signal.pthread_kill(threading.main_thread().ident, self.SIGNAL)  # type: ignore[arg-type]
            time.sleep(1.0)
            if not self.dedicated and not _ends_with_build[0] and (self.done.is_set() or self.ends_with_build):
                return  # the build has ended here (its caller reports it), or this process goes on without it
        if self.dedicated or _ends_with_build[0]:
            with contextlib.suppress(Exception):
                print(f"shardflow: error: {ServerGone(self.url)}", file=sys.stderr, flush=True)
            os._exit(GONE_STATUS)


_watches: list[ServerWatch] = []  # the watches open in this process (one is enough)


@contextlib.contextmanager
def watch_server() -> Iterator[None]:
    """Watch the current flow run's server (Prefect's API URL; none: Prefect's own in-process one, nothing to watch)
    for the block, unless a watch is open already (``shardflow build`` watches the whole flow call, its start and
    end included).

    A deployment's run has a process of its own (a worker's, ``serve``'s): it exits after :data:`EXIT_GRACE`
    if the run has not ended by then, leaving the staging for a rerun, as a ``kill -9`` would.
    """
    from prefect.context import FlowRunContext
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url or _watches:
        yield
        return
    run = FlowRunContext.get()
    with ServerWatch(str(url), dedicated=bool(run and run.flow_run and run.flow_run.deployment_id)):
        yield
