"""``float32`` and ``float16``: the plain IEEE codecs, no scales.

``float32`` is an exact copy; ``float16`` is numpy's round-to-nearest-even
cast, saturated at +-65504 (like the fp8 codecs) instead of overflowing to
infinity, and decoded through a 65536-entry lookup table.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .base import F32, Codec, check_input, for_row_blocks, non_finite_error, rows_per_chunk

_FLOAT16_MAX = float(np.finfo(np.float16).max)  # 65504


@dataclass(frozen=True, kw_only=True)
class FloatCodec(Codec):
    """``float32`` (copy) and ``float16`` (RNE cast, saturated at +-65504)."""

    def encode(self, x: F32, *, threads: int | None = None) -> tuple[NDArray[Any], None]:
        xc = check_input(x)
        n, d = xc.shape
        codes = np.empty((n, d), dtype=self.storage_dtype)
        rpc = rows_per_chunk(d)
        half = self.storage_dtype == np.float16
        failed: list[bool] = []

        def work(start: int, stop: int) -> None:
            for s in range(start, stop, rpc):
                e = min(s + rpc, stop)
                if not np.isfinite(xc[s:e]).all():
                    failed.append(True)
                    return
                if half:
                    # Saturate like the fp8 codecs instead of overflowing to inf.
                    np.copyto(codes[s:e], np.clip(xc[s:e], -_FLOAT16_MAX, _FLOAT16_MAX), casting="same_kind")
                else:
                    np.copyto(codes[s:e], xc[s:e])

        for_row_blocks(n, d, work, threads)
        if failed:
            raise non_finite_error()
        return codes, None

    def decode_chunk(self, codes: NDArray[Any], scales: F32 | None, out: F32) -> None:
        if self.storage_dtype == np.float16:
            # A 65536-entry table (256 KiB) beats numpy's half->single cast.
            # Exact: the table is that very cast.
            np.take(_float16_decode_table(), codes.view(np.uint16), out=out, mode="wrap")
        else:
            np.copyto(out, codes)


# Built on first use (not at import) and kept: 256 KiB, and only float16
# decoding needs it.
@functools.cache
def _float16_decode_table() -> F32:
    return np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)
