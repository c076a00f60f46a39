"""Every file a manifest names, with its size and SHA-256: what ``shardflow push`` sends and what a read-back of a
version on a bucket fetches (``runtime.remote.fetch_version``).

Shards, their indexes and sidecars, statistics and embedding files are all
``{file, bytes, sha256}`` entries somewhere in the manifest (inputs aside); the
tokenizer's copy (``tokenized_info.rank_file`` / ``tokenizer_file``) is named
with a SHA-256 but no size.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any, Iterator, NamedTuple

from .errors import ValidationError
from .manifest import Manifest

__all__ = ["NamedFile", "named_files", "refuse_repeated_shards"]


class NamedFile(NamedTuple):
    name: Any
    """The file's name as the manifest gives it (not yet checked: see ``manifest.version_file``)."""
    size: int | None
    """Its bytes; None for the tokenizer's copy, which the manifest names without a size."""
    sha256: Any
    where: str
    """Where in the manifest it is named, for messages (``splits.train.shards[3]``)."""


def named_files(manifest: Manifest) -> Iterator[NamedFile]:
    """The files ``manifest`` names, in manifest order (a file named twice comes twice)."""

    def walk(node: Any, where: str) -> Iterator[NamedFile]:
        if isinstance(node, dict):
            if isinstance(node.get("file"), str) and isinstance(node.get("bytes"), int) and "sha256" in node:
                yield NamedFile(node["file"], node["bytes"], node["sha256"], where)
            for key, value in node.items():
                yield from walk(value, f"{where}.{key}" if where else str(key))
        elif isinstance(node, list):
            for i, value in enumerate(node):
                yield from walk(value, f"{where}[{i}]")

    yield from walk({k: v for k, v in manifest.to_dict().items() if k != "inputs"}, "")
    for key in ("rank_file", "tokenizer_file"):
        name = manifest.tokenized_info.get(key)
        if name:
            yield NamedFile(name, None, manifest.tokenized_info.get(f"{key}_sha256"), f"tokenized_info.{key}")


def refuse_repeated_shards(directory: Path, manifest: Manifest) -> None:
    """One line, before any shard is read, for a manifest listing a shard file more than once.

    Each listing would otherwise be checked (and its bytes hashed) again: one shard listed
    100,000 times is 100,000 reads, and the sum of the listings' tokens could be made to add up.
    """
    counts = Counter(str(shard.file) for entry in manifest.splits.values() for shard in entry.shards)
    repeated = [(file, n) for file, n in counts.items() if n > 1]
    if repeated:
        file, n = repeated[0]
        more = f" (and {len(repeated) - 1} other shard files)" if len(repeated) > 1 else ""
        raise ValidationError(
            f"{directory / 'metadata.yaml'}: lists the shard {file} {n} times{more}; a version lists each shard "
            "once, so this manifest was changed or is corrupt: rebuild the version or restore its metadata.yaml"
        )
