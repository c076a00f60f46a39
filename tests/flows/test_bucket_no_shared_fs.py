"""A build to a bucket on Dask workers that share no path with the client, nor with each other (issue 42).

The cluster is a real ``dask scheduler`` and two ``dask worker`` commands, each in a mount namespace of its own
with a tmpfs over the client's whole temporary directory (its corpus copy, its scratch, its local data root) and
its own HOME, TMPDIR, scratch and ``--local-directory`` inside that tmpfs (tests/support/isolated.py); an audit
hook in each worker process logs every path it opens. The bucket is moto on loopback, which the workers reach
through a counting proxy of their own, so the test sees what they read and send. The client runs the commands
as docs/OPERATIONS.md gives them: ``shardflow build s3://... --no-prefect --runner dask --address ...``.

The tests run in order on one cluster: an ``s3://`` build against a local build of the same inputs (bytes,
manifest, ``dataset_path``, no client path opened on a worker, each shard sent once, ``open_shards`` from a fresh
process); a local ``--data-root`` the workers can't see (one line, quickly, workers alive); the Prefect flow, whose
task runs still need a scratch every worker sees (one line naming it); two builds of the same inputs at once (one
version, the units tokenized about once); a worker killed with SIGKILL mid-build (the same bytes); and, last, every
worker lost (the build stops in one line) and a new one (a rerun from a fresh scratch skips the committed units).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from support.cli import cli_env
from support.isolated import IsolatedDaskCluster, assert_no_path_under, isolation_unavailable, opened_paths, start_isolated_cluster
from support.paths import PYTHON, SHARDFLOW
from support.prefect import PrefectServer

pytest.importorskip("distributed")
pytest.importorskip("s3fs", reason="object storage needs the optional extra: pip install 'shardflow[s3]'")
pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")

from support.s3 import CountingProxy, S3Server  # noqa: E402

pytestmark = pytest.mark.slow

SMALL_SHARDS = ("--shard-tokens", "20000")
OPTIONS = ["--shard-tokens", "200000", "--val-fraction", "0.1", "--no-prefect", "--progress", "none"]


class Setup:
    """The bucket, its proxies, the isolated cluster and the client's directory, shared by the module's tests."""

    def __init__(self, base: Path, cluster: IsolatedDaskCluster, s3: S3Server, bucket: str, proxy: CountingProxy,
                 env: dict[str, str]) -> None:
        self.base, self.cluster, self.s3, self.bucket, self.proxy, self.env = base, cluster, s3, bucket, proxy, env

    def build(self, name: str, *extra: str, scratch: str = "scratch", timeout: float = 300,
              runner: bool = True, source: str = "corpus") -> subprocess.CompletedProcess[str]:
        cmd = [*SHARDFLOW, "build", f"s3://{self.bucket}/{source}/", "--name", name, *OPTIONS, *extra]
        if runner:
            cmd += ["--runner", "dask", "--address", self.cluster.address]
        if "--data-root" not in extra:
            cmd += ["--data-root", f"s3://{self.bucket}/data", "--catalog", f"s3://{self.bucket}/catalog",
                    "--scratch", str(self.base / scratch)]
        return subprocess.run(cmd, env=self.env, cwd=self.base, capture_output=True, text=True, timeout=timeout)

    def objects(self, prefix: str) -> dict[str, bytes]:
        fs = self.s3.fs()
        root = f"{self.bucket}/{prefix}/"
        return {p[len(root):]: fs.cat_file(p) for p in fs.find(root)}

    def sent(self, prefix: str) -> dict[str, int]:
        """How many times the workers sent each object under ``prefix`` (PUTs; a multipart upload counts once)."""
        counts: dict[str, int] = {}
        for method, path, _ in list(self.proxy.requests):
            key = path.split("?")[0].lstrip("/")
            if method == "PUT" and key.startswith(f"{self.bucket}/{prefix}/") and "partNumber=" not in path:
                counts[key[len(self.bucket) + len(prefix) + 2:]] = counts.get(key[len(self.bucket) + len(prefix) + 2:], 0) + 1
            if method == "POST" and "uploadId=" in path and key.startswith(f"{self.bucket}/{prefix}/"):
                rel = key[len(self.bucket) + len(prefix) + 2:]
                counts[rel] = counts.get(rel, 0) + 1  # a multipart upload completed
        return counts


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> Iterator[Setup]:
    reason = isolation_unavailable()
    if reason:
        pytest.skip(f"isolated workers need a mount namespace of their own (root): {reason}")
    base = tmp_path_factory.mktemp("client")
    s3 = S3Server()
    bucket = f"nofs-{uuid.uuid4().hex[:8]}"
    fs = s3.fs()
    fs.mkdir(bucket)
    for p in sorted(corpus.glob("*.parquet")):
        fs.put_file(str(p), f"{bucket}/corpus/{p.name}")
    proxy = CountingProxy(s3.endpoint)
    env = cli_env({**s3.env, "CI": "true"})
    cluster = start_isolated_cluster(base / "dask", {**env, "AWS_ENDPOINT_URL": proxy.endpoint}, hidden=[base],
                                     workers=2, audit=tmp_path_factory.mktemp("audit"))
    try:
        yield Setup(base, cluster, s3, bucket, proxy, env)
    finally:
        cluster.close()
        proxy.close()
        s3.stop()


def outside_own(setup: Setup) -> dict[str, set[str]]:
    """What each worker opened, but in its own directory (made inside its tmpfs, over the client's directory: a
    path there is the worker's own disk; the client's files and the other worker's are under the same name)."""
    return {worker: {p for p in paths if not Path(p).is_relative_to(setup.cluster.worker_directory(worker))}
            for worker, paths in opened_paths(setup.cluster.audit).items()}


OPEN = textwrap.dedent("""
    import json, sys
    import numpy as np
    from shardflow.runtime import open_shards
    shards = open_shards(sys.argv[1], catalog=sys.argv[2])
    print(json.dumps({"vocab": shards.vocab_size, "shards": shards.num_shards,
                      "first": np.asarray(shards.read(0, 16)).tolist()}))
""")


def test_an_s3_build_on_workers_sharing_no_path_equals_a_local_build(setup: Setup) -> None:
    started = time.monotonic()
    res = setup.build("nf")
    wall = time.monotonic() - started
    assert res.returncode == 0, f"{res.stderr[-4000:]}\n{setup.cluster.logs()}"
    assert res.stdout.splitlines()[0] == f"published nf@v1 to s3://{setup.bucket}/data/nf/v1", res.stdout
    assert "Traceback" not in res.stderr

    local = setup.build("nf", "--data-root", str(setup.base / "local/data"), "--catalog", str(setup.base / "local/cat"),
                        runner=False)
    assert local.returncode == 0, local.stderr[-3000:]
    directory = setup.base / "local/data/nf/v1"
    ours = setup.objects("data/nf/v1")
    theirs = yaml.safe_load((directory / "metadata.yaml").read_text())
    manifest = yaml.safe_load(ours["metadata.yaml"])
    assert manifest["dataset_path"] == f"s3://{setup.bucket}/data/nf/v1"
    assert {k: v for k, v in manifest.items() if k not in ("dataset_path", "created_at")} == {
        k: v for k, v in theirs.items() if k not in ("dataset_path", "created_at")}
    named = [s["file"] for split in theirs["splits"].values() for s in split["shards"]]
    named += [f["file"] for split in theirs["splits"].values() for s in split["shards"] for f in [s["index"], *s.get("sidecars", [])]]
    named += [p.relative_to(directory).as_posix() for p in directory.glob("stats.*")]
    assert len(named) > 6
    for file in named:
        assert ours[file] == (directory / file).read_bytes(), file
    assert not [k for k in setup.objects("data/nf") if "/.staging/" in f"/{k}" or k.startswith(".leases/")]

    # Each shard object went up once, from the workers; no worker opened a path of the client's.
    shards = [f for f in named if not f.startswith("stats.")]
    sent = setup.sent("data/nf/v1")
    assert all(sent.get(f) == 1 for f in shards), {f: sent.get(f) for f in shards}
    assert_no_path_under(outside_own(setup), [setup.base])
    print(f"s3 build on 2 isolated workers: {wall:.1f} s wall; sent {sum(len(ours[f]) for f in shards)} bytes "
          f"of shards, local version {sum((directory / f).stat().st_size for f in shards)} bytes")

    # A fresh process with an empty cache opens the bucket's version.
    fresh = subprocess.run([PYTHON, "-c", OPEN, "nf@v1", f"s3://{setup.bucket}/catalog"], capture_output=True,
                           text=True, timeout=120, env={**setup.env, "SHARDFLOW_CACHE": str(setup.base / "fresh-cache")})
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    got = json.loads(fresh.stdout)
    assert got["shards"] == len(theirs["splits"]["train"]["shards"]) and got["vocab"] > 100_000


def test_a_local_data_root_the_workers_cannot_see_is_refused_in_one_line(setup: Setup) -> None:
    started = time.monotonic()
    res = setup.build("nl", "--data-root", str(setup.base / "only-here/data"), "--catalog",
                      str(setup.base / "only-here/cat"), timeout=120)
    took = time.monotonic() - started
    assert res.returncode != 0
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot see this path" in lines[0] and str(setup.base / "only-here/data") in lines[0], res.stderr
    assert took < 30, took
    assert all(w.alive() for w in setup.cluster.workers)
    assert len(setup.cluster.worker_info()) == 2


def test_the_prefect_flow_on_workers_that_cannot_see_its_scratch_says_so_in_one_line(
    setup: Setup, prefect_server: PrefectServer
) -> None:
    started = time.monotonic()
    cmd = [*SHARDFLOW, "build", f"s3://{setup.bucket}/corpus/", "--name", "np", "--progress", "none",
           "--runner", "dask", "--address", setup.cluster.address, "--data-root", f"s3://{setup.bucket}/data",
           "--catalog", f"s3://{setup.bucket}/catalog", "--scratch", str(setup.base / "flow-scratch")]
    res = subprocess.run(cmd, env={**setup.env, **prefect_server.env}, cwd=setup.base, capture_output=True, text=True,
                         timeout=300)
    assert res.returncode != 0
    assert "cannot see this path" in res.stderr and str(setup.base / "flow-scratch") in res.stderr, res.stderr[-3000:]
    assert "--no-prefect --runner dask" in res.stderr and "Traceback" not in res.stderr
    assert time.monotonic() - started < 120


def test_an_incremental_build_on_workers_sharing_no_path_equals_a_local_one(setup: Setup, corpus: Path) -> None:
    fs = setup.s3.fs()
    files = sorted(corpus.glob("*.parquet"))
    for p in files[:3]:
        fs.put_file(str(p), f"{setup.bucket}/more/{p.name}")
    local = ["--data-root", str(setup.base / "local-inc/data"), "--catalog", str(setup.base / "local-inc/cat")]
    for _ in range(2):  # v1 of three inputs, then v2 with the fourth: its parent's shards copied, val gathered here
        res = setup.build("ni", source="more")
        assert res.returncode == 0, f"{res.stderr[-4000:]}\n{setup.cluster.logs()}"
        here = setup.build("ni", *local, source="more", runner=False)
        assert here.returncode == 0, here.stderr[-3000:]
        fs.put_file(str(files[3]), f"{setup.bucket}/more/{files[3].name}")
    assert res.stdout.splitlines()[0] == f"published ni@v2 to s3://{setup.bucket}/data/ni/v2", res.stdout
    directory = setup.base / "local-inc/data/ni/v2"
    manifest = yaml.safe_load(setup.objects("data/ni/v2")["metadata.yaml"])
    assert manifest["reuse"]["parent"] == "ni@v1" and len(manifest["reuse"]["tokenized_inputs"]) == 1, manifest["reuse"]
    ours = setup.objects("data/ni/v2")
    compared = 0
    for path in directory.rglob("*"):
        rel = path.relative_to(directory).as_posix()
        if path.is_file() and (rel.endswith((".bin", ".bos.idx")) or rel.startswith("stats.")):
            assert ours[rel] == path.read_bytes(), rel
            compared += 1
    assert compared >= 8


def test_two_builds_of_the_same_inputs_at_once_tokenize_them_once(setup: Setup) -> None:
    setup.proxy.reset()
    results: dict[str, subprocess.CompletedProcess[str]] = {}

    def run(which: str) -> None:
        started = time.monotonic()
        results[which] = setup.build("nt", scratch=f"scratch-{which}")
        print(f"build {which}: {time.monotonic() - started:.1f} s")

    threads = [threading.Thread(target=run, args=(w,)) for w in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for which, res in results.items():
        assert res.returncode == 0, f"{which}: {res.stderr[-3000:]}"
        assert "nt@v1" in res.stdout, res.stdout
    units = [k for k in setup.sent("data/nt") if k.startswith(".staging/") and k.count("/parts/unit-") and k.endswith(".json")]
    assert len(units) <= 1.1 * 4, units  # the corpus is 4 work units
    sent = setup.sent("data/nt/v1")
    assert sent and all(n == 1 for k, n in sent.items() if k.endswith((".bin", ".bos.idx"))), sent


def test_a_worker_killed_mid_build_changes_no_byte(setup: Setup) -> None:
    setup.proxy.reset()
    holder: dict[str, Any] = {}

    def run() -> None:
        holder["res"] = setup.build("nk")

    thread = threading.Thread(target=run)
    thread.start()
    fs = setup.s3.fs()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # the first unit committed: the build is under way
        fs.invalidate_cache()
        if [p for p in fs.find(f"{setup.bucket}/data/nk/") if "/parts/unit-" in p and p.endswith(".json")]:
            break
        time.sleep(0.2)
    victim = setup.cluster.workers[0]
    listed_at_kill = fs.exists(f"{setup.bucket}/catalog/nk.yaml")
    victim.kill(signal.SIGKILL)
    thread.join(300)
    res = holder["res"]
    assert res.returncode == 0, f"{res.stderr[-4000:]}\n{setup.cluster.logs()}"
    assert not listed_at_kill  # the worker died mid-build
    local = setup.build("nk", "--data-root", str(setup.base / "local/data"), "--catalog",
                        str(setup.base / "local/cat"), runner=False)
    assert local.returncode == 0, local.stderr[-3000:]
    directory = setup.base / "local/data/nk/v1"
    ours = setup.objects("data/nk/v1")
    for path in directory.rglob("*"):
        rel = path.relative_to(directory).as_posix()
        if path.is_file() and (rel.endswith((".bin", ".bos.idx")) or rel.startswith("stats.")):
            assert ours[rel] == path.read_bytes(), rel


def test_a_cluster_that_loses_every_worker_stops_the_build_and_another_machine_resumes_it(setup: Setup) -> None:
    holder: dict[str, Any] = {}
    env = setup.env
    setup.env = {**env, "SHARDFLOW_DASK_NO_WORKERS_S": "8"}
    try:
        # Small shards: dozens of write jobs after the units, so the workers are still needed when they die, however
        # late (under load) the first unit's record is seen.
        thread = threading.Thread(target=lambda: holder.setdefault("res", setup.build("nw", *SMALL_SHARDS)))
        thread.start()
        fs = setup.s3.fs()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not holder:
            fs.invalidate_cache()
            if [p for p in fs.find(f"{setup.bucket}/data/nw/") if "/parts/unit-" in p and p.endswith(".json")]:
                break
            time.sleep(0.2)
        lost_at = time.monotonic()
        for worker in setup.cluster.workers:
            worker.kill(signal.SIGKILL)
        thread.join(120)
        took = time.monotonic() - lost_at
    finally:
        setup.env = env
    res = holder["res"]
    assert res.returncode != 0, res.stdout
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no Dask worker for 8 s" in lines[0], res.stderr[-1500:]
    assert took < 60, took

    # A new worker, and the build run again from another machine (a fresh scratch): the units the first run
    # committed on the bucket are not tokenized again.
    setup.cluster.start_worker("w2")
    setup.cluster.wait_for_workers(["w2"])
    setup.proxy.reset()
    again = setup.build("nw", *SMALL_SHARDS, scratch="scratch-elsewhere")
    assert again.returncode == 0, f"{again.stderr[-4000:]}\n{setup.cluster.logs()}"
    assert again.stdout.splitlines()[0] == f"published nw@v1 to s3://{setup.bucket}/data/nw/v1", again.stdout
    tokenized = [k for k in setup.sent("data/nw") if "/parts/unit-" in k and k.endswith(".json")]
    assert len(tokenized) < 4, tokenized

