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

    python bench/bench_runtime.py --checks           # the readers' checks: open time and reads, with and without

``--checks`` builds a version of 2,000 and more shards instead (a ``--mb 100``
corpus in 10,000-token shards) and measures what the
readers' trust checks cost (issue 40): at open, the pin (a shared ``flock`` on
the version directory) and reading the record of published files; as shards
are first mapped, a stat each against that record; and the token-id check of
every served window (``TokenDataset``: one ``argmax`` per group of 64 samples).
"Without" is the same code with those four taken out (patched here; the
token-id check by a ``__getitem__`` as it was before the checks). Rounds
alternate between the two; each figure is the median of ``--repeats`` rounds,
and the ratio of the medians is printed: targets, open under 1.10x and reads
over 0.95x. Reads are measured four ways: ``TokenDataset`` random access on
mapped, checked shards (steady state, as the table above measures it); the
first pass over a freshly opened ``TokenDataset``, in order and in a random
order (every shard mapped and stat-checked, every group of samples id-checked,
once); and a ``StreamingTokenDataset`` epoch over a fresh one (shuffled).
"""

from __future__ import annotations

import argparse
import bisect
import contextlib
import gc
import operator
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
MAKE_CORPUS = ROOT.parent / "shared" / "tools" / "make_corpus.py"

from shardflow.pipeline import build  # noqa: E402
from shardflow.config import BuildConfig  # noqa: E402
from shardflow.formats import get_format  # noqa: E402
from shardflow import reader  # noqa: E402
from shardflow.runtime import StreamingTokenDataset, TokenDataset  # noqa: E402
from shardflow.runtime.packing import pack_fields  # noqa: E402


def prepare(work: Path, mb: int, shard_tokens: int, name: str = "benchrt") -> tuple[Path, str]:
    corpus = work / f"corpus-{mb}mb"
    if not corpus.exists():
        t0 = time.perf_counter()
        subprocess.run([sys.executable, str(MAKE_CORPUS), str(corpus), "--mb", str(mb), "--files", "8"], check=True)
        print(f"made the {mb} MB corpus in {time.perf_counter() - t0:.1f} s", flush=True)
    t0 = time.perf_counter()
    result = build(
        BuildConfig(name=name, sources=(str(corpus),), shard_tokens=shard_tokens),
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


class UncheckedTokenDataset(TokenDataset):
    """``TokenDataset`` whose ``__getitem__`` is the one from before the token-id check (issue 40): the baseline."""

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        i = index if type(index) is int else operator.index(index)
        n = self._len
        if i < 0:
            i += n
        if i < 0 or i >= n:
            raise IndexError(f"sample {index} out of range: {self.shards.name} split {self.split!r} has {n} samples")
        cum = self._cum
        k = bisect.bisect_right(cum, i) - 1
        starts = self._starts
        start = (i - cum[k]) * self._window if starts is None else int(starts[i])
        view = self._views[k]
        if view is None:
            view = self.shards.shard(k)
        w = view[start : start + self._window]
        item = {"input_ids": w[:-1].astype(np.int64), "labels": w[1:].astype(np.int64)}
        if self.pack_sequences:
            item.update(pack_fields(self.shards.doc_starts(k), start, item["labels"]))
        return item


@contextlib.contextmanager
def checks_off() -> Iterator[None]:
    """Open readers without the trust checks: no pin, no record of published files (so no stat as a shard is
    first mapped); the datasets made meanwhile are made ``UncheckedTokenDataset`` (no token-id check) by ``open_ds``."""
    saved = reader.VersionPin, reader.published_stats
    reader.VersionPin = lambda directory, ref: None  # type: ignore[assignment,misc]
    reader.published_stats = lambda *args, **kwargs: None  # type: ignore[assignment]
    try:
        yield
    finally:
        reader.VersionPin, reader.published_stats = saved  # type: ignore[misc]


def measure_checks(catalog: Path, ref: str, seq_len: int, samples: int, repeats: int, seed: int,
                   clock: Callable[[], float]) -> dict[str, tuple[float, float]]:
    """``{measure: (median with the checks, median without)}``: seconds to open, samples/s of three reads."""

    def open_ds(checked: bool) -> TokenDataset:
        if checked:
            return TokenDataset(ref, seq_len=seq_len, catalog=catalog)
        with checks_off():
            ds = TokenDataset(ref, seq_len=seq_len, catalog=catalog)
        ds.__class__ = UncheckedTokenDataset
        return ds

    def opened(checked: bool) -> float:
        gc.collect()
        t0 = clock()
        ds = open_ds(checked)
        took = clock() - t0
        del ds
        return took

    def first_pass(checked: bool) -> float:
        ds = open_ds(checked)
        return rate(lambda: [ds[i] for i in range(len(ds))], len(ds), clock)

    def first_random_pass(checked: bool) -> float:
        ds = open_ds(checked)
        order = np.random.default_rng(seed).permutation(len(ds)).tolist()
        return rate(lambda: [ds[i] for i in order], len(ds), clock)

    def stream_pass(checked: bool) -> float:
        stream = StreamingTokenDataset(open_ds(checked), seed=seed)
        n = len(stream)
        return rate(lambda: [None for _ in stream], n, clock)

    warm(open_ds(False))
    mapped = {True: open_ds(True), False: open_ds(False)}
    idx = np.random.default_rng(seed).integers(0, len(mapped[True]), samples).tolist()
    for ds in mapped.values():  # every shard mapped (and, checked, stat- and id-checked) before the timed rounds
        for i in range(len(ds)):
            ds[i]

    def random_reads(checked: bool) -> float:
        ds = mapped[checked]
        return rate(lambda: [ds[i] for i in idx], samples, clock)

    measures = {"open (s)": opened, "random reads, mapped (samples/s)": random_reads,
                "first pass in order, fresh (samples/s)": first_pass,
                "first pass at random, fresh (samples/s)": first_random_pass,
                "streaming epoch, fresh (samples/s)": stream_pass}
    runs: dict[str, dict[bool, list[float]]] = {name: {True: [], False: []} for name in measures}
    for r in range(repeats):  # alternating, so drifting machine load hits both alike
        for name, fn in measures.items():
            for _ in range(5 if fn is random_reads else 1):  # the quick one: five times a round
                for checked in ((True, False) if r % 2 == 0 else (False, True)):
                    runs[name][checked].append(fn(checked))
    return {name: (float(np.median(v[True])), float(np.median(v[False]))) for name, v in runs.items()}


def main_checks(args: argparse.Namespace, work: Path) -> None:
    catalog, ref = prepare(work, args.mb, args.shard_tokens, name="benchchecks")
    shards = TokenDataset(ref, seq_len=args.seq_lens[0], catalog=catalog).shards
    print(f"{ref}: {shards.num_tokens:,} tokens in {shards.num_shards:,} shards of {shards.dtype.name}; "
          f"median of {args.repeats} rounds, warm page cache, {args.clock} clock\n")
    head = f"{'seq_len':>7}  {'measure':<44} {'with checks':>12} {'without':>12} {'ratio':>7}"
    print(head)
    print("-" * len(head))
    results = {}
    for seq_len in args.seq_lens:
        figures = measure_checks(catalog, ref, seq_len, args.samples, args.repeats, args.seed, CLOCKS[args.clock])
        results[str(seq_len)] = figures
        for name, (with_, without) in figures.items():
            fmt = "{:>12.4f}" if name.startswith("open") else "{:>12,.0f}"
            print(f"{seq_len:>7}  {name:<44} {fmt.format(with_)} {fmt.format(without)} {with_ / without:>7.3f}")
        print()
    if args.json:
        args.json.write_text(json.dumps({"ref": ref, "shards": shards.num_shards, "clock": args.clock,
                                         "repeats": args.repeats, "checks": results}, indent=1))


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
    ap.add_argument("--checks", action="store_true",
                    help="measure the readers' trust checks on a version of 2,000+ shards (defaults: --mb 100 "
                    "--shard-tokens 10000 --seq-lens 1024 --repeats 15)")
    args = ap.parse_args()
    if args.checks:
        given = set(sys.argv[1:])
        for flag, value in (("--mb", 100), ("--shard-tokens", 10_000), ("--seq-lens", [1024]), ("--repeats", 15)):
            if flag not in given:
                setattr(args, flag[2:].replace("-", "_"), value)

    work = args.work or Path(tempfile.mkdtemp(prefix="bench-runtime-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        if args.checks:
            main_checks(args, work)
            return
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
