"""Benchmark: what collecting the statistics (stats.json and the card) costs, as a share of the build.

    python bench/bench_stats.py                      # a 50 MB corpus from make_corpus.py, 3 rounds
    python bench/bench_stats.py --corpus DIR --rounds 5 --stats-column source

One run, alternating: each round builds the same corpus three times, each
build in a fresh process into a fresh data root: with statistics off
(``BuildConfig(stats=False)``, ``--no-stats``: no per-unit counts, no stats.json,
no card), with the statistics but no card (``card=False``, ``--no-card``), and
as by default (statistics and card); the order rotates every round so that no side always runs first on
a warm page cache. The baseline is measured in the same run, on the same
machine, at the same time.

Reported: per round and as medians, each side's wall and CPU seconds; the
cost of collecting the statistics, ``median(stats) / median(off) - 1``
(target: under 5%), and with the card; inside the builds, the time
the stats-card stage spends merging the statistics into stats.json and drawing the
card (three PNGs, drawn with Pillow: a small fixed cost, whatever the corpus
size, beside the shard jobs), plus finalize's card text; and that the builds wrote
stats.json and the card's PNGs. On a shared machine wall times are
noisy: use several rounds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAKE_CORPUS = ROOT.parent / "shared" / "tools" / "make_corpus.py"

E2E = r"""
import importlib, json, resource, sys, time
from pathlib import Path
publish = importlib.import_module("shardflow.pipeline.publish")  # the package re-exports a function of that name
card_stage = importlib.import_module("shardflow.pipeline.card_stage")
from shardflow.pipeline import build
from shardflow.config import BuildConfig
corpus, out, column, options = sys.argv[1], sys.argv[2], sys.argv[3] or None, json.loads(sys.argv[4])
spent = {"stats": 0.0, "card": 0.0}
def timed(name, fn):
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[name] += time.perf_counter() - t
    return wrapper
card_stage.write_stats = timed("stats", card_stage.write_stats)
card_stage.draw_plots = timed("card", card_stage.draw_plots)
publish.write_card_text_quietly = timed("card", publish.write_card_text_quietly)
t0 = time.perf_counter()
r = build(BuildConfig(name="bench", sources=(corpus,), stats_column=column, val_fraction=0.01, **options),
          data_root=out + "/data", catalog=out + "/manifests", workers=2)
dt = time.perf_counter() - t0
d = Path(r.manifest_path).parent
pngs = sorted(p.name for p in (d / "card").glob("*.png")) if (d / "card").is_dir() else []
ru = resource.getrusage(resource.RUSAGE_SELF)
print(json.dumps({"seconds": dt, "cpu_seconds": ru.ru_utime + ru.ru_stime, "stats_json": (d / "stats.json").exists(), "pngs": pngs,
                  "finalize_stats_s": spent["stats"], "finalize_card_s": spent["card"]}))
"""


# Each side's BuildConfig options.
SIDES = {
    "off": {"stats": False},   # no statistics, no card: the baseline (--no-stats)
    "stats": {"card": False},  # statistics collected, stats.json, no card (--no-card)
    "card": {},                # the default: statistics and the card
}


def run_build(corpus: Path, side: str, column: str | None) -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory(prefix="bench-stats-") as out:
        proc = subprocess.run([sys.executable, "-c", E2E, str(corpus), out, column or "", json.dumps(SIDES[side])], env=env,
                              capture_output=True, text=True, check=False)
        if proc.returncode:
            raise SystemExit(f"build failed:\n{proc.stderr[-3000:]}")
        return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, help="a directory of Parquet files (default: make one with make_corpus.py)")
    ap.add_argument("--mb", type=float, default=50, help="size of the corpus to make (default 50 MB)")
    ap.add_argument("--files", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stats-column", default="source", help="the --stats-column of the 'on' builds ('' for none)")
    args = ap.parse_args()
    tmp = None
    corpus = args.corpus
    if corpus is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-stats-corpus-")
        corpus = Path(tmp.name)
        subprocess.run([sys.executable, str(MAKE_CORPUS), str(corpus), "--mb", str(args.mb), "--files", str(args.files)],
                       check=True, capture_output=True)
    size = sum(p.stat().st_size for p in corpus.glob("*.parquet")) / 1e6
    print(f"corpus: {corpus} ({size:.1f} MB of Parquet), {args.rounds} rounds, workers=2, cpus={os.cpu_count()}")
    wall: dict[str, list[float]] = {k: [] for k in SIDES}
    cpu: dict[str, list[float]] = {k: [] for k in SIDES}
    cards, merges = [], []
    for r in range(args.rounds):
        order = list(SIDES)
        order = order[r % 3 :] + order[: r % 3]  # rotate, so that no side always runs first
        got = {side: run_build(corpus, side, args.stats_column or None) for side in order}
        assert got["card"]["stats_json"] and got["stats"]["stats_json"] and not got["off"]["stats_json"]
        assert got["card"]["pngs"] and not got["stats"]["pngs"]
        for side in SIDES:
            wall[side].append(got[side]["seconds"])
            cpu[side].append(got[side]["cpu_seconds"])
        cards.append(got["card"]["finalize_card_s"])
        merges.append(got["stats"]["finalize_stats_s"])
        print(f"round {r + 1}: " + ", ".join(f"{s} {got[s]['seconds']:.2f} s ({got[s]['cpu_seconds']:.1f} CPU s)" for s in SIDES)
              + f"; stats.json merge {got['stats']['finalize_stats_s']:.2f} s, card {got['card']['finalize_card_s']:.2f} s "
              f"({', '.join(got['card']['pngs'])})")
    med = statistics.median
    base, base_cpu = med(wall["off"]), med(cpu["off"])
    print(f"median wall: off {base:.2f} s, stats {med(wall['stats']):.2f} s, stats + card {med(wall['card']):.2f} s")
    print(f"collecting the statistics: {100 * (med(wall['stats']) / base - 1):+.1f}% wall, "
          f"{100 * (med(cpu['stats']) / base_cpu - 1):+.1f}% CPU (target < 5%); stats.json merge {med(merges):.3f} s")
    print(f"with the card: {100 * (med(wall['card']) / base - 1):+.1f}% wall, {100 * (med(cpu['card']) / base_cpu - 1):+.1f}% CPU "
          f"(drawing it: {med(cards):.2f} s, beside the shard jobs; a fixed cost, whatever the corpus size)")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
