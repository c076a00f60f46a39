"""An ``s3://`` build on the Dask runner (a local 2-process cluster), read in place by the workers.

The corpus lives on a loopback S3 server (moto); the flow's process plans from
the listing, and the cluster's worker processes, which find the endpoint
through ``AWS_ENDPOINT_URL`` like any S3 client, read and hash the objects.
The version is byte-identical to a threads-runner build of a local copy.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from ops_support import PrefectServer, run_cli, version_files

pytest.importorskip("prefect_dask", reason="the Dask runner needs the optional extra: pip install 'shardflow[dask]'")
pytest.importorskip("s3fs", reason="object storage needs the optional extra: pip install 'shardflow[s3]'")
pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")
distributed = pytest.importorskip("distributed")

from s3_support import CountingProxy, S3Server, environment  # noqa: E402


@pytest.mark.slow
def test_an_s3_build_on_the_dask_runner_equals_a_local_build(
    prefect_server: PrefectServer, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    s3 = S3Server()
    try:
        bucket = f"dask-{uuid.uuid4().hex[:8]}"
        fs = s3.fs()
        fs.mkdir(bucket)
        for p in sorted(corpus.glob("*.parquet")):
            fs.put_file(str(p), f"{bucket}/corpus/{p.name}")
        for key, value in prefect_server.env.items():
            if key.startswith("PREFECT_"):
                monkeypatch.setenv(key, value)
        # The flow's process (the CLI) and the workers reach S3 through counting proxies of their own.
        proxy = CountingProxy(s3.endpoint)
        worker_proxy = CountingProxy(s3.endpoint)
        env = {**prefect_server.env, **s3.env, "AWS_ENDPOINT_URL": proxy.endpoint, "CI": "true"}
        corpus_bytes = sum(p.stat().st_size for p in corpus.glob("*.parquet"))
        common = ["--name", "s3scale", "--shard-tokens", "200000", "--val-fraction", "0.1"]
        # The worker processes are spawned with this process's environment: the S3 endpoint and keys included.
        with environment({**s3.env, "AWS_ENDPOINT_URL": worker_proxy.endpoint}), distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
        ) as cluster:
            res = run_cli(
                ["build", f"s3://{bucket}/corpus/", *common, "--runner", "dask", "--address", cluster.scheduler_address,
                 "--workers", "4", "--data-root", "dask/data", "--catalog", "dask/cat"],
                env, tmp_path,
            )
            assert res.returncode == 0, res.stderr[-3000:]
            with distributed.Client(cluster) as client:
                per_worker = client.run(
                    lambda dask_worker: sum(1 for entry in dask_worker.state.log if entry[2] == "memory")
                )
        assert sum(per_worker.values()) >= 4 + 4 and all(n > 0 for n in per_worker.values()), per_worker
        # The workers, not the flow's process, read the objects: each one whole (they hash it).
        for p in corpus.glob("*.parquet"):
            assert worker_proxy.bytes_asked(f"{bucket}/corpus/{p.name}", p.stat().st_size) >= p.stat().st_size, p.name
        worker_proxy.close()
        # The flow's machine read metadata only: the listing and the footers, not the objects.
        flow_read = sum(proxy.bytes_asked(f"{bucket}/corpus/{p.name}", p.stat().st_size) for p in corpus.glob("*.parquet"))
        assert flow_read <= 4 * (64 << 10) < corpus_bytes, (flow_read, corpus_bytes)
        assert not [r for r in proxy.requests if r[0] == "GET" and r[2] is None and "list-type" not in r[1]], proxy.requests
        proxy.close()
        dask_dir = Path(res.stdout.strip().splitlines()[-1]).parent
        assert not [p for p in (tmp_path / "dask" / "data").rglob("*.parquet")], "an input was copied"

        res = run_cli(["build", str(corpus), *common, "--data-root", "local/data", "--catalog", "local/cat"], env, tmp_path)
        assert res.returncode == 0, res.stderr[-3000:]
        local_dir = Path(res.stdout.strip().splitlines()[-1]).parent
        assert version_files(dask_dir) == version_files(local_dir) and len(version_files(local_dir)) >= 8
    finally:
        s3.stop()
