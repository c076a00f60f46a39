"""The codec contract and what every codec shares.

:class:`Codec` (the interface, plus ``decode`` and ``decode_rows``, which every
codec gets for free around its own ``decode_chunk``), the input/codes/scales/out
checks, the persistent thread pool and the row-block chunking that all encoders
and decoders run on, and the per-row absmax and scale computation of the scaled
codecs (int8, fp8 rowscale).  No codec lives here; see the package docstring.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

F32 = NDArray[np.float32]

# Elements processed per chunk by one thread.  2^18 float32 = 1 MiB, about one
# core's L2: smaller chunks lose to per-call and GIL hand-off overhead, larger
# ones gain nothing (e4m3 encode, bench/bench_codecs.py).
_CHUNK_ELEMS = 1 << 18

# Below this many elements the thread hand-off costs more than it saves.
_PARALLEL_MIN_ELEMS = 4 * _CHUNK_ELEMS

_ABS_MASK = np.uint32(0x7FFFFFFF)
_F32_INF_BITS = 0x7F800000

# Smallest absmax an int8/rowscale row is scaled by: keeps 1/scale finite in
# float32 for rows of tiny (even subnormal) values.  Such rows lose precision,
# which is fine: their contribution to any similarity is nil.
_MIN_ABSMAX = float(np.finfo(np.float32).tiny) * 2.0**24
# Largest absmax a row is scaled by: near FLT_MAX, code * scale (= qmax *
# fl(absmax / qmax)) could round past FLT_MAX to inf on decode.  Values above
# the cap saturate at qmax, an error of at most 2^-16 relative.
_MAX_ABSMAX = float(np.finfo(np.float32).max) * (1.0 - 2.0**-16)

def _num_threads() -> int:
    """Worker threads for large arrays: the CPUs this process may run on."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        n = os.cpu_count() or 1
    return max(1, min(n, 16))


_POOL_LOCK = threading.Lock()
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    # One persistent pool: creating threads on every call would cost more than
    # a small random-row fetch itself.
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(_num_threads(), thread_name_prefix="shardflow-codec")
        return _POOL


def _forget_pool_after_fork() -> None:
    # A forked child inherits the pool object but not its threads; submitting
    # to it would hang forever.  Start afresh (lazily) in the child.
    global _POOL, _POOL_LOCK
    _POOL = None
    _POOL_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pool_after_fork)


def for_row_blocks(
    n: int, d: int, work: Callable[[int, int], None], threads: int | None
) -> None:
    """Run ``work(start, stop)`` over contiguous row blocks covering ``[0, n)``.

    Rows are split into one contiguous block per thread (not many small tasks)
    so each worker streams through memory and allocates its scratch once.
    """
    if n == 0:
        return
    t = _num_threads() if threads is None else threads
    if t < 1:
        raise ValueError(f"threads must be >= 1, got {t}")
    t = min(t, n)
    if t == 1 or n * d < _PARALLEL_MIN_ELEMS:
        work(0, n)
        return
    bounds = [n * i // t for i in range(t + 1)]
    futures = [_pool().submit(work, bounds[i], bounds[i + 1]) for i in range(t)]
    for f in futures:
        f.result()  # re-raises a worker's exception here


def rows_per_chunk(d: int) -> int:
    return max(1, _CHUNK_ELEMS // d)


def check_matrix(x: Any, what: str) -> None:
    if not isinstance(x, np.ndarray):
        raise ValueError(f"{what} must be a numpy array, got {type(x).__name__}")
    if x.ndim != 2:
        raise ValueError(f"{what} must be 2-D (n, d), got shape {x.shape}")
    if x.shape[1] < 1:
        raise ValueError(f"{what} must have at least one column, got shape {x.shape}")


def check_input(x: Any) -> F32:
    check_matrix(x, "x")
    if x.dtype != np.float32:
        raise ValueError(f"x must be float32, got {x.dtype}; convert with x.astype(np.float32)")
    # Chunk views below assume C order; copying once is cheaper than strided
    # bit tricks on every pass.
    return np.ascontiguousarray(x)


def non_finite_error() -> ValueError:
    return ValueError("x contains NaN or infinity; embeddings must be finite")


def row_absmax(xc: F32, scratch_u32: NDArray[np.uint32]) -> NDArray[np.float32]:
    """Per-row max |x| of a C-contiguous chunk; raises on NaN/inf.

    Works on the uint32 view: clearing the sign bit gives |x|, and for
    non-negative floats integer order equals float order, so an integer max is
    exact, faster than ``np.abs(x).max(1)``, and exposes NaN/inf as patterns
    >= 0x7F800000 for free.
    """
    a = scratch_u32[: xc.size].reshape(xc.shape)
    np.bitwise_and(xc.view(np.uint32), _ABS_MASK, out=a)
    m = a.max(axis=1)
    if m.size and int(m.max()) >= _F32_INF_BITS:
        raise non_finite_error()
    return m.view(np.float32)


def scales_from_absmax(absmax: NDArray[np.float32], qmax: float) -> tuple[F32, F32]:
    """Return ``(scale, inverse)`` per row so that ``x * inverse`` spans +-qmax.

    Computed in float64 (n values only, so it is free) to keep the float32
    results correctly rounded.  All-zero rows get scale 1.0 (codes are zeros
    anyway) so that every stored scale is positive and finite.
    """
    a = absmax.astype(np.float64)
    zero = a == 0.0
    a = np.where(zero, qmax, np.clip(a, _MIN_ABSMAX, _MAX_ABSMAX))
    scale = (a / qmax).astype(np.float32)
    inv = (qmax / a).astype(np.float32)
    return scale, inv


def _check_scales(scales: Any, n: int, codec: str) -> NDArray[np.float32]:
    if not isinstance(scales, np.ndarray):
        raise ValueError(f"codec {codec!r} needs a float32 scales array of shape ({n},)")
    if scales.dtype != np.float32 or scales.shape != (n,):
        raise ValueError(
            f"codec {codec!r} needs float32 scales of shape ({n},), "
            f"got {scales.dtype} {scales.shape}"
        )
    # n values: cheap, and a zero/NaN scale would poison every decoded value.
    if n and not (np.isfinite(scales).all() and (scales > 0).all()):
        raise ValueError(f"codec {codec!r}: scales must be positive and finite")
    return scales


def _prepare_decode(
    codec: Codec, codes: Any, scales: Any, out: Any
) -> tuple[NDArray[Any], NDArray[np.float32] | None, F32]:
    check_matrix(codes, "codes")
    if codes.dtype != codec.storage_dtype:
        hint = " (fp8 codes are stored as uint8 bit patterns)" if codec.storage_dtype == np.uint8 else ""
        raise ValueError(
            f"codec {codec.name!r} decodes {codec.storage_dtype} codes, got {codes.dtype}{hint}"
        )
    n, d = codes.shape
    if codec.has_scales:
        scales = _check_scales(scales, n, codec.name)
    elif scales is not None:
        raise ValueError(f"codec {codec.name!r} has no scales; pass scales=None")
    if out is None:
        out = np.empty((n, d), dtype=np.float32)
    elif not (
        isinstance(out, np.ndarray)
        and out.dtype == np.float32
        and out.shape == (n, d)
        and out.flags.c_contiguous
        and out.flags.writeable
    ):
        raise ValueError(f"out must be a writeable C-contiguous float32 array of shape ({n}, {d})")
    return np.ascontiguousarray(codes), scales, out


@dataclass(frozen=True, kw_only=True)
class Codec:
    """A named, stateless quantization codec (see the table in :mod:`shardflow.codecs`).

    ``encode(x)`` takes a finite float32 ``(n, d)`` array and returns
    ``(codes, scales)``: ``codes`` has shape ``(n, d)`` and dtype
    :attr:`storage_dtype`; ``scales`` is float32 ``(n,)`` when
    :attr:`has_scales`, else ``None``.  ``decode(codes, scales, out=None)``
    returns float32 ``(n, d)`` (written into ``out`` when given).  Both take an
    optional keyword ``threads`` (default: the CPUs available).  A codec
    implements ``encode`` and ``decode_chunk``; ``decode`` checks its arguments
    and runs ``decode_chunk`` on row chunks.
    """

    name: str
    storage_dtype: np.dtype[Any]
    has_scales: bool

    def encode(self, x: F32, *, threads: int | None = None) -> tuple[NDArray[Any], F32 | None]:
        raise NotImplementedError

    def decode(
        self,
        codes: NDArray[Any],
        scales: F32 | None = None,
        out: F32 | None = None,
        *,
        threads: int | None = None,
    ) -> F32:
        codes, scales, out = _prepare_decode(self, codes, scales, out)
        n, d = codes.shape
        rpc = rows_per_chunk(d)

        def work(start: int, stop: int) -> None:
            for s in range(start, stop, rpc):
                e = min(s + rpc, stop)
                self.decode_chunk(codes[s:e], None if scales is None else scales[s:e], out[s:e])

        for_row_blocks(n, d, work, threads)
        return out

    def decode_chunk(self, codes: NDArray[Any], scales: F32 | None, out: F32) -> None:
        """Decode one block of checked, C-contiguous rows into ``out``: each codec's own step of ``decode``."""
        raise NotImplementedError

    def decode_rows(
        self,
        codes: NDArray[Any],
        scales: F32 | None,
        ids: NDArray[np.integer[Any]] | Sequence[int],
        out: F32 | None = None,
        *,
        threads: int | None = 1,
    ) -> F32:
        """Fetch rows ``ids`` (any order, repeats allowed) and decode them.

        ``codes``/``scales`` may be memory-mapped (``np.load(mmap_mode="r")``).
        The ids are sorted before gathering so the reads walk the file forward
        (page-cache and TLB friendly, unlike an unsorted fancy index), then the gathered *codes* are put back into the
        caller's order (cheaper than permuting the 2-4x larger float32 rows)
        and decoded once.
        """
        check_matrix(codes, "codes")
        idx = np.asarray(ids)
        if idx.ndim != 1 or (idx.size and idx.dtype.kind not in "iu"):
            raise ValueError(f"ids must be a 1-D integer array, got {idx.dtype} shape {idx.shape}")
        n = codes.shape[0]
        idx = idx.astype(np.intp, copy=False)
        if idx.size and (int(idx.min()) < 0 or int(idx.max()) >= n):
            raise ValueError(f"ids must be in [0, {n}), got range [{idx.min()}, {idx.max()}]")
        order = np.argsort(idx, kind="stable")
        sub_sorted = np.take(codes, idx[order], axis=0)
        sub = np.empty_like(sub_sorted)
        sub[order] = sub_sorted  # un-permute
        sub_scales = None if scales is None else np.take(scales, idx)
        return self.decode(sub, sub_scales, out, threads=threads)

