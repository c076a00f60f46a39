"""``EmbeddingStore``: read a version's per-document embeddings back, dequantized, in milliseconds.

    store = EmbeddingStore("wikitext@latest", split="train")
    store.get_rows([3, 17, 42])          # float32 (3, dim), decoded from the stored codec
    ids, vecs = store.for_tokens(0, 1025)  # the documents a token window touches, and their rows

The codes (and scales) are memory-mapped ``.npy`` files; a fetch sorts the ids,
gathers the codes, restores the caller's order and decodes once, so only the
touched pages are read. Needs numpy and ml_dtypes only.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from .. import codecs
from ..catalog import Catalog
from ..embeddings import load_split_embeddings
from ..reader import open_version

__all__ = ["EmbeddingStore"]


class EmbeddingStore:
    """The embeddings of one split of a published version; row ``i`` is document ``i``."""

    def __init__(
        self,
        ref: str | os.PathLike[str],
        split: str = "train",
        catalog: Catalog | str | os.PathLike[str] | None = None,
        *,
        verify: bool = False,
    ) -> None:
        self.version = open_version(ref, catalog=catalog, verify=verify)
        self.split = split
        self._codes, self._scales, self.section = load_split_embeddings(
            self.version.directory, self.version.manifest, split
        )
        self._codec = codecs.get_codec(self.section["codec"])

    def __len__(self) -> int:
        return int(self._codes.shape[0])

    @property
    def dim(self) -> int:
        return int(self._codes.shape[1])

    @property
    def codec(self) -> str:
        """The codec the rows are stored with (``int8``, ``e4m3``, ``float16``, ...)."""
        return self._codec.name

    @property
    def quality(self) -> dict[str, float] | None:
        """The codec's measured quality on this split (mean/min cosine, recall@k)."""
        return self.section.get("quality")

    def get_rows(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Float32 ``(len(ids), dim)``: the decoded embeddings of documents ``ids`` (any order, repeats ok)."""
        idx = np.asarray(ids, dtype=np.int64)
        if idx.ndim != 1:
            raise ValueError(f"ids must be 1-D, got shape {idx.shape}")
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"document ids must be in [0, {len(self)}), got [{idx.min()}, {idx.max()}]")
        return self._codec.decode_rows(self._codes, self._scales, idx)

    def documents_in(self, start: int, stop: int) -> np.ndarray:
        """Ids of the documents that split-wide tokens ``[start, stop)`` belong to, ascending."""
        starts = self.version.split(self.split).doc_starts
        first = max(int(np.searchsorted(starts, start, side="right")) - 1, 0)
        last = max(int(np.searchsorted(starts, stop - 1, side="right")) - 1, first)
        return np.arange(first, last + 1, dtype=np.int64)

    def for_tokens(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Join a token window (e.g. a training sample's span) with its documents' embeddings."""
        ids = self.documents_in(start, stop)
        return ids, self.get_rows(ids)

    def __repr__(self) -> str:
        return f"EmbeddingStore({self.version.ref!r}, split={self.split!r}, rows={len(self)}, dim={self.dim}, codec={self.codec!r})"
