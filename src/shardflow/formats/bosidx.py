"""The ``.bos.idx`` sidecar: where documents start in a shard.

A headerless array of little-endian token indices (not bytes) of every document start in the
shard, strictly ascending; int32 entries when the shard holds at most ``MAX_INT32_TOKENS`` tokens,
else int64. The width follows from the shard's token count alone, which every reader knows, so
the file carries no header and indexes of smaller shards stay byte-identical. What the entries
point at for each placement: docs/FORMAT.md (section ``.bos.idx``).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ValidationError

__all__ = ["BOS_IDX_SUFFIX", "BOS_IDX_DTYPE", "MAX_INT32_TOKENS", "entry_dtype", "encode", "read", "index_path"]

BOS_IDX_SUFFIX = ".bos.idx"
BOS_IDX_DTYPE = np.dtype("<i4")
"""The entries of a shard of at most ``MAX_INT32_TOKENS`` tokens."""
WIDE_DTYPE = np.dtype("<i8")
MAX_INT32_TOKENS = 2**31 - 1
"""A shard of more tokens than this has int64 entries (its last token's index no longer fits int32).
Read through ``entry_dtype`` at call time, never copied: tests lower it to write int64 indexes of small shards."""


def entry_dtype(ntokens: int | None) -> np.dtype:
    """The entry dtype of the index of a shard of ``ntokens`` tokens (None: a shard known to be small)."""
    return BOS_IDX_DTYPE if ntokens is None or ntokens <= MAX_INT32_TOKENS else WIDE_DTYPE


def index_path(shard: Path) -> Path:
    """The sidecar of a shard: same directory and stem, suffix ``.bos.idx``."""
    return shard.with_name(shard.stem + BOS_IDX_SUFFIX)


def encode(starts: np.ndarray, ntokens: int | None = None) -> bytes:
    """The bytes of the index of a shard of ``ntokens`` tokens whose documents start at ``starts``."""
    starts = np.asarray(starts)
    dtype = entry_dtype(ntokens)
    if len(starts) and int(starts.max()) > np.iinfo(dtype).max:
        raise ValueError(f"document start {int(starts.max())} does not fit {dtype}; pass the shard's token count")
    return starts.astype(dtype).tobytes()


def read(path: Path | str, ntokens: int | None = None) -> np.ndarray:
    """The entries of the index of a shard of ``ntokens`` tokens, checked for size, order and range.

    Int32 or int64 as on disk (``entry_dtype(ntokens)``); None: a shard of at most ``MAX_INT32_TOKENS``.
    """
    path = Path(path)
    try:
        size = path.stat().st_size  # one stat, not exists() then stat(): readers read thousands of indexes
    except FileNotFoundError:
        raise ValidationError(f"{path}: the .bos.idx index is missing") from None
    dtype = entry_dtype(ntokens)
    if size % dtype.itemsize:
        raise ValidationError(
            f"{path}: {size} bytes is not a whole number of {'int32' if dtype.itemsize == 4 else 'int64'} entries "
            f"(the index of a shard of {ntokens if ntokens is not None else 'at most 2**31 - 1'} tokens)"
        )
    starts = np.fromfile(path, dtype=dtype)
    if len(starts) > 1 and not np.all(starts[1:] > starts[:-1]):
        raise ValidationError(f"{path}: entries are not strictly ascending")
    if len(starts) and (starts[0] < 0 or (ntokens is not None and starts[-1] >= ntokens)):
        raise ValidationError(f"{path}: entries point outside the shard's {ntokens} tokens")
    return starts
