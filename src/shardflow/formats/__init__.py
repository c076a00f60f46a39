"""Shard file formats: one module reads and writes each, registered here by name.

A shard is a flat array of token ids, optionally preceded by a header. Every
format offers the same small contract (``ShardFormat``): the header bytes for
a given token count and dtype, and a read-only memory map of the tokens that
refuses a file whose header or size disagrees; formats that keep files beside
a shard (``megatron``'s ``.idx``) also say what they hold (``sidecars``) and
check them (``check_sidecars``). Byte layouts are specified in
``docs/FORMAT.md``.
"""

from __future__ import annotations

from ..errors import ConfigError
from .base import ShardFormat
from .megatron import MEGATRON
from .nanogpt import NANOGPT, NANOGPT_LEGACY
from .npy import NPY
from .rawbin import RAWBIN

__all__ = ["ShardFormat", "FORMATS", "get_format", "NANOGPT", "NANOGPT_LEGACY", "NPY", "RAWBIN", "MEGATRON"]

FORMATS: dict[str, ShardFormat] = {f.name: f for f in (NANOGPT, NANOGPT_LEGACY, NPY, RAWBIN, MEGATRON)}


def get_format(name: str) -> ShardFormat:
    """The format called ``name``; a ``ConfigError`` lists the known ones."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ConfigError(f"unknown shard format {name!r}; use one of {', '.join(FORMATS)}") from None
