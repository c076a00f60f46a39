"""The floors under the flow's fixed costs on this machine: what no change to shardflow can go below.

Alternating rounds, medians (every figure is a fresh process):

* ``python -c pass`` and ``python -c "import prefect.main"``: the interpreter, and Prefect's import,
  which every flow run from the command line pays before its flow run exists;
* the temporary server alone: Prefect's own temporary server, launched as Prefect launches it
  (``uvicorn --factory prefect.server.api.server:create_app`` in ephemeral mode), until
  ``/api/health`` answers: Prefect's floor, whatever shardflow does;
* the README's first command (the bundled sample, a fresh data root) on the temporary server,
  and against a running ``prefect server`` (the path ``shardflow build`` takes when one answers
  on 127.0.0.1:4200);
* with ``--corpus DIR --extra FILE``: the incremental pair (DIR's files, then with FILE added),
  first through the flow against the running server, then the same incremental with
  ``--no-prefect``: the core's own incremental cost, which the flow's can only add to.

    python bench/bench_floor.py --rounds 5 [--corpus C1000 --extra C_EXTRA/part-00000.parquet]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_flow import ROOT, Server, base_env, free_port  # noqa: E402

SAMPLE = ROOT / "tests" / "assets" / "sample.parquet"


def _wall(cmd: list[str], env: dict[str, str], cwd: Path) -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if proc.returncode:
        sys.exit(f"failed: {' '.join(cmd)}\n{proc.stderr[-2000:]}")
    return took


def _server_answers(home: Path) -> float:
    """Seconds from launching Prefect's temporary server, as Prefect itself does, to its first answer.

    (``SubprocessASGIServer``'s command and environment; this benchmark may read Prefect's internals,
    the product may not: ``flows/server.py`` reaches the same app through ``create_app(ephemeral=True)``.)
    """
    import importlib.util

    port = free_port()
    app_dir = str(Path(importlib.util.find_spec("prefect").origin).parent.parent)
    env = {**base_env(), "PREFECT_HOME": str(home), "PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1",
           "PREFECT__SERVER_FINAL": "1"}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "uvicorn", "--app-dir", app_dir, "--factory",
                             "prefect.server.api.server:create_app", "--host", "127.0.0.1", "--port", str(port),
                             "--log-level", "error", "--lifespan", "on"], env=env)
    try:
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/api/health", timeout=1).read()
                return time.perf_counter() - t0
            except OSError:
                if proc.poll() is not None:
                    sys.exit("the temporary server exited before it answered")
                time.sleep(0.02)
    finally:
        proc.terminate()
        proc.wait()


def _build(sources: Path, name: str, env: dict[str, str], work: Path, *extra: str) -> float:
    return _wall([sys.executable, "-m", "shardflow", "build", str(sources), "--name", name, "--data-root",
                  str(work / "data"), "--catalog", str(work / "catalog"), "--progress", "none", *extra], env, work)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--corpus", type=Path, help="a directory of Parquet files: also measure the incremental pair")
    ap.add_argument("--extra", type=Path, help="the file the incremental build adds (with --corpus)")
    args = ap.parse_args()
    if (args.corpus is None) != (args.extra is None):
        sys.exit("--corpus and --extra go together")
    work = Path(tempfile.mkdtemp(prefix="shardflow-bench-floor-"))
    server = Server(work)
    temp_home = work / "temp-home"
    env_temp = {**base_env(), "PREFECT_HOME": str(temp_home), "SHARDFLOW_REUSE_LOCAL_SERVER": "0"}
    env_srv = {**base_env(), "PREFECT_API_URL": server.url, "PREFECT_HOME": str(work / "client-home")}
    _server_answers(temp_home)  # a first start creates its database: not what a user meets twice
    res: dict[str, list[float]] = {}

    def note(label: str, seconds: float) -> None:
        res.setdefault(label, []).append(seconds)

    try:
        for i in range(args.rounds):
            note("python -c pass", _wall([sys.executable, "-c", "pass"], base_env(), work))
            note("python -c 'import prefect.main'", _wall([sys.executable, "-c", "import prefect.main"], base_env(), work))
            note("the temporary server answers (after launch)", _server_answers(temp_home))
            for label, env in (("README first command, temporary server", env_temp),
                               ("README first command, running server", env_srv)):
                run = Path(tempfile.mkdtemp(dir=work))
                note(label, _build(SAMPLE, "sample", env, run))
                shutil.rmtree(run)
            if args.corpus is not None:
                grown = Path(tempfile.mkdtemp(dir=work))
                for f in sorted(args.corpus.glob("*.parquet")):
                    os.symlink(f.resolve(), grown / f.name)
                runs = {side: Path(tempfile.mkdtemp(dir=work)) for side in ("flow", "core")}
                note("first build (1 of the pair), flow, running server", _build(grown, "inc", env_srv, runs["flow"]))
                _build(grown, "inc", env_srv, runs["core"], "--no-prefect")
                os.symlink(args.extra.resolve(), grown / f"zzzz-{args.extra.name}")  # sorts last: appended
                note("incremental (+1 file), flow, running server", _build(grown, "inc", env_srv, runs["flow"]))
                note("incremental (+1 file), --no-prefect", _build(grown, "inc", env_srv, runs["core"], "--no-prefect"))
                shutil.rmtree(grown)
                for r in runs.values():
                    shutil.rmtree(r)
            print(f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in res.items()), flush=True)
    finally:
        server.stop()
    print(f"\nmedians of {args.rounds} rounds (min-max), load average now {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores:\n")
    print("| measure | median | range |\n|---|---:|---:|")
    for k, v in res.items():
        print(f"| {k} | {statistics.median(v):.2f} s | {min(v):.2f}-{max(v):.2f} s |")
    if args.corpus is not None:
        first = statistics.median(res["first build (1 of the pair), flow, running server"])
        core = statistics.median(res["incremental (+1 file), --no-prefect"])
        prefect = statistics.median(res["python -c 'import prefect.main'"])
        print(f"\nthe core's own incremental is {core / first:.2f} of the flow's first build; with Prefect's import "
              f"alone added, {(core + prefect) / first:.2f} (the target: 0.25)")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
