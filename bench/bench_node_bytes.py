"""Benchmark: what each node downloads over one epoch of a bucket version read by 4 nodes (issue 43, item 4).

    python bench/bench_node_bytes.py                      # 8 MB corpus, about 70 shards, 4 nodes
    python bench/bench_node_bytes.py --mb 16 --nodes 8 --shard-tokens 20000

Builds a version from a ``make_corpus.py`` corpus (train split only) with small
shards, uploads it and its catalog to moto's S3 server on loopback
(``bench/loopback_s3.py``), then simulates ``--nodes`` nodes, each with an empty
cache directory of its own, reading its share of one epoch (``seq_len=1024``, no
cache limit, so the cache ends holding everything the node fetched):

* ``streaming``: ``StreamingTokenDataset(rank=r, world_size=N, shuffle_group=8)``;
* ``map+DistributedSampler``: ``TokenDataset`` indexed by PyTorch's
  ``DistributedSampler(num_replicas=N, rank=r, shuffle=True)`` (needs torch);
* ``map+ShardSampler``: ``TokenDataset`` indexed by
  ``shardflow.runtime.ShardSampler(rank=r, world_size=N, shuffle_group=8)``.

Reported per way and node: the bytes it fetched (the cache's files, markers
aside), as a multiple of its share (split bytes / N), against the bound
``1.5 x share + one shuffle group`` (the 8 largest shards). Deterministic: the
figures are counts, not timings, so one run is enough.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
MAKE_CORPUS = HERE.parent.parent / "shared" / "tools" / "make_corpus.py"
SEQ = 1024
GROUP = 8


def cached_bytes(cache: Path) -> int:
    return sum(p.stat().st_size for p in cache.rglob("*") if p.is_file() and not p.name.startswith(".")
               and p.name != "metadata.yaml" and not p.name.endswith(".yaml"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=8)
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--shard-tokens", type=int, default=30_000)
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()

    from loopback_s3 import start_moto

    from shardflow.bucket.fs import filesystem
    from shardflow.config import BuildConfig
    from shardflow.manifest import read_manifest
    from shardflow.pipeline import build
    from shardflow.runtime import ShardSampler, StreamingTokenDataset, TokenDataset

    server = start_moto()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = args.work or Path(tmp)
            corpus = work / "corpus"
            if not corpus.is_dir():
                subprocess.run([sys.executable, str(MAKE_CORPUS), str(corpus), "--mb", str(args.mb), "--files", "8"],
                               check=True, capture_output=True)
            config = BuildConfig(name="nb", sources=tuple(str(p) for p in sorted(corpus.glob("*.parquet"))),
                                 shard_tokens=args.shard_tokens, val_fraction=0.0)
            result = build(config, data_root=work / "data", catalog=work / "catalog")
            manifest = read_manifest(Path(result.manifest_path).parent)
            entries = manifest.splits["train"].shards
            fs, _ = filesystem("s3://nb-bench")
            fs.mkdir("nb-bench")
            fs.put(str(work / "data") + "/", "nb-bench/data/", recursive=True)
            fs.put(str(work / "catalog") + "/", "nb-bench/catalog/", recursive=True)
            catalog = "s3://nb-bench/catalog"
            sizes = np.array([e.bytes + e.index.bytes + sum(f.bytes for f in e.sidecars) for e in entries])
            total, n = int(sizes.sum()), args.nodes
            share = total / n
            group = int(np.sort(sizes)[-GROUP:].sum())
            print(f"version nb@{manifest.version}: {len(entries)} train shards, {total:,} bytes (shards and indexes); "
                  f"{n} nodes, share {share:,.0f} bytes, bound 1.5 x share + group = {1.5 * share + group:,.0f}")

            def streaming(cache: Path, r: int) -> Iterable[Any]:
                return StreamingTokenDataset("nb@latest", catalog=catalog, cache_dir=cache, seq_len=SEQ, rank=r,
                                             world_size=n, seed=0, shuffle_group=GROUP)

            def indexed(sampler: Callable[[TokenDataset, int], Iterable[int]]) -> Callable[[Path, int], Iterable[Any]]:
                def read(cache: Path, r: int) -> Iterable[Any]:
                    ds = TokenDataset("nb@latest", catalog=catalog, cache_dir=cache, seq_len=SEQ)
                    return (ds[i] for i in sampler(ds, r))
                return read

            def distributed(ds: TokenDataset, r: int) -> Iterable[int]:
                from torch.utils.data import DistributedSampler

                return iter(DistributedSampler(ds, num_replicas=n, rank=r, shuffle=True, seed=0))

            ways: dict[str, Callable[[Path, int], Iterable[Any]]] = {"streaming": streaming}
            try:
                import torch  # noqa: F401

                ways["map+DistributedSampler"] = indexed(distributed)
            except ImportError:
                print("map+DistributedSampler: skipped (pip install 'shardflow[torch]')")
            ways["map+ShardSampler"] = indexed(lambda ds, r: ShardSampler(ds, rank=r, world_size=n, seed=0,
                                                                           shuffle_group=GROUP))
            print(f"{'way':24} {'node':>4} {'samples':>8} {'fetched bytes':>14} {'x share':>8} {'x version':>9}  within bound")
            for way, reader in ways.items():
                for r in range(n):
                    cache = work / "caches" / way / str(r)
                    count = sum(1 for _ in reader(cache, r))
                    got = cached_bytes(cache)
                    print(f"{way:24} {r:>4} {count:>8} {got:>14,} {got / share:>8.2f} {got / total:>9.2f}  "
                          f"{'yes' if got <= 1.5 * share + group else 'NO'}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
