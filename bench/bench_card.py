"""Benchmark: what the statistics and the dataset card cost on a build's wall time, against a baseline checkout.

    python bench/bench_card.py --baseline /tmp/base                 # the README's first command, 5 rounds
    python bench/bench_card.py --baseline /tmp/base --corpus DIR    # the same on a corpus (--workers 2)

``--baseline DIR``: another checkout (``git -C MAIN archive HEAD | tar -x -C DIR``).
Each round runs, alternating this checkout and the baseline (the order
rotating every round), each build in a fresh process, fresh directories:

* the README's first command, ``shardflow build SOURCE --name NAME`` (the
  flow, with the temporary server; a ``PREFECT_HOME`` per checkout, warmed
  by one build first, as after a first use);
* the same with ``--no-prefect`` (the core).

Inside every build, each stage's function is timed (wrapped in the stage
table, which both checkouts have): when it first started and last ended,
from the process start. Reported (medians): the wall time, the CPU time (the
build process and the children it waited for); ``finalize``
(the ``validate`` stage: the manifest, the card and, in the baseline, the
wait for the card's thread); and the tail after the shards, from the last
validate-shard job's end to the end of ``finalize``, which holds any wait
for the card wherever it was drawn; the ``stats-card`` stage where there is one.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLE = ROOT / "tests" / "assets" / "sample.parquet"

# The command line, with each stage's function timed; the times are printed when publish returns
# (the command line may leave without the interpreter's teardown).
TIMED_CLI = r"""
import dataclasses, json, sys, time
T0 = time.perf_counter()
import shardflow.pipeline as b, shardflow.pipeline.run as r, shardflow.pipeline.stages as s
spans = {}
def timed(stage):
    def run(plan, *job):
        t = time.perf_counter() - T0
        try:
            return stage.run(plan, *job)
        finally:
            a, e, n = spans.get(stage.name, (t, 0.0, 0.0))
            end = time.perf_counter() - T0
            spans[stage.name] = (min(a, t), max(e, end), n + end - t)
            if stage.name == "publish":
                print("STAGE-TIMES " + json.dumps(spans), file=sys.stderr, flush=True)
    return dataclasses.replace(stage, run=run)
table = tuple(timed(x) for x in s.STAGES)
s.STAGES = r.STAGES = b.STAGES = table
from shardflow.cli.commands import main
sys.exit(main(sys.argv[1:]))
"""


def env_for(tree: Path, home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PYTHONPATH=f"{tree / 'src'}:{tree}", PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONUNBUFFERED="1",
               PREFECT_HOME=str(home))
    return env


def run(tree: Path, home: Path, cwd: Path, source: Path, name: str, extra: list[str]) -> dict:
    cwd.mkdir(parents=True, exist_ok=True)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", TIMED_CLI, "build", str(source), "--name", name, "--progress", "none", *extra],
                          env=env_for(tree, home), cwd=cwd, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    if proc.returncode != 0:
        sys.exit(f"build failed ({tree}):\n{proc.stderr[-3000:]}")
    line = next(l for l in proc.stderr.splitlines() if l.startswith("STAGE-TIMES "))
    spans = json.loads(line.split(" ", 1)[1])
    fin = spans["validate"]
    shards_end = spans["validate-shard"][1]
    out = {"wall": wall, "cpu": cpu, "finalize": fin[2], "tail": fin[1] - shards_end}
    if "stats-card" in spans:
        out["stats_card"] = spans["stats-card"][2]
        out["stats_card_after_shards"] = max(0.0, spans["stats-card"][1] - shards_end)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True)
    ap.add_argument("--corpus", type=Path, default=SAMPLE, help="a file or directory (default: the bundled sample)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=None, help="--workers for the builds (default: the command's)")
    ap.add_argument("--core-only", action="store_true", help="only --no-prefect")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-card-"))
    trees = {"this": ROOT, "base": args.baseline.resolve()}
    homes = {side: work / f"home-{side}" for side in trees}
    extra = ["--workers", str(args.workers)] if args.workers else []
    modes = {"core": ["--no-prefect"]} if args.core_only else {"flow": [], "core": ["--no-prefect"]}
    for side, tree in trees.items():  # warm-ups: the temporary server's database, the page cache
        run(tree, homes[side], work / f"warm-{side}", SAMPLE, "warm", [])
    res: dict[tuple[str, str], list[dict]] = {(m, s): [] for m in modes for s in trees}
    print(f"cores: {os.cpu_count()}, load average at start {os.getloadavg()[0]:.2f}; source {args.corpus}", flush=True)
    for i in range(args.rounds):
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for mode, margs in modes.items():
            for side in order:
                r = run(trees[side], homes[side], work / f"{mode}-{side}-{i}", args.corpus, "sample", [*margs, *extra])
                res[(mode, side)].append(r)
        print(f"round {i + 1}: " + "; ".join(
            f"{m} {s} {res[(m, s)][-1]['wall']:.2f} s (finalize {res[(m, s)][-1]['finalize']:.2f}, "
            f"tail {res[(m, s)][-1]['tail']:.2f})" for m in modes for s in trees), flush=True)
    print(f"\nmedians over {args.rounds} rounds; load average now {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores\n")
    print("| build | checkout | wall (s) | CPU (s) | finalize (s) | after the last shard check to the end of finalize (s) | stats-card stage (s) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for mode in modes:
        for side in trees:
            rs = res[(mode, side)]
            med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
            card = f"{med['stats_card']:.2f} ({med['stats_card_after_shards']:.2f} after the shards)" if "stats_card" in med else "—"
            print(f"| {mode} | {side} | {med['wall']:.2f} | {med['cpu']:.2f} | {med['finalize']:.2f} | {med['tail']:.2f} | {card} |")
        b = statistics.median(r["wall"] for r in res[(mode, "base")])
        n = statistics.median(r["wall"] for r in res[(mode, "this")])
        bc = statistics.median(r["cpu"] for r in res[(mode, "base")])
        nc = statistics.median(r["cpu"] for r in res[(mode, "this")])
        print(f"| {mode} | this ÷ base | {n / b:.2f} | {nc / bc:.2f} | | | |")
    print("\nall walls: " + "; ".join(f"{m} {s}: " + ", ".join(f"{r['wall']:.2f}" for r in res[(m, s)]) for m in modes for s in trees))


if __name__ == "__main__":
    main()
