"""Benchmark: what the statistics and the dataset card cost on a build's wall time, against a baseline checkout.

    python bench/bench_card.py --baseline /tmp/base                 # the README's first command, 5 rounds
    python bench/bench_card.py --baseline /tmp/base --corpus DIR    # the same on a corpus (--workers 2)
    python bench/bench_card.py --baseline /tmp/base --incremental DIR --rounds 5   # the card alone; +1 input of N

``--baseline DIR``: another checkout (``git worktree add DIR HEAD``, or ``git -C MAIN archive HEAD | tar -x -C DIR``).
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

``--incremental DIR`` (a directory of N Parquet inputs, ``make_corpus.py --mb 64 --files 16``) measures
instead, per checkout, each in a fresh process: the card alone (``write_card`` of a version with a
parent: its four plots and README, which a build pays; ``import shardflow.card`` before it, which a
build has paid already; and the process's wall time); a first build of all N inputs as a command (``shardflow build DIR --no-prefect``); the
incremental build that adds the last input to a version of the other N - 1 (a copy of one built once
per checkout), as a command, with the stats-card stage's span; and the same with ``--no-card``, the
floor the card's cost is measured against. The goal: incremental <= first / N + 1.0 s.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
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
    shards_end = max(e for stage, (_, e, _) in spans.items() if stage not in ("stats-card", "validate", "publish"))
    out = {"wall": wall, "cpu": cpu, "finalize": fin[2], "tail": fin[1] - shards_end}
    if "stats-card" in spans:
        out["stats_card"] = spans["stats-card"][2]
        out["stats_card_after_shards"] = max(0.0, spans["stats-card"][1] - shards_end)
    return out


# The card of a version with a parent, drawn in a fresh process: every import it needs included.
CARD = r"""
import json, sys, time
T0 = time.perf_counter()
from pathlib import Path
from shardflow.card import write_card
from shardflow.manifest import read_manifest
T1 = time.perf_counter()
version, parent, out = map(Path, sys.argv[1:])
write_card(out, read_manifest(version), parent=parent)
T2 = time.perf_counter()
print(json.dumps({"import_s": T1 - T0, "card_s": T2 - T1, "files": sorted(p.name for p in (out / "card").iterdir())}))
"""


def _command(tree: Path, cwd: Path, source: Path, extra: list[str]) -> dict:
    """``shardflow build SOURCE --no-prefect`` in ``cwd`` (its data root and catalog), a fresh process: wall and stage spans."""
    return run(tree, cwd / "prefect-home", cwd, source, "inc", ["--no-prefect", "--data-root", str(cwd / "data"),
                                                                   "--catalog", str(cwd / "catalog"), *extra])


def _incremental_setup(tree: Path, corpus: Path, work: Path) -> dict[str, Path]:
    """Once per checkout: a version of all inputs but the last (the template each incremental build copies),
    and a version with a parent for the card alone."""
    files = sorted(corpus.glob("*.parquet"))
    tpl = work / "template"
    src = tpl / "src"
    src.mkdir(parents=True)
    for f in files[:-1]:
        os.symlink(f.resolve(), src / f.name)
    _command(tree, tpl, src, [])
    child = work / "child"
    shutil.copytree(tpl, child, symlinks=True)
    os.symlink(files[-1].resolve(), child / "src" / files[-1].name)
    _command(tree, child, child / "src", [])
    return {"template": tpl, "v1": child / "data" / "inc" / "v1", "v2": child / "data" / "inc" / "v2",
            "last": files[-1].resolve(), "all": corpus.resolve()}


def _incremental_round(tree: Path, places: dict[str, Path], work: Path, n: int) -> dict:
    out = work / f"card-{n}"
    out.mkdir(parents=True)
    shutil.copy(places["v2"] / "stats.json", out)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", CARD, str(places["v2"]), str(places["v1"]), str(out)],
                          env=env_for(tree, work), capture_output=True, text=True)
    card_wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"the card failed ({tree}):\n{proc.stderr[-3000:]}")
    card = json.loads(proc.stdout.splitlines()[-1])
    first = _command(tree, work / f"first-{n}", places["all"], [])
    row = {"card_s": card["card_s"], "import_s": card["import_s"], "card_wall": card_wall, "first": first["wall"],
           "card_cpu": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime), "first_cpu": first["cpu"]}
    for label, extra in (("inc", []), ("inc_no_card", ["--no-card"])):
        w = work / f"{label}-{n}"
        shutil.copytree(places["template"], w, symlinks=True)
        os.symlink(places["last"], w / "src" / places["last"].name)
        r = _command(tree, w, w / "src", extra)
        row[label], row[f"{label}_cpu"] = r["wall"], r["cpu"]
        if label == "inc":
            row["stats_card"] = r.get("stats_card", 0.0)
            row["stats_card_after_shards"] = r.get("stats_card_after_shards", 0.0)
        shutil.rmtree(w)
    shutil.rmtree(work / f"first-{n}")
    shutil.rmtree(out)
    return row


def incremental(trees: dict[str, Path], corpus: Path, rounds: int, work: Path) -> None:
    nfiles = len(list(corpus.glob("*.parquet")))
    places = {side: _incremental_setup(tree, corpus, work / f"setup-{side}") for side, tree in trees.items()}
    res: dict[str, list[dict]] = {side: [] for side in trees}
    print(f"cores: {os.cpu_count()}, load average at start {os.getloadavg()[0]:.2f}; {nfiles} inputs in {corpus}", flush=True)
    for i in range(rounds):
        order = list(trees) if i % 2 == 0 else list(reversed(trees))
        for side in order:
            res[side].append(_incremental_round(trees[side], places[side], work / side, i))
        print(f"round {i + 1}: " + "; ".join(
            f"{s} card {res[s][-1]['card_s']:.3f} s (+ import {res[s][-1]['import_s']:.2f}), first {res[s][-1]['first']:.2f} s, +1 {res[s][-1]['inc']:.2f} s "
            f"(--no-card {res[s][-1]['inc_no_card']:.2f})" for s in trees), flush=True)
    med = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for side, rs in res.items()}
    print(f"\nmedians over {rounds} rounds; load average now {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores\n")
    print("| checkout | the card: import shardflow.card (s) | the card: its plots and README (s) | its process (s) | "
          "first build (s) | +1 input (s) | stats-card stage (s) | +1 with --no-card (s) | +1 ÷ first | goal: first/N + 1.0 s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for side, m in med.items():
        print(f"| {side} | {m['import_s']:.3f} | {m['card_s']:.3f} | {m['card_wall']:.2f} | {m['first']:.2f} | {m['inc']:.2f} | "
              f"{m['stats_card']:.2f} ({m['stats_card_after_shards']:.2f} after the shards) | {m['inc_no_card']:.2f} | "
              f"{m['inc'] / m['first']:.3f} | {m['first'] / nfiles + 1.0:.2f} |")
    t, b = med["this"], med["base"]
    print(f"| this ÷ base | {t['import_s'] / b['import_s']:.2f} | {t['card_s'] / b['card_s']:.3f} | {t['card_wall'] / b['card_wall']:.2f} | "
          f"{t['first'] / b['first']:.2f} | {t['inc'] / b['inc']:.2f} | | {t['inc_no_card'] / b['inc_no_card']:.2f} | | |")
    print("\nCPU seconds (user + system of each process: less noisy than wall time on a shared machine):\n")
    print("| checkout | the card's process | first build | +1 input | +1 with --no-card |")
    print("|---|---:|---:|---:|---:|")
    for side, m in med.items():
        print(f"| {side} | {m['card_cpu']:.2f} | {m['first_cpu']:.2f} | {m['inc_cpu']:.2f} | {m['inc_no_card_cpu']:.2f} |")
    print(f"| this ÷ base | {t['card_cpu'] / b['card_cpu']:.2f} | {t['first_cpu'] / b['first_cpu']:.2f} | "
          f"{t['inc_cpu'] / b['inc_cpu']:.2f} | {t['inc_no_card_cpu'] / b['inc_no_card_cpu']:.2f} |")
    print("\nall rounds: " + json.dumps(res))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, required=True)
    ap.add_argument("--corpus", type=Path, default=SAMPLE, help="a file or directory (default: the bundled sample)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--workers", type=int, default=None, help="--workers for the builds (default: the command's)")
    ap.add_argument("--core-only", action="store_true", help="only --no-prefect")
    ap.add_argument("--incremental", type=Path, metavar="DIR",
                    help="a directory of Parquet inputs: the card alone, a first build and +1 input, as commands")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="bench-card-"))
    trees = {"this": ROOT, "base": args.baseline.resolve()}
    if args.incremental:
        try:
            incremental(trees, args.incremental, args.rounds, work)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return
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
