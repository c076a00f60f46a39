"""Arrow arrays to and from numpy without pyarrow's Python-object conversions, which import pandas.

pyarrow's conversion of Python objects (``pa.array(list)``, ``pa.scalar``,
``pc.fill_null(x, 0)``) and a ``BooleanArray``'s ``to_numpy`` first import
pandas to recognise its types: its import holds the GIL (docs/PERFORMANCE.md)
in a build process that never uses pandas, where Prefect's import and the tokenizer's load are waiting
for the same GIL. These helpers give the same arrays from their buffers.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa

__all__ = ["large_strings", "large_binaries", "bool_array", "byte_lengths"]


def large_strings(values: Sequence[str | None]) -> pa.Array:
    """``pa.array(values, type=pa.large_string())``: raises ``UnicodeEncodeError`` on a lone surrogate, as it does."""
    return _from_bytes(pa.large_string(), [None if v is None else v.encode("utf-8") for v in values])


def large_binaries(values: Sequence[bytes | None]) -> pa.Array:
    """``pa.array(values, type=pa.large_binary())``."""
    return _from_bytes(pa.large_binary(), values)


def _from_bytes(type_: pa.DataType, values: Sequence[bytes | None]) -> pa.Array:
    n = len(values)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.fromiter((0 if v is None else len(v) for v in values), dtype=np.int64, count=n), out=offsets[1:])
    data = b"".join(v for v in values if v is not None)
    valid = np.fromiter((v is not None for v in values), dtype=bool, count=n)
    nulls = n - int(valid.sum())
    validity = pa.py_buffer(np.packbits(valid, bitorder="little")) if nulls else None
    return pa.Array.from_buffers(type_, n, [validity, pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls)


def bool_array(mask: pa.Array) -> np.ndarray:
    """A ``BooleanArray`` without nulls as numpy bools, unpacked from its bitmap (least significant bit first)."""
    if mask.null_count:
        raise ValueError("bool_array: the mask has nulls")
    bits = np.frombuffer(mask.buffers()[1], dtype=np.uint8)
    return np.unpackbits(bits, bitorder="little")[mask.offset : mask.offset + len(mask)].astype(bool)


def byte_lengths(texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each value's length in bytes (``pc.binary_length``; a null's is 0) of a string or binary array, large or not,
    as int64, from its offsets (``to_numpy`` of the lengths imports pandas)."""
    if isinstance(texts, pa.ChunkedArray):
        parts = [byte_lengths(chunk) for chunk in texts.chunks]
        return np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    large = pa.types.is_large_string(texts.type) or pa.types.is_large_binary(texts.type)
    buf = texts.buffers()[1]
    if buf is None:  # an empty array may have no offsets buffer
        return np.zeros(len(texts), dtype=np.int64)
    offsets = np.frombuffer(buf, dtype=np.int64 if large else np.int32)[texts.offset : texts.offset + len(texts) + 1]
    return np.diff(offsets).astype(np.int64, copy=False)
