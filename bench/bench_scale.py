"""Benchmark: a build from ``s3://`` on a Dask cluster of 1 and then 2 worker processes; per-unit costs.

    python bench/bench_scale.py                     # 32 MB Parquet corpus, 8 objects, on loopback S3 (moto)
    python bench/bench_scale.py --mb 64 --files 16 --unit-mb 4 --out scale.json

The corpus (``make_corpus.py``) is put on a loopback S3 server (moto's
``ThreadedMotoServer``, reached through ``AWS_ENDPOINT_URL`` like any S3
store). For each cluster size a fresh ``distributed.LocalCluster`` of N
single-threaded worker processes runs the build's stage table
(``shardflow.build.STAGES``) with ``run_stages``, one Dask task per job, the
way the Prefect flow's Dask runner does, but without Prefect's overhead, so
what is measured is the work itself. Reported, as JSON on stdout:

* planning on this process: wall seconds, objects, and bytes received from
  the S3 server while planning (a counting proxy in front of it);
* per stage: wall seconds and the summed per-job seconds (work seconds) of
  tokenize-unit, write-shard and validate-shard, and the one-job stages;
* per-core rates from the 1-worker run: text MB/s and tokens/s per core for
  tokenize-unit (which includes reading the object from S3 and hashing it),
  tokens/s for write-shard and validate-shard;
* the speed-up of 2 workers over 1 on the whole build.

Each worker process is limited to one core for tokenizing (``RAYON_NUM_THREADS=1``:
gigatoken's batch encode otherwise spreads over every core), so the 1-worker
rates are per-core rates. The S3 server runs in this benchmark's process, on
the same cores: on a shared 2-core machine the 2-worker figure is a lower
bound on scaling.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT), str(ROOT / "tests")]
MAKE_CORPUS = ROOT.parent / "shared" / "tools" / "make_corpus.py"


def _timed(stage, plan, *job):  # runs on a worker: the job's result and its own seconds
    t0 = time.perf_counter()
    result = stage(plan, *job)
    return result, time.perf_counter() - t0


def run(n_workers: int, url: str, work: Path, s3_env: dict[str, str], options: dict) -> dict:
    import distributed

    from shardflow.build import build_lock, plan_build, run_stages
    from shardflow.config import BuildConfig
    from s3_support import CountingProxy, environment

    config = BuildConfig(name=f"scale{n_workers}", sources=(url,), **options)
    proxy = CountingProxy(s3_env["AWS_ENDPOINT_URL"])
    with environment({"AWS_ENDPOINT_URL": proxy.endpoint}):
        t0 = time.perf_counter()
        plan = plan_build(config, data_root=work / f"data{n_workers}", catalog=work / f"cat{n_workers}")
        plan_s = time.perf_counter() - t0
    proxy.close()
    plan_json_bytes = (Path(plan.staging) / "plan.json").stat().st_size
    stages: dict[str, dict] = {}
    with distributed.LocalCluster(
        n_workers=n_workers, threads_per_worker=1, processes=True, dashboard_address=None, host="127.0.0.1"
    ) as cluster, distributed.Client(cluster) as client:
        client.run(lambda: __import__("shardflow.build"))  # imports are not part of the work

        def run_jobs(stage, jobs):
            t = time.perf_counter()
            if stage.fan_out == "one":
                out = [_timed(stage, plan, *job) for job in jobs]
            else:
                out = client.gather(client.map(_timed, [stage] * len(jobs), [plan] * len(jobs), *zip(*jobs), pure=False))
            stages[stage.name] = {"jobs": len(jobs), "wall_s": time.perf_counter() - t, "work_s": sum(s for _, s in out)}
            return [r for r, _ in out]

        t0 = time.perf_counter()
        with build_lock(plan) as plan:
            done = run_stages(plan, run_jobs)
        build_s = time.perf_counter() - t0
    manifest = done["validate"][0]
    return {
        "workers": n_workers,
        "plan": {"wall_s": plan_s, "objects": len(plan.inputs), "units": len(plan.units), "bytes_received": proxy.received},
        "build_wall_s": build_s,
        "tokens": manifest.totals["tokens"],
        "documents": manifest.totals["documents"],
        "plan_json_bytes": plan_json_bytes,
        "shards": manifest.totals["shards"],
        "stages": stages,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=32)
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--unit-mb", type=int, default=4)
    ap.add_argument("--shard-tokens", type=int, default=2_000_000)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--source", choices=("s3", "local"), default="s3", help="build from the S3 server, or from the local copy")
    args = ap.parse_args()
    from s3_support import S3Server, environment

    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = work / "corpus"
        subprocess.run([sys.executable, str(MAKE_CORPUS), str(corpus), "--mb", str(args.mb), "--files", str(args.files)], check=True)
        corpus_bytes = sum(p.stat().st_size for p in corpus.glob("*.parquet"))
        server = S3Server()
        fs = server.fs()
        fs.mkdir("corpus")
        for p in sorted(corpus.glob("*.parquet")):
            fs.put_file(str(p), f"corpus/c/{p.name}")
        options = dict(shard_tokens=args.shard_tokens, unit_bytes=args.unit_mb << 20, val_fraction=0.01)
        results = []
        # The workers, spawned by LocalCluster, inherit the S3 endpoint; and one core each: gigatoken's
        # batch encode would otherwise use every core of the machine in each worker (rayon's pool).
        with environment({**server.env, "RAYON_NUM_THREADS": "1"}):
            url = "s3://corpus/c/" if args.source == "s3" else str(corpus)
            for n in (1, 2):
                results.append(run(n, url, work, server.env, options))
        server.stop()
    one = results[0]
    text_mb = args.mb  # make_corpus's --mb is the text size
    tok = one["stages"]["tokenize-unit"]
    per_core = {
        "tokenize_text_mb_s": text_mb / tok["work_s"],
        "tokenize_tokens_s": one["tokens"] / tok["work_s"],
        "write_tokens_s": one["tokens"] / one["stages"]["write-shard"]["work_s"],
        "validate_tokens_s": one["tokens"] / one["stages"]["validate-shard"]["work_s"],
    }
    report = {
        "command": " ".join([os.path.relpath(sys.executable), *sys.argv]),
        "cpus": os.cpu_count(),
        "load_avg_at_end": os.getloadavg(),
        "source": args.source,
        "corpus": {"text_mb": args.mb, "objects": args.files, "parquet_bytes": corpus_bytes},
        "runs": results,
        "per_core_from_1_worker": per_core,
        "speedup_2_over_1": results[0]["build_wall_s"] / results[1]["build_wall_s"],
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
