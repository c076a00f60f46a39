"""``int8``: row-wise absmax quantization to signed bytes, one float32 scale per row.

``s = absmax(row) / 127`` and ``codes = rint(x / s)`` in [-127, 127]; decoding
is ``codes * s``.  The absmax and scale helpers are shared with the fp8
rowscale codecs (see :mod:`.base`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import NDArray

from .base import F32, Codec, check_input, for_row_blocks, non_finite_error, row_absmax, rows_per_chunk, scales_from_absmax


@dataclass(frozen=True, kw_only=True)
class Int8Codec(Codec):
    """Row-wise absmax int8: ``s = absmax/127``, ``codes = rint(x/s)``.

    Codes lie in [-127, 127] (symmetric: -128 is never used, so negation is
    exact).  All-zero rows get scale 1.0.
    """

    def encode(self, x: F32, *, threads: int | None = None) -> tuple[NDArray[np.int8], F32]:
        xc = check_input(x)
        n, d = xc.shape
        codes = np.empty((n, d), dtype=np.int8)
        scales = np.empty(n, dtype=np.float32)
        rpc = rows_per_chunk(d)
        failed: list[bool] = []

        def work(start: int, stop: int) -> None:
            buf = np.empty(min(rpc, stop - start) * d, dtype=np.uint32)
            for s in range(start, stop, rpc):
                e = min(s + rpc, stop)
                try:
                    absmax = row_absmax(xc[s:e], buf)
                except ValueError:
                    failed.append(True)
                    return
                scale, inv = scales_from_absmax(absmax, 127.0)
                scales[s:e] = scale
                y = buf.view(np.float32)[: (e - s) * d].reshape(e - s, d)
                # Multiply by the reciprocal (a multiply is much cheaper than a
                # divide); |x * inv| <= 127 * (1 + 2 eps) so rint never exceeds
                # 127 and the clip is only a guard.
                np.multiply(xc[s:e], inv[:, None], out=y)
                np.rint(y, out=y)
                np.clip(y, -127.0, 127.0, out=y)
                np.copyto(codes[s:e], y, casting="unsafe")

        for_row_blocks(n, d, work, threads)
        if failed:
            raise non_finite_error()
        return codes, scales

    def decode_chunk(self, codes: NDArray[Any], scales: F32 | None, out: F32) -> None:
        assert scales is not None  # has_scales: decode has checked them
        np.multiply(codes, scales[:, None], out=out)
