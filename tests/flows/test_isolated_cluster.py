"""The isolated Dask cluster (tests/support/isolated.py): workers that share no path with the client or each other.

Two ``dask worker`` commands, each in a mount namespace of its own with a fresh tmpfs over the client's temporary
directory, are checked through a distributed ``Client`` the way a test of a multi-machine deployment would rely on
them: a client file is not there for a worker (a task that opens it fails with FileNotFoundError, and the worker
lives on), each worker's home, temporary and scratch directories are its own and invisible to the client and the
other worker, shardflow imports, and the audit preload logs what the worker process opens (the worker process,
not its nanny). The functions sent to the workers are lambdas or local functions: cloudpickle sends those by
value (a module-level function of this file would be sent by reference, and the workers cannot import it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest

from support.isolated import (
    IsolatedDaskCluster, assert_no_path_under, isolation_unavailable, opened_paths, start_isolated_cluster,
)
from support.paths import SRC_DIR

pytest.importorskip("distributed")
pytestmark = pytest.mark.slow

WORKERS = ["w0", "w1"]
DIRS = ("HOME", "TMPDIR", "SHARDFLOW_SCRATCH", "XDG_CACHE_HOME")


@pytest.fixture(scope="module")
def client_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The client's working directory (hidden from the workers), holding ``client.txt``."""
    reason = isolation_unavailable()
    if reason:
        pytest.skip(f"isolated workers need a mount namespace of their own (root): {reason}")
    base = tmp_path_factory.mktemp("client")
    (base / "client.txt").write_text("the client's own file\n")
    return base


@pytest.fixture(scope="module")
def cluster(client_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[IsolatedDaskCluster]:
    """A scheduler and 2 isolated workers; the audit directory is a sibling of the hidden one, so it stays visible."""
    started = start_isolated_cluster(client_dir / "dask", os.environ, hidden=[client_dir], workers=2,
                                     audit=tmp_path_factory.mktemp("audit"))
    try:
        yield started
    finally:
        print(started.logs())
        started.close()


@pytest.fixture(scope="module")
def client(cluster: IsolatedDaskCluster) -> Iterator[Any]:
    with cluster.client() as c:
        yield c


@pytest.fixture(scope="module")
def addresses(cluster: IsolatedDaskCluster) -> dict[str, str]:
    """Each worker's address, by name."""
    return {name: w["address"] for name, w in cluster.wait_for_workers(WORKERS).items()}


def test_client_files_are_not_on_the_workers(client: Any, client_dir: Path, addresses: dict[str, str]) -> None:
    client_txt = client_dir / "client.txt"
    assert client_txt.exists()
    assert client.run(os.path.exists, str(client_txt)) == {a: False for a in addresses.values()}
    # The tmpfs over the client's directory holds the worker's own directory only.
    listed = client.run(os.listdir, str(client_dir))
    assert {name: listed[a] for name, a in addresses.items()} == {name: [f"worker-{name}"] for name in WORKERS}


def test_each_worker_has_its_own_directories(
    client: Any, cluster: IsolatedDaskCluster, addresses: dict[str, str]
) -> None:
    seen = client.run(lambda: ({k: os.environ[k] for k in DIRS}, os.getcwd()))
    for name, address in addresses.items():
        env, cwd = seen[address]
        own = cluster.worker_directory(name)
        assert all(Path(v).is_relative_to(own) for v in [*env.values(), cwd]), (name, env, cwd)
        assert Path(env["SHARDFLOW_SCRATCH"]) == own / "scratch"
    first, second = (seen[addresses[n]][0] for n in WORKERS)
    assert all(first[k] != second[k] for k in DIRS)
    # Not even the directory exists for the client: it was made inside the worker's tmpfs.
    assert not cluster.worker_directory("w0").exists()


def test_a_workers_files_are_its_own(client: Any, cluster: IsolatedDaskCluster, addresses: dict[str, str]) -> None:
    def write() -> str:
        path = Path(os.environ["SHARDFLOW_SCRATCH"]) / "from-worker.txt"
        path.write_text("written on the worker\n")
        return str(path)

    w0, w1 = addresses["w0"], addresses["w1"]
    path = client.run(write, workers=[w0])[w0]
    assert Path(path).is_relative_to(cluster.worker_directory("w0"))
    assert client.run(lambda p: open(p).read(), path, workers=[w0])[w0] == "written on the worker\n"
    assert client.run(os.path.exists, path, workers=[w1]) == {w1: False}
    assert not os.path.exists(path)


def test_a_task_opening_a_client_path_fails_and_the_worker_lives_on(
    client: Any, cluster: IsolatedDaskCluster, client_dir: Path, addresses: dict[str, str]
) -> None:
    pids = client.run(os.getpid)
    path = str(client_dir / "client.txt")
    future = client.submit(lambda: open(path).read(), pure=False)
    with pytest.raises(FileNotFoundError) as raised:
        future.result(timeout=30)
    assert raised.value.filename == path
    # The same worker processes, all registered, still run tasks.
    assert client.submit(lambda: 6 * 7, pure=False).result(timeout=30) == 42
    assert client.run(os.getpid) == pids
    assert sorted(cluster.worker_info()) == WORKERS


def test_shardflow_imports_on_the_workers(client: Any, addresses: dict[str, str]) -> None:
    def where() -> str:
        import shardflow

        return shardflow.__file__

    files = client.run(where)
    assert all(Path(f).is_relative_to(SRC_DIR) for f in files.values()), files


def test_the_audit_log_records_what_the_worker_process_opens(
    client: Any, cluster: IsolatedDaskCluster, client_dir: Path, addresses: dict[str, str]
) -> None:
    def touch_and_read() -> str:
        path = Path(os.environ["HOME"]) / "audited.txt"
        path.write_text("audited\n")
        return open(path).read() and str(path)

    made = client.run(touch_and_read)
    client_txt = str(client_dir / "client.txt")
    with pytest.raises(FileNotFoundError):
        client.submit(lambda: open(client_txt).read(), pure=False).result(timeout=30)
    opened = opened_paths(cluster.audit, events=["open"])
    assert sorted(opened) == WORKERS
    for name, address in addresses.items():
        assert made[address] in opened[name], (name, sorted(opened[name]))
        others = [cluster.worker_directory(n) for n in WORKERS if n != name]
        assert_no_path_under({name: opened[name]}, others)
    # The hook is in the worker processes (the nanny's children), not in the nannies: one log per worker
    # process, named by its pid.
    running = client.run(os.getpid)
    pids = {name: running[address] for name, address in addresses.items()}
    logs = {p.name for p in cluster.audit.glob("audit-*.log")}
    assert {f"audit-{name}-{pid}.log" for name, pid in pids.items()} <= logs
    nannies = {w.process.pid for w in cluster.workers}
    assert not any(f"-{pid}.log" in log for pid in nannies for log in logs)
    # A failed attempt is logged too (the audit event precedes the open): the task above tried client.txt.
    with pytest.raises(AssertionError, match="client.txt"):
        assert_no_path_under(opened_paths(cluster.audit), [client_dir])
