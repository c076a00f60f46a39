"""Benchmark: the tokenize stage on threads against processes (issue 44, item 4: both cores busy).

    python bench/bench_tokenize_workers.py --corpus REAL --rounds 3

One plan of ``--corpus``; then, per round, each in a fresh process and in turn: the stage's jobs on 1
thread, on 2 threads (as ``build(..., workers=2)`` runs them), and split between 2 processes (each
imports shardflow, loads the tokenizer and tokenizes every other unit, as a process pool started for
the build would), and on 2 and 3 processes forked after the tokenizer is loaded and set up (a pool with
no start-up cost, each unit to the next free process). Wall seconds, CPU seconds (the process and its children) and CPU/wall, medians.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

# One way of running the stage, in a fresh process: "threads:N" or "processes:N".
RUN = r"""
import json, resource, subprocess, sys, time
from concurrent.futures import ThreadPoolExecutor
from shardflow import pipeline as b
from shardflow.pipeline.staging import as_plan
staging, how = sys.argv[1], sys.argv[2]
kind, n = how.split(":")
stage = b.STAGES[0]  # tokenize-unit
jobs = [job[0] for job in stage.jobs(as_plan(staging), {})]
def one(job):  # by name: a forked process finds it in its copy of this module
    stage(staging, job)
def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
t0, c0 = time.perf_counter(), cpu()
if kind == "threads":
    with ThreadPoolExecutor(int(n)) as pool:
        list(pool.map(lambda j: stage(staging, j), jobs))
elif kind == "forked":  # started after the tokenizer's load and set-up: no start-up cost (gigatoken: 1 thread each)
    import multiprocessing
    from shardflow.tokenizers import load_tokenizer
    plan = as_plan(staging)
    load_tokenizer(plan.config.tokenizer, backend=plan.config.backend).warm()
    with multiprocessing.get_context("fork").Pool(int(n)) as pool:
        list(pool.imap_unordered(one, jobs))
else:
    code = "import sys, json\nfrom shardflow import pipeline as b\nfor j in json.loads(sys.argv[2]): b.STAGES[0](sys.argv[1], j)"
    procs = [subprocess.Popen([sys.executable, "-c", code, staging, json.dumps(jobs[i::int(n)])]) for i in range(int(n))]
    if any(p.wait() for p in procs):
        sys.exit("a process failed")
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": cpu() - c0}))
"""

PLAN = r"""
import sys
from shardflow import pipeline as b
from shardflow.config import BuildConfig
print(b.plan_build(BuildConfig(name="bench", sources=(sys.argv[1],)), data_root=sys.argv[2], catalog=sys.argv[3]).staging)
"""

WAYS = ("threads:1", "threads:2", "processes:2", "forked:2", "forked:3")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    results: dict[str, list[dict]] = {way: [] for way in WAYS}
    with tempfile.TemporaryDirectory(prefix="bench-tokw-") as tmp:
        for r in range(args.rounds):
            for way in (WAYS if r % 2 == 0 else WAYS[::-1]):
                out = Path(tmp) / "out"
                shutil.rmtree(out, ignore_errors=True)
                staging = subprocess.run([sys.executable, "-c", PLAN, str(args.corpus), str(out / "data"), str(out / "cat")],
                                         capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1]
                got = subprocess.run([sys.executable, "-c", RUN, staging, way], capture_output=True, text=True, check=True)
                row = json.loads(got.stdout.strip().splitlines()[-1])
                results[way].append(row)
                print(f"round {r + 1} {way:12} wall {row['wall']:5.2f} s  cpu {row['cpu']:5.2f} s  "
                      f"cpu/wall {row['cpu'] / row['wall']:4.2f}", flush=True)
    print("\n| the tokenize stage | wall (s) | CPU (s) | CPU/wall |\n|---|---:|---:|---:|")
    for way, rows in results.items():
        wall, cpu = statistics.median(r["wall"] for r in rows), statistics.median(r["cpu"] for r in rows)
        print(f"| {way} | {wall:.2f} | {cpu:.2f} | {cpu / wall:.2f} |")


if __name__ == "__main__":
    main()
