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
   (:func:`build_until_answered`); the flow resumes it. It runs under a watcher (``flows/watcher.py``), so a build killed
   with ``kill -9`` takes it along. A server that exits while starting is
   reported at once, with its own last line.

Only public interfaces: Prefect's ``create_app`` and settings, uvicorn's command
line; this process is pointed at the server with ``prefect.settings.temporary_settings``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from concurrent.futures import FIRST_COMPLETED, wait
from pathlib import Path
from typing import Any, Iterator

from shardflow.errors import ShardflowError
from shardflow.flows.watcher import watched

__all__ = ["TemporaryServer", "start_server", "running_server", "LOCAL_SERVER", "REUSE_ENV"]

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


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class TemporaryServer:
    """Prefect's temporary server on a free loopback port, under a watcher; or, with ``url``, a server found running."""

    def __init__(self, url: str | None = None) -> None:
        self.process: subprocess.Popen[bytes] | None = None
        self.url = url or ""
        if url is None:
            self._launch()

    def _launch(self) -> None:
        port = _free_port()
        self.url = f"http://127.0.0.1:{port}/api"
        command = [sys.executable, "-m", "uvicorn", "--factory", "shardflow.flows.server_app:app", "--host", "127.0.0.1",
                   "--port", str(port), "--log-level", "error", "--lifespan", "on"]
        env = {**SERVER_DEFAULTS, **os.environ}
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
        """Block until the server answers; a server that exits or stays silent is one error line."""
        deadline = time.monotonic() + timeout
        while self.process is not None:
            if self.process.poll() is not None:
                raise ShardflowError(
                    f"Prefect's temporary server exited while starting: {self._last_line()}; "
                    "run 'prefect server start' and set PREFECT_API_URL, or build with --no-prefect"
                )
            if running_server(self.url, timeout=1):
                return
            if time.monotonic() > deadline:
                self.stop()
                raise ShardflowError(
                    f"Prefect's temporary server did not answer on {self.url} within {timeout:.0f} s "
                    "(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS); run 'prefect server start' and set "
                    "PREFECT_API_URL, or build with --no-prefect"
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
                    drain_prefect_workers()  # queued logs and events go out while the server is still up
        finally:
            self.stop()

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None:
            return
        if process.poll() is None:
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


def build_until_answered(server: TemporaryServer, request: Any) -> None:
    """While ``server`` starts, the build (a ``BuildRequest``) runs without Prefect: planned, locked, and its
    stages' jobs run on its workers' threads until the server answers (never the manifest and the publish: the
    flow's); then the lock is released and the flow resumes the build.

    The jobs finished here are committed, as those of a run that was stopped: the flow answers them from
    disk (``Stage.done``) without a task run, and their log lines stay out of the run's logs. A bad input
    fails here, before any flow run. The driver is the same (``drive``); only the executor stops it. A build
    to a bucket waits for the flow: its catalog is synced once, there, before it is planned (``run_request``).
    """
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
                    results[pending.pop(future)] = future.result()  # a job's error is the build's, here as in the flow
            return [results[i] for i in range(len(jobs))]

    with contextlib.suppress(Handover), UntilAnswered(workers) as executor:
        drive(request.config, executor, data_root=request.data_root, catalog=request.catalog)


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
