"""The ``.bos.idx`` sidecar: where documents start in a shard.

A headerless array of little-endian int32: the token index (counted from the
first token after any header, not in bytes) of every document start in the
shard, strictly ascending. With BOS placement each entry points at a BOS
token; with EOS placement it points at the token after an EOS (or 0). A
document continued from the previous shard has no entry.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ValidationError

__all__ = ["BOS_IDX_SUFFIX", "BOS_IDX_DTYPE", "encode", "read", "index_path"]

BOS_IDX_SUFFIX = ".bos.idx"
BOS_IDX_DTYPE = np.dtype("<i4")


def index_path(shard: Path) -> Path:
    """The sidecar of a shard: same directory and stem, suffix ``.bos.idx``."""
    return shard.with_name(shard.stem + BOS_IDX_SUFFIX)


def encode(starts: np.ndarray) -> bytes:
    """The bytes of an index holding ``starts`` (token indices within the shard)."""
    return np.asarray(starts, dtype=BOS_IDX_DTYPE).tobytes()


def read(path: Path | str, ntokens: int | None = None) -> np.ndarray:
    """The entries of an index file, checked for size, order and range."""
    path = Path(path)
    if not path.exists():
        raise ValidationError(f"{path}: the .bos.idx index is missing")
    size = path.stat().st_size
    if size % BOS_IDX_DTYPE.itemsize:
        raise ValidationError(f"{path}: {size} bytes is not a whole number of int32 entries")
    starts = np.fromfile(path, dtype=BOS_IDX_DTYPE)
    if len(starts) > 1 and not np.all(starts[1:] > starts[:-1]):
        raise ValidationError(f"{path}: entries are not strictly ascending")
    if len(starts) and (starts[0] < 0 or (ntokens is not None and starts[-1] >= ntokens)):
        raise ValidationError(f"{path}: entries point outside the shard's {ntokens} tokens")
    return starts
