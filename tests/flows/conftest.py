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

import sys
from pathlib import Path
from typing import Iterator

import pyarrow.parquet as pq
import pytest

from support.dask import DaskCluster, start_cluster
from support.paths import SAMPLE
from support.prefect import PrefectServer, drain_prefect_workers, prefect_server as started_server


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrefectServer]:
    """``prefect server start`` on a free localhost port, for the whole session."""
    with started_server(tmp_path_factory.mktemp("prefect-server")) as server:
        try:
            yield server
        finally:
            if "prefect" in sys.modules:
                drain_prefect_workers()


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

    Separate processes on loopback (tests/support/dask.py), each
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
