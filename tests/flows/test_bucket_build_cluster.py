"""``s3://`` inputs to an ``s3://`` data root and catalog, on a real Dask cluster, read back in a fresh process.

The cluster is ``dask scheduler`` and two ``dask worker`` processes
(tests/support/dask.py), reporting to the session's Prefect
server; the bucket is moto's S3 server on loopback, which every process finds
through ``AWS_ENDPOINT_URL``. The build is ``shardflow build`` as docs/OPERATIONS.md
gives it (the workers tokenize into a shared scratch directory and send the
shards to the bucket; the flow's process writes the manifest and the bucket
catalog entry last); the version is then opened with ``StreamingTokenDataset`` from the
bucket's catalog, in a new process with an empty cache, and every sample of
every split equals those of a local build (threads, local data root) of the same inputs.

The flow's process and the workers reach S3 through counting proxies of their
own (``CountingProxy``): the workers, not the flow's process, read the input
objects (each one whole: they hash it), and the flow's process reads their
listing and footers only.
"""

from __future__ import annotations

import json
import subprocess
import textwrap
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml

from support.dask import start_cluster
from support.cli import run_cli
from support.paths import PYTHON
from support.prefect import PrefectServer

pytest.importorskip("prefect_dask", reason="the Dask runner needs the optional extra: pip install 'shardflow[dask]'")
pytest.importorskip("s3fs", reason="object storage needs the optional extra: pip install 'shardflow[s3]'")
pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")

from support.s3 import CountingProxy, S3Server  # noqa: E402

COMMON = ["--name", "s3c", "--shard-tokens", "200000", "--val-fraction", "0.1"]

READ_ALL = textwrap.dedent("""
    import json, sys
    import numpy as np
    from shardflow.runtime import StreamingTokenDataset
    ref, catalog, cache, out = sys.argv[1:5]
    samples = {}
    for split in ("train", "val"):
        ds = StreamingTokenDataset(ref, catalog=catalog or None, split=split, seq_len=256, shuffle=False,
                                   cache_dir=cache or None)
        rows = list(ds)
        samples[split] = {k: np.stack([r[k] for r in rows]).tolist() for k in rows[0]}
    json.dump(samples, open(out, "w"))
""")


def read_all(ref: str, catalog: str, cache: str, out: Path, env: dict[str, str]) -> dict:
    """Every sample of both splits, as a fresh Python process reads them with ``StreamingTokenDataset``."""
    res = subprocess.run([PYTHON, "-c", READ_ALL, ref, catalog, cache, str(out)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow
def test_an_s3_to_s3_build_on_a_dask_cluster_reads_back_in_a_fresh_process_as_a_local_build(
    prefect_server: PrefectServer, corpus: Path, tmp_path: Path
) -> None:
    s3 = S3Server()
    try:
        bucket = f"s3s3-{uuid.uuid4().hex[:8]}"
        fs = s3.fs()
        fs.mkdir(bucket)
        for p in sorted(corpus.glob("*.parquet")):
            fs.put_file(str(p), f"{bucket}/corpus/{p.name}")
        env = {**prefect_server.env, **s3.env, "CI": "true"}
        proxy, worker_proxy = CountingProxy(s3.endpoint), CountingProxy(s3.endpoint)
        cluster = start_cluster(tmp_path / "dask", {**env, "AWS_ENDPOINT_URL": worker_proxy.endpoint}, workers=2)
        try:
            res = run_cli(
                ["build", f"s3://{bucket}/corpus/", *COMMON, "--runner", "dask", "--address", cluster.address,
                 "--workers", "2", "--data-root", f"s3://{bucket}/data", "--catalog", f"s3://{bucket}/catalog",
                 "--scratch", str(tmp_path / "scratch")],
                {**env, "AWS_ENDPOINT_URL": proxy.endpoint}, tmp_path, timeout=300,
            )
            assert res.returncode == 0, f"{res.stderr[-4000:]}\n{cluster.logs()}"
            assert f"Connecting to an existing Dask cluster at {cluster.address}" in res.stderr
            logs = [worker.log.read_text() for worker in cluster.workers]
            assert all("Task run 'tokenize s3c unit" in log for log in logs), cluster.logs()  # both workers tokenized
            # ... and the workers, not the flow's process, sent the files (from the shared scratch).
            assert any("Task run 'push s3c@v1: " in log for log in logs), cluster.logs()
        finally:
            cluster.close()
        inputs = {f"{bucket}/corpus/{p.name}": p.stat().st_size for p in corpus.glob("*.parquet")}
        # The workers read every input object whole (they hash it); the flow's process read the listing and the
        # footers only, never a whole input object.
        for key, size in inputs.items():
            assert worker_proxy.bytes_asked(key, size) >= size, key
        flow_read = sum(proxy.bytes_asked(key, size) for key, size in inputs.items())
        assert flow_read <= len(inputs) * (64 << 10) < sum(inputs.values()), (flow_read, inputs)
        assert not [r for r in proxy.requests if r[0] == "GET" and r[2] is None and "/corpus/" in r[1]
                    and "list-type" not in r[1]], proxy.requests
        proxy.close()
        worker_proxy.close()
        assert res.stdout.splitlines() == [f"published s3c@v1 to s3://{bucket}/data/s3c/v1",
                                           f"s3://{bucket}/data/s3c/v1/metadata.yaml"]
        assert "Traceback" not in res.stderr
        assert fs.exists(f"{bucket}/catalog/s3c.yaml") and fs.exists(f"{bucket}/data/s3c/v1/metadata.yaml")

        local = run_cli(["build", f"s3://{bucket}/corpus/", *COMMON, "--no-prefect", "--data-root", "local/data",
                         "--catalog", "local/cat"], env, tmp_path)
        assert local.returncode == 0, local.stderr[-3000:]
        want = read_all(str(Path(local.stdout.splitlines()[-1]).parent), "", "", tmp_path / "local.json", env)
        cache = tmp_path / "fresh-cache"
        got = read_all("s3c@v1", f"s3://{bucket}/catalog", str(cache), tmp_path / "remote.json", env)
        assert got == want
        assert len(np.asarray(want["train"]["input_ids"])) > 100 and len(want["val"]["input_ids"]) > 0
        assert any(cache.rglob("*.bin"))  # read through the cache, from the bucket

        # One input more, built by the flow (threads) from a fresh scratch: v1 is fetched (a task run), only the
        # new input tokenized, v1's shards linked.
        first = sorted(corpus.glob("*.parquet"))[0]
        fs.put_file(str(first), f"{bucket}/corpus/zz-more.parquet")
        more = run_cli(["build", f"s3://{bucket}/corpus/", *COMMON, "--workers", "2", "--data-root", f"s3://{bucket}/data",
                        "--catalog", f"s3://{bucket}/catalog", "--scratch", str(tmp_path / "fresh-scratch")], env, tmp_path,
                       timeout=300)
        assert more.returncode == 0, more.stderr[-4000:]
        assert more.stdout.splitlines()[0] == f"published s3c@v2 to s3://{bucket}/data/s3c/v2"
        assert "Task run 'fetch the parent of s3c' - Finished in state Completed()" in more.stderr, more.stderr[-3000:]
        assert "fetched s3c@v1 (" in more.stderr
        reuse = yaml.safe_load(fs.cat_file(f"{bucket}/data/s3c/v2/metadata.yaml"))["reuse"]
        assert reuse["parent"] == "s3c@v1" and reuse["tokenized_inputs"] == ["zz-more.parquet"], reuse
    finally:
        s3.stop()
