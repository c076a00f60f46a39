"""Benchmark: end-to-end build throughput against the raw tokenizer on the same cores.

    python bench/bench_build.py                      # makes a 1000 MB corpus with make_corpus.py
    python bench/bench_build.py --corpus DIR --small-mb 100
    python bench/bench_build.py --mb 300 --compare-with b9be734     # this checkout vs a commit, alternating

For each backend it measures, each in a fresh process (so no warm caches are
shared between measurements):

* raw: the tokenizer alone encoding the corpus's texts already in memory
  (``encode_batch`` over 4096-document batches), in tokens/s;
* end-to-end: ``shardflow.build.build`` (read Parquet, tokenize, write shards
  and indexes, validate with checksums, publish), in tokens/s, and its peak RSS;
* the ratio end-to-end / raw (target: >= 0.60 for the fast backend);
* a ceiling on that ratio: the CPU work every build must do besides tokenizing
  (decode the Parquet text column, SHA-256 of the inputs, SHA-256 of the output
  tokens on write and again at validation), measured in the same process as the
  tokenizer, spread over all cores with nothing else done.

The tiktoken backend runs on a smaller corpus (``--small-mb``) because it is
about 10x slower. Peak memory is reported for the small and the large corpus,
to show it does not grow with the corpus. Prefect's temporary-server start-up
is measured separately (a trivial flow in a fresh process), and so is the
Prefect flow's own end-to-end time on the large corpus.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAKE_CORPUS = ROOT.parent / "shared" / "tools" / "make_corpus.py"

RAW = r"""
import glob, json, sys, time
import pyarrow.parquet as pq
from shardflow.tokenizers import load_tokenizer
corpus, backend, batch_rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = load_tokenizer("cl100k_base", backend=backend)
batches = []  # Arrow string arrays already in memory: the same input the pipeline passes
for f in sorted(glob.glob(corpus + "/**/*.parquet", recursive=True)):
    col = pq.read_table(f, columns=["text"]).column(0).combine_chunks()
    batches.extend(col.slice(i, batch_rows) for i in range(0, len(col), batch_rows))
t0 = time.perf_counter()
n = 0
for texts in batches:
    tokens, offsets = tok.encode_batch(texts)
    n += len(tokens)
dt = time.perf_counter() - t0
print(json.dumps({"tokens": n, "seconds": dt, "backend": tok.backend}))
"""

E2E = r"""
import json, sys, time, resource
from shardflow.build import build
from shardflow.config import BuildConfig
from shardflow.reader import open_version
corpus, backend, out = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = time.perf_counter()
r = build(BuildConfig(name="bench", sources=(corpus,), backend=backend), data_root=out + "/data", catalog=out + "/manifests", workers=2)
dt = time.perf_counter() - t0
m = open_version(r.ref, catalog=out + "/manifests").manifest
print(json.dumps({"tokens": m.totals["tokens"], "documents": m.totals["documents"], "seconds": dt,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

PHASES = r"""
import json, sys, time
from concurrent.futures import ThreadPoolExecutor
from shardflow import build as b
from shardflow.config import BuildConfig
corpus, out = sys.argv[1], sys.argv[2]
t = {}
t0 = time.perf_counter()
plan = b.plan_build(BuildConfig(name="bench", sources=(corpus,)), data_root=out + "/data", catalog=out + "/manifests")
t["plan (fingerprint inputs)"] = time.perf_counter() - t0
t0 = time.perf_counter()
with ThreadPoolExecutor(2) as pool:
    tokens = sum(r.tokens for r in pool.map(lambda u: b.tokenize_unit(plan, u), range(len(plan.units))))
t["read + tokenize + write parts"] = time.perf_counter() - t0
t0 = time.perf_counter()
layout = b.make_layout(plan)
with ThreadPoolExecutor(2) as pool:
    list(pool.map(lambda sk: b.write_shard(plan, *sk), layout.shard_jobs()))
t["layout + write shards"] = time.perf_counter() - t0
t0 = time.perf_counter()
b.finalize(plan)
t["validate (re-read, SHA-256)"] = time.perf_counter() - t0
t0 = time.perf_counter()
b.publish(plan)
t["publish"] = time.perf_counter() - t0
print(json.dumps({"tokens": tokens, "phases": t}))
"""

CEILING = r"""
import glob, hashlib, json, os, resource, sys, time
import pyarrow.parquet as pq
from shardflow.tokenizers import load_tokenizer
corpus, backend = sys.argv[1], sys.argv[2]
files = sorted(glob.glob(corpus + "/**/*.parquet", recursive=True))
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
def batches(f):
    pf = pq.ParquetFile(f, buffer_size=1 << 20, pre_buffer=False)
    return (b.column(0) for b in pf.iter_batches(batch_size=4096, columns=["text"], use_threads=False))
# 1. Decode the text column as the pipeline reads it: streamed, each batch dropped once used
#    (keeping them all would add the page faults of a corpus-sized allocation).
c0 = cpu()
for f in files:
    for _ in batches(f):
        pass
decode_cpu = cpu() - c0
texts = [b for f in files for b in batches(f)]
# 2. The tokenizer alone, in memory: its wall time and the CPU time it uses.
tok = load_tokenizer("cl100k_base", backend=backend)
t0, c0, n = time.perf_counter(), cpu(), 0
for batch in texts:
    tokens, offsets = tok.encode_batch(batch)
    n += len(tokens) + len(offsets) - 1  # with one boundary token per document
tok_wall, tok_cpu = time.perf_counter() - t0, cpu() - c0
# 3. SHA-256 of the inputs (their content fingerprint).
c0 = cpu()
for f in files:
    with open(f, "rb") as fh:
        hashlib.file_digest(fh, "sha256")
in_hash_cpu = cpu() - c0
# 4. SHA-256 of the output bytes (the tokens at 4 bytes each), once.
block = bytes(64 << 20)
c0, h, left = cpu(), hashlib.sha256(), n * 4
while left > 0:
    h.update(block[: min(left, len(block))])
    left -= len(block)
out_hash_cpu = cpu() - c0
cores = os.cpu_count() or 1
# No build can take less wall time than its unavoidable CPU work spread over every core:
# decoding, tokenizing, hashing the inputs, and hashing the outputs twice (on write and at validation).
floor = max(tok_wall, (decode_cpu + tok_cpu + in_hash_cpu + 2 * out_hash_cpu) / cores)
print(json.dumps({"tokens": n, "tok_wall": tok_wall, "tok_cpu": tok_cpu, "decode_cpu": decode_cpu,
                  "in_hash_cpu": in_hash_cpu, "out_hash_cpu": out_hash_cpu, "cores": cores,
                  "floor_seconds": floor, "ratio_ceiling": tok_wall / floor}))
"""

DISK = r"""
import json, os, sys, time
path = sys.argv[1]
block = b"\0" * (8 << 20)
t0 = time.perf_counter()
with open(path, "wb") as f:
    for _ in range(128):
        f.write(block)
    f.flush()
    os.fsync(f.fileno())
dt = time.perf_counter() - t0
os.remove(path)
print(json.dumps({"mb_per_s": 1024 / dt}))
"""

PREFECT_STARTUP = r"""
import json, time
t0 = time.perf_counter()
from prefect import flow
@flow
def noop() -> int:
    return 1
noop()
print(json.dumps({"seconds": time.perf_counter() - t0}))
"""

PREFECT_E2E = r"""
import json, sys, time
t0 = time.perf_counter()
from shardflow.flows.build import build_dataset
from shardflow.config import BuildConfig
corpus, out = sys.argv[1], sys.argv[2]
ref = build_dataset(config=BuildConfig(name="bench", sources=(corpus,)), workers=2, data_root=out + "/data", catalog=out + "/manifests")
print(json.dumps({"seconds": time.perf_counter() - t0, "ref": ref}))
"""


def run_py(code: str, *args: str, tree: Path = ROOT) -> dict:
    """Run ``code`` in a fresh process on the shardflow of ``tree`` (this checkout, or a baseline's)."""
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}:{tree}", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"benchmark step failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def make_corpus(path: Path, mb: int, files: int) -> Path:
    if not path.exists():
        print(f"making a {mb} MB corpus in {path} ...", flush=True)
        subprocess.run([sys.executable, str(MAKE_CORPUS), str(path), "--mb", str(mb), "--files", str(files)], check=True)
    return path


def compare_with(ref: str, corpus: Path, work: Path, rounds: int) -> None:
    """End-to-end build time of this checkout against git ``ref``, alternating runs, same corpus.

    The two builds run in turns (A B A B ...) so that noise from the shared
    machine hits both alike; the medians and their ratio are printed.
    """
    import statistics

    base = work / f"baseline-{ref.replace('/', '_')}"
    if not base.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), ref], check=True,
                       capture_output=True)
    times: dict[str, list[float]] = {"this checkout": [], ref: []}
    try:
        for _ in range(rounds):
            for label, tree in (("this checkout", ROOT), (ref, base)):
                out = tempfile.mkdtemp(prefix="cmp-", dir=work)
                r = run_py(E2E, str(corpus), "gigatoken", out, tree=tree)
                times[label].append(r["seconds"])
                print(f"  {label:14s} {r['seconds']:6.2f} s  ({r['tokens'] / r['seconds'] / 1e6:.1f} M tok/s)", flush=True)
    finally:
        subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)], capture_output=True)
    ours, theirs = statistics.median(times["this checkout"]), statistics.median(times[ref])
    print(f"\nmedian end-to-end build over {rounds} alternating runs on {corpus.name}: this checkout {ours:.2f} s, "
          f"{ref} {theirs:.2f} s; ratio {ours / theirs:.3f} (below 1: faster)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, help="a Parquet corpus directory (default: make a --mb corpus)")
    ap.add_argument("--mb", type=int, default=1000)
    ap.add_argument("--small-mb", type=int, default=300)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--skip-prefect", action="store_true")
    ap.add_argument("--compare-with", metavar="GIT_REF",
                    help="only compare the end-to-end build with another commit's, alternating runs")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each side with --compare-with")
    args = ap.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="shardflow-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    big = args.corpus or make_corpus(work / f"corpus-{args.mb}mb", args.mb, 16)
    if args.compare_with:
        compare_with(args.compare_with, big, work, args.rounds)
        return
    # Same size of file as the big corpus (1000 MB / 16 files), so peak memory compares like with like.
    small = make_corpus(work / f"corpus-{args.small_mb}mb", args.small_mb, max(1, round(args.small_mb * 16 / args.mb)))
    print(f"cores: {os.cpu_count()}  corpus: {big}  small corpus: {small}\n", flush=True)

    rows = []
    big_tokens = 0
    for backend, corpus in (("gigatoken", big), ("tiktoken", small)):
        # The raw rate is the tokenizer's best in-memory rate: batches of 4096 rows (as the
        # pipeline feeds it) and whole files at once, each in a fresh process; the faster wins.
        raws = [run_py(RAW, str(corpus), backend, str(rows)) for rows in (4096, 10**9)]
        for how, r in zip(("4096-row batches", "whole files"), raws):
            print(f"  {backend} raw, {how}: {r['tokens'] / r['seconds'] / 1e6:.1f} M tok/s", flush=True)
        raw = max(raws, key=lambda r: r["tokens"] / r["seconds"])
        out = tempfile.mkdtemp(prefix="e2e-", dir=work)
        e2e = run_py(E2E, str(corpus), backend, out)
        assert raw["tokens"] + e2e["documents"] == e2e["tokens"], "raw and built token counts disagree"
        raw_rate = raw["tokens"] / raw["seconds"]
        e2e_rate = e2e["tokens"] / e2e["seconds"]
        if backend == "gigatoken":
            big_tokens = e2e["tokens"]
        rows.append((backend, corpus.name, raw_rate, e2e_rate, e2e_rate / raw_rate, e2e["peak_rss_mb"]))
        print(f"{backend}: raw {raw_rate/1e6:.1f} M tok/s, end-to-end {e2e_rate/1e6:.1f} M tok/s "
              f"({e2e['seconds']:.1f} s, peak RSS {e2e['peak_rss_mb']:.0f} MB)", flush=True)
    out = tempfile.mkdtemp(prefix="e2e-", dir=work)
    small_fast = run_py(E2E, str(small), "gigatoken", out)

    print("\n| backend | corpus | raw tokenizer (M tok/s) | end-to-end build (M tok/s) | ratio | peak RSS (MB) |")
    print("|---|---|---:|---:|---:|---:|")
    for b, c, r, e, ratio, rss in rows:
        print(f"| {b} | {c} | {r/1e6:.1f} | {e/1e6:.1f} | {ratio:.2f} | {rss:.0f} |")
    print(f"\npeak RSS, gigatoken end-to-end: {small_fast['peak_rss_mb']:.0f} MB on {small.name}, "
          f"{rows[0][5]:.0f} MB on {big.name} (bounded by batch size x workers, not corpus size)")

    phases = run_py(PHASES, str(big), tempfile.mkdtemp(prefix="phases-", dir=work))
    disk = run_py(DISK, str(work / "disk-test.bin"))
    total = sum(phases["phases"].values())
    print(f"\nwhere the end-to-end time goes on {big.name} ({phases['tokens'] / 1e6:.0f} M tokens, "
          f"{phases['tokens'] / total / 1e6:.1f} M tok/s; this disk writes {disk['mb_per_s']:.0f} MB/s with fsync):")
    for phase, seconds in phases["phases"].items():
        print(f"  {phase:32s} {seconds:6.2f} s  {100 * seconds / total:4.0f}%")

    ceiling = run_py(CEILING, str(big), "gigatoken")
    print(f"\nthe best ratio any build with these steps can reach on these cores (gigatoken, {big.name}): "
          f"{ceiling['ratio_ceiling']:.2f}")
    print(f"  tokenizer alone: {ceiling['tok_wall']:.2f} s wall, {ceiling['tok_cpu']:.2f} s CPU on {ceiling['cores']} cores")
    for what, key in (("decode the Parquet text column", "decode_cpu"), ("SHA-256 of the inputs", "in_hash_cpu"),
                      ("SHA-256 of the output tokens, x2 (write, validate)", "out_hash_cpu")):
        mult = 2 if key == "out_hash_cpu" else 1
        print(f"  {what:50s} {mult * ceiling[key]:6.2f} s CPU")
    print(f"  => no build can take less than {ceiling['floor_seconds']:.2f} s "
          f"(all that CPU work spread over every core, nothing else done)")

    if not args.skip_prefect:
        start = run_py(PREFECT_STARTUP)
        out = tempfile.mkdtemp(prefix="e2e-", dir=work)
        flow = run_py(PREFECT_E2E, str(big), out)
        print(f"\nPrefect temporary server start-up + trivial flow: {start['seconds']:.1f} s (one-off per process)")
        print(f"Prefect flow end-to-end on {big.name}: {flow['seconds']:.1f} s including start-up; "
              f"{big_tokens / max(flow['seconds'] - start['seconds'], 1e-9) / 1e6:.1f} M tok/s excluding it")


if __name__ == "__main__":
    main()
