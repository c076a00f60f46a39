"""Benchmark: what one Prefect task run costs, on a loopback ``prefect server``, and how many a build may have.

    python bench/bench_orchestration.py                    # threads and Dask runners, 100 and 400 task runs
    python bench/bench_orchestration.py --runs 200,800 --skip-dask

A flow submits N task runs that do nothing but log one line and return a small
dict (what a shardflow job returns), on Prefect's thread pool runner
(``--workers`` threads, as ``shardflow build --workers``) and on prefect-dask's
runner against a local ``distributed`` cluster (2 worker processes; there the
workers report their task runs themselves). Every flow runs in a fresh process
against one server started here (its own ``PREFECT_HOME``, SQLite), so what is
measured is the API round trips (create, states, logs) and the server's
writes, the part of a build that grows with its number of task runs.

It reports, per runner, the flow's wall time for each N and the slope between
the two: seconds per task run at that concurrency, i.e. how many task runs per
second the server and the flow's process sustain together (on this machine
the server shares the two cores with the flow and the workers: pessimistic for
a server on its own machine). The CPU seconds of the flow's process and of the
server per task run are reported too. The last line is JSON.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_flow import Server, base_env  # noqa: E402  (a sibling script: the same server fixture)

FLOW = r"""
import json, resource, sys, time
from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.task_runners import ThreadPoolTaskRunner

n, workers, address = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]


@task(cache_policy=NO_CACHE, persist_result=False)
def job(i: int) -> dict:
    get_run_logger().info("job %d done", i)
    return {"job": i, "tokens": 1000 * i}


def runner():
    if address == "-":
        return ThreadPoolTaskRunner(max_workers=workers)
    from prefect_dask import DaskTaskRunner
    return DaskTaskRunner(address=address)


@flow(task_runner=runner(), persist_result=False)
def many() -> float:
    t0 = time.perf_counter()
    futures = [job.submit(i) for i in range(n)]
    assert [f.result()["job"] for f in futures] == list(range(n))
    return time.perf_counter() - t0


t0 = time.perf_counter()
inside = many()
wall = time.perf_counter() - t0
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"wall": wall, "tasks": inside, "cpu": ru.ru_utime + ru.ru_stime}))
"""


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a process and its children that exited, from /proc (Linux)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def one_flow(server: Server, env: dict[str, str], n: int, workers: int, address: str) -> dict:
    before = cpu_seconds(server.proc.pid)
    proc = subprocess.run([sys.executable, "-c", FLOW, str(n), str(workers), address], env=env,
                          capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"the flow of {n} task runs failed:\n{proc.stderr[-3000:]}")
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["server_cpu"] = cpu_seconds(server.proc.pid) - before
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", default="100,400", help="two task-run counts, the slope is taken between them")
    ap.add_argument("--workers", type=int, default=8, help="threads of the thread pool runner")
    ap.add_argument("--rounds", type=int, default=2, help="flows per count (the median is kept)")
    ap.add_argument("--skip-dask", action="store_true")
    args = ap.parse_args()
    small, large = (int(x) for x in args.runs.split(","))
    work = Path(tempfile.mkdtemp(prefix="bench-orchestration-"))
    server = Server(work)
    env = {**base_env(), "PREFECT_API_URL": server.url, "PREFECT_HOME": str(work / "client-home"),
           "PREFECT_LOGGING_LEVEL": "WARNING"}
    results: dict[str, dict] = {}
    cluster = None
    try:
        runners = [("threads", "-")]
        if not args.skip_dask:
            from distributed import LocalCluster

            cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                   host="127.0.0.1")
            runners.append(("dask (2 worker processes)", cluster.scheduler_address))
        one_flow(server, env, 5, args.workers, "-")  # warm-up: the server's first writes, imports on disk
        for name, address in runners:
            per_n = {}
            for n in (small, large):
                rounds = sorted((one_flow(server, env, n, args.workers, address) for _ in range(args.rounds)),
                                key=lambda r: r["tasks"])
                per_n[n] = rounds[len(rounds) // 2]
                r = per_n[n]
                print(f"{name:28s} {n:5d} task runs: {r['tasks']:7.2f} s in the flow ({n / r['tasks']:6.1f}/s), "
                      f"flow process {r['cpu']:6.2f} CPU s, server {r['server_cpu']:6.2f} CPU s", flush=True)
            a, b = per_n[small], per_n[large]
            results[name] = {
                "seconds_per_task_run": (b["tasks"] - a["tasks"]) / (large - small),
                "flow_cpu_per_task_run": (b["cpu"] - a["cpu"]) / (large - small),
                "server_cpu_per_task_run": (b["server_cpu"] - a["server_cpu"]) / (large - small),
                "runs": {str(k): v for k, v in per_n.items()},
            }
    finally:
        if cluster is not None:
            cluster.close()
        server.stop()
    print()
    print("| runner | s per task run (slope) | task runs/s | flow process CPU s / run | server CPU s / run |")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['seconds_per_task_run'] * 1e3:.1f} ms | {1 / r['seconds_per_task_run']:.0f} | "
              f"{r['flow_cpu_per_task_run'] * 1e3:.1f} ms | {r['server_cpu_per_task_run'] * 1e3:.1f} ms |")
    print(json.dumps({"workers": args.workers, "runs": [small, large], "load_average": os.getloadavg()[0],
                      "runners": results}))


if __name__ == "__main__":
    main()
