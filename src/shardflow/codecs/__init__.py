"""Quantization codecs for per-document embedding matrices.

Each codec turns a finite ``float32`` matrix of shape ``(n, d)`` into a matrix
of *codes* (same shape, a compact storage dtype) plus, for the codecs that need
them, one ``float32`` scale per row; ``decode`` turns them back into
``float32``.  The registry is :data:`CODECS`; look a codec up with
:func:`get_codec`.

=================  ===============  ======  =====================================
name               stored as        scales  value
=================  ===============  ======  =====================================
``float32``        ``float32``      no      exact copy
``float16``        ``float16``      no      IEEE half, RNE, saturated at +-65504
``e4m3``           ``uint8``        no      float8_e4m3fn bits, saturated at +-448
``e5m2``           ``uint8``        no      float8_e5m2 bits, saturated at +-57344
``e4m3-rowscale``  ``uint8``        yes     e4m3 of ``x / s``, ``s = absmax/448``
``e5m2-rowscale``  ``uint8``        yes     e5m2 of ``x / s``, ``s = absmax/57344``
``int8``           ``int8``         yes     ``rint(x / s)``, ``s = absmax/127``
=================  ===============  ======  =====================================

Why fp8 codes are ``uint8``: numpy cannot round-trip ml_dtypes' fp8 dtypes
through ``.npy`` (e5m2 saves as ``'<f1'`` which ``np.load`` rejects, e4m3fn as
an anonymous ``'<V1'``), so we store the raw bit patterns and record the codec
name in the manifest instead.

Why not ``x.astype(ml_dtypes.float8_e4m3fn)``: that cast runs at ~0.55 GB/s
here and silently turns values above 464 into NaN.  Instead the encoder uses an
exact table method (see :func:`.fp8._fp8_encode_table`) and the decoder a
256-entry lookup table; both run chunk-wise (bounded memory, cache-resident
temporaries) on a few threads, because numpy releases the GIL inside its
loops.  The encoder output is bit-identical to ml_dtypes' round-to-nearest-even
cast of the input clipped to the format's finite range.

All encoders reject NaN and infinity with :class:`ValueError`: a non-finite
embedding is an upstream bug, and quietly saturating it would hide that.

:func:`quality` measures what a codec costs in retrieval terms (cosine to the
float32 original and nearest-neighbour recall@k).

The modules:

    base      the Codec contract, input/codes/scales checks, the shared thread
              pool and row-block chunking, per-row absmax and scales
    floats    FloatCodec: float32, float16
    fp8       Fp8Codec: e4m3, e5m2, with or without row scales
    int8      Int8Codec: int8
    quality   quality()

Adding a codec: write one module with a frozen, keyword-only dataclass
subclassing ``base.Codec`` that implements ``encode`` and ``decode`` (check
input with ``_check_input`` and ``_prepare_decode``, run the work through
``_for_row_blocks`` in chunks of ``_rows_per_chunk(d)`` rows, reject NaN/inf
with ``_non_finite_error``; ``decode_rows`` comes for free), and add its
instance to ``CODECS`` below.  The name is what manifests record, so it never
changes once published; ``get_codec``, ``codec_names``, the embedding stage
and the readers then cover it.  The name must also be added to
``shardflow.config.EMBED_CODECS`` (the options check and the CLI's choices):
the config keeps its own tuple because ``import shardflow`` must not import
ml_dtypes, and tests/test_codecs.py checks that the two agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

import numpy as np

from ..errors import ConfigError

# Every name the single-module shardflow.codecs had (private helpers included)
# stays importable from here, so callers and notebooks keep working.
from .base import (  # noqa: F401
    _ABS_MASK,
    _CHUNK_ELEMS,
    _F32_INF_BITS,
    _MAX_ABSMAX,
    _MIN_ABSMAX,
    _PARALLEL_MIN_ELEMS,
    F32,
    Codec,
    _check_input,
    _check_matrix,
    _check_scales,
    _for_row_blocks,
    _forget_pool_after_fork,
    _non_finite_error,
    _num_threads,
    _pool,
    _prepare_decode,
    _row_absmax,
    _rows_per_chunk,
    _scales_from_absmax,
)
from .floats import _FLOAT16_MAX, FloatCodec, _float16_decode_table  # noqa: F401
from .fp8 import (  # noqa: F401
    _FP8_DTYPES,
    _KEY_SHIFT,
    _KEY_SHIFT_U32,
    _LOW_MASK,
    Fp8Codec,
    _fp8_decode_table,
    _fp8_encode_chunk,
    _fp8_encode_table,
    _fp8_max,
    _Fp8Format,
)
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


def _fp8(name: str, fmt: _Fp8Format, rowscale: bool) -> Fp8Codec:
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


def __getattr__(name: str) -> Any:
    # The pool and its lock are rebound in base (lazily, and after a fork), so
    # a copy taken here would go stale; read the live ones instead.
    if name in ("_POOL", "_POOL_LOCK"):
        from . import base

        return getattr(base, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
