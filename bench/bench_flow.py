"""Benchmark: the Prefect flow against the core (``--no-prefect``), measured in one run.

    python bench/bench_flow.py --mb 1000 --files 16        # the issue's size (minutes)
    python bench/bench_flow.py --mb 50 --rounds 1          # a quick look while developing

Every build runs the ``shardflow build`` command line in a fresh process, so
imports, start-up and exit count, as a user sees them. It starts its own
``prefect server`` (a free localhost port, its own ``PREFECT_HOME``) and
measures, on one ``make_corpus.py`` corpus, alternating the sides each round
so that noise from a shared machine hits them alike (medians):

* the core: ``shardflow build --no-prefect``;
* the flow against the running server (``PREFECT_API_URL`` set);
* the flow with no ``PREFECT_API_URL`` (the temporary server; its own ``PREFECT_HOME``,
  created by a warm-up run, as after a first use);
* the README's first command on the bundled sample (``shardflow build
  tests/assets/sample.parquet --name sample``, fresh data root), warm and with a
  never-used ``PREFECT_HOME``;
* an incremental build: the corpus plus one more file (+1 of 16), against the
  first build, both through the flow against the running server; and the end of
  the incremental run from the server's task runs: from the last shard check to
  the end of finalize (any wait for the dataset card), the ``stats-card`` task;
* the same incremental pair under ``shardflow serve`` (``bench/bench_serve.py``);
* ``--runner dask`` on a local ``distributed`` cluster (2 worker processes x 1
  thread) against the threads runner, same corpus, same run (skipped without
  the ``dask`` extra);
* where the flow's wall time goes: the flow run's task runs as recorded by the
  server (a timeline, per stage: wall time, and how busy the ``--workers``
  slots were), against the core's own stages timed in one process.

With ``--baseline DIR`` (another checkout, e.g. ``git archive main | tar -x -C DIR``), that
checkout's command line is timed in the same rounds too, for a before/after on one loaded machine
(``--baseline . --baseline-env SHARDFLOW_HEAD_START=0``: this checkout with one switch off)
(the incremental pair too, interleaved with this checkout's; ``--inc-rounds N`` repeats the
incremental pairs N times, the sides' order rotating, and reports the median round).

Ratios are speeds (core time / flow time: 1.0 means the flow costs nothing on
top of the core), except incremental / first build, a ratio of times. The end
prints a markdown table to paste into the README's performance section.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any, Iterator

ROOT = Path(__file__).resolve().parent.parent
MAKE_CORPUS = ROOT.parent / "shared" / "tools" / "make_corpus.py"
SAMPLE = ROOT / "tests" / "assets" / "sample.parquet"

CORE_STAGES = r"""
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
from shardflow import pipeline as b
from shardflow.config import BuildConfig
corpus, out, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
t = {}
t0 = time.perf_counter()
plan = b.plan_build(BuildConfig(name="bench", sources=(corpus,)), data_root=out + "/data", catalog=out + "/manifests")
t["plan"] = time.perf_counter() - t0
done = {}
for stage in b.STAGES:
    if not stage.when(plan):
        continue
    t0 = time.perf_counter()
    with ThreadPoolExecutor(workers) as pool:
        done[stage.name] = list(pool.map(lambda job: stage(plan, *job), stage.jobs(plan, done)))
    t[stage.name] = time.perf_counter() - t0
print(json.dumps(t))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PYTHONPATH=f"{ROOT / 'src'}:{ROOT}", PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONUNBUFFERED="1")
    return env


class Server:
    """``prefect server start`` on a free port with its own home, for the whole benchmark."""

    def __init__(self, work: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        home = work / "server-home"
        env = {**base_env(), "PREFECT_HOME": str(home), "PREFECT_UI_API_URL": self.url}
        self.log = open(work / "server.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            stdout=self.log, stderr=subprocess.STDOUT, env=env, start_new_session=True,
        )
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(OSError):
                if self.request("GET", "/health") is True:
                    break
            if self.proc.poll() is not None or time.monotonic() > deadline:
                sys.exit(f"prefect server did not start; see {work / 'server.log'}")
            time.sleep(0.25)

    def request(self, method: str, path: str, body: Any = None) -> Any:
        data = None if body is None else json.dumps(body).encode()
        for attempt in range(8):
            req = urllib.request.Request(f"{self.url}{path}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=30) as resp:
                    raw = resp.read()
                return json.loads(raw) if raw else None
            except urllib.error.HTTPError as exc:
                # 503: SQLite busy while the server records a run's events; retried, as Prefect's client does.
                if exc.code != 503 or attempt == 7:
                    raise
                time.sleep(0.25 * 2 ** min(attempt, 3))

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.log.close()


class Run:
    """One ``shardflow build`` in a fresh process: wall time, CPU time (with its children), output."""

    def __init__(self, args: list[str], env: dict[str, str], cwd: Path) -> None:
        cwd.mkdir(parents=True, exist_ok=True)
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "shardflow", "build", *args, "--progress", "none"],
                                env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate()
        self.wall = time.perf_counter() - t0
        ru = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu_total = ru.ru_utime + ru.ru_stime  # cumulative over all children; callers take differences
        self.stdout, self.stderr = out, err
        if proc.returncode != 0:
            sys.exit(f"shardflow build {' '.join(args)} failed ({proc.returncode}):\n{err[-3000:]}")
        self.bad_lines = [l for l in (out + err).splitlines() if " ERROR " in l or "| ERROR" in l or "Traceback" in l]


def build(corpus: Path, name: str, root: Path, env: dict[str, str], *extra: str) -> Run:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = Run([str(corpus), "--name", name, "--data-root", str(root / "data"), "--catalog", str(root / "manifests"),
             "--workers", str(WORKERS), *extra], env, root)
    r.cpu = r.cpu_total - (before.ru_utime + before.ru_stime)
    return r


def make_corpus(path: Path, mb: int, files: int, seed: int = 0) -> Path:
    if not path.exists():
        print(f"making a {mb} MB corpus of {files} files in {path} ...", flush=True)
        subprocess.run([sys.executable, str(MAKE_CORPUS), str(path), "--mb", str(mb), "--files", str(files),
                        "--seed", str(seed)], check=True, capture_output=True)
    return path


def _ts(s: str | None) -> float:
    return datetime.fromisoformat(s.replace("Z", "+00:00")).timestamp() if s else float("nan")


def timeline(server: Server, name: str, wall_start: float, wall_end: float) -> dict[str, Any]:
    """The flow run of ``build NAME`` and its task runs, from the server: seconds per stage."""
    runs = server.request("POST", "/flow_runs/filter", {"flow_runs": {"name": {"any_": [f"build {name}"]}},
                                                        "sort": "START_TIME_DESC", "limit": 1})
    fr = runs[0]
    tasks: list[dict[str, Any]] = []
    for _ in range(40):  # task runs reach the server through events: give them a moment
        tasks = server.request("POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [fr["id"]]}}, "limit": 200})
        if tasks and all(t.get("end_time") for t in tasks):
            break
        time.sleep(0.25)
    f0, f1 = _ts(fr["start_time"]), _ts(fr["end_time"])
    stages: dict[str, list[tuple[float, float]]] = {}
    for t in tasks:
        stages.setdefault(_stage_of(t["name"]), []).append((_ts(t["start_time"]), _ts(t["end_time"])))
    rows = {"start-up (process start to flow run start)": f0 - wall_start}
    busy = {}
    last = f0
    for stage in ("plan", "tokenize", "layout", "write", "validate", "publish"):
        spans = stages.get(stage)
        if not spans:
            continue
        s0, s1 = min(a for a, _ in spans), max(b for _, b in spans)
        rows[f"gap before {stage}"] = s0 - last
        rows[stage] = s1 - s0
        busy[stage] = sum(b - a for a, b in spans) / ((s1 - s0) * min(WORKERS, len(spans))) if s1 > s0 else 1.0
        last = s1
    rows["artifacts + flow run end (after publish)"] = f1 - last
    rows["exit (flow run end to process exit)"] = wall_end - f1
    return {"rows": rows, "busy": busy, "tasks": len(tasks)}


def tail(server: Server, name: str) -> dict[str, float]:
    """Of the latest ``build NAME`` flow run: from the last shard job's task run's end (write-shard; validate-shard in
    a tree that still reads each shard back) to finalize's
    (the ``validate NAME`` task run) end, which holds any wait for the card; finalize itself; the
    ``stats-card`` task run (none in a checkout without the stage) and how much of it ran after the shards."""
    runs = server.request("POST", "/flow_runs/filter", {"flow_runs": {"name": {"any_": [f"build {name}"]}},
                                                        "sort": "START_TIME_DESC", "limit": 1})
    tasks: list[dict[str, Any]] = []
    for _ in range(40):
        tasks = server.request("POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [runs[0]["id"]]}}, "limit": 200})
        if tasks and all(t.get("end_time") for t in tasks):
            break
        time.sleep(0.25)
    by_name = {t["name"]: (_ts(t["start_time"]), _ts(t["end_time"])) for t in tasks}
    checks = [e for n, (_, e) in by_name.items() if n.startswith((f"validate {name} ", f"write {name} ")) and " shard " in n]
    last_check = max(checks) if checks else by_name[f"layout {name}"][1]
    f0, f1 = by_name[f"validate {name}"]
    out = {"after_shards": f1 - last_check, "finalize": f1 - f0}
    if f"stats-card {name}" in by_name:
        c0, c1 = by_name[f"stats-card {name}"]
        out["stats_card"], out["stats_card_after_shards"] = c1 - c0, max(0.0, c1 - last_check)
    return out


def _tail_text(t: dict[str, float]) -> str:
    card = (f"; stats-card task {t['stats_card']:.2f} s, {t['stats_card_after_shards']:.2f} s of it after the shards"
            if "stats_card" in t else "")
    return f"last shard check to finalize's end {t['after_shards']:.2f} s (finalize {t['finalize']:.2f} s){card}"


def _stage_of(task_run_name: str) -> str:
    return task_run_name.split(" ")[0]


def median(xs: list[float]) -> float:
    return statistics.median(xs)


@contextlib.contextmanager
def dask_cluster(env: dict[str, str]) -> Iterator[str | None]:
    try:
        import distributed  # noqa: F401
        import prefect_dask  # noqa: F401
    except ImportError:
        yield None
        return
    # The workers are spawned processes: they inherit this environment, and report to the server.
    saved = dict(os.environ)
    os.environ.update({k: v for k, v in env.items() if k.startswith("PREFECT_") or k == "PYTHONPATH"})
    sys.path[:0] = [str(ROOT / "src"), str(ROOT)]
    try:
        with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                      host="127.0.0.1") as cluster:
            yield cluster.scheduler_address
    finally:
        os.environ.clear()
        os.environ.update(saved)


WORKERS = 2


def main() -> None:
    global WORKERS
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mb", type=int, default=1000)
    ap.add_argument("--files", type=int, default=16)
    ap.add_argument("--corpus", type=Path, help="an existing make_corpus.py corpus directory (else made in --workdir)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--rounds", type=int, default=3, help="alternating rounds of core / flow / temporary server")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--skip-dask", action="store_true")
    ap.add_argument("--skip-serve", action="store_true", help="skip the incremental pair under shardflow serve")
    ap.add_argument("--inc-rounds", type=int, default=1, help="rounds of the incremental pair (first build, +1 file)")
    ap.add_argument("--baseline", type=Path, metavar="DIR",
                    help="another checkout (e.g. git worktree add --detach DIR main) timed in the same rounds")
    ap.add_argument("--baseline-env", action="append", default=[], metavar="KEY=VALUE",
                    help="environment of the baseline's builds; with --baseline . it times this checkout with a "
                         "switch off, e.g. --baseline . --baseline-env SHARDFLOW_HEAD_START=0")
    args = ap.parse_args()
    if args.baseline:
        args.baseline = args.baseline.resolve()  # its builds run in other directories
        for package in ("flows", "tasks"):
            # An installed checkout maps shardflow.flows/.tasks to *this* checkout's flows/ and tasks/; the
            # baseline's own, found first on its PYTHONPATH, keep its command line from mixing the two.
            link = args.baseline / "src" / "shardflow" / package
            if (args.baseline / package).is_dir() and not link.exists():
                link.symlink_to(args.baseline / package)
    WORKERS = args.workers
    work = args.workdir or Path(tempfile.mkdtemp(prefix="shardflow-bench-flow-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = args.corpus or make_corpus(work / f"corpus-{args.mb}mb-{args.files}", args.mb, args.files)
    # +1 file: a 17th file of the same size from another seed, named to sort last.
    extra = make_corpus(work / f"extra-{args.mb}mb", max(1, args.mb // args.files), 1, seed=17)
    grown = work / "grown"
    if not grown.exists():
        grown.mkdir()
        for f in sorted(corpus.glob("*.parquet")):
            os.symlink(f.resolve(), grown / f.name)
    n_files = len(list(corpus.glob("*.parquet")))
    load = os.getloadavg()
    print(f"cores: {os.cpu_count()}, load average at start {load[0]:.2f}; corpus {corpus} ({n_files} files)", flush=True)

    server = Server(work)
    try:
        env_srv = {**base_env(), "PREFECT_API_URL": server.url, "PREFECT_HOME": str(work / "client-home")}
        env_tmp = {**base_env(), "PREFECT_HOME": str(work / "temp-home")}
        bad: list[str] = []

        # Warm-ups: the page cache, the temporary server's database (as after a first use).
        build(SAMPLE, "warm", work / "warm-core", env_srv, "--no-prefect")
        build(SAMPLE, "warm", work / "warm-tmp", env_tmp)

        sides = [("core", env_srv, ["--no-prefect"]), ("server", env_srv, []), ("temp", env_tmp, [])]
        base_tmp: dict[str, str] = {}
        tree: dict[str, str] = {}
        if args.baseline:
            # The same measurements of another checkout's command line, in the same rounds.
            tree = {"PYTHONPATH": f"{args.baseline / 'src'}:{args.baseline}",
                    **dict(kv.split("=", 1) for kv in args.baseline_env)}
            base_tmp = {**env_tmp, **tree, "PREFECT_HOME": str(work / "base-temp-home")}
            build(SAMPLE, "warm", work / "warm-base-tmp", base_tmp)
            sides += [("base-server", {**env_srv, **tree}, []), ("base-temp", base_tmp, [])]
        t: dict[str, list[float]] = {side: [] for side, _, _ in sides}
        t["sample"], t["base-sample"] = [], []
        cpu: dict[str, list[float]] = {side: [] for side, _, _ in sides}
        lines = []
        for i in range(args.rounds):
            for side, env, extra_args in sides:
                root = Path(tempfile.mkdtemp(prefix=f"{side}-", dir=work))
                name = f"{side}{i}"
                t_start = time.time()
                r = build(corpus, name, root, env, *extra_args)
                t[side].append(r.wall)
                cpu[side].append(r.cpu)
                bad += r.bad_lines
                if side == "server":
                    lines.append(timeline(server, name, t_start, time.time()))
                shutil.rmtree(root, ignore_errors=True)
            cwd = Path(tempfile.mkdtemp(prefix="sample-", dir=work))
            r = Run([str(SAMPLE), "--name", "sample"], env_tmp, cwd)
            t["sample"].append(r.wall)
            bad += r.bad_lines
            if base_tmp:
                cwd = Path(tempfile.mkdtemp(prefix="base-sample-", dir=work))
                t["base-sample"].append(Run([str(SAMPLE), "--name", "sample"], base_tmp, cwd).wall)
            print(f"round {i + 1}: core {t['core'][-1]:.2f} s, flow vs server {t['server'][-1]:.2f} s, "
                  f"flow with temporary server {t['temp'][-1]:.2f} s, README first command {t['sample'][-1]:.2f} s",
                  flush=True)
        cwd = Path(tempfile.mkdtemp(prefix="sample-fresh-", dir=work))
        fresh = Run([str(SAMPLE), "--name", "sample"], {**env_tmp, "PREFECT_HOME": str(cwd / "home")}, cwd)
        bad += fresh.bad_lines

        # Incremental: first build of the 16 files, then the same dataset with the 17th file added.
        inc_root = work / "incremental"
        shutil.rmtree(inc_root, ignore_errors=True)
        for f in grown.glob("*-extra.parquet"):
            f.unlink()
        # With --baseline, the baseline's pair too, interleaved (first, first, second, second);
        # --inc-rounds such rounds, the order of the sides rotating, medians reported.
        inc_sides = [("inc", env_srv, inc_root)]
        if args.baseline:
            inc_sides.append(("inc-base", {**env_srv, **tree},
                              work / "incremental-base"))
        inc_runs: dict[str, list[tuple[Run, Run, dict[str, float]]]] = {label: [] for label, _, _ in inc_sides}
        extra_file = grown / f"part-{n_files:05d}-extra.parquet"
        inc_lines: dict[str, list[dict[str, Any]]] = {}
        for i in range(args.inc_rounds):
            order = inc_sides if i % 2 == 0 else inc_sides[::-1]
            firsts = {}
            for label, env, root in order:
                shutil.rmtree(root, ignore_errors=True)
                firsts[label] = build(grown, label, root, env)
            os.symlink(next(extra.glob("*.parquet")).resolve(), extra_file)
            for label, env, root in order:
                t_start = time.time()
                second_run = build(grown, label, root, env)
                ends = tail(server, label)
                inc_lines.setdefault(label, []).append(timeline(server, label, t_start, time.time()))
                inc_runs[label].append((firsts[label], second_run, ends))
                bad += firsts[label].bad_lines + second_run.bad_lines
            extra_file.unlink()
        # The median round by the ratio (for an even count, the lower middle).
        mid = {label: sorted(runs, key=lambda r: r[1].wall / r[0].wall)[(len(runs) - 1) // 2] for label, runs in inc_runs.items()}
        firsts = {label: m[0] for label, m in mid.items()}
        seconds = {label: m[1] for label, m in mid.items()}
        tails = {label: {k: statistics.median(r[2][k] for r in inc_runs[label]) for k in inc_runs[label][0][2]}
                 for label in inc_runs}

        # The same incremental pair under `shardflow serve` (runs started through the API, bench/bench_serve.py).
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        from bench_serve import report as serve_report, serve_incremental

        served = None if args.skip_serve else serve_incremental(
            server, env_srv, grown, next(extra.glob("*.parquet")), work, rounds=args.inc_rounds)

        # Dask against threads, alternating, same corpus.
        dask_t: list[float] = []
        threads_t: list[float] = []
        if not args.skip_dask:
            with dask_cluster(env_srv) as address:
                if address is None:
                    print("dask: skipped (pip install 'shardflow[dask]')")
                else:
                    # A first run on fresh workers also pays their imports and tokenizer load (once per
                    # worker process); measured apart, then the alternating runs on the warm cluster.
                    cold = build(SAMPLE, "dask-cold", work / "dask-cold", env_srv, "--runner", "dask", "--address", address)
                    print(f"dask: first run on the fresh cluster (the sample): {cold.wall:.2f} s", flush=True)
                    for i in range(max(1, args.rounds - 1)):
                        for label, extra_args, acc in (("threads", [], threads_t),
                                                       ("dask", ["--runner", "dask", "--address", address], dask_t)):
                            root = Path(tempfile.mkdtemp(prefix=f"{label}-", dir=work))
                            r = build(corpus, f"{label}{i}", root, env_srv, *extra_args)
                            acc.append(r.wall)
                            bad += r.bad_lines
                            shutil.rmtree(root, ignore_errors=True)

        core_stages = json.loads(subprocess.run(
            [sys.executable, "-c", CORE_STAGES, str(corpus), str(Path(tempfile.mkdtemp(prefix="stages-", dir=work))),
             str(WORKERS)], env=base_env(), capture_output=True, text=True, check=True).stdout.strip().splitlines()[-1])
    finally:
        server.stop()

    core, srv, tmp = median(t["core"]), median(t["server"]), median(t["temp"])
    print(f"\nmedians over {args.rounds} round(s), {corpus.name}, --workers {WORKERS}; load average now "
          f"{os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    print(f"  core {core:.2f} s wall ({median(cpu['core']):.2f} s CPU); flow vs server {srv:.2f} s "
          f"({median(cpu['server']):.2f} s CPU); flow with temporary server {tmp:.2f} s "
          f"({median(cpu['temp']):.2f} s CPU, the server's own not counted)")
    print(f"  all runs: core {', '.join(f'{x:.2f}' for x in t['core'])}; server {', '.join(f'{x:.2f}' for x in t['server'])}; "
          f"temp {', '.join(f'{x:.2f}' for x in t['temp'])}; sample {', '.join(f'{x:.2f}' for x in t['sample'])}")

    # The breakdown of the median flow run.
    line = sorted(lines, key=lambda l: sum(l["rows"].values()))[len(lines) // 2]
    print(f"\nwhere the flow's wall time goes (flow vs running server, {line['tasks']} task runs), "
          f"against the core's stages in one process:\n")
    print("| segment | flow (s) | busy slots | core (s) |")
    print("|---|---:|---:|---:|")
    # The flow's "validate" segment holds finalize and, in a tree that has them, the validate-shard task runs (both
    # named "validate ...").
    core_stages["validate"] = core_stages.get("validate-shard", 0.0) + core_stages.get("validate", 0.0)
    core_of = {"plan": "plan", "tokenize": "tokenize-unit", "layout": "layout", "write": "write-shard",
               "validate": "validate", "publish": "publish"}
    for seg, secs in line["rows"].items():
        busy = f"{100 * line['busy'][seg]:.0f}%" if seg in line["busy"] else ""
        c = core_stages.get(core_of.get(seg, ""), None)
        print(f"| {seg} | {secs:.2f} | {busy} | {'' if c is None else f'{c:.2f}'} |")
    print(f"| total | {sum(line['rows'].values()):.2f} | | {sum(core_stages.values()):.2f} (stages only) |")

    print("\n| measure | target | measured |")
    print("|---|---|---|")
    print(f"| flow against a running server ÷ core (`--no-prefect`), wall time | ≥ 0.90 | "
          f"{core / srv:.2f} ({srv:.2f} s vs {core:.2f} s) |")
    print(f"| flow with the temporary server ÷ core, wall time | ≥ 0.75 | {core / tmp:.2f} ({tmp:.2f} s) |")
    print(f"| the README's first command on the bundled sample (fresh data root) | ≤ 3.5 s wall | "
          f"{median(t['sample']):.2f} s ({fresh.wall:.2f} s with a never-used PREFECT_HOME) |")
    inc = inc_runs["inc"]
    inc_first, inc_second = median([a.wall for a, _, _ in inc]), median([b.wall for _, b, _ in inc])
    print(f"| incremental (+1 file of {n_files}) ÷ first build, through the flow against a running server | ≤ 0.25 | "
          f"{median([b.wall / a.wall for a, b, _ in inc]):.2f} ({inc_second:.2f} s vs {inc_first:.2f} s) |")
    if dask_t:
        print(f"| Dask runner (2 workers × 1 thread) ÷ threads runner | ≥ 0.80 | "
              f"{median(threads_t) / median(dask_t):.2f} ({median(dask_t):.2f} s vs {median(threads_t):.2f} s) |")
    else:
        print("| Dask runner ÷ threads runner | ≥ 0.80 | not measured |")
    if args.inc_rounds > 1:
        for label, runs in inc_runs.items():
            print(f"incremental rounds ({label}): " + ", ".join(f"{b.wall:.2f}/{a.wall:.2f} s" for a, b, _ in runs))
    print(f"\nincremental build, the end of the run (medians): {_tail_text(tails['inc'])}")
    # Where the incremental run's time goes, per side: each segment's median over the rounds.
    print("\n| incremental run, segment | " + " | ".join(f"{label} (s)" for label in inc_lines) + " |")
    print("|---|" + "---:|" * len(inc_lines))
    segs = list(dict.fromkeys(k for ls in inc_lines.values() for l in ls for k in l["rows"]))
    for seg in segs:
        cells = [f"{statistics.median(l['rows'].get(seg, 0.0) for l in ls):.2f}" for ls in inc_lines.values()]
        print(f"| {seg} | " + " | ".join(cells) + " |")
    if args.baseline:
        b1, b2 = firsts["inc-base"], seconds["inc-base"]
        print(f"baseline {args.baseline}: incremental ÷ first build {b2.wall / b1.wall:.2f} ({b2.wall:.2f} s vs "
              f"{b1.wall:.2f} s); {_tail_text(tails['inc-base'])}")
    if args.baseline:
        print(f"\nthis checkout against {args.baseline} (same rounds, medians; ratio below 1: faster):\n")
        print("| measure | baseline | this checkout | ratio |")
        print("|---|---:|---:|---:|")
        for label, side in (("flow against the running server", "server"), ("flow with the temporary server", "temp"),
                            ("README first command", "sample")):
            b, n = median(t[f"base-{side}"]), median(t[side])
            print(f"| {label} | {b:.2f} s ({core / b:.2f} of core) | {n:.2f} s ({core / n:.2f} of core) | {n / b:.2f} |"
                  if side != "sample" else f"| {label} | {b:.2f} s | {n:.2f} s | {n / b:.2f} |")
    print("\nthe incremental build (+1 file), through the flow against the running server, medians:\n")
    print("| checkout | first build | incremental | ratio | its tokenize phase | its task runs |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, runs in inc_runs.items():
        lines = inc_lines.get(label, [])
        print(f"| {'baseline' if label == 'inc-base' else 'this checkout'} | {median([a.wall for a, _, _ in runs]):.2f} s | "
              f"{median([b.wall for _, b, _ in runs]):.2f} s | {median([b.wall / a.wall for a, b, _ in runs]):.2f} | "
              f"{median([l['rows'].get('tokenize', 0.0) for l in lines]):.2f} s | "
              f"{median([l.get('tasks', 0) for l in lines]):.0f} |")
    print("\nthe same incremental pair under `shardflow serve` (runs started through the API; medians):\n")
    print("| measure | first build | incremental (+1 input) | ratio |\n|---|---:|---:|---:|")
    if served is not None:
        print("\n".join(serve_report(served)))
    print(f"\nERROR or traceback lines in the output of successful builds: {len(bad)}")
    for l in bad[:10]:
        print(f"  {l}")


if __name__ == "__main__":
    main()
