"""Synthetic shard directories, written with the real shard formats, for a test that needs exact control over
shard sizes and document starts (the runtime tests)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from shardflow.formats import bosidx, get_format


def write_shards(
    directory: Path,
    shards: list[np.ndarray],
    *,
    format: str = "nanogpt",
    dtype: str = "uint32",
    starts: list[np.ndarray] | None = None,
    stem: str = "data_train",
) -> list[Path]:
    """Write ``shards`` (token arrays) as ``{stem}_{k:06d}.{ext}`` in ``format``, with ``.bos.idx`` when ``starts``."""
    fmt = get_format(format)
    dt = np.dtype(dtype).newbyteorder("<")
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, toks in enumerate(shards):
        path = directory / f"{stem}_{k:06d}.{fmt.extension}"
        path.write_bytes(fmt.header(len(toks), dt) + np.asarray(toks, dtype=dt).tobytes())
        if starts is not None:
            bosidx.index_path(path).write_bytes(bosidx.encode(starts[k]))
        paths.append(path)
    return paths


def counting_shards(sizes: list[int]) -> list[np.ndarray]:
    """Shards whose tokens are their split-wide positions: a window's content names where it came from."""
    out, base = [], 0
    for n in sizes:
        out.append(np.arange(base, base + n, dtype=np.uint32))
        base += n
    return out


BOS = 7  # the boundary token of the synthetic document shards


def document_shards(doc_lengths: list[int], shard_tokens: int, *, placement: str = "bos") -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A token stream of documents (boundary token included in each length), cut into shards.

    Non-boundary tokens are 100 + the document's number (mod 50000), so a
    token tells which document it belongs to. Returns (shards, per-shard starts).
    """
    stream_parts = []
    for d, n in enumerate(doc_lengths):
        doc = np.full(n, 100 + d % 50000, dtype=np.uint32)
        if placement == "bos":
            doc[0] = BOS
        else:
            doc[-1] = BOS
        stream_parts.append(doc)
    stream = np.concatenate(stream_parts) if stream_parts else np.empty(0, np.uint32)
    doc_starts = np.concatenate(([0], np.cumsum(doc_lengths)[:-1])).astype(np.int64) if doc_lengths else np.empty(0, np.int64)
    shards, starts = [], []
    for lo in range(0, len(stream), shard_tokens):
        hi = min(lo + shard_tokens, len(stream))
        shards.append(stream[lo:hi])
        inside = doc_starts[(doc_starts >= lo) & (doc_starts < hi)] - lo
        starts.append(inside)
    return shards, starts
