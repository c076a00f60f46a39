"""What every target's settings text says: paths of split directories, counts and boundary ids of a version."""

from __future__ import annotations

from pathlib import Path

from ..manifest import Manifest

__all__ = ["split_dir", "split_tokens", "boundary_ids", "header"]


def split_dir(manifest: Manifest, directory: Path, split: str) -> Path:
    """The directory holding ``split``'s shards (the version directory itself for a flat, schema-1 version)."""
    shards = manifest.splits[split].shards if split in manifest.splits else ()
    if shards and "/" in shards[0].file:
        return directory / shards[0].file.rsplit("/", 1)[0]
    return directory


def split_tokens(manifest: Manifest, split: str) -> int:
    entry = manifest.splits.get(split)
    return entry.tokens if entry is not None else 0


def boundary_ids(manifest: Manifest) -> tuple[int | None, int | None]:
    """``(BOS id, EOS id)`` of the version (None where its placement has none)."""
    b = manifest.boundary_tokens
    return (b.bos[1] if b.bos else None, b.eos[1] if b.eos else None)


def header(stack: str, manifest: Manifest) -> list[str]:
    info = manifest.tokenized_info
    bos, eos = boundary_ids(manifest)
    return [
        f"# {stack}: settings for {manifest.ref}",
        f"# tokens: {manifest.dtype}, vocab_size {info['vocab_size']}, BOS id {bos}, EOS id {eos} "
        f"({manifest.boundary_tokens.placement}); train {split_tokens(manifest, 'train'):,} tokens, "
        f"val {split_tokens(manifest, 'val'):,}",
    ]
