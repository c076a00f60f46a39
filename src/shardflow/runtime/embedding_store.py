"""``EmbeddingStore``: read a version's per-document embeddings back, dequantized, in milliseconds.

    store = EmbeddingStore("wikitext@latest", split="train")
    store.get_rows([3, 17, 42])          # float32 (3, dim), decoded from the stored codec
    ids, vecs = store.for_tokens(0, 1025)  # the documents a token window touches, and their rows
    q = store.project(query_vectors)     # model-space queries into the stored rows' space (PCA)

The codes (and scales) are memory-mapped ``.npy`` files, one per token shard
(written by the build's per-shard jobs; one per split in versions embedded
before them), read as one table: row ``i`` is document ``i`` of the split
whatever file holds it. A fetch finds each id's file, sorts the ids, gathers
the codes, restores the caller's order and decodes, so only the touched pages
are read. Needs numpy and ml_dtypes only.

A version embedded with a PCA (``--embed-dim K``) stores K-dimensional rows;
:meth:`EmbeddingStore.project` maps an embedding of the model (a query embedded
later) into that space with the version's own mean and components, and
:meth:`EmbeddingStore.reconstruct` maps stored rows back to the model's space.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import numpy as np

from .. import codecs
from ..catalog import Catalog
from ..embed.files import load_embedding_parts, load_projection
from ..embed.pca import as_rows
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
        self._parts, self.section = load_embedding_parts(self.version.directory, self.version.manifest, split)
        self._offsets = np.concatenate(([0], np.cumsum([len(p.codes) for p in self._parts]))).astype(np.int64)
        """Row offset of each file (length files + 1; the last is the number of rows)."""
        self._codec = codecs.get_codec(self.section["codec"])
        self._projection = load_projection(self.version.directory, self.version.manifest)

    def __len__(self) -> int:
        return int(self._offsets[-1])

    @property
    def dim(self) -> int:
        """Width of the stored rows: ``embed_dim`` with a PCA, else the model's dimension."""
        return int(self.section["dim"])

    @property
    def files(self) -> int:
        """How many codes files hold the rows (one per shard; one per split in older versions)."""
        return len(self._parts)

    @property
    def model_dim(self) -> int:
        """Dimension of the model's embeddings (what :meth:`project` takes)."""
        return self.dim if self._projection is None else self._projection.input_dim

    @property
    def pca(self) -> dict[str, Any] | None:
        """The PCA the rows were reduced with (dim, explained_variance_ratio, files), or None."""
        return self.version.manifest.extra["embeddings"].get("pca")

    @property
    def pca_quality(self) -> dict[str, float] | None:
        """With a PCA: reduced and decoded rows against the unreduced float32 embeddings on this split
        (``mean_cosine`` of the reconstruction, ``recall_at_k`` of neighbours in the reduced space,
        ``recall_at_k_reconstructed``); None without one."""
        return self.section.get("pca_quality")

    def project(self, queries: Sequence[float] | np.ndarray) -> np.ndarray:
        """Model-space embeddings into the stored rows' space, as float32.

        ``(n, model_dim) -> (n, dim)``, and one ``(model_dim,)`` vector ``-> (dim,)``.

        With a PCA this is ``(queries - mean) @ components.T`` with the version's
        own float32 mean and components, the very computation the stored rows
        went through before their codec; compare the result with
        :meth:`get_rows`. Without a PCA it is the identity (a float32 copy), so
        search code can call it whatever the version. Wrong dimensions raise
        ``ValueError``.

        Cosines between projected rows are taken around the PCA mean, so their
        nearest neighbours differ more from the model's own than those of the
        reconstructions do (``pca_quality``: ``recall_at_k`` against
        ``recall_at_k_reconstructed``).
        """
        if self._projection is not None:
            return self._projection.project(queries)
        return _identity(queries, self.dim, "queries")

    def reconstruct(self, rows: Sequence[float] | np.ndarray) -> np.ndarray:
        """Stored-space rows back into the model's space, as float32.

        ``(n, dim) -> (n, model_dim)``, and one ``(dim,)`` row ``-> (model_dim,)``.
        ``rows @ components + mean`` with a PCA (their cosine to the originals
        is the ``pca_quality`` mean cosine), the identity without one.
        """
        if self._projection is not None:
            return self._projection.reconstruct(rows)
        return _identity(rows, self.dim, "rows")

    @property
    def codec(self) -> str:
        """The codec the rows are stored with (``int8``, ``e4m3``, ``float16``, ...)."""
        return self._codec.name

    @property
    def quality(self) -> dict[str, float] | None:
        """The codec's measured quality on this split (mean/min cosine, recall@k); with a PCA, in the reduced space."""
        return self.section.get("quality")

    def get_rows(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Float32 ``(len(ids), dim)``: the decoded embeddings of documents ``ids`` (any order, repeats ok)."""
        given = np.asarray(ids)
        if given.size and not np.issubdtype(given.dtype, np.integer):
            # Converting would take 1.7 or True for row 1: another document's embedding, silently.
            raise TypeError(f"document ids must be integers, got {given.dtype} ids")
        idx = given.astype(np.int64)
        if idx.ndim != 1:
            raise ValueError(f"ids must be 1-D, got shape {idx.shape}")
        if idx.size and (idx.min() < 0 or idx.max() >= len(self)):
            raise IndexError(f"document ids must be in [0, {len(self)}), got [{idx.min()}, {idx.max()}]")
        if len(self._parts) == 1:
            part = self._parts[0]
            return self._codec.decode_rows(part.codes, part.scales, idx)
        out = np.empty((len(idx), self.dim), dtype=np.float32)
        which = np.searchsorted(self._offsets, idx, side="right") - 1  # the file holding each id
        for f in np.unique(which):
            sel = np.flatnonzero(which == f)
            part = self._parts[int(f)]
            out[sel] = self._codec.decode_rows(part.codes, part.scales, idx[sel] - self._offsets[f])
        return out

    def documents_in(self, start: int, stop: int) -> np.ndarray:
        """Ids of the documents that split-wide tokens ``[start, stop)`` belong to, ascending."""
        shards = self.version.split(self.split)
        if not 0 <= start < stop <= shards.num_tokens:
            raise IndexError(f"token window [{start}, {stop}) is not a window of the {self.split} split's "
                             f"{shards.num_tokens} tokens: it needs 0 <= start < stop <= {shards.num_tokens}")
        starts = shards.doc_starts
        first = max(int(np.searchsorted(starts, start, side="right")) - 1, 0)
        last = max(int(np.searchsorted(starts, stop - 1, side="right")) - 1, first)
        return np.arange(first, last + 1, dtype=np.int64)

    def for_tokens(self, start: int, stop: int) -> tuple[np.ndarray, np.ndarray]:
        """Join a token window (e.g. a training sample's span) with its documents' embeddings."""
        ids = self.documents_in(start, stop)
        return ids, self.get_rows(ids)

    def __repr__(self) -> str:
        return f"EmbeddingStore({self.version.ref!r}, split={self.split!r}, rows={len(self)}, dim={self.dim}, codec={self.codec!r})"


def _identity(x: Sequence[float] | np.ndarray, dim: int, what: str) -> np.ndarray:
    """A float32 copy of ``x`` (shape ``(n, dim)`` or ``(dim,)``, checked like a projection's input)."""
    rows = as_rows(x, dim, what)
    return (rows[0] if np.ndim(x) == 1 else rows).copy()
