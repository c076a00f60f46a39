"""Quantization codecs for per-document embedding matrices.

Each codec turns a finite ``float32`` matrix of shape ``(n, d)`` into a matrix
of *codes* (same shape, a compact storage dtype) plus, for the codecs that need
them, one ``float32`` scale per row; ``decode`` turns them back into
``float32``. The registry is :data:`CODECS`; look a codec up with
:func:`get_codec`; :func:`quality` measures what a codec costs in retrieval
terms. The codecs, their storage and ranges: docs/EMBEDDINGS.md ("Codecs").
Encoders and decoders run chunk-wise (bounded memory, cache-resident
temporaries) on a few threads, because numpy releases the GIL inside its loops.

The modules: ``base`` (the Codec contract, checks, thread pool, row-block
chunking, per-row absmax and scales), ``floats`` (float32, float16), ``fp8``
(e4m3, e5m2, with or without row scales), ``int8``, ``quality``.

Adding a codec: write one module with a frozen, keyword-only dataclass
subclassing ``base.Codec`` that implements ``encode`` (check input with
``check_input``, run the work through ``for_row_blocks`` in chunks of
``rows_per_chunk(d)`` rows, reject NaN/inf with ``non_finite_error``) and
``decode_chunk``, and add its instance to ``CODECS`` below. Its name (never
changed once published) must also be added to ``shardflow.config.EMBED_CODECS``:
the config keeps its own tuple because ``import shardflow`` must not import
ml_dtypes, and tests/test_codecs.py checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

import numpy as np

from ..errors import ConfigError
from .base import Codec
from .floats import FloatCodec
from .fp8 import Fp8Codec, Fp8Format
from .int8 import Int8Codec

# Binds the function over the submodule of the same name, as before the split:
# ``shardflow.codecs.quality`` is the function.
from .quality import quality

__all__ = [
    "CODECS",
    "Codec",
    "Fp8Codec",
    "FloatCodec",
    "Int8Codec",
    "codec_names",
    "get_codec",
    "quality",
]

_U8 = np.dtype(np.uint8)


def _fp8(name: str, fmt: Fp8Format, rowscale: bool) -> Fp8Codec:
    return Fp8Codec(name=name, storage_dtype=_U8, has_scales=rowscale, fmt=fmt, rowscale=rowscale)


# The one place codecs are registered.  The order is kept as it was (dict
# iteration order is visible through CODECS.items()).
CODECS: Mapping[str, Codec] = MappingProxyType(
    {
        "float32": FloatCodec(name="float32", storage_dtype=np.dtype(np.float32), has_scales=False),
        "float16": FloatCodec(name="float16", storage_dtype=np.dtype(np.float16), has_scales=False),
        "e4m3": _fp8("e4m3", "e4m3", rowscale=False),
        "e5m2": _fp8("e5m2", "e5m2", rowscale=False),
        "e4m3-rowscale": _fp8("e4m3-rowscale", "e4m3", rowscale=True),
        "e5m2-rowscale": _fp8("e5m2-rowscale", "e5m2", rowscale=True),
        "int8": Int8Codec(name="int8", storage_dtype=np.dtype(np.int8), has_scales=True),
    }
)
"""All codecs by name (read-only)."""


def codec_names() -> list[str]:
    """Sorted names of the registered codecs."""
    return sorted(CODECS)


def get_codec(name: str) -> Codec:
    """Return the codec called ``name``.

    An unknown name raises :class:`~shardflow.errors.ConfigError` (a
    ``ValueError``) whose message lists the known codecs.
    """
    try:
        return CODECS[name]
    except (KeyError, TypeError):
        raise ConfigError(f"unknown codec {name!r}; known codecs: {', '.join(codec_names())}") from None
