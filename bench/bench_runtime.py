"""Benchmark: random access through the runtime's map-style dataset against raw memmap slicing.

    python bench/bench_runtime.py                    # makes a 200 MB corpus, builds it, measures
    python bench/bench_runtime.py --work DIR --keep  # reuse (or keep) the corpus and version in DIR

Builds (or reuses) a version of a ``make_corpus.py --mb 200`` corpus (cl100k,
uint32 tokens, nanogpt shards), warms the page cache by reading every shard
once, then reads the same 10,000 random samples, at seq_len 1024 and 4096,
with each of these in the same process, interleaved, best of ``--repeats``:

* ``raw memmap -> int64``: ``np.memmap`` of each shard (as nanoGPT and
  KempnerForge open them), ``w = mm[s:s+L+1]``, ``x = w[:-1].astype(int64)``,
  ``y = w[1:].astype(int64)`` -- the same output as the dataset, with the
  window locations computed beforehand (so the raw loop pays no lookup);
* ``raw ndarray view -> int64``: the same from a plain ndarray view of each
  map, the fastest raw slicing there is in Python, for reference;
* ``TokenDataset``: ``ds[i]`` (lookup by binary search, slice, two int64 copies);
* ``TokenDataset packed``: ``pack_sequences=True`` (adds doc_ids, position_ids,
  cu_seqlens and label masking);
* ``TokenDataset aligned`` and ``aligned+packed``: ``align_to_bos=True``, on
  their own (different) samples, for the cost of alignment.

Prints samples/s, microseconds per sample, and the ratios to raw memmap slicing
(target for plain windows: >= 0.80) and to the ndarray-view loop. Times are
the process's CPU time by default (``--clock wall`` for elapsed time): the
loops are single-threaded and read a warm page cache, so CPU time is the time
they take, and it does not count the time other jobs on a shared machine hold
the core.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
MAKE_CORPUS = ROOT.parent / "shared" / "tools" / "make_corpus.py"

from shardflow.pipeline import build  # noqa: E402
from shardflow.config import BuildConfig  # noqa: E402
from shardflow.formats import get_format  # noqa: E402
from shardflow.runtime import TokenDataset  # noqa: E402


def prepare(work: Path, mb: int, shard_tokens: int) -> tuple[Path, str]:
    corpus = work / f"corpus-{mb}mb"
    if not corpus.exists():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(MAKE_CORPUS), str(corpus), "--mb", str(mb), "--files", "8"], check=True)
        print(f"made the {mb} MB corpus in {time.perf_counter() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    result = build(
        BuildConfig(name="benchrt", sources=(str(corpus),), shard_tokens=shard_tokens),
        data_root=work / "data",
        catalog=work / "manifests",
        workers=2,
    )
    how = "built" if result.created else "reused"
    print(f"{how} {result.ref} in {time.perf_counter() - t0:.1f} s", flush=True)
    return work / "manifests", result.ref


def warm(ds: TokenDataset) -> int:
    """Read every shard file once, so the measurements run on a warm page cache."""
    total = 0
    for info in ds.shards.shards:
        with open(info.path, "rb") as f:
            while chunk := f.read(16 << 20):
                total += len(chunk)
    return total


CLOCKS = {"cpu": time.process_time, "wall": time.perf_counter}


def rate(fn: Callable[[], None], n: int, clock: Callable[[], float]) -> float:
    gc.collect()
    gc.disable()
    try:
        t0 = clock()
        fn()
        return n / (clock() - t0)
    finally:
        gc.enable()


def measure(
    catalog: Path, ref: str, seq_len: int, samples: int, repeats: int, seed: int, clock: Callable[[], float]
) -> dict[str, float]:
    plain = TokenDataset(ref, seq_len=seq_len, catalog=catalog)
    packed = TokenDataset(ref, seq_len=seq_len, catalog=catalog, pack_sequences=True)
    aligned = TokenDataset(ref, seq_len=seq_len, catalog=catalog, align_to_bos=True)
    aligned_packed = TokenDataset(ref, seq_len=seq_len, catalog=catalog, align_to_bos=True, pack_sequences=True)
    warm(plain)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(plain), samples).tolist()
    aidx = rng.integers(0, len(aligned), samples).tolist()
    locs = [plain.locate(i) for i in idx]
    window = seq_len + 1
    fmt = get_format(plain.shards.format.name)
    header = len(fmt.header(0, plain.shards.dtype))
    memmaps = [
        np.memmap(s.path, dtype=plain.shards.dtype, mode="r", offset=header, shape=(s.tokens,)) for s in plain.shards.shards
    ]
    views = [m.view(np.ndarray) for m in memmaps]

    def raw_memmap() -> None:
        for k, s in locs:
            w = memmaps[k][s : s + window]
            w[:-1].astype(np.int64)
            w[1:].astype(np.int64)

    def raw_view() -> None:
        for k, s in locs:
            w = views[k][s : s + window]
            w[:-1].astype(np.int64)
            w[1:].astype(np.int64)

    def run(ds: TokenDataset, indices: list[int]) -> Callable[[], None]:
        def go() -> None:
            for i in indices:
                ds[i]

        return go

    methods = {
        "raw memmap -> int64": raw_memmap,
        "raw ndarray view -> int64": raw_view,
        "TokenDataset": run(plain, idx),
        "TokenDataset packed": run(packed, idx),
        "TokenDataset aligned": run(aligned, aidx),
        "TokenDataset aligned+packed": run(aligned_packed, aidx),
    }
    for fn in methods.values():  # a first pass touches every page of the maps (minor faults)
        fn()
    rates = {name: 0.0 for name in methods}
    for _ in range(repeats):  # interleaved, so drifting machine load hits every method alike
        for name, fn in methods.items():
            rates[name] = max(rates[name], rate(fn, samples, clock))
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", type=Path, help="directory for the corpus and the version (default: a temporary one)")
    ap.add_argument("--keep", action="store_true", help="keep --work afterwards")
    ap.add_argument("--mb", type=int, default=200, help="corpus size for make_corpus.py (default 200)")
    ap.add_argument("--shard-tokens", type=int, default=4_000_000)
    ap.add_argument("--samples", type=int, default=10_000)
    ap.add_argument("--seq-lens", type=int, nargs="+", default=[1024, 4096])
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--clock",
        choices=sorted(CLOCKS),
        default="cpu",
        help="cpu: this process's CPU time (steady on a shared machine; the loops are single-threaded and the "
        "page cache is warm, so it is the time they take); wall: elapsed time",
    )
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-runtime-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        catalog, ref = prepare(work, args.mb, args.shard_tokens)
        info = TokenDataset(ref, seq_len=1024, catalog=catalog).shards
        print(
            f"{ref}: {info.num_tokens:,} tokens in {info.num_shards} shards of {info.dtype.name}; "
            f"{args.samples:,} random samples, best of {args.repeats}, warm page cache, {args.clock} clock\n"
        )
        results: dict[str, dict[str, float]] = {}
        head = f"{'seq_len':>7}  {'method':<28} {'samples/s':>11} {'us/sample':>10} {'vs raw memmap':>14} {'vs raw view':>12}"
        print(head)
        print("-" * len(head))
        for seq_len in args.seq_lens:
            rates = measure(catalog, ref, seq_len, args.samples, args.repeats, args.seed, CLOCKS[args.clock])
            results[str(seq_len)] = rates
            raw, view = rates["raw memmap -> int64"], rates["raw ndarray view -> int64"]
            for name, rate in rates.items():
                print(f"{seq_len:>7}  {name:<28} {rate:>11,.0f} {1e6 / rate:>10.2f} {rate / raw:>14.2f} {rate / view:>12.2f}")
            cost = 1e6 / rates["TokenDataset packed"] - 1e6 / rates["TokenDataset"]
            print(f"{'':>7}  packing costs {cost:.2f} us/sample ({rates['TokenDataset packed'] / rates['TokenDataset']:.2f}x the plain rate)")
            print()
        if args.json:
            payload = {"ref": ref, "samples": args.samples, "clock": args.clock, "rates": results}
            args.json.write_text(json.dumps(payload, indent=1))
    finally:
        if args.work is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
