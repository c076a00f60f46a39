"""Throughput of shardflow's embedding codecs, and random-row fetch latency.

Run as ``python bench/bench_codecs.py`` (add ``--help`` for options).  Prints:

1. encode/decode throughput per codec on a (200000, 384) float32 array, in GB/s
   of float32, beside an ``np.copyto`` memcpy baseline measured in the same run
   (and the plain ml_dtypes ``astype`` casts, for reference);
2. random-row fetch + dequantize from a memory-mapped int8 ``.npy`` of >= 1 GB
   (warm page cache) for 1..10000 rows, beside a raw ``np.memmap`` fancy index
   of the same rows.

Best-of-N timings: the machine may be shared, and the minimum is the least
disturbed run.  Not a test; nothing here asserts.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import ml_dtypes
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from shardflow.codecs import CODECS, get_codec  # noqa: E402

__all__ = ["main"]


def best_of(fn: Callable[[], object], repeat: int) -> float:
    """Minimum wall time of ``repeat`` calls, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def throughput(rows: int, dim: int, repeat: int, threads: int | None) -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal((rows, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)  # embedding-like magnitudes
    nbytes = x.nbytes
    out = np.empty_like(x)
    out.fill(0)  # fault the pages in before timing
    memcpy = nbytes / best_of(lambda: np.copyto(out, x), repeat) / 1e9

    print(f"\n== codec throughput: ({rows}, {dim}) float32 = {nbytes / 1e6:.0f} MB, "
          f"threads={threads or 'auto'}, best of {repeat} ==")
    print(f"{'codec':<16}{'encode GB/s':>12}{'x memcpy':>10}{'decode GB/s':>13}{'x memcpy':>10}")
    print(f"{'memcpy (copyto)':<16}{memcpy:>12.2f}{1.0:>10.2f}{memcpy:>13.2f}{1.0:>10.2f}")
    for name in CODECS:
        codec = get_codec(name)
        codes, scales = codec.encode(x, threads=threads)
        enc = nbytes / best_of(lambda: codec.encode(x, threads=threads), repeat) / 1e9
        dec = nbytes / best_of(lambda: codec.decode(codes, scales, out=out, threads=threads), repeat) / 1e9
        print(f"{name:<16}{enc:>12.2f}{enc / memcpy:>10.2f}{dec:>13.2f}{dec / memcpy:>10.2f}")
    # Reference: what a plain ml_dtypes cast achieves (single-threaded, with clip).
    for label, dt, mx in (("ml_dtypes e4m3", ml_dtypes.float8_e4m3fn, 448.0),
                          ("ml_dtypes e5m2", ml_dtypes.float8_e5m2, 57344.0)):
        r = min(repeat, 3)
        enc = nbytes / best_of(lambda: np.clip(x, -mx, mx).astype(dt), r) / 1e9
        f8 = x.astype(dt)
        dec = nbytes / best_of(lambda: f8.astype(np.float32), r) / 1e9
        print(f"{label:<16}{enc:>12.2f}{enc / memcpy:>10.2f}{dec:>13.2f}{dec / memcpy:>10.2f}")


def fetch(rows: int, dim: int, reps: int) -> None:
    codec = get_codec("int8")
    with tempfile.TemporaryDirectory(prefix="bench_codecs_") as tmp:
        path = Path(tmp) / "codes.npy"
        mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.int8, shape=(rows, dim))
        rng = np.random.default_rng(1)
        step = 100_000
        for s in range(0, rows, step):
            e = min(s + step, rows)
            mm[s:e] = rng.integers(-127, 128, size=(e - s, dim), dtype=np.int8)
        mm.flush()
        del mm
        scales = rng.uniform(0.001, 0.01, size=rows).astype(np.float32)
        np.save(Path(tmp) / "scales.npy", scales)
        size = path.stat().st_size
        codes = np.load(path, mmap_mode="r")
        scales_mm = np.load(Path(tmp) / "scales.npy", mmap_mode="r")
        # Warm the page cache (and this process's page tables) with one pass.
        chk = 0
        for s in range(0, rows, step):
            chk += int(codes[s : s + step, 0].sum())
        _ = np.asarray(scales_mm).sum()
        print(f"\n== random-row fetch from a memory-mapped int8 .npy: ({rows}, {dim}) = "
              f"{size / 1e9:.2f} GB, warm cache, median (best) of repeats ==")
        print(f"{'rows':>7}{'decode_rows ms':>20}{'raw memmap[ids] ms':>22}{'raw sorted ms':>18}")
        for m in (1, 100, 1000, 10000):
            r = reps if m <= 1000 else max(5, reps // 10)
            id_sets = [np.random.default_rng(100 + i).integers(0, rows, size=m) for i in range(r)]
            t_dec, t_raw, t_sorted = [], [], []
            for ids in id_sets:
                t0 = time.perf_counter()
                got = codec.decode_rows(codes, scales_mm, ids)
                t_dec.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                raw = codes[ids]
                t_raw.append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                np.take(codes, np.sort(ids), axis=0)
                t_sorted.append(time.perf_counter() - t0)
                assert got.shape == raw.shape
            def fmt(ts: list[float]) -> str:
                return f"{np.median(ts) * 1e3:.3f} ({min(ts) * 1e3:.3f})"
            print(f"{m:>7}{fmt(t_dec):>20}{fmt(t_raw):>22}{fmt(t_sorted):>18}")
        del codes, scales_mm


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=200_000, help="rows of the throughput array")
    p.add_argument("--dim", type=int, default=384)
    p.add_argument("--repeat", type=int, default=7, help="timed repeats per measurement (best is shown)")
    p.add_argument("--threads", type=int, default=None, help="codec threads (default: all CPUs)")
    p.add_argument("--fetch-rows", type=int, default=2_700_000, help="rows of the memmapped int8 file")
    p.add_argument("--fetch-reps", type=int, default=100, help="repeats per fetch size")
    p.add_argument("--skip-fetch", action="store_true")
    p.add_argument("--skip-throughput", action="store_true")
    a = p.parse_args(argv)
    print(f"numpy {np.__version__}, ml_dtypes {ml_dtypes.__version__}, CPUs {os.cpu_count()}")
    if not a.skip_throughput:
        throughput(a.rows, a.dim, a.repeat, a.threads)
    if not a.skip_fetch:
        fetch(a.fetch_rows, a.dim, a.fetch_reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
