"""Computing embeddings: one vector per document, per token shard, quantized, in memory-mapped ``.npy`` files.

This module computes; the files' names, layout, loading and validation are in
``shardflow.embed.files`` (its names are re-exported here, so
``from shardflow.embed.compute import validate_embeddings`` keeps working).

The pieces a build runs as jobs (``shardflow.pipeline.embed_stage``): ``fit_projection``, with a
PCA, once per version before the rest (embed a fixed sample of the train split, fit, write its
mean and components); ``embed_part``, one per shard (its documents embedded, projected, encoded
into the shard's own files); ``split_section`` and ``embeddings_info``, the manifest sections.
``add_embeddings`` runs them all over a version (``shardflow embed``) on ``workers`` threads.

The text embedded is the document decoded from its tokens (exactly the source text, since
``decode(encode_ordinary(t)) == t``). Rows are streamed into ``np.lib.format.open_memmap``
``docs_per_batch`` at a time, so a job's memory is bounded by the batch, and results are small
dictionaries, never arrays. The PCA's sample (``pca.sample_ids``) is the same documents whatever
the workers or shard sizes, and the fit runs alone, so its files are the same bytes on every run;
those documents are embedded twice (by the fit and by their shard's job). Files, manifest sections
and how a split's figures combine its parts': docs/FORMAT.md ("Embedding files").

Importing this module does not import torch: ``shardflow.embed.embedder`` imports it
only when the model is first used.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np

from .. import codecs
from .._io import load_npy, sha256_file, tmp_path_for
from ..config import EmbedOptions
from .models import MODELS
from .embedder import Embedder
from .files import (
    embedding_file_names,
    embedding_key,
    embedding_parts,
    load_embedding_parts,
    load_projection,
    load_split_embeddings,
    part_file_names,
    pca_file_names,
    validate_embeddings,
)
from ..manifest import Manifest
from .pca import Projection, check_reduction, fit_pca, sample_ids
from ..reader import Version
from ..shardset import ShardSet

__all__ = [
    "EmbedOptions",
    "embedding_file_names",
    "part_file_names",
    "pca_file_names",
    "embedding_parts",
    "pca_fit_split",
    "check_embed_options",
    "shard_texts",
    "fit_projection",
    "embed_part",
    "split_section",
    "embeddings_info",
    "add_embeddings",
    "validate_embeddings",
    "load_embedding_parts",
    "load_split_embeddings",
    "load_projection",
    "embedding_key",
]

Texts = Callable[[int], str]
"""``texts(i)``: the text of document ``i`` (of a split, or of one shard)."""


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


def shard_texts(shards: ShardSet, k: int, decode: Callable[[np.ndarray], str]) -> tuple[int, Texts]:
    """``(n, texts)``: the ``n`` documents that start in shard ``k`` of ``shards``, and ``texts(i)`` the ``i``-th decoded.

    A document runs to the next document's start; in a schema-3 version that is
    within the shard, in older ones it may be in a later shard, which is read
    too. Its boundary tokens (BOS/EOS) are not part of its text.
    """
    starts = np.asarray(shards.doc_starts(k), dtype=np.int64) + int(shards.offsets[k])
    end = int(shards.offsets[-1])
    for j in range(k + 1, shards.num_shards):  # where the shard's last document ends
        later = shards.doc_starts(j)
        if len(later):
            end = int(shards.offsets[j]) + int(later[0])
            break
    bounds = np.append(starts, end)
    head = 1 if shards.placement in ("bos", "both") else 0
    tail = 1 if shards.placement in ("eos", "both") else 0

    def texts(i: int) -> str:
        tokens = shards.read(int(bounds[i]), int(bounds[i + 1]))
        return decode(tokens[head : len(tokens) - tail])

    return len(starts), texts


def _embed_batches(
    embedder: Any, texts: Texts, ids: np.ndarray, options: EmbedOptions
) -> Iterator[tuple[int, int, np.ndarray, Any]]:
    """Yield ``(lo, hi, float32 vectors of documents ids[lo:hi], embedder stats)``, ``docs_per_batch`` at a time."""
    for lo in range(0, len(ids), options.docs_per_batch):
        hi = min(len(ids), lo + options.docs_per_batch)
        vectors = embedder.embed([texts(int(i)) for i in ids[lo:hi]])
        yield lo, hi, vectors, embedder.last_stats


def _save_npy(directory: Path, name: str, array: np.ndarray) -> dict[str, Any]:
    """Write ``array`` as the ``.npy`` file ``directory / name`` (temporary name, then ``os.replace``); its manifest entry."""
    path = directory / name
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path_for(path)
    with open(tmp, "wb") as f:  # a file object: np.save would append ".npy" to the temporary name
        np.save(f, array, allow_pickle=False)
    os.replace(tmp, path)
    return {"file": name, "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def fit_projection(
    directory: Path, name: str, options: EmbedOptions, *, split: str, documents: int, texts: Texts, embedder: Any
) -> tuple[Projection, dict[str, Any]]:
    """Embed the fit sample of ``split`` (``documents`` long, ``texts`` by split-wide id), fit the PCA, write its files.

    Returns ``(projection, the manifest's embeddings.pca section)``.
    """
    assert options.embed_dim is not None
    ids = sample_ids(documents, min(options.pca_sample, documents))
    vectors = np.empty((len(ids), int(embedder.spec.dim)), dtype=np.float32)
    for lo, hi, batch, _ in _embed_batches(embedder, texts, ids, options):
        vectors[lo:hi] = batch
    projection = fit_pca(vectors, options.embed_dim)
    mean_name, components_name = pca_file_names(name)
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
    return projection, section


def _pca_quality(reference: np.ndarray, decoded: np.ndarray, projection: Projection, *, k: int) -> dict[str, Any]:
    """Reduced-and-decoded rows against the float32 originals in the model's full space."""
    reconstructed = projection.reconstruct(decoded)
    q = codecs.quality(reference, reconstructed, k=k, sample=len(reference), search=decoded)
    q["recall_at_k_reconstructed"] = codecs.quality(reference, reconstructed, k=k, sample=len(reference))["recall_at_k"]
    return q


def embed_part(
    directory: Path,
    names: tuple[str, str],
    options: EmbedOptions,
    *,
    rows: int,
    texts: Texts,
    embedder: Any,
    projection: Projection | None = None,
    on_batch: Callable[[int, int], None] | None = None,
) -> tuple[dict[str, Any], int]:
    """Embed documents ``0 .. rows-1`` (``texts``) into the files ``names`` (codes, scales) under ``directory``.

    With ``projection`` every row is reduced by it before the codec. Returns
    ``(the part's manifest entry, text tokens embedded)``; the files are written
    under temporary names and renamed.
    """
    codec = codecs.get_codec(options.codec)
    model_dim = int(embedder.spec.dim)
    dim = model_dim if projection is None else projection.dim
    codes_path, scales_path = directory / names[0], directory / names[1]
    codes_path.parent.mkdir(parents=True, exist_ok=True)
    codes_tmp, scales_tmp = tmp_path_for(codes_path), tmp_path_for(scales_path)
    codes = np.lib.format.open_memmap(codes_tmp, mode="w+", dtype=codec.storage_dtype, shape=(rows, dim))
    scales = (
        np.lib.format.open_memmap(scales_tmp, mode="w+", dtype=np.float32, shape=(rows,)) if codec.has_scales else None
    )
    # The float32 originals of the first rows are kept (bounded) to measure the codec's quality;
    # with a PCA both in the model's space and reduced.
    sample_n = min(rows, options.quality_sample)
    reference = np.empty((sample_n, model_dim), dtype=np.float32)
    reduced_reference = reference if projection is None else np.empty((sample_n, dim), dtype=np.float32)
    truncated = long_docs = tokens = 0
    for lo, hi, vectors, stats in _embed_batches(embedder, texts, np.arange(rows), options):
        truncated += stats.truncated
        long_docs += stats.long_documents
        tokens += stats.tokens
        reduced = vectors if projection is None else projection.project(vectors)
        if lo < sample_n:
            reference[lo : min(hi, sample_n)] = vectors[: min(hi, sample_n) - lo]
            reduced_reference[lo : min(hi, sample_n)] = reduced[: min(hi, sample_n) - lo]
        c, s = codec.encode(reduced)
        codes[lo:hi] = c
        if scales is not None:
            scales[lo:hi] = s
        if on_batch is not None:
            on_batch(hi, rows)
    codes.flush()
    del codes
    if scales is not None:
        scales.flush()
        del scales
    os.replace(codes_tmp, codes_path)
    entry: dict[str, Any] = {
        "file": names[0],
        "bytes": codes_path.stat().st_size,
        "sha256": sha256_file(codes_path),
        "rows": rows,
        "scales": None,
        "long_documents": long_docs,
        "truncated": truncated,
    }
    if codec.has_scales:
        os.replace(scales_tmp, scales_path)
        entry["scales"] = {"file": names[1], "bytes": scales_path.stat().st_size, "sha256": sha256_file(scales_path)}
    entry["quality"] = None
    if projection is not None:
        entry["pca_quality"] = None
    if sample_n >= 2:
        stored = load_npy(codes_path, mmap_mode="r")
        stored_scales = load_npy(scales_path, mmap_mode="r") if codec.has_scales else None
        decoded = codec.decode(
            np.ascontiguousarray(stored[:sample_n]),
            None if stored_scales is None else np.ascontiguousarray(stored_scales[:sample_n]),
        )
        # recall@10 needs at least 11 rows; tiny parts (a small val) measure recall@(n-1).
        k = min(10, sample_n - 1)
        entry["quality"] = _plain(codecs.quality(reduced_reference, decoded, k=k, sample=sample_n))
        if projection is not None:
            entry["pca_quality"] = _plain(_pca_quality(reference, decoded, projection, k=k))
    return entry, tokens


def _combined(figures: list[dict[str, Any] | None]) -> dict[str, Any] | None:
    """The parts' quality figures as the split's: rows summed, means and recalls row-weighted, minima, smallest k."""
    qs = [q for q in figures if q]
    if not qs:
        return None
    rows = sum(int(q["rows"]) for q in qs)
    out: dict[str, Any] = {}
    for key in qs[0]:
        values = [q[key] for q in qs]
        if key == "rows":
            out[key] = rows
        elif key == "k":
            out[key] = min(values)
        elif key.startswith("min_"):
            out[key] = float(min(values))
        else:
            out[key] = float(sum(v * int(q["rows"]) for v, q in zip(values, qs)) / rows)
    return out


def split_section(parts: list[dict[str, Any]], options: EmbedOptions, *, dim: int, pca: bool) -> dict[str, Any]:
    """A split's ``embeddings`` section from its parts (shard order): totals, combined quality, and the parts."""
    codec = codecs.get_codec(options.codec)
    section: dict[str, Any] = {
        "rows": sum(int(p["rows"]) for p in parts),
        "dim": dim,
        "codec": codec.name,
        "storage_dtype": str(codec.storage_dtype),
        "bytes": sum(int(p["bytes"]) + (int(p["scales"]["bytes"]) if p["scales"] else 0) for p in parts),
        "long_documents": sum(int(p["long_documents"]) for p in parts),
        "truncated": sum(int(p["truncated"]) for p in parts),
        "quality": _combined([p["quality"] for p in parts]),
    }
    if pca:
        section["pca_quality"] = _combined([p.get("pca_quality") for p in parts])
    section["parts"] = parts
    return section


def embeddings_info(embedder: Any, options: EmbedOptions, pca: dict[str, Any] | None) -> dict[str, Any]:
    """The manifest's top-level ``embeddings`` section: the model, the codec, the options, the floors, the PCA."""
    info = {
        **embedder.model_info(),
        "codec": options.codec,
        "options": options.to_dict(),
        "floors": {"min_mean_cosine": options.min_mean_cosine, "min_recall_at_10": options.min_recall_at_10},
    }
    info.pop("device", None)  # where it ran is not a property of the data
    if pca is not None:
        info["pca"] = pca
    return info


def add_embeddings(
    directory: Path,
    manifest: Manifest,
    options: EmbedOptions,
    *,
    workers: int = 1,
    on_batch: Callable[[str, int, int], None] | None = None,
) -> Manifest:
    """Embed every split of the version in ``directory``, one part per shard on ``workers`` threads.

    Returns the manifest with the new sections; the caller writes it (it is the
    commit point). ``on_batch(split, rows done, rows)`` follows each finished part.
    """
    check_embed_options(manifest, options)
    version = Version(directory, manifest)
    decode = version.tokenizer.decode  # loaded here, once, not by the threads
    projection, pca_info = None, None
    if options.embed_dim is not None:
        split = pca_fit_split(manifest)
        projection, pca_info = fit_projection(
            directory, manifest.name, options, split=split, documents=manifest.splits[split].documents,
            texts=version.split(split).text, embedder=Embedder(config=options),
        )

    def one(job: tuple[str, int]) -> dict[str, Any]:
        name, k = job
        rows, texts = shard_texts(version.split(name).shards, k, decode)
        return embed_part(directory, part_file_names(manifest.name, name, k), options, rows=rows, texts=texts,
                          embedder=Embedder(config=options), projection=projection)[0]

    jobs = [(name, k) for name, entry in manifest.splits.items() for k in range(len(entry.shards))]
    parts: dict[str, list[dict[str, Any]]] = {name: [] for name in manifest.splits}
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for (name, _), part in zip(jobs, pool.map(one, jobs)):
            parts[name].append(part)
            if on_batch is not None:
                on_batch(name, sum(p["rows"] for p in parts[name]), manifest.splits[name].documents)
    dim = MODELS[options.model].dim if projection is None else projection.dim
    splits = dict(manifest.splits)
    extra_bytes = 0 if pca_info is None else pca_info["mean"]["bytes"] + pca_info["components"]["bytes"]
    for name, entry in manifest.splits.items():
        section = split_section(parts[name], options, dim=dim, pca=projection is not None)
        splits[name] = type(entry)(
            documents=entry.documents, tokens=entry.tokens, shards=entry.shards, extra={**entry.extra, "embeddings": section}
        )
        extra_bytes += section["bytes"]
    info = embeddings_info(Embedder(config=options), options, pca_info)
    totals = {**manifest.totals, "embedding_bytes": extra_bytes}
    return manifest.replace(splits=splits, totals=totals, extra={**manifest.extra, "embeddings": info})


def _plain(q: dict[str, Any]) -> dict[str, Any]:
    """Quality figures as plain Python numbers (for YAML)."""
    return {k: (float(v) if isinstance(v, float) else v) for k, v in q.items()}
