"""Benchmark: what collecting the statistics (stats.json and the card) costs, as a share of the build.

    python bench/bench_stats.py                      # a 50 MB corpus from make_corpus.py, 3 rounds
    python bench/bench_stats.py --corpus DIR --rounds 5 --stats-column source

One run, alternating: each round builds the same corpus twice, each build in a
fresh process into a fresh data root, once with statistics off
(``SHARDFLOW_STATS=0``: no per-unit counts, no stats.json, no card) and once
with them on (the default), the order swapped every round so that neither
side always runs first on a warm page cache. The baseline is measured in the
same run, on the same machine, at the same time.

Reported: the median end-to-end seconds of each side, the overhead
``median(on) / median(off) - 1`` (target: under 5%), the per-round ratios,
the time ``finalize`` spends on the statistics and the card alone (measured
inside the "on" builds), and that every "on" build wrote stats.json and the
card's PNGs.
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
import json, sys, time
from pathlib import Path
import shardflow.build.publish as publish
from shardflow.build import build
from shardflow.config import BuildConfig
corpus, out, column = sys.argv[1], sys.argv[2], sys.argv[3] or None
spent = {"stats": 0.0, "card": 0.0}
def timed(name, fn):
    def wrapper(*a, **k):
        t = time.perf_counter()
        try:
            return fn(*a, **k)
        finally:
            spent[name] += time.perf_counter() - t
    return wrapper
publish.write_stats = timed("stats", publish.write_stats)
publish.write_card_quietly = timed("card", publish.write_card_quietly)
t0 = time.perf_counter()
r = build(BuildConfig(name="bench", sources=(corpus,), stats_column=column, val_fraction=0.01),
          data_root=out + "/data", catalog=out + "/manifests", workers=2)
dt = time.perf_counter() - t0
d = Path(r.manifest_path).parent
pngs = sorted(p.name for p in (d / "card").glob("*.png")) if (d / "card").is_dir() else []
print(json.dumps({"seconds": dt, "stats_json": (d / "stats.json").exists(), "pngs": pngs,
                  "finalize_stats_s": spent["stats"], "finalize_card_s": spent["card"]}))
"""


def run_build(corpus: Path, stats: bool, column: str | None) -> dict:
    env = dict(os.environ, SHARDFLOW_STATS="1" if stats else "0")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "src"), str(ROOT), env.get("PYTHONPATH", "")])
    with tempfile.TemporaryDirectory(prefix="bench-stats-") as out:
        proc = subprocess.run([sys.executable, "-c", E2E, str(corpus), out, column or ""], env=env,
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
    off, on, ratios = [], [], []
    for r in range(args.rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {}
        for stats in order:
            got[stats] = run_build(corpus, stats, args.stats_column or None)
        off.append(got[False]["seconds"])
        on.append(got[True]["seconds"])
        ratios.append(got[True]["seconds"] / got[False]["seconds"])
        assert got[True]["stats_json"] and not got[False]["stats_json"]
        print(f"round {r + 1}: off {got[False]['seconds']:.2f} s, on {got[True]['seconds']:.2f} s "
              f"(ratio {ratios[-1]:.3f}; finalize: stats {got[True]['finalize_stats_s']:.2f} s, "
              f"card {got[True]['finalize_card_s']:.2f} s); card PNGs: {', '.join(got[True]['pngs'])}")
    overhead = statistics.median(on) / statistics.median(off) - 1
    print(f"median: off {statistics.median(off):.2f} s, on {statistics.median(on):.2f} s; "
          f"overhead {100 * overhead:+.1f}% (target < 5%); per-round ratios {', '.join(f'{x:.3f}' for x in ratios)}")
    if tmp is not None:
        tmp.cleanup()


if __name__ == "__main__":
    main()
