"""Embedding files on disk: their names, loading them back checked, and validating them against the manifest.

The file-level half of the embedding stage (``shardflow.embeddings`` computes);
validation, the readers and the runtime's ``EmbeddingStore`` use it without
importing the reader or the embedder. Files of a version directory (in its
``embeddings/`` directory since manifest schema 2; flat before), per split::

    <name>_<split>.emb.npy          codes, shape (documents, dim); dtype by codec
                                    (float32, float16, int8, or uint8 for fp8 bit patterns)
    <name>_<split>.emb.scales.npy   float32 (documents,), for codecs with per-row scales

and, per version, with a PCA (``EmbedOptions.embed_dim``)::

    <name>.emb.pca_mean.npy         float32 (model dim,)
    <name>.emb.pca_components.npy   float32 (embed_dim, model dim), orthonormal rows

Row ``i`` is document ``i`` of the split, in token-shard order. The manifest
sections that describe them (``embeddings``, ``splits.<split>.embeddings``)
are documented in ``shardflow.embeddings`` and ``docs/FORMAT.md``.

Validation (``validate_embeddings``, run by ``validate_dir`` and so by
``shardflow validate``): row count equals the split's document count, no NaN or
inf after decoding, scales positive and finite, projection files present with
the recorded shapes, checksums match, quality above the floors.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np

from . import codecs
from ._io import load_npy, sha256_file
from .config import EmbedOptions
from .errors import ValidationError
from .manifest import EMBEDDINGS_DIR, Manifest, version_file
from .pca import Projection

__all__ = [
    "embedding_file_names",
    "pca_file_names",
    "load_split_embeddings",
    "load_projection",
    "validate_embeddings",
    "embedding_key",
]

_DECODE_BLOCK = 65536  # rows per validation block (25 MB of float32 at dim 384)


def embedding_file_names(name: str, split: str) -> tuple[str, str]:
    """``(codes file, scales file)`` of a split's embeddings, relative to the version directory.

    In ``embeddings/`` (schema 2), apart from every split's shards, so that a
    ``*.npy`` glob over a split directory never picks them up. Versions written
    before keep theirs flat; readers take the names from the manifest.
    """
    return f"{EMBEDDINGS_DIR}/{name}_{split}.emb.npy", f"{EMBEDDINGS_DIR}/{name}_{split}.emb.scales.npy"


def pca_file_names(name: str) -> tuple[str, str]:
    """``(mean file, components file)`` of a version's PCA projection, relative to the version directory."""
    return f"{EMBEDDINGS_DIR}/{name}.emb.pca_mean.npy", f"{EMBEDDINGS_DIR}/{name}.emb.pca_components.npy"


def _open_npy(directory: Path, entry: dict[str, Any], what: str, *, mmap: bool = True) -> np.ndarray:
    """The ``.npy`` file a manifest entry (``file``, ``bytes``) names, after checking it is there, whole and readable."""
    path = version_file(directory, entry["file"], f"the {what} file")  # the one confinement check
    if not path.exists():
        raise ValidationError(f"{path}: the {what} file is missing")
    if path.stat().st_size != entry["bytes"]:
        raise ValidationError(
            f"{path}: {path.stat().st_size} bytes, but the manifest says {entry['bytes']}; truncated or changed"
        )
    try:
        return load_npy(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except ValueError as exc:
        raise ValidationError(f"{path}: not a readable .npy file ({exc})") from None


def load_split_embeddings(directory: Path, manifest: Manifest, split: str) -> tuple[np.ndarray, np.ndarray | None, dict[str, Any]]:
    """``(codes memmap, scales memmap or None, section)`` of a split, after checking files and shapes."""
    try:
        section = manifest.splits[split].extra["embeddings"]
    except KeyError:
        raise ValidationError(f"{directory}: split {split!r} of {manifest.ref} has no embeddings") from None
    codes_path = directory / section["file"]
    codes = _open_npy(directory, section, "embedding")
    codec = codecs.get_codec(section["codec"])
    if codes.dtype != codec.storage_dtype or codes.shape != (section["rows"], section["dim"]):
        raise ValidationError(
            f"{codes_path}: holds {codes.dtype} {codes.shape}, the manifest says "
            f"{codec.storage_dtype} {(section['rows'], section['dim'])}"
        )
    scales = None
    if section.get("scales"):
        scales_path = directory / section["scales"]["file"]
        scales = _open_npy(directory, section["scales"], "scales")
        if scales.dtype != np.float32 or scales.shape != (section["rows"],):
            raise ValidationError(f"{scales_path}: holds {scales.dtype} {scales.shape}, expected float32 ({section['rows']},)")
    elif codec.has_scales:
        raise ValidationError(f"{codes_path}: codec {codec.name} needs scales, the manifest lists none")
    return codes, scales, section


def load_projection(directory: Path, manifest: Manifest) -> Projection | None:
    """The version's PCA projection (None when its embeddings are not reduced), after checking its files."""
    pca = (manifest.extra.get("embeddings") or {}).get("pca")
    if not pca:
        return None
    arrays: dict[str, np.ndarray] = {}
    for part, shape in (("mean", (pca["input_dim"],)), ("components", (pca["dim"], pca["input_dim"]))):
        array = _open_npy(directory, pca[part], f"PCA {part}", mmap=False)
        if array.dtype != np.dtype("<f4") or array.shape != tuple(shape):
            raise ValidationError(
                f"{directory / pca[part]['file']}: holds {array.dtype} {array.shape}, "
                f"the manifest says float32 {tuple(shape)}"
            )
        arrays[part] = array
    try:
        return Projection(
            mean=arrays["mean"],
            components=arrays["components"],
            explained_variance_ratio=pca.get("explained_variance_ratio"),
        )
    except ValueError as exc:
        raise ValidationError(f"{directory / pca['components']['file']}: not a usable PCA projection ({exc})") from None


def _floor_problems(q: dict[str, Any], floors: dict[str, Any], *, where: str, what: str, fix: str) -> list[str]:
    """Quality figures ``q`` below ``floors``, one message each."""
    problems = []
    if q.get("mean_cosine", 1.0) < floors.get("min_mean_cosine", 0.0):
        problems.append(
            f"{where}: {what} mean cosine {q['mean_cosine']:.5f} is below the floor {floors['min_mean_cosine']}; {fix}"
        )
    if q.get("recall_at_k", 1.0) < floors.get("min_recall_at_10", 0.0):
        problems.append(
            f"{where}: {what} recall@10 {q['recall_at_k']:.3f} is below the floor {floors['min_recall_at_10']}; {fix}"
        )
    return problems


def _projection_problems(directory: Path, manifest: Manifest, *, checksums: bool) -> list[str]:
    """Problems with the PCA projection files (empty when there is no PCA or they are right)."""
    pca = manifest.extra["embeddings"].get("pca")
    if not pca:
        return []
    try:
        load_projection(directory, manifest)
    except ValidationError as exc:
        return [str(exc)]
    problems = []
    for part in ("mean", "components"):
        path = directory / pca[part]["file"]
        if checksums and sha256_file(path) != pca[part]["sha256"]:
            problems.append(f"{path}: SHA-256 does not match the manifest; the PCA {part} file was changed")
    for split, entry in manifest.splits.items():
        section = entry.extra.get("embeddings") or {}
        if section and section.get("dim") != pca["dim"]:
            problems.append(
                f"{directory / section['file']}: rows of {section.get('dim')} dimensions, "
                f"but the PCA reduces to {pca['dim']}"
            )
    return problems


def validate_embeddings(directory: Path, manifest: Manifest, *, checksums: bool = True) -> list[str]:
    """Problems with the version's embeddings (empty when they are right or absent)."""
    info = manifest.extra.get("embeddings")
    if not info:
        return []
    problems = _projection_problems(directory, manifest, checksums=checksums)
    floors = info.get("floors", {})
    pca_floors = (info.get("pca") or {}).get("floors", {})
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
        problems += _floor_problems(
            section.get("quality") or {},
            floors,
            where=str(codes_path),
            what=f"codec {section['codec']}",
            fix="choose a more precise codec or lower the floor",
        )
        if info.get("pca"):
            problems += _floor_problems(
                section.get("pca_quality") or {},
                pca_floors,
                where=str(codes_path),
                what=f"after the PCA to {info['pca']['dim']} dimensions,",
                fix="keep more dimensions (embed_dim) or lower the floor (pca_min_mean_cosine, pca_min_recall_at_10)",
            )
    return problems


def embedding_key(parent_build_key: str, options: EmbedOptions) -> str:
    """Build key of a version made by adding embeddings to ``parent``: same inputs, same key."""
    payload = f"{parent_build_key}\0{sorted(options.key_fields().items())}"
    return hashlib.sha256(payload.encode()).hexdigest()
