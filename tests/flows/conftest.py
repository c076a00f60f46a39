"""Fixtures of the operations tests: ONE real Prefect server for the whole session, and small corpora.

``prefect_server`` runs ``prefect server start`` (API and UI) on a free
localhost port, with its own ``PREFECT_HOME`` and SQLite database in a
temporary directory, ``PREFECT_UI_API_URL`` set so the UI can reach its API,
and telemetry off. It is started once per session (8-20 s) and torn down at
the end. Subprocesses (the CLI, ``shardflow serve``, Dask workers) reach it
through ``server.env``; in-process flows through the ``prefect_api`` fixture.
A real server (not Prefect's temporary one) is what the browser test, the
Dask workers and ``serve`` need anyway, so every test here shares it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import time
import urllib.error
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq
import pytest

from core_support import IDLE_SERVER_SERVICES
from dask_cluster_support import DaskCluster, start_cluster
from ops_support import PYTHON, SAMPLE, PrefectServer, client_env, free_port


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """``prefect server start`` on a free localhost port, for the whole session."""
    base = tmp_path_factory.mktemp("prefect-server")
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
            [PYTHON, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
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
        if "prefect" in sys.modules:
            drain_prefect_workers()
        try:
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def prefect_api(prefect_server: PrefectServer, tmp_path: Path) -> Iterator[PrefectServer]:
    """Point this process's Prefect client at the session's server (for flows called in-process)."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    # Prefect keeps one events worker per process whatever the API URL: one left bound to an earlier
    # test's server (tests/test_cli.py's temporary one) would drop this test's task runs.
    drain_prefect_workers()
    with temporary_settings(updates={PREFECT_API_URL: prefect_server.api_url}):
        try:
            yield prefect_server
        finally:
            drain_prefect_workers()


def drain_prefect_workers() -> None:
    """Send this process's queued logs and events while the server is up (else exit stalls retrying)."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    EventsWorker.drain_all(timeout=10)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of 4 Parquet files (the sample corpus, 16-row row groups): 4 work units, ~594k cl100k tokens."""
    out = tmp_path_factory.mktemp("corpus")
    table = pq.read_table(SAMPLE)
    for i in range(4):
        # Different slices per file, so files differ and so do their shards.
        pq.write_table(table.slice(i * 5), out / f"part-{i}.parquet", row_group_size=16)
    return out


@pytest.fixture
def dask_cluster(prefect_server: PrefectServer, tmp_path: Path) -> Iterator[DaskCluster]:
    """A real 2-worker Dask cluster, as docs/OPERATIONS.md runs it: ``dask scheduler`` and two ``dask worker``.

    Separate processes on loopback (tests/flows/dask_cluster_support.py), each
    worker with one thread and its own process group, so a test can kill one;
    the workers report task runs to the session's Prefect server. Their logs
    are printed at teardown, so a failed test shows them.
    """
    cluster = start_cluster(tmp_path / "dask-cluster", prefect_server.env, workers=2)
    try:
        yield cluster
    finally:
        print(cluster.logs())
        cluster.close()
