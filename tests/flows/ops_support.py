"""Helpers of the operations tests (tests/flows): the Prefect server handle, running the CLI, comparing versions."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent
SAMPLE = TESTS / "assets" / "sample.parquet"
PYTHON = sys.executable
SHARDFLOW = [PYTHON, "-m", "shardflow.flows.cli"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        with urllib.request.urlopen(req, timeout=30) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else None

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


def run_cli(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``shardflow ARGS`` in a subprocess; stdout and stderr captured as text."""
    return subprocess.run(
        [*SHARDFLOW, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )


def version_files(directory: Path) -> dict[str, bytes]:
    """The bytes of a version's data files (shards and indexes), not its manifest (which has timestamps)."""
    # card/ (the dataset card) is a view of stats.json, which is compared.
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(Path(directory).rglob("*"))
            if p.is_file() and p.name != "metadata.yaml" and p.relative_to(directory).parts[0] != "card"}
