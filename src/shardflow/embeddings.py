"""The embedding stage: one vector per document of every split, quantized, in memory-mapped ``.npy`` files.

This module computes; the files' names, layout, loading and validation are in
``shardflow.embedding_files`` (its names are re-exported here, so
``from shardflow.embeddings import validate_embeddings`` keeps working).

Row ``i`` of a split's file is document ``i`` of the split, in token-shard
order; the text that is embedded is the document decoded from its tokens
(exactly the source text, since ``decode(encode_ordinary(t)) == t``). Rows are
streamed into ``np.lib.format.open_memmap`` in batches, so memory is bounded by
the batch.

With a PCA (``EmbedOptions.embed_dim``), an evenly spaced sample of at most
``pca_sample`` documents of the train split is embedded first and the PCA
fitted on it (``shardflow.pca``); then every row is projected,
``(x - mean) @ components.T``, before the codec. The sample's vectors are kept
(bounded by ``pca_sample``) and reused, not embedded twice. The val split is
not in the sample, so its quality figures are measured on held-out documents.

The manifest gets a top-level ``embeddings`` section (model, codec, options,
quality floors) and, per split, ``splits.<split>.embeddings`` with the files,
their sizes and SHA-256, and the codec's measured quality on a sample of the
version's own embeddings (mean/min cosine to float32, recall@10). With a PCA,
``embeddings.pca`` holds K, the explained-variance ratio, the projection files
and their floors, and ``splits.<split>.embeddings.pca_quality`` the quality
against the unreduced float32 embeddings: cosine of the reconstruction, and
recall@10 of neighbours found in the reduced space (and among the
reconstructions); ``quality`` is then the codec's alone, in the reduced space.

Importing this module does not import torch: ``shardflow.embedder`` imports it
only when the model is first used.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import codecs
from ._io import load_npy, sha256_file, tmp_path_for
from .config import EmbedOptions
from .embed_models import MODELS
from .embedder import Embedder
from .embedding_files import (
    embedding_file_names,
    embedding_key,
    load_projection,
    load_split_embeddings,
    pca_file_names,
    validate_embeddings,
)
from .manifest import Manifest
from .pca import Projection, check_reduction, fit_pca, sample_ids
from .reader import Version

__all__ = [
    "EmbedOptions",
    "embedding_file_names",
    "pca_file_names",
    "pca_fit_split",
    "check_embed_options",
    "embed_split",
    "add_embeddings",
    "validate_embeddings",
    "load_split_embeddings",
    "load_projection",
    "embedding_key",
]


def pca_fit_split(manifest: Manifest) -> str:
    """The split the PCA is fitted on: ``train`` (the first split if there is none)."""
    return "train" if "train" in manifest.splits else next(iter(manifest.splits))


def check_embed_options(manifest: Manifest, options: EmbedOptions) -> None:
    """Refuse, before any work, options this version cannot support: a PCA wider than its fit sample."""
    if options.embed_dim is None:
        return
    split = pca_fit_split(manifest)
    n = manifest.splits[split].documents
    check_reduction(
        options.embed_dim,
        input_dim=MODELS[options.model].dim,
        sample_rows=min(options.pca_sample, n),
        where=f"embed_dim={options.embed_dim} on {manifest.name} (split {split!r} has {n} documents)",
        more_rows="embed a corpus with more documents",
    )


@dataclass(frozen=True, kw_only=True)
class _Known:
    """Rows already embedded (the PCA's fit sample): reused, not embedded again."""

    ids: np.ndarray  # ascending document ids
    vectors: np.ndarray  # float32 (len(ids), model dim)
    long_documents: int
    truncated: int


def _embed_rows(
    embedder: Any, texts: Callable[[int], str], lo: int, hi: int, *, known: _Known | None
) -> tuple[np.ndarray, int, int]:
    """``(vectors of documents [lo, hi), long documents, truncated)``, embedding only what ``known`` lacks."""
    if known is None:
        vectors = embedder.embed([texts(i) for i in range(lo, hi)])
        return vectors, embedder.last_stats.long_documents, embedder.last_stats.truncated
    a, b = np.searchsorted(known.ids, [lo, hi])
    have = known.ids[a:b] - lo
    out = np.empty((hi - lo, known.vectors.shape[1]), dtype=np.float32)
    out[have] = known.vectors[a:b]
    todo = np.setdiff1d(np.arange(hi - lo), have)
    if not len(todo):
        return out, 0, 0
    out[todo] = embedder.embed([texts(lo + int(i)) for i in todo])
    return out, embedder.last_stats.long_documents, embedder.last_stats.truncated


def _save_npy(directory: Path, name: str, array: np.ndarray) -> dict[str, Any]:
    """Write ``array`` as the ``.npy`` file ``directory / name`` (temporary name, then ``os.replace``); its manifest entry."""
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path_for(path)
    with open(tmp, "wb") as f:  # a file object: np.save would append ".npy" to the temporary name
        np.save(f, array, allow_pickle=False)
    os.replace(tmp, path)
    return {"file": name, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def _fit_projection(
    directory: Path, manifest: Manifest, options: EmbedOptions, *, embedder: Any, texts: Callable[[int], str]
) -> tuple[Projection, _Known, dict[str, Any]]:
    """Embed the fit sample, fit the PCA, write its files; ``(projection, sample rows, manifest section)``."""
    assert options.embed_dim is not None
    split = pca_fit_split(manifest)
    n = manifest.splits[split].documents
    ids = sample_ids(n, min(options.pca_sample, n))
    vectors = np.empty((len(ids), int(embedder.spec.dim)), dtype=np.float32)
    long_docs = truncated = 0
    for lo in range(0, len(ids), options.docs_per_batch):
        hi = min(len(ids), lo + options.docs_per_batch)
        vectors[lo:hi] = embedder.embed([texts(int(i)) for i in ids[lo:hi]])
        long_docs += embedder.last_stats.long_documents
        truncated += embedder.last_stats.truncated
    projection = fit_pca(vectors, options.embed_dim)
    mean_name, components_name = pca_file_names(manifest.name)
    section = {
        "dim": projection.dim,
        "input_dim": projection.input_dim,
        "fit_split": split,
        "sample_rows": len(ids),
        "explained_variance_ratio": projection.explained_variance_ratio,
        "mean": _save_npy(directory, mean_name, projection.mean),
        "components": _save_npy(directory, components_name, projection.components),
        "floors": {"min_mean_cosine": options.pca_min_mean_cosine, "min_recall_at_10": options.pca_min_recall_at_10},
    }
    known = _Known(ids=ids, vectors=vectors, long_documents=long_docs, truncated=truncated)
    return projection, known, section


def _pca_quality(reference: np.ndarray, decoded: np.ndarray, projection: Projection, *, k: int) -> dict[str, Any]:
    """Reduced-and-decoded rows against the float32 originals in the model's full space."""
    reconstructed = projection.reconstruct(decoded)
    q = codecs.quality(reference, reconstructed, k=k, sample=len(reference), search=decoded)
    q["recall_at_k_reconstructed"] = codecs.quality(reference, reconstructed, k=k, sample=len(reference))["recall_at_k"]
    return q


def embed_split(
    directory: Path,
    manifest: Manifest,
    split: str,
    options: EmbedOptions,
    *,
    embedder: Any,
    texts: Callable[[int], str],
    on_batch: Callable[[int, int], None] | None = None,
    projection: Projection | None = None,
    known: _Known | None = None,
) -> dict[str, Any]:
    """Embed every document of ``split`` into ``directory``; returns the split's manifest section.

    With ``projection`` every row is reduced by it before the codec; ``known``
    (from the PCA fit) holds rows of this split that are already embedded.
    """
    codec = codecs.get_codec(options.codec)
    n = manifest.splits[split].documents
    model_dim = int(embedder.spec.dim)
    dim = model_dim if projection is None else projection.dim
    codes_name, scales_name = embedding_file_names(manifest.name, split)
    codes_path, scales_path = directory / codes_name, directory / scales_name
    codes_path.parent.mkdir(parents=True, exist_ok=True)
    codes_tmp, scales_tmp = tmp_path_for(codes_path), tmp_path_for(scales_path)
    codes = np.lib.format.open_memmap(codes_tmp, mode="w+", dtype=codec.storage_dtype, shape=(n, dim))
    scales = (
        np.lib.format.open_memmap(scales_tmp, mode="w+", dtype=np.float32, shape=(n,)) if codec.has_scales else None
    )
    # The float32 originals of the first rows are kept (bounded) to measure the codec's quality;
    # with a PCA both in the model's space and reduced.
    sample_n = min(n, options.quality_sample)
    reference = np.empty((sample_n, model_dim), dtype=np.float32)
    reduced_reference = reference if projection is None else np.empty((sample_n, dim), dtype=np.float32)
    truncated = long_docs = 0
    if known is not None:
        long_docs, truncated = known.long_documents, known.truncated
    for lo in range(0, n, options.docs_per_batch):
        hi = min(n, lo + options.docs_per_batch)
        vectors, batch_long, batch_truncated = _embed_rows(embedder, texts, lo, hi, known=known)
        truncated += batch_truncated
        long_docs += batch_long
        rows = vectors if projection is None else projection.project(vectors)
        if lo < sample_n:
            reference[lo : min(hi, sample_n)] = vectors[: min(hi, sample_n) - lo]
            reduced_reference[lo : min(hi, sample_n)] = rows[: min(hi, sample_n) - lo]
        c, s = codec.encode(rows)
        codes[lo:hi] = c
        if scales is not None:
            scales[lo:hi] = s
        if on_batch is not None:
            on_batch(hi, n)
    codes.flush()
    del codes
    if scales is not None:
        scales.flush()
        del scales
    os.replace(codes_tmp, codes_path)
    section: dict[str, Any] = {
        "file": codes_name,
        "bytes": codes_path.stat().st_size,
        "sha256": sha256_file(codes_path),
        "rows": n,
        "dim": dim,
        "codec": codec.name,
        "storage_dtype": str(codec.storage_dtype),
        "scales": None,
        "long_documents": long_docs,
        "truncated": truncated,
    }
    if codec.has_scales:
        os.replace(scales_tmp, scales_path)
        section["scales"] = {"file": scales_name, "bytes": scales_path.stat().st_size, "sha256": sha256_file(scales_path)}
    section["quality"] = None
    if projection is not None:
        section["pca_quality"] = None
    if sample_n >= 2:
        stored = load_npy(codes_path, mmap_mode="r")
        stored_scales = load_npy(scales_path, mmap_mode="r") if codec.has_scales else None
        decoded = codec.decode(
            np.ascontiguousarray(stored[:sample_n]),
            None if stored_scales is None else np.ascontiguousarray(stored_scales[:sample_n]),
        )
        # recall@10 needs at least 11 rows; tiny splits (a small val) measure recall@(n-1).
        k = min(10, sample_n - 1)
        section["quality"] = _plain(codecs.quality(reduced_reference, decoded, k=k, sample=sample_n))
        if projection is not None:
            section["pca_quality"] = _plain(_pca_quality(reference, decoded, projection, k=k))
    return section


def _plain(q: dict[str, Any]) -> dict[str, Any]:
    """Quality figures as plain Python numbers (for YAML)."""
    return {k: (float(v) if isinstance(v, float) else v) for k, v in q.items()}


def add_embeddings(
    directory: Path,
    manifest: Manifest,
    options: EmbedOptions,
    *,
    on_batch: Callable[[str, int, int], None] | None = None,
) -> Manifest:
    """Embed every split of the version in ``directory``; returns the manifest with the new sections.

    The caller writes the returned manifest (it is the commit point).
    """
    check_embed_options(manifest, options)
    version = Version(directory, manifest)
    embedder = Embedder(config=options)  # the stage's options are the embedder's config
    splits = dict(manifest.splits)
    extra_bytes = 0
    projection, known, pca_info = None, None, None
    if options.embed_dim is not None:
        projection, known, pca_info = _fit_projection(
            directory, manifest, options, embedder=embedder, texts=version.split(pca_fit_split(manifest)).text
        )
        extra_bytes += pca_info["mean"]["bytes"] + pca_info["components"]["bytes"]
    for name, entry in manifest.splits.items():
        split = version.split(name)
        section = embed_split(
            directory,
            manifest,
            name,
            options,
            embedder=embedder,
            texts=split.text,
            on_batch=None if on_batch is None else (lambda done, total, _n=name: on_batch(_n, done, total)),
            projection=projection,
            known=known if pca_info is not None and name == pca_info["fit_split"] else None,
        )
        splits[name] = type(entry)(
            documents=entry.documents,
            tokens=entry.tokens,
            shards=entry.shards,
            extra={**entry.extra, "embeddings": section},
        )
        extra_bytes += section["bytes"] + (section["scales"]["bytes"] if section["scales"] else 0)
    info = {
        **embedder.model_info(),
        "codec": options.codec,
        "options": options.to_dict(),
        "floors": {"min_mean_cosine": options.min_mean_cosine, "min_recall_at_10": options.min_recall_at_10},
    }
    info.pop("device", None)  # where it ran is not a property of the data
    if pca_info is not None:
        info["pca"] = pca_info
    totals = {**manifest.totals, "embedding_bytes": extra_bytes}
    return manifest.replace(splits=splits, totals=totals, extra={**manifest.extra, "embeddings": info})
