"""A real Prefect server for the tests: ``prefect server start`` on a free loopback port, and its client side."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Sequence

from support.paths import PYTHON
from support.processes import free_port, stop_group

IDLE_SERVER_SERVICES = {
    f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false"
    for name in ("LATE_RUNS", "FOREMAN", "PAUSE_EXPIRATIONS", "TRIGGERS", "CANCELLATION_CLEANUP", "REPOSSESSOR")
}
"""The environment of a test's ``prefect server start``: its loop services that no test uses, off. Each polls the
database while the server idles (an idle server took about 7% of a core, about half with these off), and the
suite keeps several servers up on its 2 cores."""


@dataclass
class PrefectServer:
    url: str
    """``http://127.0.0.1:PORT``: the UI."""
    home: Path
    process: subprocess.Popen[bytes]
    log: Path
    env: dict[str, str] = field(default_factory=dict)
    """Environment for subprocesses that talk to this server."""

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            f"{self.api_url}{path}", data=data, method=method, headers={"Content-Type": "application/json"}
        )
        # A loaded server answers 503 while its SQLite database is busy: asked again, as Prefect's own client
        # does, for up to a minute (a bounded wait: the error is raised after it).
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    raw = resp.read()
                return json.loads(raw) if raw else None
            except urllib.error.HTTPError as exc:
                if exc.code not in (429, 503) or time.monotonic() > deadline:
                    raise
                time.sleep(1)

    def flow_runs(self, name: str) -> list[dict[str, Any]]:
        return self.request(
            "POST", "/flow_runs/filter", {"flow_runs": {"name": {"any_": [name]}}, "sort": "START_TIME_DESC"}
        )

    def wait_flow_run(self, flow_run_id: str, timeout: float = 90) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            run = self.request("GET", f"/flow_runs/{flow_run_id}")
            state = (run.get("state") or {}).get("type")
            if state in ("COMPLETED", "FAILED", "CRASHED", "CANCELLED"):
                return run
            if time.monotonic() > deadline:
                raise TimeoutError(f"flow run {flow_run_id} still {state} after {timeout} s")
            time.sleep(0.5)


def client_env(api_url: str, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_API_URL=api_url,
        PREFECT_HOME=str(home),
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_LOGGING_LEVEL="INFO",
        PYTHONUNBUFFERED="1",
    )
    return env


@contextmanager
def prefect_server(base: Path, command: Sequence[str] = (PYTHON, "-m", "prefect")) -> Iterator[PrefectServer]:
    """``COMMAND server start`` on a free loopback port, its home, database and ``server.log`` in ``base``, until
    the block ends (then SIGTERM to its process group). ``env`` of the server is for its clients (home
    ``base/client-home``)."""
    home = base / "server-home"
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(
        PREFECT_HOME=str(home),
        PREFECT_UI_API_URL=f"{url}/api",  # else the UI shows "Can't connect to Server API" off port 4200
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        **IDLE_SERVER_SERVICES,
        PREFECT_SERVER_API_HOST="127.0.0.1",
        PREFECT_SERVER_API_PORT=str(port),
    )
    log = base / "server.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*command, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    server = PrefectServer(url=url, home=home, process=proc, log=log, env=client_env(f"{url}/api", base / "client-home"))
    deadline = time.monotonic() + 120
    try:
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"prefect server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if server.request("GET", "/health") is True:
                    break
            except (urllib.error.URLError, ConnectionError, OSError):
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"prefect server did not answer in 120 s:\n{log.read_text()[-3000:]}")
            time.sleep(0.25)
        yield server
    finally:
        stop_group(proc)


def drain_prefect_workers() -> None:
    """Send this process's queued logs and events while the server is up (else exit stalls retrying)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    EventsWorker.drain_all(timeout=10)
