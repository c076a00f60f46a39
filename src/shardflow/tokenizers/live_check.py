"""The live spot-check: the fast backend's ids of a document against the reference library's.

A fast backend is checked against its reference on probe strings when it is
loaded (``base.checked_fast``); a build also checks one document of every
batch it encodes (``check_batch``), so live data guards exactness too. The
document is the batch's longest of at most ``CHECK_BYTES``, its ids the ones
the batch is written with: a bounded cost per batch, whatever the documents'
sizes (the first document of each batch, whatever its size, encoded by both
backends again, took 0.33 s, 0.22 s of it the reference, of a 3.4 s profile of
the 300 MB corpus of source files' 75 batches: docs/PERFORMANCE.md).
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from .._arrow import byte_lengths
from ..errors import InputError
from .base import Tokenizer

__all__ = ["check_identity", "check_batch", "CHECK_BYTES"]

CHECK_BYTES = 32 << 10
"""The largest document ``check_batch`` picks (UTF-8 bytes), where the batch has one that short."""


def check_identity(tokenizer: Tokenizer, texts: Sequence[str], *, where: str) -> None:
    """Raise if the fast backend differs from the reference ``encode_ordinary`` on ``texts``."""
    if tokenizer.backend == tokenizer.reference_backend or not texts:
        return
    tokens, offsets = tokenizer.encode_batch(list(texts))
    for i, text in enumerate(texts):
        if tokens[offsets[i] : offsets[i + 1]].tolist() != tokenizer.encode_ordinary(text):
            raise _disagree(tokenizer, where, f"document {i}")


def check_batch(
    tokenizer: Tokenizer, texts: pa.Array | pa.ChunkedArray, tokens: np.ndarray, offsets: np.ndarray, *,
    where: Callable[[int], str],
) -> None:
    """Raise if ``tokens[offsets[i]:offsets[i+1]]``, the fast backend's ids of ``texts[i]``, differ from the reference's.

    ``i`` is the batch's longest document of at most ``CHECK_BYTES`` (else its shortest); ``where(i)`` names it
    (the file and row) in the error.
    """
    if tokenizer.backend == tokenizer.reference_backend or not len(texts):
        return
    sizes = byte_lengths(texts)
    small = np.flatnonzero(sizes <= CHECK_BYTES)
    i = int(small[np.argmax(sizes[small])]) if len(small) else int(np.argmin(sizes))
    expected = np.asarray(tokenizer.encode_ordinary(texts[i].as_py()), dtype=np.int64)
    if not np.array_equal(tokens[offsets[i] : offsets[i + 1]], expected):
        raise _disagree(tokenizer, where(i), "this document")


def _disagree(tokenizer: Tokenizer, where: str, which: str) -> InputError:
    ref = tokenizer.reference_backend
    return InputError(f"{where}: the {tokenizer.backend} backend and {ref} disagree on {which}; "
                      f"rerun with --backend {ref} and report the document")
