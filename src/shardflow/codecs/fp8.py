"""fp8 codecs: ``e4m3`` and ``e5m2``, each plain (saturating) or with row scales.

Codes are the raw fp8 bit patterns stored as ``uint8`` (numpy cannot
round-trip ml_dtypes' fp8 dtypes through ``.npy``; the manifest records the
codec name instead).  Encoding is an exact 16384-entry table method (see
:func:`_fp8_encode_table`), bit-identical to ml_dtypes' round-to-nearest-even
cast of the input clipped to the format's finite range; decoding is a
256-entry lookup table.  ml_dtypes is used only to build the tables, because
its own cast is slow (docs/PERFORMANCE.md) and turns values above 464 into NaN.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Literal

import ml_dtypes
import numpy as np
from numpy.typing import NDArray

from .base import F32, Codec, check_input, for_row_blocks, non_finite_error, row_absmax, rows_per_chunk, scales_from_absmax

# The encode table is indexed by the top 14 bits of the float32 pattern (sign,
# 8 exponent bits, 5 mantissa bits) with the lowest of them OR-ed with a sticky
# bit for the 18 bits below; see _fp8_encode_table for why that is exact.
_KEY_SHIFT = 18
_LOW_MASK = np.uint32((1 << _KEY_SHIFT) - 1)
_KEY_SHIFT_U32 = np.uint32(_KEY_SHIFT)


Fp8Format = Literal["e4m3", "e5m2"]
_FP8_DTYPES: dict[str, Any] = {
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
}


@functools.cache
def _fp8_max(fmt: Fp8Format) -> float:
    return float(ml_dtypes.finfo(_FP8_DTYPES[fmt]).max)  # 448 / 57344


@functools.cache
def _fp8_encode_table(fmt: Fp8Format) -> NDArray[np.uint8]:
    """16384-entry table: key(float32 bits) -> fp8 code, built by ml_dtypes.

    The key is ``(u >> 18) | sticky`` where ``u`` is the float32 bit pattern
    and ``sticky`` is 1 iff any of bits 0..17 is set.  It keeps sign, exponent
    and mantissa bits 22..19 exactly, and folds bit 18 and everything below
    into one "is there anything below bit 19" flag.

    That is all round-to-nearest-even needs: both fp8 formats keep at most 3
    mantissa bits, so their round bit is bit 19 or higher (higher for their
    subnormals) and bits 18..0 only ever matter as "zero or not" (tie vs.
    above the tie).  Hence every float32 with a given key rounds to the same
    fp8 value, and the table can be built by casting one representative per
    key with ml_dtypes itself; bit-exactness then follows by construction (and
    is checked exhaustively over all 2^32 patterns in the notes, and on every
    key in the tests).  The table also does the clipping: keys above the
    format's range map to +-max.  Non-finite keys map to the NaN code 0x7F/0xFF
    (which finite inputs never produce, as they saturate) so the encoder can
    detect them after the fact with one cheap pass over the uint8 codes.

    Why not ``float16`` as an intermediate: numpy's float32->float16 cast is
    slow (bench/bench_codecs.py) and the double rounding float32->float16->fp8 is not
    exact (e.g. 1 + 2**-4 + 2**-12 becomes the tie 1 + 2**-4 in float16, then
    rounds to 1.0 instead of 1.125 in e4m3).
    """
    dt = _FP8_DTYPES[fmt]
    maxv = _fp8_max(fmt)
    keys = np.arange(1 << (32 - _KEY_SHIFT), dtype=np.uint32)
    rep = (keys << _KEY_SHIFT_U32) | (keys & np.uint32(1))  # sticky -> set bit 0
    vals = rep.view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        table = np.clip(vals, -maxv, maxv).astype(dt).view(np.uint8).copy()
    non_finite = ((rep >> np.uint32(23)) & np.uint32(0xFF)) == 0xFF
    table[non_finite] = np.where(rep[non_finite] >> np.uint32(31) == 1, 0xFF, 0x7F)
    return table


@functools.cache
def _fp8_decode_table(fmt: Fp8Format) -> F32:
    return np.arange(256, dtype=np.uint8).view(_FP8_DTYPES[fmt]).astype(np.float32)


def _fp8_encode_chunk(
    u: NDArray[np.uint32],
    out: NDArray[np.uint8],
    table: NDArray[np.uint8],
    tmp: NDArray[np.uint32],
    key: NDArray[np.uint32],
    check_finite: bool,
) -> bool:
    """Encode one flat chunk of float32 bit patterns; return False on NaN/inf.

    Five integer passes plus one table gather, all on cache-resident buffers:
    ``key = (u >> 18) | (((u & 0x3FFFF) + 0x3FFFF) >> 18)``.  The add sets bit
    18 exactly when any of the low 18 bits is set (it cannot carry further, as
    the sum is at most 2 * 0x3FFFF), which is the sticky bit.
    """
    np.bitwise_and(u, _LOW_MASK, out=tmp)
    np.add(tmp, _LOW_MASK, out=tmp)
    np.right_shift(tmp, _KEY_SHIFT_U32, out=tmp)
    np.right_shift(u, _KEY_SHIFT_U32, out=key)
    np.bitwise_or(key, tmp, out=key)
    # mode="wrap" is the cheapest bounds mode (keys are < 2^14 by construction).
    np.take(table, key, out=out, mode="wrap")
    if not check_finite:
        return True
    # NaN codes (x & 0x7F == 0x7F) come only from non-finite input; OR-ing the
    # sign bit in makes them exactly 0xFF, so a max finds them.
    b = tmp.view(np.uint8)[: out.size]
    np.bitwise_or(out, np.uint8(0x80), out=b)
    return bool(b.size == 0 or int(b.max()) != 0xFF)


@dataclass(frozen=True, kw_only=True)
class Fp8Codec(Codec):
    """fp8 codes (``uint8`` bit patterns), optionally with per-row scaling.

    Without ``rowscale`` values beyond the format's range saturate at +-448
    (e4m3) / +-57344 (e5m2), exactly like ``np.clip`` then the ml_dtypes cast.
    With ``rowscale`` each row is first multiplied by ``max / absmax(row)``
    (scale = ``absmax / max`` stored as float32), so any magnitude fits and
    small-norm rows use the full exponent range.
    """

    fmt: Fp8Format
    rowscale: bool

    def encode(self, x: F32, *, threads: int | None = None) -> tuple[NDArray[np.uint8], F32 | None]:
        xc = check_input(x)
        n, d = xc.shape
        codes = np.empty((n, d), dtype=np.uint8)
        scales = np.empty(n, dtype=np.float32) if self.rowscale else None
        table = _fp8_encode_table(self.fmt)
        maxv = _fp8_max(self.fmt)
        rpc = rows_per_chunk(d)
        failed: list[bool] = []

        def work(start: int, stop: int) -> None:
            m = min(rpc, stop - start) * d
            tmp = np.empty(m, dtype=np.uint32)
            key = np.empty(m, dtype=np.uint32)
            y = np.empty(m, dtype=np.float32) if scales is not None else None
            for s in range(start, stop, rpc):
                e = min(s + rpc, stop)
                k = (e - s) * d
                if scales is not None and y is not None:
                    try:
                        absmax = row_absmax(xc[s:e], tmp)
                    except ValueError:
                        failed.append(True)
                        return
                    scale, inv = scales_from_absmax(absmax, maxv)
                    scales[s:e] = scale
                    yc = y[:k].reshape(e - s, d)
                    np.multiply(xc[s:e], inv[:, None], out=yc)
                    u = y[:k].view(np.uint32)
                else:
                    u = xc[s:e].reshape(-1).view(np.uint32)
                # With rowscale, row_absmax has already rejected NaN/inf.
                if not _fp8_encode_chunk(
                    u, codes[s:e].reshape(-1), table, tmp[:k], key[:k], check_finite=scales is None
                ):
                    failed.append(True)
                    return

        for_row_blocks(n, d, work, threads)
        if failed:
            raise non_finite_error()
        return codes, scales

    def decode_chunk(self, codes: NDArray[Any], scales: F32 | None, out: F32) -> None:
        # A 256-entry float32 table (1 KiB, L1-resident) gather is many times faster
        # than the ml_dtypes astype (docs/PERFORMANCE.md).  Exact by construction.
        np.take(_fp8_decode_table(self.fmt), codes, out=out, mode="wrap")
        if scales is not None:
            np.multiply(out, scales[:, None], out=out)
