"""The ``bin`` shard format: a headerless flat array of tokens (nanoGPT's ``train.bin``).

The file holds nothing but the little-endian token ids; the dtype lives in the
manifest, and a reader must be told it (it is never guessed from the size).
Nothing in it counts tokens, so a shard may hold more than 2**31 tokens (its
``.bos.idx`` then has int64 entries): nanoGPT's one ``train.bin`` per split.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ConfigError, ValidationError
from .base import UNLIMITED_SHARD_TOKENS, ShardFormat

__all__ = ["RawBinFormat", "RAWBIN"]


class RawBinFormat(ShardFormat):
    name = "bin"
    extension = "bin"
    header_magic = None
    max_tokens = UNLIMITED_SHARD_TOKENS

    def header(self, ntokens: int, dtype: np.dtype) -> bytes:
        self.check_dtype(dtype)
        return b""

    def unknown_dtype(self, path: Path) -> np.dtype:
        """The dtype of a shard whose reader was not told it: a headerless file does not record it."""
        raise ConfigError(f"{path}: a headerless .bin shard does not record its dtype; pass dtype='uint16' or 'uint32'")

    def read_header(self, path: Path, dtype: np.dtype | None) -> tuple[int, int, np.dtype]:
        dt = self.unknown_dtype(path) if dtype is None else np.dtype(dtype).newbyteorder("<")
        size = path.stat().st_size
        if size % dt.itemsize:
            raise ValidationError(f"{path}: {size} bytes is not a whole number of {dt} tokens")
        return 0, size // dt.itemsize, dt


RAWBIN = RawBinFormat()
