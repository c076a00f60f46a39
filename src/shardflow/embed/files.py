"""Embedding files on disk: their names, loading them back checked, and validating them against the manifest.

The file-level half of the embedding stage (``shardflow.embed.compute`` computes);
validation, the readers and the runtime's ``EmbeddingStore`` use it without
importing the reader or the embedder. One *part* per token shard of each split
(``<name>_<split>_<NNNNNN>.emb.npy``, and ``.emb.scales.npy`` for codecs with
row scales; one part per split in versions embedded before the per-shard jobs),
and with a PCA ``<name>.emb.pca_mean.npy`` and ``<name>.emb.pca_components.npy``:
docs/FORMAT.md ("Embedding files").

Validation (``validate_embeddings``, run by ``validate_dir`` and so by
``shardflow validate``): row count equals the split's document count (and
each part's its shard's), no NaN or inf after decoding, scales positive and
finite, projection files present with the recorded shapes, checksums match,
quality above the floors.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .. import codecs
from .._io import load_npy, sha256_file
from ..config import EmbedOptions
from ..errors import ValidationError
from ..manifest import EMBEDDINGS_DIR, Manifest, version_file
from .pca import Projection

__all__ = [
    "embedding_file_names",
    "part_file_names",
    "pca_file_names",
    "embedding_parts",
    "EmbeddingPart",
    "load_embedding_parts",
    "load_split_embeddings",
    "load_projection",
    "projection_from_section",
    "validate_embeddings",
    "embedding_key",
]

_DECODE_BLOCK = 65536  # rows per validation block (25 MB of float32 at dim 384)


def embedding_file_names(name: str, split: str) -> tuple[str, str]:
    """``(codes file, scales file)`` of a split embedded as one part (versions embedded before the per-shard jobs).

    In ``embeddings/`` (schema 2), apart from every split's shards, so that a
    ``*.npy`` glob over a split directory never picks them up. Versions written
    before keep theirs flat; readers take the names from the manifest.
    """
    return f"{EMBEDDINGS_DIR}/{name}_{split}.emb.npy", f"{EMBEDDINGS_DIR}/{name}_{split}.emb.scales.npy"


def part_file_names(name: str, split: str, k: int) -> tuple[str, str]:
    """``(codes file, scales file)`` of the embeddings of shard ``k`` of ``split``, relative to the version directory."""
    stem = f"{EMBEDDINGS_DIR}/{name}_{split}_{k:06d}"
    return f"{stem}.emb.npy", f"{stem}.emb.scales.npy"


def pca_file_names(name: str) -> tuple[str, str]:
    """``(mean file, components file)`` of a version's PCA projection, relative to the version directory."""
    return f"{EMBEDDINGS_DIR}/{name}.emb.pca_mean.npy", f"{EMBEDDINGS_DIR}/{name}.emb.pca_components.npy"


def embedding_parts(section: dict[str, Any]) -> list[dict[str, Any]]:
    """The files of a split's ``embeddings`` section in row order, each ``{file, bytes, sha256, rows, scales}``.

    Its ``parts`` (one per shard); a section written before the per-shard jobs
    names one file itself and is its own single part.
    """
    if "parts" in section:
        return list(section["parts"])
    return [section]


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


@dataclass(frozen=True, kw_only=True, eq=False)
class EmbeddingPart:
    """One embedding file of a split, opened: its codes (and scales) memory-mapped, and its manifest entry."""

    codes: np.ndarray
    scales: np.ndarray | None
    entry: dict[str, Any]
    path: Path
    scales_path: Path | None = None


def load_embedding_parts(directory: Path, manifest: Manifest, split: str) -> tuple[list[EmbeddingPart], dict[str, Any]]:
    """``(parts in row order, section)`` of a split's embeddings, after checking every file and its shape."""
    try:
        section = manifest.splits[split].extra["embeddings"]
    except KeyError:
        raise ValidationError(f"{directory}: split {split!r} of {manifest.ref} has no embeddings") from None
    codec = codecs.get_codec(section["codec"])
    parts = []
    for entry in embedding_parts(section):
        codes_path = directory / entry["file"]
        codes = _open_npy(directory, entry, "embedding")
        if codes.dtype != codec.storage_dtype or codes.shape != (entry["rows"], section["dim"]):
            raise ValidationError(
                f"{codes_path}: holds {codes.dtype} {codes.shape}, the manifest says "
                f"{codec.storage_dtype} {(entry['rows'], section['dim'])}"
            )
        scales, scales_path = None, None
        if entry.get("scales"):
            scales_path = directory / entry["scales"]["file"]
            scales = _open_npy(directory, entry["scales"], "scales")
            if scales.dtype != np.float32 or scales.shape != (entry["rows"],):
                raise ValidationError(f"{scales_path}: holds {scales.dtype} {scales.shape}, expected float32 ({entry['rows']},)")
        elif codec.has_scales:
            raise ValidationError(f"{codes_path}: codec {codec.name} needs scales, the manifest lists none")
        parts.append(EmbeddingPart(codes=codes, scales=scales, entry=entry, path=codes_path, scales_path=scales_path))
    return parts, section


def load_split_embeddings(directory: Path, manifest: Manifest, split: str) -> tuple[np.ndarray, np.ndarray | None, dict[str, Any]]:
    """``(codes memmap, scales memmap or None, section)`` of a split stored as one file, after checking it.

    A split embedded by per-shard jobs has one file per shard: read it with
    :func:`load_embedding_parts` or ``shardflow.runtime.EmbeddingStore``.
    """
    parts, section = load_embedding_parts(directory, manifest, split)
    if len(parts) != 1:
        raise ValidationError(
            f"{directory}: the embeddings of split {split!r} are {len(parts)} files, one per shard; "
            "read them with load_embedding_parts or shardflow.runtime.EmbeddingStore"
        )
    return parts[0].codes, parts[0].scales, section


def projection_from_section(directory: Path, pca: dict[str, Any]) -> Projection:
    """The PCA projection that a manifest's ``embeddings.pca`` section names, after checking its files."""
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


def load_projection(directory: Path, manifest: Manifest) -> Projection | None:
    """The version's PCA projection (None when its embeddings are not reduced), after checking its files."""
    pca = (manifest.extra.get("embeddings") or {}).get("pca")
    return projection_from_section(directory, pca) if pca else None


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
                f"{_where(directory, manifest, split)}: rows of {section.get('dim')} dimensions, "
                f"but the PCA reduces to {pca['dim']}"
            )
    return problems


def _where(directory: Path, manifest: Manifest, split: str) -> str:
    """How messages name a split's embedding files: the one file, or the pattern of its per-shard files."""
    parts = embedding_parts(manifest.splits[split].extra["embeddings"])
    if len(parts) == 1:
        return str(directory / parts[0]["file"])
    return str(directory / part_file_names(manifest.name, split, 0)[0]).replace("_000000.", "_*.")


def _part_problems(part: EmbeddingPart, codec: Any, *, checksums: bool) -> list[str]:
    """Problems with one opened embedding file: its checksums, its scales, rows that decode to NaN or inf."""
    problems = []
    if checksums and sha256_file(part.path) != part.entry["sha256"]:
        problems.append(f"{part.path}: SHA-256 does not match the manifest; the embeddings were changed")
    if part.scales is not None:
        scales_path = part.scales_path
        if checksums and sha256_file(scales_path) != part.entry["scales"]["sha256"]:
            problems.append(f"{scales_path}: SHA-256 does not match the manifest; the scales were changed")
        arr = np.asarray(part.scales)
        bad = np.flatnonzero(~(np.isfinite(arr) & (arr > 0)))
        if len(bad):
            problems.append(f"{scales_path}: row {int(bad[0])} has scale {float(arr[bad[0]])}; scales must be positive and finite")
            return problems
    codes, scales = part.codes, part.scales
    for lo in range(0, len(codes), _DECODE_BLOCK):
        hi = min(len(codes), lo + _DECODE_BLOCK)
        block = codec.decode(
            np.ascontiguousarray(codes[lo:hi]), None if scales is None else np.ascontiguousarray(scales[lo:hi])
        )
        finite = np.isfinite(block).all(axis=1)
        if not finite.all():
            problems.append(f"{part.path}: row {lo + int(np.argmin(finite))} decodes to NaN or inf")
            break
    return problems


def _row_problems(directory: Path, manifest: Manifest, split: str, parts: list[EmbeddingPart]) -> list[str]:
    """Row counts against the documents: the split's, and with one part per shard each shard's."""
    entry = manifest.splits[split]
    rows = sum(int(p.entry["rows"]) for p in parts)
    if rows != entry.documents:
        return [f"{_where(directory, manifest, split)}: {rows} rows, but split {split!r} has {entry.documents} documents"]
    if "parts" not in entry.extra["embeddings"]:
        return []
    if len(parts) != len(entry.shards):
        return [f"{directory}: split {split!r} has {len(entry.shards)} shards but {len(parts)} embedding files; "
                "embed the version again"]
    # Schema 3 shards hold whole documents, so part k's rows are exactly shard k's documents.
    if manifest.schema_version >= 3:
        for k, (part, shard) in enumerate(zip(parts, entry.shards)):
            if part.entry["rows"] != shard.documents:
                return [f"{part.path}: {part.entry['rows']} rows, but shard {k} of split {split!r} has "
                        f"{shard.documents} documents"]
    return []


def validate_embeddings(directory: Path, manifest: Manifest, *, checksums: bool = True) -> list[str]:
    """Problems with the version's embeddings (empty when they are right or absent)."""
    info = manifest.extra.get("embeddings")
    if not info:
        return []
    problems = _projection_problems(directory, manifest, checksums=checksums)
    floors = info.get("floors", {})
    pca_floors = (info.get("pca") or {}).get("floors", {})
    for split in manifest.splits:
        try:
            parts, section = load_embedding_parts(directory, manifest, split)
        except ValidationError as exc:
            problems.append(str(exc))
            continue
        problems += _row_problems(directory, manifest, split, parts)
        codec = codecs.get_codec(section["codec"])
        for part in parts:
            problems += _part_problems(part, codec, checksums=checksums)
        checks = [("quality", floors, f"codec {section['codec']}", "choose a more precise codec or lower the floor")]
        if info.get("pca"):
            checks.append(("pca_quality", pca_floors, f"after the PCA to {info['pca']['dim']} dimensions,",
                           "keep more dimensions (embed_dim) or lower the floor (pca_min_mean_cosine, pca_min_recall_at_10)"))
        for key, wanted, what, fix in checks:
            problems += _floor_problems(section.get(key) or {}, wanted, where=_where(directory, manifest, split),
                                        what=what, fix=fix)
    return problems


def embedding_key(parent_build_key: str, options: EmbedOptions) -> str:
    """Build key of a version made by adding embeddings to ``parent``: same inputs, same key."""
    payload = f"{parent_build_key}\0{sorted(options.key_fields().items())}"
    return hashlib.sha256(payload.encode()).hexdigest()
