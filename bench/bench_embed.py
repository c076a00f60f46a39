"""Benchmark: embedding throughput of all-MiniLM-L6-v2: the model alone, or the build's per-shard jobs.

    python bench/bench_embed.py [--docs 256] [--device auto]
    python bench/bench_embed.py --shards [--mb 4] [--workers 1,2] [--torch-threads 0,1] [--device cpu]

The first mode embeds real paragraphs from ../shared/corpora, joined until
each is at least 256 model tokens long, so every document fills the model's
window (the worst case, and what long corpus documents cost once truncated).
The model is loaded and warmed up before timing. Prints documents/s per
precision and the cosine between bf16 and fp32 embeddings of the same texts.

``--shards`` measures what a build's embed-shard jobs do (``shardflow.embed.compute``:
``shard_texts`` then ``embed_part``: decode, embed in bf16, int8 codes, per-shard
files): a real corpus (``../shared/tools/make_corpus.py --mb N``: real
paragraphs, web-like document lengths) is built without embeddings, then every
shard's job runs on a pool of each ``--workers`` threads, timed from the first
job's start to the last one's end (the model loaded and warmed up before).
``--torch-threads`` 0 leaves torch's intra-op threads at its default (the
cores), N sets them. Prints documents/s and text tokens/s (after truncation to
the window), in total and per core.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from shardflow.embed.embedder import EmbedConfig, Embedder

CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"
MAKE_CORPUS = CORPORA.parent / "tools" / "make_corpus.py"


def texts(n: int) -> list[str]:
    paragraphs = [p for p in re.split(r"\n \n|\n\n", (CORPORA / "wikitext2_valid.txt").read_text()) if len(p) > 200]
    out, i = [], 0
    while len(out) < n:
        doc = ""
        while len(doc) < 1600:  # ~1600 characters is > 256 WordPiece tokens of English prose
            doc += paragraphs[i % len(paragraphs)] + "\n"
            i += 1
        out.append(doc)
    return out


def shard_jobs(args: argparse.Namespace) -> None:
    """Time the per-shard embedding jobs over a real corpus at each number of workers."""
    import torch

    from shardflow.pipeline import build
    from shardflow.config import BuildConfig, EmbedOptions
    from shardflow.embed.files import part_file_names
    from shardflow.embed.compute import embed_part, shard_texts
    from shardflow.reader import open_version

    tmp = Path(tempfile.mkdtemp(prefix="bench-embed-"))
    subprocess.run([sys.executable, str(MAKE_CORPUS), str(tmp / "corpus"), "--mb", str(args.mb), "--files", "2"], check=True)
    config = BuildConfig(name="bench", sources=(str(tmp / "corpus"),), shard_tokens=args.shard_tokens, val_fraction=0.0)
    ref = build(config, data_root=tmp / "data", catalog=tmp / "catalog", workers=2).ref
    version = open_version(ref, catalog=tmp / "catalog")
    decode = version.tokenizer.decode
    options = EmbedOptions(codec="int8", device=args.device)
    jobs = [(s, k) for s in version.splits for k in range(version.split(s).num_shards)]
    docs = sum(version.split(s).num_documents for s in version.splits)
    Embedder(config=options).embed([version.split(jobs[0][0]).text(i) for i in range(8)])  # load + warm up
    cores = os.cpu_count() or 1
    default_threads = torch.get_num_threads()
    print(f"{ref}: {docs} documents in {len(jobs)} shards, {args.mb} MB of text; {cores} cores; device {args.device}")

    def one(job: tuple[str, int], out: Path) -> tuple[int, int]:
        split, k = job
        rows, texts_k = shard_texts(version.split(split).shards, k, decode)
        part, tokens = embed_part(out, part_file_names("bench", split, k), options, rows=rows, texts=texts_k,
                                  embedder=Embedder(config=options))
        return part["rows"], tokens

    for threads in args.torch_threads:
        torch.set_num_threads(threads or default_threads)
        for workers in args.workers:
            out = Path(tempfile.mkdtemp(dir=tmp))
            t0, c0 = time.perf_counter(), time.process_time()
            with ThreadPoolExecutor(max_workers=workers) as pool:
                done = list(pool.map(lambda job: one(job, out), jobs))
            dt, cpu = time.perf_counter() - t0, time.process_time() - c0
            rows, tokens = sum(r for r, _ in done), sum(t for _, t in done)
            # Per core: over the wall time on every core; and over the CPU time this process used, which
            # other processes on the machine do not inflate.
            print(f"workers {workers}, torch threads {torch.get_num_threads()}: {dt:6.1f} s wall, {cpu:6.1f} s CPU; "
                  f"{rows / dt:6.1f} documents/s ({rows / dt / cores:5.1f} per core, {rows / cpu:5.1f} per CPU-second), "
                  f"{tokens / dt:7.0f} tokens/s ({tokens / dt / cores:6.0f} per core, {tokens / cpu:6.0f} per CPU-second); "
                  f"{tokens / rows:.0f} tokens/document")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=256)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--shards", action="store_true", help="time the build's per-shard embedding jobs instead")
    ap.add_argument("--mb", type=float, default=4, help="--shards: megabytes of real text")
    ap.add_argument("--shard-tokens", type=int, default=100_000, help="--shards: tokens per shard")
    ap.add_argument("--workers", type=lambda v: [int(x) for x in v.split(",")], default=[1, 2])
    ap.add_argument("--torch-threads", type=lambda v: [int(x) for x in v.split(",")], default=[0])
    args = ap.parse_args()
    if args.shards:
        shard_jobs(args)
        return
    docs = texts(args.docs)
    results = {}
    for precision in ("fp32", "bf16"):
        emb = Embedder(config=EmbedConfig(precision=precision, device=args.device))
        emb.embed(docs[:32])  # load + warm up
        t0 = time.perf_counter()
        vecs = emb.embed(docs)
        dt = time.perf_counter() - t0
        assert emb.last_stats.truncated == len(docs), "every benchmark text should fill the 256-token window"
        results[precision] = (len(docs) / dt, vecs)
        device = emb.model_info()["device"]
        print(f"{precision}: {len(docs) / dt:7.1f} documents/s on {device} ({len(docs)} documents of 256 tokens)")
    cos = (results["fp32"][1] * results["bf16"][1]).sum(axis=1)
    print(f"bf16 vs fp32: {results['bf16'][0] / results['fp32'][0]:.2f}x, cosine mean {cos.mean():.6f} min {cos.min():.6f}")


if __name__ == "__main__":
    main()
