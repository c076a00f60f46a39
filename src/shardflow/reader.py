"""Reading a published version back: the manifest, lazily memory-mapped shards, and documents.

    v = open_version("wikitext@latest")
    split = v.split("train")
    split.document(0)        # token ids of document 0, without its BOS/EOS
    split.text(0)            # ... decoded: the original text

Opening reads the manifest (and its shard table, if it has one) and a few
files of the catalog; it makes no filesystem call per shard. Each shard and
index is checked as it is first mapped or read: present, of the manifest's
size, not a symlink out of the version, not changed since it was published
(``shardflow.shardset``). ``verify=True`` also checks every file, every
checksum and the index invariants at open (``shardflow validate``).
"""

from __future__ import annotations

import functools
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from .catalog import Catalog, asked_name_problem, resolve_version
from .provenance import vouch_for
from .errors import ValidationError
from .manifest import Manifest, SplitEntry, read_manifest, version_file
from .pins import VersionPin, published_stats
from .shardset import ShardSet

__all__ = ["Version", "Split", "open_version"]

log = logging.getLogger("shardflow.reader")
_WARNED: set[str] = set()
"""Version directories opened by path that no catalog lists, warned about once (per process)."""


class Split:
    """One split of a version: documents and text over its ``ShardSet`` (``shards``).

    Offsets, document starts and the cache of memory maps live in the shard
    set, which ``shardflow.runtime.open_shards`` returns for the same split.
    """

    def __init__(self, version: "Version", name: str, entry: SplitEntry) -> None:
        self.version = version
        self.name = name
        self.entry = entry
        self.shards = ShardSet.from_manifest(
            version.directory, version.manifest, name, version=version, pin=version.pin, published=version.published
        )
        """The split's shards: offsets, per-shard and split-wide document starts, token ranges, maps."""

    @property
    def num_shards(self) -> int:
        return self.shards.num_shards

    @property
    def num_tokens(self) -> int:
        return self.shards.num_tokens

    @property
    def num_documents(self) -> int:
        return self.entry.documents

    @property
    def shard_offsets(self) -> np.ndarray:
        """Token offset of each shard within the split (int64, length ``shards + 1``)."""
        return self.shards.offsets

    def shard(self, k: int) -> np.ndarray:
        """Shard ``k``'s tokens (a read-only memory map; checked against its header on first use)."""
        return self.shards.memmap(k)

    def shard_starts(self, k: int) -> np.ndarray:
        """The document starts in shard ``k`` (its ``.bos.idx``), as token indices within the shard."""
        return self.shards.doc_starts(k)

    @property
    def doc_starts(self) -> np.ndarray:
        """Start of every document in split-wide token coordinates (int64, ascending)."""
        return self.shards.all_doc_starts()

    def tokens(self, start: int, stop: int) -> np.ndarray:
        """Split-wide tokens ``[start, stop)``, across shard boundaries when needed."""
        return self.shards.read(start, stop)

    def document(self, i: int, *, with_boundary: bool = False) -> np.ndarray:
        """Token ids of document ``i`` of this split (its BOS and/or EOS excluded unless asked)."""
        if not 0 <= i < self.num_documents:
            raise IndexError(f"document {i} out of range: split {self.name!r} has {self.num_documents} documents")
        starts = self.doc_starts
        stop = int(starts[i + 1]) if i + 1 < len(starts) else self.num_tokens
        toks = self.tokens(int(starts[i]), stop)
        if with_boundary:
            return toks
        placement = self.shards.placement
        head = 1 if placement in ("bos", "both") else 0
        tail = 1 if placement in ("eos", "both") else 0
        return toks[head : len(toks) - tail]

    def text(self, i: int) -> str:
        """Document ``i`` decoded to text."""
        return self.version.tokenizer.decode(self.document(i))


class Version:
    """A published version: its directory, its manifest and its splits.

    ``pin`` (``shardflow.pins.VersionPin``) keeps ``shardflow rm`` off the version while this object or
    one of its splits' shard sets lives; ``published`` is each file's size and mtime as published, which
    the shard sets check as they first map a shard (``open_version`` gives both).
    """

    def __init__(
        self, directory: Path, manifest: Manifest, *, pin: VersionPin | None = None,
        published: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        self.directory = directory
        self.manifest = manifest
        self.pin = pin
        self.published = published
        self.dtype = np.dtype(manifest.dtype).newbyteorder("<")
        self._splits = {name: Split(self, name, entry) for name, entry in manifest.splits.items()}

    @property
    def ref(self) -> str:
        return self.manifest.ref

    @property
    def splits(self) -> list[str]:
        return list(self._splits)

    def split(self, name: str = "train") -> Split:
        try:
            return self._splits[name]
        except KeyError:
            raise KeyError(f"{self.ref} has no split {name!r}; its splits are {', '.join(self._splits)}") from None

    @functools.cached_property
    def tokenizer(self) -> Any:
        # Imported on use: tokenizers needs pyarrow and tiktoken, which the training runtime does not.
        from .tokenizers import load_tokenizer

        from .tokenizers import load_reference_tokenizer

        info = self.manifest.tokenized_info
        if info.get("rank_file"):  # a local rank file, copied into the version when it was built
            path = version_file(self.directory, info["rank_file"], "tokenized_info.rank_file")
            return load_tokenizer(str(path), backend="tiktoken")
        if info.get("tokenizer_file"):  # a tokenizer.json or .model, copied likewise
            return load_reference_tokenizer(str(version_file(self.directory, info["tokenizer_file"], "tokenized_info.tokenizer_file")))
        return load_tokenizer(self.manifest.config.get("tokenizer", info["tokenizer"]), backend="tiktoken")

    def __repr__(self) -> str:
        return f"Version({self.ref!r}, {str(self.directory)!r})"


def open_version(
    ref: str | os.PathLike[str], *, catalog: Catalog | str | os.PathLike[str] | None = None, verify: bool = False
) -> Version:
    """Open ``NAME@VERSION``, ``NAME@latest`` or a version directory / ``metadata.yaml`` path.

    ``NAME@REF`` is always looked up in the catalog (``./NAME@REF`` is a folder). A path is checked
    against the catalog that published it (``catalog``, else the one its publisher record names);
    one that no catalog lists (a version received from elsewhere) is served, checked against its own
    manifest only, with a one-line warning (once per directory and process).
    """
    directory, asked = resolve_version(ref, catalog)
    pin = VersionPin(directory, os.fspath(ref))  # before anything is read: rm refuses it from here on
    manifest = read_manifest(directory)
    vouch = vouch_for(directory, manifest, catalog)
    wrong = [*vouch.problems, asked_name_problem(asked, manifest, directory)]
    if wrong[0]:
        raise ValidationError(wrong[0])
    if vouch.catalog is None and str(directory) not in _WARNED:
        _WARNED.add(str(directory))
        log.warning("%s; it is served checked against its own manifest only", vouch.unlisted(directory))
    # No per-file check here: O(shards) filesystem calls on every rank at every start. The shard sets check
    # each file as they first map it (shardset.py), and verify=True checks them all below.
    # What the shard sets check as they first map a shard: the record of the catalog that lists the
    # version, or with verify the stats of the files about to be hashed.
    published = published_stats(directory, manifest, vouch.catalog, current=verify)
    if verify:
        # Imported here, not at the top: full validation brings the embedding checks and their
        # codecs (ml_dtypes), and ``import shardflow`` (this module) must stay numpy and PyYAML
        # only for the training runtime. No cycle: validation does not import the reader.
        from .validation import validate_dir

        validate_dir(directory, manifest, checksums=True)
    return Version(directory, manifest, pin=pin, published=published)
