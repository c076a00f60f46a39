"""Scale-out: ``shardflow build --runner dask --address tcp://...`` on a 2-worker ``distributed.LocalCluster``
writes exactly the bytes of the local (threads) runner, with the work units run by the cluster."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.builds import version_files
from support.cli import run_cli
from support.prefect import PrefectServer
from shardflow.manifest import read_manifest

pytest.importorskip("prefect_dask", reason="the Dask runner needs the optional extra: pip install 'shardflow[dask]'")
distributed = pytest.importorskip("distributed")


@pytest.mark.slow
def test_dask_runner_output_is_byte_identical_to_the_local_runner(
    prefect_server: PrefectServer, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The workers (spawned processes) get the server's environment; the tasks they run report to it.
    for key, value in prefect_server.env.items():
        if key.startswith("PREFECT_"):
            monkeypatch.setenv(key, value)
    env = {**prefect_server.env, "CI": "true"}
    common = ["build", str(corpus), "--name", "scale", "--shard-tokens", "200000", "--val-fraction", "0.1"]

    with distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
    ) as cluster:
        res = run_cli(
            [*common, "--runner", "dask", "--address", cluster.scheduler_address, "--workers", "4",
             "--data-root", "dask/data", "--catalog", "dask/cat"],
            env, tmp_path,
        )
        assert res.returncode == 0, res.stderr[-3000:]
        assert f"Connecting to an existing Dask cluster at {cluster.scheduler_address}" in res.stderr
        # The cluster ran the work: 4 tokenize tasks, a write and a validation per shard, over both workers.
        with distributed.Client(cluster) as client:
            per_worker = client.run(
                lambda dask_worker: sum(1 for entry in dask_worker.state.log if entry[2] == "memory")
            )
        # The same driver on the same cluster without Prefect (pipeline/dask_executor.py).
        bare = run_cli(
            [*common, "--no-prefect", "--runner", "dask", "--address", cluster.scheduler_address,
             "--data-root", "bare/data", "--catalog", "bare/cat"],
            env, tmp_path,
        )
        assert bare.returncode == 0, bare.stderr[-3000:]
        with distributed.Client(cluster) as client:
            # Its jobs (``_run_job`` tasks; the plan it scattered to each worker is not one).
            after = client.run(lambda dask_worker: sum(1 for entry in dask_worker.state.log if entry[2] == "memory"
                                                       and str(entry[0]).startswith("_run_job")))
    assert res.stdout.splitlines()[0] == "published scale@v1"
    dask_dir = Path(res.stdout.strip().splitlines()[-1]).parent
    # 5 shards: each unit's train documents (90k to 140k tokens, under the 200k bound) are one shard of its own,
    # and the gathered val split (about 40k) is one.
    splits = read_manifest(dask_dir).splits
    assert [len(splits[s].shards) for s in ("train", "val")] == [4, 1]
    assert sum(per_worker.values()) == 4 + 5, per_worker
    assert len(per_worker) == 2 and all(n > 0 for n in per_worker.values()), per_worker
    assert sum(after.values()) == 4 + 5, after  # the bare run's jobs ran there too

    res = run_cli([*common, "--data-root", "local/data", "--catalog", "local/cat"], env, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    local_dir = Path(res.stdout.strip().splitlines()[-1]).parent
    assert dask_dir != local_dir
    dask_files, local_files = version_files(dask_dir), version_files(local_dir)
    assert sorted(dask_files) == sorted(local_files) and len(local_files) >= 8  # shards + .bos.idx
    assert dask_files == local_files
    assert version_files(Path(bare.stdout.strip().splitlines()[-1]).parent) == local_files


@pytest.mark.slow
def test_dask_runner_refuses_the_temporary_server_and_a_missing_address(tmp_path: Path, corpus: Path) -> None:
    import os

    from support.prefect import client_env

    env = client_env("", tmp_path / "home")
    env.pop("PREFECT_API_URL")
    base = ["build", str(corpus), "--name", "x", "--data-root", "d", "--catalog", "c", "--runner", "dask"]
    res = run_cli(base, env, tmp_path)
    assert res.returncode == 2 and "--runner dask needs --address" in res.stderr
    res = run_cli([*base, "--address", "tcp://127.0.0.1:9"], env, tmp_path)
    assert res.returncode == 2
    assert "needs a Prefect server that the Dask workers can reach" in res.stderr and "PREFECT_API_URL" in res.stderr
    assert "Traceback" not in res.stderr
    assert not os.path.exists(tmp_path / "d")
