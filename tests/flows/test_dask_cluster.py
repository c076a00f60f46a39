"""``shardflow build --runner dask`` on a real cluster (``dask scheduler``, ``dask worker`` processes); lost workers.

The cluster is the one docs/OPERATIONS.md tells users to run (the
``dask_cluster`` fixture: tests/support/dask.py). A worker killed with SIGKILL while
it tokenizes a work unit costs nothing but time: Dask runs the job again on a
worker still there (or on the one its nanny starts in its place), the job
rewrites its unit's pieces from scratch (``tokenize_unit`` removes what an
interrupted run left), and the build publishes exactly the bytes of a local build. (A build on such a
cluster with nothing killed: tests/flows/test_bucket_build_cluster.py.) Prefect records
the rerun in the same task run: Pending, Running (the lost worker), Pending,
Running (the other one), Completed.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import pytest

from support.dask import DaskCluster, start_cluster
from support.builds import version_files
from support.cli import run_cli
from support.paths import PYTHON, REPO, SHARDFLOW
from support.prefect import PrefectServer

pytest.importorskip("prefect_dask", reason="the Dask runner needs the optional extra: pip install 'shardflow[dask]'")
pytest.importorskip("distributed")

MAKE_CORPUS = REPO.parent / "shared" / "tools" / "make_corpus.py"
NAME = "cluster"
# 4 work units of 8 MB (2M tokens). The tiktoken backend, several times slower than the default one here, takes a
# second or two a unit on a worker: long enough to catch both workers in the middle of one and kill one of them.
OPTIONS = ["--name", NAME, "--unit-mb", "8", "--backend", "tiktoken", "--shard-tokens", "1000000",
           "--val-fraction", "0.1"]
UNITS = 4


@pytest.fixture(scope="module")
def units_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """32 MB of real text in 2 Parquet files with 64-row row groups: 4 work units at ``--unit-mb 8``."""
    if not MAKE_CORPUS.exists():
        pytest.skip(f"needs the shared corpus tool {MAKE_CORPUS}")
    out = tmp_path_factory.mktemp("units-corpus")
    subprocess.run([PYTHON, str(MAKE_CORPUS), str(out), "--mb", "32", "--files", "2", "--rows-per-group", "64"],
                   check=True, capture_output=True)
    return out


@pytest.fixture(scope="module")
def local_bytes(units_corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """The data files of a local build (threads in one process, no Prefect) of ``units_corpus``."""
    cwd = tmp_path_factory.mktemp("local-build")
    res = run_cli(["build", str(units_corpus), *OPTIONS, "--no-prefect", "--data-root", "data", "--catalog", "cat"],
                  {**os.environ, "CI": "true"}, cwd)
    assert res.returncode == 0, res.stderr[-3000:]
    files = version_files(Path(res.stdout.strip().splitlines()[-1]).parent)
    assert len(files) >= 2 * 9  # 8 train + 1 val shards and their .bos.idx
    return files


def start_build(
    corpus: Path, cluster: DaskCluster, env: dict[str, str], cwd: Path, *extra: str
) -> subprocess.Popen[str]:
    """``shardflow build CORPUS --runner dask --address tcp://...``, as the docs show it, in the background."""
    return subprocess.Popen(
        [*SHARDFLOW, "build", str(corpus), *OPTIONS, *extra, "--runner", "dask", "--address", cluster.address,
         "--workers", "2", "--data-root", str(cwd / "data"), "--catalog", str(cwd / "cat")],
        env={**env, "CI": "true"}, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )


def finish(build: subprocess.Popen[str], cluster: DaskCluster, timeout: float = 150) -> tuple[str, str]:
    """Wait for the build; a hang fails the test (with the cluster's logs), never leaves the build running."""
    try:
        out, err = build.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(build.pid, signal.SIGKILL)
        out, err = build.communicate()
        pytest.fail(f"the build hung for {timeout} s:\n{err[-3000:]}\n{cluster.logs()}")
    assert build.returncode == 0, f"{err[-4000:]}\n{cluster.logs()}"
    assert out.splitlines()[0] == f"published {NAME}@v1", out
    assert "Traceback" not in err
    return out, err


def units_in_progress(data_root: Path) -> list[Path]:
    """Work units half-written: ``parts/unit-N/`` holds pieces, its marker ``parts/unit-N.json`` is not there yet."""
    return [d for d in data_root.glob(f"{NAME}/.staging/*/parts/unit-*")
            if d.is_dir() and not d.with_name(d.name + ".json").exists()]


def kill_mid_unit(
    cluster: DaskCluster, build: subprocess.Popen[str], data_root: Path, kill: Callable[[str], Any],
    also: Callable[[], bool] = lambda: True,
) -> tuple[str, datetime]:
    """Once both workers are in the middle of a work unit (and ``also()`` holds), ``kill`` one by its address.

    At once: a unit takes one or two seconds, and one that ended just before
    the kill would be rerun from its record, not from scratch.
    The worker's address, and when it was killed.
    """
    with cluster.client() as client:
        def both_busy() -> tuple[str, datetime] | None:
            if build.poll() is not None:
                pytest.fail(f"the build ended before both workers tokenized:\n{build.communicate()[1][-3000:]}")
            if len(units_in_progress(data_root)) < 2:
                return None
            busy = sorted(addr for addr, keys in client.processing().items() if keys)
            # The slow check last but one; the units checked again just before the kill.
            if len(busy) == 2 and also() and len(units_in_progress(data_root)) == 2:
                killed_at = datetime.now(timezone.utc)
                kill(busy[0])
                return busy[0], killed_at
            return None

        try:
            return cluster.wait(both_busy, 90, "two work units tokenizing at once", interval=0.05)
        except BaseException:
            os.killpg(build.pid, signal.SIGKILL)
            build.communicate()
            raise


def two_tokenize_runs_running(since: datetime) -> Callable[[], bool]:
    """Whether the server has (at least) two tokenize task runs Running in the build started after ``since``.

    Needs the ``prefect_api`` fixture.

    The workers send their task runs' states as events, in the background: a
    worker killed before its events are out leaves no trace of its attempt.
    """
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter, FlowRunFilterName, FlowRunFilterStartTime, TaskRunFilter, TaskRunFilterName, TaskRunFilterState,
        TaskRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType

    build = FlowRunFilter(name=FlowRunFilterName(any_=[f"build {NAME}"]),
                          start_time=FlowRunFilterStartTime(after_=since))
    running = TaskRunFilter(name=TaskRunFilterName(like_="tokenize"),
                            state=TaskRunFilterState(type=TaskRunFilterStateType(any_=[StateType.RUNNING])))

    def check() -> bool:
        with get_client(sync_client=True) as client:
            return len(client.read_task_runs(flow_run_filter=build, task_run_filter=running)) >= 2

    return check


@pytest.mark.slow
def test_a_worker_lost_mid_unit_costs_a_rerun_not_the_build(
    dask_cluster: DaskCluster, prefect_api: PrefectServer, units_corpus: Path, local_bytes: dict[str, bytes],
    tmp_path: Path,
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter, FlowRunFilterId, FlowRunFilterName, FlowRunFilterStartTime, TaskRunFilter, TaskRunFilterName,
    )
    from prefect.client.schemas.objects import StateType

    groups = dask_cluster.worker_groups()
    began = datetime.now(timezone.utc)
    build = start_build(units_corpus, dask_cluster, prefect_api.env, tmp_path)
    # The whole worker, nanny included, as a lost machine: no replacement comes.
    victim, killed_at = kill_mid_unit(dask_cluster, build, tmp_path / "data", lambda addr: groups[addr].kill(),
                                      two_tokenize_runs_running(began))
    name = groups[victim].name
    out, _ = finish(build, dask_cluster)
    assert list(dask_cluster.worker_info()) == [n for n in ("w0", "w1") if n != name]  # it did not come back
    assert version_files(Path(out.strip().splitlines()[-1]).parent) == local_bytes

    with get_client(sync_client=True) as client:
        (flow_run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            name=FlowRunFilterName(any_=[f"build {NAME}"]), start_time=FlowRunFilterStartTime(after_=began)))
        assert flow_run.state is not None and flow_run.state.is_completed()
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])),
                                     task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="tokenize")))
        history = {run.name: sorted(client.read_task_run_states(run.id), key=lambda s: s.timestamp) for run in runs}
    # One task run per unit, whatever ran it twice: Dask runs the lost job again under the same task run id.
    assert len(runs) == UNITS and all(run.state is not None and run.state.is_completed() for run in runs)
    kinds = {name: [s.type for s in states] for name, states in history.items()}
    rerun = [name for name, states in kinds.items() if states.count(StateType.RUNNING) == 2]
    assert len(rerun) == 1, kinds  # the unit the killed worker was tokenizing, and only it
    assert kinds[rerun[0]] == [StateType.PENDING, StateType.RUNNING, StateType.PENDING, StateType.RUNNING,
                               StateType.COMPLETED]
    first, second = (s.timestamp for s in history[rerun[0]] if s.type == StateType.RUNNING)
    assert first < killed_at < second  # started on the lost worker, started again after it was gone
    others = [states for name, states in kinds.items() if name not in rerun]
    assert all(states == [StateType.PENDING, StateType.RUNNING, StateType.COMPLETED] for states in others), kinds


@pytest.mark.slow
def test_a_worker_process_killed_mid_unit_without_prefect(
    dask_cluster: DaskCluster, units_corpus: Path, local_bytes: dict[str, bytes], tmp_path: Path
) -> None:
    # pipeline/dask_executor.py: the driver's jobs submitted to the cluster directly. This time only the worker process
    # dies (the kernel's OOM killer would do that): its nanny starts a new one, under the same name.
    groups, pids = dask_cluster.worker_groups(), dask_cluster.worker_pids()
    build = start_build(units_corpus, dask_cluster, dict(os.environ), tmp_path, "--no-prefect")
    victim, _ = kill_mid_unit(dask_cluster, build, tmp_path / "data", lambda addr: os.kill(pids[addr], signal.SIGKILL))
    name, pid = groups[victim].name, pids[victim]
    out, _ = finish(build, dask_cluster)
    assert version_files(Path(out.strip().splitlines()[-1]).parent) == local_bytes
    log = next(w for w in dask_cluster.workers if w.name == name).log.read_text()
    assert f"Worker process {pid} was killed by signal 9" in log and "Restarting worker" in log, dask_cluster.logs()
    replaced = dask_cluster.wait_for_workers(["w0", "w1"], timeout=30)
    assert replaced[name]["address"] != victim  # a new worker process, back under its name


@pytest.mark.slow
def test_a_job_that_kills_every_worker_it_runs_on_stops_the_build_with_one_clear_line(
    prefect_api: PrefectServer, units_corpus: Path, local_bytes: dict[str, bytes], tmp_path: Path
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter, FlowRunFilterId, FlowRunFilterName, FlowRunFilterStartTime, TaskRunFilter, TaskRunFilterName,
    )
    from prefect.client.schemas.objects import StateType

    # Dask gives a job up after allowed-failures + 1 of its workers died running it (3 + 1 by default): with 0,
    # one kill is the job that runs the machine out of memory every time.
    cluster = start_cluster(tmp_path / "dask-cluster", {**prefect_api.env,
                                                        "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "0"})
    try:
        def kill_a_worker_mid_unit(build: subprocess.Popen[str], data_root: Path, also: Callable[[], bool]) -> str:
            pids = cluster.worker_pids()
            kill_mid_unit(cluster, build, data_root, lambda addr: os.kill(pids[addr], signal.SIGKILL), also)
            try:
                _, err = build.communicate(timeout=120)
            except subprocess.TimeoutExpired:
                os.killpg(build.pid, signal.SIGKILL)
                build.communicate()
                raise
            assert build.returncode == 2, f"{err[-3000:]}\n{cluster.logs()}"
            assert "Traceback" not in err, err[-3000:]
            errors = [line for line in err.splitlines() if line.startswith("shardflow: error:")]
            assert len(errors) == 1, err[-3000:]
            assert re.fullmatch(rf"shardflow: error: tokenize {NAME} unit \d/{UNITS} part-0000\d\.parquet\[\d+:\d+\]: "
                                r"every Dask worker that ran this job died while running it, .*--unit-mb.*"
                                r"run the same build again to go on", errors[0]), errors[0]
            assert not (data_root / NAME / "v1").exists()
            return errors[0]

        bare = tmp_path / "bare"
        bare.mkdir()
        kill_a_worker_mid_unit(start_build(units_corpus, cluster, dict(os.environ), bare, "--no-prefect"),
                               bare / "data", lambda: True)
        # As the message says: the same build again goes on from the units done, and publishes the same bytes.
        cluster.wait_for_workers(["w0", "w1"])  # the nanny's new worker process
        again = start_build(units_corpus, cluster, dict(os.environ), bare, "--no-prefect")
        out, _ = finish(again, cluster)
        assert version_files(Path(out.strip().splitlines()[-1]).parent) == local_bytes

        began = datetime.now(timezone.utc)
        flow = tmp_path / "flow"
        flow.mkdir()
        cluster.wait_for_workers(["w0", "w1"])
        line = kill_a_worker_mid_unit(start_build(units_corpus, cluster, prefect_api.env, flow), flow / "data",
                                      two_tokenize_runs_running(began))

        def tokenize_runs() -> list[Any]:
            with get_client(sync_client=True) as client:
                (flow_run,) = client.read_flow_runs(flow_run_filter=FlowRunFilter(
                    name=FlowRunFilterName(any_=[f"build {NAME}"]), start_time=FlowRunFilterStartTime(after_=began)))
                assert flow_run.state is not None and flow_run.state.type == StateType.FAILED
                return client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])),
                                             task_run_filter=TaskRunFilter(name=TaskRunFilterName(like_="tokenize")))

        # The unit the other worker was tokenizing ends as it would have (the flow does not wait for it); the job
        # given up on is marked crashed, not left running forever: no worker is left to end its task run.
        def all_final() -> list[Any] | None:
            runs = tokenize_runs()
            return runs if all(run.state is not None and run.state.is_final() for run in runs) else None

        runs = cluster.wait(all_final, 60, "every tokenize task run in a final state", interval=0.5)
    finally:
        print(cluster.logs())
        cluster.close()
    crashed = [run for run in runs if run.state is not None and run.state.type == StateType.CRASHED]
    assert len(crashed) == 1 and f"shardflow: error: {crashed[0].name}: " in line, [(r.name, r.state) for r in runs]
    assert crashed[0].state is not None
    assert "every Dask worker that ran this job died" in (crashed[0].state.message or "")
    assert all(run.state is not None and run.state.is_completed() for run in runs if run not in crashed)
