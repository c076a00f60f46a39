"""Benchmark: opening a version of 35,000 shards, warm and with its files evicted: seconds and peak memory (issue 43).

    python bench/bench_open.py                          # makes the versions in a temporary directory, 5 runs each
    python bench/bench_open.py --work DIR --runs 7      # makes them in DIR, or reuses them from an earlier run
    python bench/bench_open.py --layouts table          # only the version whose shards are in a shard table

Makes (``tests/support/wide_version.py``: a real build of ``tests/assets/sample.parquet``
for the manifest's fields, then ``--shards`` shards of 64 tokens written with the
formats' own header and index encoders, a manifest naming them, ``publish_out``
into a catalog) two published versions of the same shards, which the catalog lists
and ``shardflow validate`` passes (run once, when a version is made):

* ``table``: the manifest lists the shards in a shard table beside it
  (``shards.tsv``, schema 4, ``shardflow.shard_table``);
* ``yaml``: the manifest lists them in its YAML (schema 3, what builds write).

Then, for each layout, opens it with default options (``seq_len=16``, the one
required option, for the datasets) in a fresh process per run, the imports done
before the clock starts: ``TokenDataset(ref, catalog=...)``,
``StreamingTokenDataset(ref, catalog=...)`` and ``open_shards(ref, catalog=...)``.
Two floors are measured the same way: ``read``, reading the manifest's bytes (and
the table's), and ``yaml``, ``yaml.load(text, Loader=yaml.CSafeLoader)`` of the
manifest (the fastest plain PyYAML load: libyaml's parser). Each run is
``warm`` (the files were read by the run before) or ``evicted``: before it, every
file of the version directory, the catalog's files and the publisher record are
dropped from the page cache (``os.posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED)``
on each, after one ``sync``; directory entries and inodes stay cached, which
fadvise does not reach). The openers are rotated from run to run.

Reported per layout, cache state and opener: the median of ``--runs`` runs (at
least 5) and the range, wall seconds, against the 2 s target (warm), and the
median CPU seconds of the process (what the open costs whatever else the
machine runs: on a shared machine the wall times vary with its load); the peak memory
the open added (Linux's ``VmHWM`` after it minus ``VmRSS`` before it, the peak
reset there through ``/proc/self/clear_refs``; else ``ru_maxrss``); and the ratio
of its median CPU seconds to each floor's (CPU, not wall: the ratio then does
not move with the machine's load). ``--out FILE`` writes it all as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "src"), str(ROOT / "tests")]

from support.wide_version import WideVersion, wide_version  # noqa: E402
from shardflow.catalog import Catalog  # noqa: E402
from shardflow.provenance import publisher_record  # noqa: E402

TARGET_S = 2.0
OPENERS = ("TokenDataset", "StreamingTokenDataset", "open_shards")
FLOORS = ("read", "yaml")

CHILD = r"""
import json, os, resource, sys, time
which, ref, catalog, directory = sys.argv[1:5]
import yaml
from shardflow.runtime import StreamingTokenDataset, TokenDataset, open_shards

def status(key):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    return None

before = status("VmRSS")
try:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current RSS: the peak below is this open's
    reset = True
except OSError:
    reset = False
maxrss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
manifest = os.path.join(directory, "metadata.yaml")
table = os.path.join(directory, "shards.tsv")
t, cpu = time.perf_counter(), time.process_time()
if which == "TokenDataset":
    obj = TokenDataset(ref, catalog=catalog, seq_len=16)
elif which == "StreamingTokenDataset":
    obj = StreamingTokenDataset(ref, catalog=catalog, seq_len=16)
elif which == "open_shards":
    obj = open_shards(ref, catalog=catalog)
elif which == "read":
    obj = [open(p, "rb").read() for p in (manifest, table) if os.path.exists(p)]
elif which == "yaml":
    with open(manifest, encoding="utf-8") as f:
        obj = yaml.load(f.read(), Loader=yaml.CSafeLoader)
seconds, cpu_seconds = time.perf_counter() - t, time.process_time() - cpu
hwm = status("VmHWM")
if reset and hwm is not None and before is not None:
    peak = hwm - before
else:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - maxrss0
print(json.dumps({"seconds": seconds, "cpu_seconds": cpu_seconds, "peak_bytes": peak}))
"""


def make(work: Path, shards: int, layout: str) -> tuple[WideVersion, float | None]:
    """The ``layout`` version of ``shards`` shards in ``work`` (made and validated unless already there)."""
    root = work / layout
    fresh = not (root / "data").is_dir()
    t = time.perf_counter()
    w = wide_version(root, shards, table=layout == "table")
    if fresh:
        subprocess.run([sys.executable, "-m", "shardflow", "validate", w.ref, "--catalog", str(w.catalog)],
                       check=True, capture_output=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    made = time.perf_counter() - t if fresh else None
    name, version = w.ref.split("@")
    assert Catalog(w.catalog).entry(name, version) is not None, f"the catalog does not list {w.ref}"
    return w, made


def evict(w: WideVersion) -> int:
    """Drop the version's files, its catalog's and its publisher record from the page cache; returns the count."""
    paths = [publisher_record(w.directory)]
    for top in (w.directory, w.catalog):
        for base, _dirs, files in os.walk(top):
            paths.extend(Path(base, f) for f in files)
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return len(paths)


def run_child(which: str, w: WideVersion) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", CHILD, which, w.ref, str(w.catalog), str(w.directory)],
        check=True, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def measure(w: WideVersion, runs: int, cache: str) -> dict[str, list[dict[str, float]]]:
    kinds = OPENERS + FLOORS
    got: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    if cache == "warm":
        for k in kinds:
            run_child(k, w)  # untimed: fills the page cache with what this kind reads
    for r in range(runs):
        for k in kinds[r % len(kinds):] + kinds[: r % len(kinds)]:
            if cache == "evicted":
                evict(w)
            got[k].append(run_child(k, w))
    return got


def summary(got: dict[str, list[dict[str, float]]]) -> dict[str, dict[str, float]]:
    out = {}
    for k, rs in got.items():
        secs = [r["seconds"] for r in rs]
        out[k] = {"median_s": statistics.median(secs), "min_s": min(secs), "max_s": max(secs),
                  "median_cpu_s": statistics.median(r["cpu_seconds"] for r in rs),
                  "peak_mb": statistics.median(r["peak_bytes"] for r in rs) / 2**20, "runs": len(rs)}
    return out


def measure_caches(w: WideVersion, runs: int, *, ratios: bool = True) -> dict[str, dict[str, dict[str, float]]]:
    """Each opener and floor, ``runs`` times with a warm and with an evicted page cache: printed, and the summaries."""
    out = {}
    for cache in ("warm", "evicted"):
        s = out[cache] = summary(measure(w, runs, cache))
        print(f"  {cache} ({runs} runs each, median [min-max]):")
        for k in OPENERS + FLOORS:
            row = s[k]
            line = (f"    {k:<22} {row['median_s']:7.3f} s [{row['min_s']:.3f}-{row['max_s']:.3f}] "
                    f"CPU {row['median_cpu_s']:7.3f} s  peak +{row['peak_mb']:7.1f} MB")
            if ratios and k in OPENERS:
                line += "  " + "  ".join(f"{row['median_cpu_s'] / max(s[f]['median_cpu_s'], 1e-6):7.1f}x {f}" for f in FLOORS)
                line += "" if cache != "warm" else (" ok" if row["median_s"] <= TARGET_S else " OVER 2 s")
            print(line)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, help="where the versions are made, or reused from (default: a temporary directory)")
    ap.add_argument("--shards", type=int, default=35_000)
    ap.add_argument("--runs", type=int, default=5, help="fresh processes per opener, layout and cache state (at least 5)")
    ap.add_argument("--layouts", default="table,yaml", help="table, yaml or both (comma-separated)")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    args = ap.parse_args()
    runs = max(5, args.runs)
    layouts = [x for x in args.layouts.split(",") if x]
    tmp = None
    if args.work is None:
        tmp = tempfile.TemporaryDirectory(prefix="bench-open-")
        args.work = Path(tmp.name)
    report: dict[str, object] = {"shards": args.shards, "runs": runs, "target_s": TARGET_S, "layouts": {}}
    try:
        for layout in layouts:
            w, made = make(args.work, args.shards, layout)
            manifest_mb = (w.directory / "metadata.yaml").stat().st_size / 2**20
            table = w.directory / "shards.tsv"
            table_mb = table.stat().st_size / 2**20 if table.exists() else 0.0
            print(f"\n{layout}: {w.ref}, {args.shards:,} shards, manifest {manifest_mb:.2f} MB, table {table_mb:.2f} MB"
                  + (f" (made and validated in {made:.1f} s)" if made is not None else " (reused)"))
            os.sync()  # dirty pages cannot be evicted
            entry: dict[str, object] = {"ref": w.ref, "manifest_mb": manifest_mb, "table_mb": table_mb}
            entry.update(measure_caches(w, runs))
            report["layouts"][layout] = entry  # type: ignore[index]
    finally:
        if tmp is not None:
            tmp.cleanup()
    if args.out:
        args.out.write_text(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
