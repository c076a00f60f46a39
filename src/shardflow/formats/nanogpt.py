"""The nanogpt shard formats: a 256 x int32 header, then the tokens.

``nanogpt`` (llm.c / modded-nanogpt, version 1 with a width field):
header[0] = 278895051, header[1] = 1, header[2] = number of tokens,
header[3] = bytes per token (2 or 4), header[4:256] = 0; then the tokens,
little-endian, 2 or 4 bytes each.

``nanogpt-legacy`` (llm.c's original): header[0] = 20240520, header[1] = 1,
header[2] = number of tokens, the rest 0; uint16 tokens only, because its
readers assume 2 bytes per token.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..errors import ConfigError, ValidationError
from .base import TOKEN_DTYPES, ShardFormat

__all__ = ["NanoGPTFormat", "NANOGPT", "NANOGPT_LEGACY", "HEADER_INTS", "HEADER_BYTES"]

HEADER_INTS = 256
HEADER_BYTES = HEADER_INTS * 4


class NanoGPTFormat(ShardFormat):
    """A 1024-byte int32 header (magic, version, count[, width]) and the tokens."""

    def __init__(self, *, name: str, magic: int, records_width: bool) -> None:
        self.name = name
        self.extension = "bin"
        self.header_magic = magic
        self.records_width = records_width

    def check_dtype(self, dtype: np.dtype) -> None:
        super().check_dtype(dtype)
        if not self.records_width and np.dtype(dtype).itemsize != 2:
            raise ConfigError(
                f"format {self.name!r} stores uint16 tokens only, but this tokenizer needs {np.dtype(dtype)} "
                "(its ids reach 65536 or more); use --format nanogpt, which records 4-byte tokens in its header"
            )

    def header(self, ntokens: int, dtype: np.dtype) -> bytes:
        self.check_dtype(dtype)
        if not 0 <= ntokens <= self.max_tokens:
            raise ConfigError(f"format {self.name!r} records the token count as int32: {ntokens} tokens do not fit one shard")
        head = np.zeros(HEADER_INTS, dtype="<i4")
        head[0] = self.header_magic
        head[1] = 1
        head[2] = ntokens
        if self.records_width:
            head[3] = np.dtype(dtype).itemsize
        return head.tobytes()

    def read_header(self, path: Path, dtype: np.dtype | None) -> tuple[int, int, np.dtype]:
        with open(path, "rb") as f:
            raw = f.read(HEADER_BYTES)
        if len(raw) < HEADER_BYTES:
            raise ValidationError(f"{path}: {len(raw)} bytes, shorter than the {HEADER_BYTES}-byte {self.name} header")
        head = np.frombuffer(raw, dtype="<i4")
        if int(head[0]) != self.header_magic:
            raise ValidationError(
                f"{path}: header magic {int(head[0])} is not {self.name}'s {self.header_magic}; "
                "wrong format or a damaged header"
            )
        if int(head[1]) != 1:
            raise ValidationError(f"{path}: unsupported {self.name} header version {int(head[1])} (expected 1)")
        ntokens = int(head[2])
        if ntokens < 0:
            raise ValidationError(f"{path}: header token count {ntokens} is negative")
        if self.records_width:
            width = int(head[3])
            if width not in (2, 4):
                raise ValidationError(f"{path}: header says {width} bytes per token; only 2 and 4 are defined")
            found = TOKEN_DTYPES["uint16" if width == 2 else "uint32"]
        else:
            found = TOKEN_DTYPES["uint16"]
        if dtype is not None and np.dtype(dtype) != found:
            raise ValidationError(f"{path}: header says {found} tokens but the manifest says {np.dtype(dtype)}")
        return HEADER_BYTES, ntokens, found


NANOGPT = NanoGPTFormat(name="nanogpt", magic=278895051, records_width=True)
NANOGPT_LEGACY = NanoGPTFormat(name="nanogpt-legacy", magic=20240520, records_width=False)
