"""Benchmark: end-to-end build throughput against the raw tokenizer on the same cores.

    python bench/bench_build.py                      # makes a 1000 MB corpus with make_corpus.py
    python bench/bench_build.py --corpus DIR --small-mb 100
    python bench/bench_build.py --mb 300 --compare-with b9be734     # this checkout vs a commit, alternating
    python bench/bench_build.py --corpus C1000 --realistic /tmp/bench/realistic --incremental \
        --compare-with GIT_REF --rounds 5                            # raw, core, ratio, incremental; both trees

For each backend it measures, each in a fresh process (so no warm caches are
shared between measurements):

* raw: the tokenizer alone encoding the corpus's texts already in memory
  (``encode_batch`` over 4096-document batches), in tokens/s;
* end-to-end: ``shardflow.pipeline.build`` (read Parquet, tokenize, write shards
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

With ``--compare-with GIT_REF``, ``--realistic DIR`` or ``--incremental`` it
measures instead, in ``--rounds`` rounds, for this checkout and (with
``--compare-with``) the commit ``GIT_REF`` (its ``git archive``, imported
through ``PYTHONPATH``), the two alternating (A B, then B A, ...), on the
``--corpus`` corpus and, with ``--realistic``, on the corpus of source files
``bench/realistic_corpus.py`` makes (made in ``DIR`` if missing):

* the raw rate of the fast backend (as above: the better of 4096-row batches and whole files);
* the core build (``shardflow.pipeline.build``, ``workers=2``, what ``--no-prefect`` runs) in tokens/s,
  and its ratio to the raw rate of the same round;
* with ``--incremental``: a build of all inputs but the last (sorted by name), then, in the same
  data root and catalog, of all of them (the first build is its parent), against the round's
  first build of all inputs: incremental seconds / first-build seconds; and the same as commands
  (``python -m shardflow build DIR --no-prefect``, each a fresh process, imports included): a first build
  of all inputs, then all but the last and all, in another catalog, against the issue's bound (first ÷ N + 1 s);
* with ``--phases``: each stage of the tree's own table timed in turn in one process (as without
  ``--compare-with``: its jobs on 2 threads, the background stage in its place), a table per corpus.

It prints the medians over the rounds as a table and, last, one JSON line with every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
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
import shardflow
print(json.dumps({"tokens": n, "seconds": dt, "backend": tok.backend, "module": shardflow.__file__}))
"""

E2E = r"""
import json, sys, time, resource
from shardflow.pipeline import build
from shardflow.config import BuildConfig
from shardflow.reader import open_version
corpus, backend, out = sys.argv[1], sys.argv[2], sys.argv[3]
t0 = time.perf_counter()
r = build(BuildConfig(name="bench", sources=(corpus,), backend=backend), data_root=out + "/data", catalog=out + "/manifests", workers=2)
dt = time.perf_counter() - t0
m = open_version(r.ref, catalog=out + "/manifests").manifest
import shardflow
reuse = m.extra.get("reuse") or {}
print(json.dumps({"tokens": m.totals["tokens"], "documents": m.totals["documents"], "seconds": dt,
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "shards": sum(len(e.shards) for e in m.splits.values()), "module": shardflow.__file__,
                  "reused_inputs": len(reuse.get("reused_inputs", ())), "linked_shards": reuse.get("linked_shards", 0)}))
"""

# Each stage of the build's table in turn (whatever the stages are: this script also times other trees),
# its jobs on 2 threads; a background stage (stats-card) runs in its place here.
PHASES = r"""
import json, resource, sys, time
from concurrent.futures import ThreadPoolExecutor
from shardflow import pipeline as b
from shardflow.config import BuildConfig
corpus, out = sys.argv[1], sys.argv[2]
t, cpu = {}, {}
def used():  # CPU seconds of this process, every thread
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
t0, c0 = time.perf_counter(), used()
plan = b.plan_build(BuildConfig(name="bench", sources=(corpus,)), data_root=out + "/data", catalog=out + "/manifests")
t["plan (fingerprint inputs)"], cpu["plan (fingerprint inputs)"] = time.perf_counter() - t0, used() - c0
done = {}
for stage in b.STAGES:
    if not stage.when(plan):
        continue
    t0, c0 = time.perf_counter(), used()
    with ThreadPoolExecutor(2) as pool:
        done[stage.name] = list(pool.map(lambda job: stage(plan, *job), stage.jobs(plan, done)))
    t[stage.name], cpu[stage.name] = time.perf_counter() - t0, used() - c0
tokens = sum(getattr(r, "tokens", 0) for r in next(iter(done.values())))  # the first stage tokenizes
print(json.dumps({"tokens": tokens, "phases": t, "cpu": cpu}))
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
print(json.dumps({"seconds": time.perf_counter() - t0, "ref": getattr(ref, "ref", ref)}))  # a BuildResult (a str before)
"""


def run_py(code: str, *args: str, tree: Path = ROOT) -> dict:
    """Run ``code`` in a fresh process on the shardflow of ``tree`` (this checkout, or a baseline's)."""
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}:{tree}", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"benchmark step failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def command(tree: Path, corpus: Path, out: Path) -> float:
    """Seconds of ``python -m shardflow build CORPUS --no-prefect`` (``tree``'s), into ``out``'s data root and catalog."""
    env = {**os.environ, "PYTHONPATH": f"{tree / 'src'}:{tree}"}
    cmd = [sys.executable, "-m", "shardflow", "build", str(corpus), "--name", "bench", "--no-prefect",
           "--data-root", str(out / "data"), "--catalog", str(out / "manifests")]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        sys.exit(f"benchmark step failed: {' '.join(cmd)}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def make_corpus(path: Path, mb: int, files: int) -> Path:
    if not path.exists():
        print(f"making a {mb} MB corpus in {path} ...", flush=True)
        subprocess.run([sys.executable, str(MAKE_CORPUS), str(path), "--mb", str(mb), "--files", str(files)], check=True)
    return path


def baseline_tree(ref: str, work: Path) -> Path:
    """Commit ``ref`` of this repository as a plain directory tree (``git archive``; the checkout is not touched).

    ``ref`` may also be a directory holding another tree already (``git archive REF | tar -x -C DIR``).
    """
    if Path(ref).is_dir():
        return Path(ref).resolve()
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--verify", f"{ref}^{{commit}}"],
                         capture_output=True, text=True)
    if sha.returncode:
        sys.exit(f"--compare-with {ref}: not a commit of {ROOT} ({sha.stderr.strip()})")
    base = work / f"baseline-{sha.stdout.strip()[:12]}"
    if not base.is_dir():
        tmp = Path(tempfile.mkdtemp(prefix="baseline-", dir=work))
        archive = subprocess.Popen(["git", "-C", str(ROOT), "archive", "--format=tar", sha.stdout.strip()],
                                   stdout=subprocess.PIPE)
        subprocess.run(["tar", "-x", "-C", str(tmp)], stdin=archive.stdout, check=True)
        if archive.wait():
            sys.exit(f"git archive {ref} failed")
        # This checkout is installed in editable mode, which maps shardflow.flows/.tasks to *its* flows/ and
        # tasks/; the baseline's own, linked into its package, are found first on its PYTHONPATH.
        for package in ("flows", "tasks"):
            if (tmp / package).is_dir() and not (tmp / "src" / "shardflow" / package).exists():
                (tmp / "src" / "shardflow" / package).symlink_to(Path("..", "..", package))  # relative: tmp is renamed
        os.replace(tmp, base)
    return base


def _rate(r: dict) -> float:
    return r["tokens"] / r["seconds"]


def one_round(tree: Path, corpus: Path, work: Path, incremental: bool, phases: bool = False) -> dict:
    """Raw rate, core build and (optionally) the incremental pair and the stages' times of one tree on one corpus,
    each a fresh process."""
    raws = [run_py(RAW, str(corpus), "gigatoken", str(rows), tree=tree) for rows in (4096, 10**9)]
    raw = max(raws, key=_rate)
    out = Path(tempfile.mkdtemp(prefix="core-", dir=work))
    core = run_py(E2E, str(corpus), "gigatoken", str(out), tree=tree)
    shutil.rmtree(out, ignore_errors=True)
    for r in (raw, core):  # the other tree's shardflow must not have been imported instead
        if not Path(r["module"]).resolve().is_relative_to(tree.resolve()):
            sys.exit(f"measuring {tree}, but shardflow was imported from {r['module']}")
    row = {"raw_rate": _rate(raw), "core_rate": _rate(core), "ratio": _rate(core) / _rate(raw),
           "core_s": core["seconds"], "tokens": core["tokens"], "shards": core["shards"],
           "peak_rss_mb": core["peak_rss_mb"], "raw_tokens_agree": raw["tokens"] + core["documents"] == core["tokens"]}
    if incremental:
        files = sorted(corpus.glob("*.parquet"))
        out = Path(tempfile.mkdtemp(prefix="incremental-", dir=work))
        src = out / "src"
        src.mkdir()
        for f in files[:-1]:
            os.symlink(f.resolve(), src / f.name)
        first = run_py(E2E, str(src), "gigatoken", str(out), tree=tree)
        os.symlink(files[-1].resolve(), src / files[-1].name)
        inc = run_py(E2E, str(src), "gigatoken", str(out), tree=tree)  # the catalog's latest is its parent
        row.update(first_minus_one_s=first["seconds"], incremental_s=inc["seconds"],
                   incremental_ratio=inc["seconds"] / core["seconds"], reused_inputs=inc["reused_inputs"],
                   linked_shards=inc["linked_shards"])
        # As commands (fresh processes, imports included): all the inputs; then all but the last, and all.
        row["command_first_s"] = command(tree, corpus, out / "cmd-first")
        (out / "src").joinpath(files[-1].name).unlink()
        command(tree, src, out / "cmd-inc")
        os.symlink(files[-1].resolve(), src / files[-1].name)
        row["command_incremental_s"] = command(tree, src, out / "cmd-inc")
        row["command_bound_s"] = row["command_first_s"] / len(files) + 1.0
        shutil.rmtree(out, ignore_errors=True)
        if inc["reused_inputs"] != len(files) - 1:
            print(f"  WARNING: the incremental build reused {inc['reused_inputs']} of {len(files) - 1} inputs",
                  flush=True)
    if phases:  # "stage:NAME" (wall) and "cpu:NAME" keys: the tree's own stages (another tree may have others)
        out = Path(tempfile.mkdtemp(prefix="phases-", dir=work))
        timed = run_py(PHASES, str(corpus), str(out), tree=tree)
        row.update({f"stage:{k}": v for k, v in timed["phases"].items()})
        row.update({f"cpu:{k}": v for k, v in timed.get("cpu", {}).items()})
        shutil.rmtree(out, ignore_errors=True)
    return row


def measure(trees: dict[str, Path], corpora: dict[str, Path], work: Path, rounds: int, incremental: bool,
            baseline_ref: str | None = None, phases: bool = False) -> dict:
    """Every tree on every corpus, ``rounds`` times, the trees' order alternating per round; medians."""
    runs: dict[str, dict[str, list[dict]]] = {c: {t: [] for t in trees} for c in corpora}
    for tree in trees.values():  # compiled, as pip does a wheel: else, with PYTHONDONTWRITEBYTECODE, each command compiles
        subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "src"), str(tree / "flows"), str(tree / "tasks")])
    print(f"cores: {os.cpu_count()}, load average at start {os.getloadavg()[0]:.2f}", flush=True)
    for i in range(rounds):
        order = list(trees.items()) if i % 2 == 0 else list(trees.items())[::-1]
        for cname, corpus in corpora.items():
            for label, tree in order:
                row = one_round(tree, corpus, work, incremental, phases)
                runs[cname][label].append(row)
                inc = (f", incremental {row['incremental_s']:.2f} s ({row['incremental_ratio']:.3f} of the first build); "
                       f"as commands: first {row['command_first_s']:.2f} s, incremental {row['command_incremental_s']:.2f} s "
                       f"(bound {row['command_bound_s']:.2f} s)" if incremental else "")
                print(f"round {i + 1} {cname:10s} {label:14s} raw {row['raw_rate'] / 1e6:6.1f} M tok/s, core "
                      f"{row['core_s']:6.2f} s ({row['core_rate'] / 1e6:5.1f} M tok/s, ratio {row['ratio']:.3f}){inc}",
                      flush=True)
    med = statistics.median
    summary: dict = {"rounds": rounds, "trees": {k: str(v) for k, v in trees.items()}, "corpora": {}}
    if "baseline" in trees:
        summary["baseline_ref"] = baseline_ref
    for cname, corpus in corpora.items():
        entry: dict = {"path": str(corpus), "files": len(list(corpus.glob("*.parquet")))}
        for label, rows in runs[cname].items():
            keys = [k for k, v in rows[0].items() if isinstance(v, (int, float)) and not isinstance(v, bool)]
            entry[label] = {k: med([r[k] for r in rows]) for k in keys}
            entry[label]["raw_tokens_agree"] = all(r["raw_tokens_agree"] for r in rows)
        summary["corpora"][cname] = entry
    summary["load_average_end"] = os.getloadavg()[0]
    return summary


def report(summary: dict, incremental: bool) -> None:
    labels = list(summary["trees"])
    print(f"\nmedians over {summary['rounds']} alternating round(s); ratio = core rate / raw rate of the same round, "
          "then the median; load average at the end " f"{summary['load_average_end']:.2f}\n")
    head = "| corpus | tree | tokens | shards | raw tokenizer (M tok/s) | core build (M tok/s) | core ÷ raw | core build (s) |"
    rule = "|---|---|---:|---:|---:|---:|---:|---:|"
    if incremental:
        head += (" incremental +1 of N (s) | incremental ÷ first build | commands: first build (s) | commands: "
                 "+1 of N (s) | bound: first ÷ N + 1 s |")
        rule += "---:|---:|---:|---:|---:|"
    print(head + "\n" + rule)
    for cname, entry in summary["corpora"].items():
        for label in labels:
            e = entry[label]
            line = (f"| {cname} ({entry['files']} files) | {label} | {e['tokens'] / 1e6:.1f} M | {e['shards']:.0f} | "
                    f"{e['raw_rate'] / 1e6:.1f} | {e['core_rate'] / 1e6:.1f} | {e['ratio']:.3f} | {e['core_s']:.2f} |")
            if incremental:
                line += (f" {e['incremental_s']:.2f} | {e['incremental_ratio']:.3f} | {e['command_first_s']:.2f} | "
                         f"{e['command_incremental_s']:.2f} | {e['command_bound_s']:.2f} |")
            print(line)
            if not e["raw_tokens_agree"]:
                print(f"  WARNING: {label} on {cname}: raw tokens + documents != built tokens")
    for cname, entry in summary["corpora"].items():
        stages = list(dict.fromkeys(k for label in labels for k in entry[label] if k.startswith("stage:")))
        if stages:
            print(f"\n{cname}: each stage in turn, one process (medians over the rounds; wall s, then CPU s of every "
                  "thread)\n\n| stage | " + " | ".join(f"{label} wall | {label} CPU" for label in labels) + " |\n|---|"
                  + "---:|---:|" * len(labels))
            for k in [*stages, None]:
                cells = []
                for label in labels:
                    for kind in ("stage:", "cpu:"):
                        e = entry[label]
                        cells.append(sum(v for key, v in e.items() if key.startswith(kind)) if k is None
                                     else e.get(kind + k[6:]))
                print(f"| {'sum of the medians' if k is None else k[6:]} | " + " | ".join("" if c is None else f"{c:.2f}" for c in cells) + " |")
    if len(labels) == 2:
        a, b = labels
        for cname, entry in summary["corpora"].items():
            print(f"{cname}: core build {a} {entry[a]['core_s']:.2f} s vs {b} {entry[b]['core_s']:.2f} s, "
                  f"ratio {entry[a]['core_s'] / entry[b]['core_s']:.3f} (below 1: {a} faster)")
    print(json.dumps(summary))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, help="a Parquet corpus directory (default: make a --mb corpus)")
    ap.add_argument("--mb", type=int, default=1000)
    ap.add_argument("--small-mb", type=int, default=300)
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--skip-prefect", action="store_true")
    ap.add_argument("--compare-with", metavar="GIT_REF",
                    help="measure raw, core and ratio (and --incremental) for this checkout and commit GIT_REF "
                         "(or a directory holding another tree), alternating runs")
    ap.add_argument("--realistic", type=Path, metavar="DIR",
                    help="also measure on the corpus of source files in DIR (bench/realistic_corpus.py; made if missing)")
    ap.add_argument("--realistic-mb", type=float, default=300, help="its size, when it is made")
    ap.add_argument("--incremental", action="store_true", help="also time the build of all inputs but the last, then of all")
    ap.add_argument("--phases", action="store_true",
                    help="with --compare-with, --realistic or --incremental: also time each stage in turn, per round")
    ap.add_argument("--rounds", type=int, default=3, help="rounds with --compare-with, --realistic or --incremental")
    args = ap.parse_args()
    work = (args.workdir or Path(tempfile.mkdtemp(prefix="shardflow-bench-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    big = (args.corpus or make_corpus(work / f"corpus-{args.mb}mb", args.mb, 16)).resolve()
    if args.compare_with or args.realistic or args.incremental:
        corpora = {big.name: big}
        if args.realistic:
            from realistic_corpus import build_corpus, describe

            record = build_corpus(args.realistic, mb=args.realistic_mb)
            print(f"realistic corpus {args.realistic}: {describe(record)}", flush=True)
            corpora["realistic"] = args.realistic.resolve()
        trees = {"this checkout": ROOT}
        if args.compare_with:
            # Labelled "baseline", not by its commit: the tables go into docs, which name no commit of ours.
            trees["baseline"] = baseline_tree(args.compare_with, work)
            print(f"baseline: {args.compare_with} ({trees['baseline']})", flush=True)
        report(measure(trees, corpora, work, args.rounds, args.incremental, args.compare_with, args.phases),
               args.incremental)
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
