"""A version's splits read back as token streams, and schema 3's whole-document rule checked shard by shard.

Two builds whose work units differ (another ``unit_bytes``, an input kind
cut otherwise) hold the same documents in other shards since manifest schema
3: ``split_streams`` is what such builds must still agree on, byte for byte.
Written from docs/FORMAT.md with the format modules' public readers.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardflow.formats import bosidx, get_format
from shardflow.manifest import read_manifest


def split_stream(directory: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """``split``'s tokens, its shards concatenated in manifest order, and its documents' starts in them."""
    directory = Path(directory)
    manifest = read_manifest(directory)
    fmt = get_format(manifest.format_name)
    dtype = np.dtype(manifest.dtype).newbyteorder("<")
    tokens, starts, offset = [], [], 0
    for entry in manifest.splits[split].shards:
        tokens.append(np.asarray(fmt.open(directory / entry.file, dtype)).copy())
        starts.append(bosidx.read(directory / entry.index.file, entry.tokens).astype(np.int64) + offset)
        offset += entry.tokens
    if not tokens:
        return np.empty(0, dtype=dtype), np.empty(0, dtype=np.int64)
    return np.concatenate(tokens), np.concatenate(starts)


def split_streams(directory: Path) -> dict[str, tuple[bytes, bytes]]:
    """Every split's token stream and document starts as bytes: equal exactly when the same documents are in
    the same order, however they are cut into shards."""
    manifest = read_manifest(directory)
    out = {}
    for split in manifest.splits:
        tokens, starts = split_stream(directory, split)
        out[split] = (tokens.astype(tokens.dtype.newbyteorder("<")).tobytes(), starts.astype("<i8").tobytes())
    return out


def assert_whole_documents(directory: Path) -> int:
    """Schema 3's rule for every shard of the version: it starts with a document (its ``.bos.idx`` starts with 0),
    indexes as many as the manifest counts, and holds at most ``shard_tokens`` tokens unless it is one document.

    Returns the number of shards checked, so that a caller can see it checked some.
    """
    directory = Path(directory)
    manifest = read_manifest(directory)
    bound = int(manifest.config["shard_tokens"])
    checked = 0
    for split, info in manifest.splits.items():
        for entry in info.shards:
            starts = bosidx.read(directory / entry.index.file, entry.tokens)
            assert len(starts) == entry.documents > 0, (split, entry.file, len(starts), entry.documents)
            assert starts[0] == 0, f"{entry.file} begins inside a document (first start {starts[0]})"
            assert entry.tokens <= bound or entry.documents == 1, (entry.file, entry.tokens, bound)
            checked += 1
    return checked
