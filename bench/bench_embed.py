"""Benchmark: embedding throughput (documents/s) of all-MiniLM-L6-v2, fp32 vs bf16, CPU and GPU.

    python bench/bench_embed.py [--docs 256] [--device auto]

Texts are real paragraphs from ../shared/corpora, joined until each is at
least 256 model tokens long, so every document fills the model's window (the
worst case, and what long corpus documents cost once truncated). The model is
loaded and warmed up before timing. Prints documents/s per precision and the
cosine between bf16 and fp32 embeddings of the same texts.
"""

from __future__ import annotations

import argparse
import re
import time
from pathlib import Path

from shardflow.embedder import EmbedConfig, Embedder

CORPORA = Path(__file__).resolve().parents[2] / "shared" / "corpora"


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--docs", type=int, default=256)
    ap.add_argument("--device", default="auto")
    args = ap.parse_args()
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
