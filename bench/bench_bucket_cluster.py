"""Benchmark: a build to a bucket on Dask workers that share no filesystem, against a local build of the same corpus.

    python bench/bench_bucket_cluster.py                  # a 32 MB make_corpus corpus in 8 files, 3 rounds
    python bench/bench_bucket_cluster.py --mb 64 --rounds 5

The corpus goes to a bucket on moto's S3 server (``moto[server]``, the test extra, in this process on
loopback). A ``dask scheduler`` and two ``dask worker`` commands start, each worker with a scratch of its
own (``SHARDFLOW_SCRATCH``) and reaching the bucket through a proxy that counts every byte it sends; the
command's process has its own. Round after round, alternating, three builds of the same corpus run as
fresh ``shardflow build --no-prefect`` commands:

* ``local``: from the local copy to a local data root, ``--workers 2`` threads (the baseline);
* ``bucket, dask``: from ``s3://`` to an ``s3://`` data root and catalog, ``--runner dask``: the workers
  tokenize into their own disk and send each shard to its final key (``bucket/remote_jobs.py``);
* ``bucket, threads``: the same to the bucket with ``--workers 2`` threads in one process: built in a
  scratch mirror, then pushed (each file sent once more, after the build).

It prints each round's wall time and the bytes sent to the bucket (request heads and bodies, every
process), then the medians, each build's wall time over the local one's, and the bytes sent over the
version's size (1.0: every byte of the version sent once). The S3 server, both workers and the
command share these 2 cores, so the wall times say what the design costs here, not at scale. The last
line is JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

from loopback_s3 import start_moto

REPO = Path(__file__).resolve().parent.parent
MAKE_CORPUS = REPO.parent / "shared" / "tools" / "make_corpus.py"
sys.path.insert(0, str(REPO / "tests"))
from support.s3 import CountingProxy  # noqa: E402  (the tests' loopback proxy, which counts bytes)

BIN = Path(sys.executable).parent
OPTIONS = ["--no-prefect", "--progress", "none", "--val-fraction", "0.01", "--shard-tokens", "2000000"]


def start_cluster(work: Path, env: dict[str, str]) -> list[subprocess.Popen[bytes]]:
    """``dask scheduler`` and two ``dask worker`` commands, each worker with a scratch of its own."""
    port = 18786 + os.getpid() % 1000
    logs = work / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    procs = [subprocess.Popen([str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], stdout=open(logs / "scheduler.log", "wb"), stderr=subprocess.STDOUT,
                              env=env, start_new_session=True)]
    time.sleep(3)
    for w in range(2):
        wenv = {**env, "SHARDFLOW_SCRATCH": str(work / f"worker-{w}")}
        procs.append(subprocess.Popen([str(BIN / "dask"), "worker", f"tcp://127.0.0.1:{port}", "--nthreads", "1",
                                       "--host", "127.0.0.1", "--no-dashboard", "--local-directory", str(work / f"space-{w}")],
                                      stdout=open(logs / f"worker-{w}.log", "wb"), stderr=subprocess.STDOUT, env=wenv,
                                      start_new_session=True))
    from distributed import Client

    with Client(f"tcp://127.0.0.1:{port}", timeout=60) as client:
        client.wait_for_workers(2, timeout=60)
    return procs


def run(cmd: list[str], env: dict[str, str]) -> float:
    started = time.monotonic()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if res.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{res.stderr[-3000:]}")
    return time.monotonic() - started


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=32)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="shardflow-bench-cluster-"))
    server = start_moto()
    procs: list[subprocess.Popen[bytes]] = []
    try:
        corpus = work / "corpus"
        subprocess.run([sys.executable, str(MAKE_CORPUS), str(corpus), "--mb", str(args.mb), "--files", str(args.files)],
                       check=True, capture_output=True)
        import s3fs

        fs = s3fs.S3FileSystem(endpoint_url=os.environ["AWS_ENDPOINT_URL"], key="bench", secret="bench")
        bucket = f"bench-{uuid.uuid4().hex[:8]}"
        fs.mkdir(bucket)
        for p in sorted(corpus.glob("*")):
            fs.put_file(str(p), f"{bucket}/corpus/{p.name}")
        client_proxy, worker_proxy = CountingProxy(os.environ["AWS_ENDPOINT_URL"]), CountingProxy(os.environ["AWS_ENDPOINT_URL"])
        env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDFLOW_")}
        procs = start_cluster(work, {**env, "AWS_ENDPOINT_URL": worker_proxy.endpoint})
        address = f"tcp://127.0.0.1:{18786 + os.getpid() % 1000}"
        shardflow = [str(BIN / "shardflow"), "build"]
        walls: dict[str, list[float]] = {"local": [], "bucket, dask": [], "bucket, threads": []}
        sent: dict[str, list[float]] = {"bucket, dask": [], "bucket, threads": []}
        size = 0
        for r in range(args.rounds):
            walls["local"].append(run([*shardflow, str(corpus), "--name", f"b{r}", *OPTIONS, "--workers", "2",
                                       "--data-root", str(work / f"local{r}/data"), "--catalog", str(work / f"local{r}/cat")], env))
            for kind, extra in (("bucket, dask", ["--runner", "dask", "--address", address]), ("bucket, threads", ["--workers", "2"])):
                client_proxy.reset()
                worker_proxy.reset()
                prefix = f"{bucket}/{kind.split(', ')[1]}{r}"
                walls[kind].append(run([*shardflow, f"s3://{bucket}/corpus/", "--name", f"b{r}", *OPTIONS, *extra,
                                        "--data-root", f"s3://{prefix}/data", "--catalog", f"s3://{prefix}/cat",
                                        "--scratch", str(work / f"scratch-{kind[-4:]}{r}")],
                                       {**env, "AWS_ENDPOINT_URL": client_proxy.endpoint}))
                fs.invalidate_cache()
                size = sum(info["size"] for info in fs.find(f"{prefix}/data/b{r}/v1/", detail=True).values())
                sent[kind].append((client_proxy.sent_bytes + worker_proxy.sent_bytes) / size)
            print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in walls.items())
                  + "; sent / version: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in sent.items()), flush=True)
        med = {k: statistics.median(v) for k, v in walls.items()}
        result = {"mb": args.mb, "files": args.files, "rounds": args.rounds, "version_bytes": size,
                  "wall_s": med, "wall_over_local": {k: med[k] / med["local"] for k in med},
                  "sent_over_version": {k: statistics.median(v) for k, v in sent.items()}}
        for k in med:
            print(f"{k:16s} {med[k]:6.1f} s  {med[k] / med['local']:.2f}x local"
                  + (f"  sent {result['sent_over_version'][k]:.2f}x the version" if k in sent else ""))
        print(json.dumps(result))
    finally:
        for proc in procs:
            try:
                os.killpg(proc.pid, 9)
            except ProcessLookupError:
                pass
        server.stop()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
