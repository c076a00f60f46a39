"""The contract every shard format implements."""

from __future__ import annotations

import os
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Callable

import numpy as np

from ..errors import ConfigError, ValidationError

__all__ = ["ShardFormat", "TOKEN_DTYPES", "MAX_SHARD_TOKENS", "UNLIMITED_SHARD_TOKENS"]

# Token ids are stored little-endian; uint16 when every id fits, else uint32.
TOKEN_DTYPES = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
# The most tokens a shard holds in a format whose header stores the count as int32
# (nanogpt, nanogpt-legacy) or that keeps int32 per-shard fields (megatron): the default limit.
MAX_SHARD_TOKENS = 2**31 - 1
# A headerless format's limit: any count an int64 .bos.idx entry can index ("unlimited").
UNLIMITED_SHARD_TOKENS = 2**63 - 1


class ShardFormat(ABC):
    """How one shard file lays out its tokens."""

    name: str
    extension: str
    """File extension without the dot."""
    header_magic: int | None = None
    """The header's magic number, for formats that have one."""
    max_tokens: int = MAX_SHARD_TOKENS
    """The most tokens one shard of this format holds (``BuildConfig.shard_tokens`` is checked against it)."""

    def check_dtype(self, dtype: np.dtype) -> None:
        """Raise ``ConfigError`` if this format cannot store ``dtype``."""
        if np.dtype(dtype) not in TOKEN_DTYPES.values():
            raise ConfigError(f"format {self.name!r} stores uint16 or uint32 tokens, not {np.dtype(dtype)}")

    @abstractmethod
    def header(self, ntokens: int, dtype: np.dtype) -> bytes:
        """The bytes that precede the tokens in a shard of ``ntokens`` tokens."""

    @abstractmethod
    def read_header(self, path: Path, dtype: np.dtype | None) -> tuple[int, int, np.dtype]:
        """``(header_bytes, ntokens, dtype)`` of an existing shard; raises ``ValidationError``.

        ``dtype`` is required for formats whose files do not record it.
        """

    def sidecars(self, shard_path: Path, ntokens: int, dtype: np.dtype, starts: np.ndarray) -> dict[Path, bytes]:
        """Files this format keeps beside a shard, besides its ``.bos.idx``: ``{path: bytes}`` (none by default).

        Derived from the shard's token count, dtype and document starts
        (``.bos.idx`` entries), never from its tokens. The writer writes each
        atomically and the manifest lists them in the shard's ``sidecars``.
        """
        return {}

    def check_sidecars(self, shard_path: Path, ntokens: int, dtype: np.dtype, starts: np.ndarray) -> list[str]:
        """Problems with the sidecars of an existing shard whose documents start at ``starts`` (none by default).

        Sizes and SHA-256 against the manifest, and missing files, are checked
        by the caller; this checks what the bytes say.
        """
        return []

    def open(
        self, path: Path | str, dtype: np.dtype | None = None, *, check: Callable[[os.stat_result], None] | None = None
    ) -> np.ndarray:
        """A read-only memory map of the shard's tokens, after checking header and size.

        ``check``, given, is called with the file's ``stat`` first (a reader's check against the stats recorded
        at publish, ``ShardSet``: one ``stat`` for both).
        """
        path = Path(path)
        offset, ntokens, dt = self.read_header(path, dtype)
        st = path.stat()
        if check is not None:
            check(st)
        size = st.st_size
        expected = offset + ntokens * dt.itemsize
        if size != expected:
            raise ValidationError(
                f"{path}: file is {size} bytes but its header says {ntokens} tokens of {dt.itemsize} bytes "
                f"after a {offset}-byte header ({expected} bytes); the shard is truncated or was changed"
            )
        if ntokens == 0:
            return np.zeros(0, dtype=dt)
        # A str, not the Path: np.memmap resolves a Path (a realpath, one lstat per component, per shard mapped).
        return np.memmap(os.fspath(path), dtype=dt, mode="r", offset=offset, shape=(ntokens,))
