"""The embedding stage: one vector per document of every split, quantized, in memory-mapped ``.npy`` files.

Files written into a version directory, per split::

    <name>_<split>.emb.npy          codes, shape (documents, dim); dtype by codec
                                    (float32, float16, int8, or uint8 for fp8 bit patterns)
    <name>_<split>.emb.scales.npy   float32 (documents,), for codecs with per-row scales

Row ``i`` is document ``i`` of the split, in token-shard order; the text that
is embedded is the document decoded from its tokens (exactly the source text,
since ``decode(encode_ordinary(t)) == t``). Rows are streamed into
``np.lib.format.open_memmap`` in batches, so memory is bounded by the batch.

The manifest gets a top-level ``embeddings`` section (model, codec, options,
quality floors) and, per split, ``splits.<split>.embeddings`` with the files,
their sizes and SHA-256, and the codec's measured quality on a sample of the
version's own embeddings (mean/min cosine to float32, recall@10).

Validation (also run by ``shardflow validate``): row count equals the split's
document count, no NaN or inf after decoding, scales positive and finite,
checksums match, quality above the floors. This module never imports torch;
only ``compute`` paths reach ``shardflow.embedder``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import codecs
from ._io import sha256_file, tmp_path_for
from .config import EmbedOptions
from .errors import ValidationError
from .manifest import Manifest, check_relative_file

__all__ = [
    "EmbedOptions",
    "embedding_file_names",
    "embed_split",
    "add_embeddings",
    "validate_embeddings",
    "load_split_embeddings",
]

_DECODE_BLOCK = 65536  # rows per validation block (25 MB of float32 at dim 384)


def embedding_file_names(name: str, split: str) -> tuple[str, str]:
    """``(codes file, scales file)`` of a split's embeddings."""
    return f"{name}_{split}.emb.npy", f"{name}_{split}.emb.scales.npy"


def _embedder(options: EmbedOptions) -> Any:
    from .embedder import EmbedConfig, Embedder

    return Embedder(
        config=EmbedConfig(
            model=options.model,
            batch_size=options.batch_size,
            max_tokens=options.max_tokens,
            long_docs=options.long_docs,
            precision=options.precision,
            device=options.device,
        )
    )


def embed_split(
    directory: Path,
    manifest: Manifest,
    split: str,
    options: EmbedOptions,
    *,
    embedder: Any,
    texts: Callable[[int], str],
    on_batch: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Embed every document of ``split`` into ``directory``; returns the split's manifest section."""
    codec = codecs.get_codec(options.codec)
    n = manifest.splits[split].documents
    dim = int(embedder.spec.dim)
    codes_name, scales_name = embedding_file_names(manifest.name, split)
    codes_path, scales_path = directory / codes_name, directory / scales_name
    codes_tmp, scales_tmp = tmp_path_for(codes_path), tmp_path_for(scales_path)
    codes = np.lib.format.open_memmap(codes_tmp, mode="w+", dtype=codec.storage_dtype, shape=(n, dim))
    scales = (
        np.lib.format.open_memmap(scales_tmp, mode="w+", dtype=np.float32, shape=(n,)) if codec.has_scales else None
    )
    # The float32 originals of the first rows are kept (bounded) to measure the codec's quality.
    sample_n = min(n, options.quality_sample)
    reference = np.empty((sample_n, dim), dtype=np.float32)
    truncated = long_docs = 0
    for lo in range(0, n, options.docs_per_batch):
        hi = min(n, lo + options.docs_per_batch)
        vectors = embedder.embed([texts(i) for i in range(lo, hi)])
        truncated += embedder.last_stats.truncated
        long_docs += embedder.last_stats.long_documents
        if lo < sample_n:
            reference[lo : min(hi, sample_n)] = vectors[: min(hi, sample_n) - lo]
        c, s = codec.encode(vectors)
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
    if sample_n >= 2:
        stored = np.load(codes_path, mmap_mode="r")
        stored_scales = np.load(scales_path, mmap_mode="r") if codec.has_scales else None
        decoded = codec.decode(
            np.ascontiguousarray(stored[:sample_n]),
            None if stored_scales is None else np.ascontiguousarray(stored_scales[:sample_n]),
        )
        # recall@10 needs at least 11 rows; tiny splits (a small val) measure recall@(n-1).
        q = codecs.quality(reference, decoded, k=min(10, sample_n - 1), sample=sample_n)
        section["quality"] = {k: (float(v) if isinstance(v, float) else v) for k, v in q.items()}
    else:
        section["quality"] = None
    return section


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
    from .reader import Version

    version = Version(directory, manifest)
    embedder = _embedder(options)
    splits = dict(manifest.splits)
    extra_bytes = 0
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
    totals = {**manifest.totals, "embedding_bytes": extra_bytes}
    return manifest.replace(splits=splits, totals=totals, extra={**manifest.extra, "embeddings": info})


def load_split_embeddings(directory: Path, manifest: Manifest, split: str) -> tuple[np.ndarray, np.ndarray | None, dict[str, Any]]:
    """``(codes memmap, scales memmap or None, section)`` of a split, after checking files and shapes."""
    try:
        section = manifest.splits[split].extra["embeddings"]
    except KeyError:
        raise ValidationError(f"{directory}: split {split!r} of {manifest.ref} has no embeddings") from None
    codes_path = directory / check_relative_file(section["file"], str(directory))
    if not codes_path.exists():
        raise ValidationError(f"{codes_path}: the embedding file is missing")
    if codes_path.stat().st_size != section["bytes"]:
        raise ValidationError(
            f"{codes_path}: {codes_path.stat().st_size} bytes, but the manifest says {section['bytes']}; truncated or changed"
        )
    try:
        codes = np.load(codes_path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise ValidationError(f"{codes_path}: not a readable .npy file ({exc})") from None
    codec = codecs.get_codec(section["codec"])
    if codes.dtype != codec.storage_dtype or codes.shape != (section["rows"], section["dim"]):
        raise ValidationError(
            f"{codes_path}: holds {codes.dtype} {codes.shape}, the manifest says "
            f"{codec.storage_dtype} {(section['rows'], section['dim'])}"
        )
    scales = None
    if section.get("scales"):
        scales_path = directory / check_relative_file(section["scales"]["file"], str(directory))
        if not scales_path.exists() or scales_path.stat().st_size != section["scales"]["bytes"]:
            raise ValidationError(f"{scales_path}: the scales file is missing or has the wrong size")
        scales = np.load(scales_path, mmap_mode="r", allow_pickle=False)
        if scales.dtype != np.float32 or scales.shape != (section["rows"],):
            raise ValidationError(f"{scales_path}: holds {scales.dtype} {scales.shape}, expected float32 ({section['rows']},)")
    elif codec.has_scales:
        raise ValidationError(f"{codes_path}: codec {codec.name} needs scales, the manifest lists none")
    return codes, scales, section


def validate_embeddings(directory: Path, manifest: Manifest, *, checksums: bool = True) -> list[str]:
    """Problems with the version's embeddings (empty when they are right or absent)."""
    info = manifest.extra.get("embeddings")
    if not info:
        return []
    problems: list[str] = []
    floors = info.get("floors", {})
    for split, entry in manifest.splits.items():
        try:
            codes, scales, section = load_split_embeddings(directory, manifest, split)
        except ValidationError as exc:
            problems.append(str(exc))
            continue
        codes_path = directory / section["file"]
        if section["rows"] != entry.documents:
            problems.append(
                f"{codes_path}: {section['rows']} rows, but split {split!r} has {entry.documents} documents"
            )
        if checksums and sha256_file(codes_path) != section["sha256"]:
            problems.append(f"{codes_path}: SHA-256 does not match the manifest; the embeddings were changed")
        if scales is not None:
            scales_path = directory / section["scales"]["file"]
            if checksums and sha256_file(scales_path) != section["scales"]["sha256"]:
                problems.append(f"{scales_path}: SHA-256 does not match the manifest; the scales were changed")
            arr = np.asarray(scales)
            bad = np.flatnonzero(~(np.isfinite(arr) & (arr > 0)))
            if len(bad):
                problems.append(f"{scales_path}: row {int(bad[0])} has scale {float(arr[bad[0]])}; scales must be positive and finite")
                continue
        codec = codecs.get_codec(section["codec"])
        for lo in range(0, len(codes), _DECODE_BLOCK):
            hi = min(len(codes), lo + _DECODE_BLOCK)
            block = codec.decode(
                np.ascontiguousarray(codes[lo:hi]), None if scales is None else np.ascontiguousarray(scales[lo:hi])
            )
            finite = np.isfinite(block).all(axis=1)
            if not finite.all():
                problems.append(f"{codes_path}: row {lo + int(np.argmin(finite))} decodes to NaN or inf")
                break
        q = section.get("quality")
        if q:
            if q.get("mean_cosine", 1.0) < floors.get("min_mean_cosine", 0.0):
                problems.append(
                    f"{codes_path}: codec {section['codec']} mean cosine {q['mean_cosine']:.5f} is below the floor "
                    f"{floors['min_mean_cosine']}; choose a more precise codec or lower the floor"
                )
            if q.get("recall_at_k", 1.0) < floors.get("min_recall_at_10", 0.0):
                problems.append(
                    f"{codes_path}: codec {section['codec']} recall@10 {q['recall_at_k']:.3f} is below the floor "
                    f"{floors['min_recall_at_10']}; choose a more precise codec or lower the floor"
                )
    return problems


def embedding_key(parent_build_key: str, options: EmbedOptions) -> str:
    """Build key of a version made by adding embeddings to ``parent``: same inputs, same key."""
    payload = f"{parent_build_key}\0{sorted(options.key_fields().items())}"
    return hashlib.sha256(payload.encode()).hexdigest()
