"""A printable look at a dataset: a few decoded documents, document lengths, tokens per shard.

``inspect_version(ref, split=...)`` returns the report ``shardflow show`` prints,
for a person to eyeball a dataset before training on it: does the text decode
to what was expected, where are the boundary tokens, are the document lengths
plausible, are the shards the sizes they should be. It reads the manifest, the
``.bos.idx`` sidecars and only the tokens of the documents it shows.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..catalog import Catalog
from .shards import ShardSet, open_shards

__all__ = ["inspect_version", "length_histogram"]

_BAR = 40  # characters of the longest histogram bar
_SHOW_ALL_SHARDS = 40


def _n(x: int | float) -> str:
    return f"{int(x):,}"


def _count(x: int | float, noun: str) -> str:
    """``1 shard``, ``148,378 tokens``."""
    return f"{_n(x)} {noun}{'' if int(x) == 1 else 's'}"


def _printable(text: str) -> str:
    # Keep newlines and tabs; show other control characters escaped so the
    # report cannot garble a terminal.
    return "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in text)


def length_histogram(lengths: np.ndarray, *, indent: str = "  ") -> list[str]:
    """Lines of a log2-bucketed text histogram of ``lengths`` (all >= 1)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if not len(lengths):
        return [f"{indent}(no documents)"]
    buckets = np.floor(np.log2(np.maximum(lengths, 1))).astype(np.int64)
    counts = np.bincount(buckets)
    first = int(buckets.min())
    top = int(counts.max())
    width = len(_n(2 ** len(counts)))
    lines = []
    for b in range(first, len(counts)):
        c = int(counts[b])
        bar = "█" * (max(1, round(_BAR * c / top)) if c else 0)
        lines.append(f"{indent}[{_n(2**b):>{width}}, {_n(2 ** (b + 1)):>{width}})  {bar:<{_BAR}}  {_n(c)}")
    return lines


def _decoder(shards: ShardSet) -> Any | None:
    if shards.version is None:
        return None
    try:
        return shards.version.tokenizer
    except Exception:  # a tokenizer that cannot load here (e.g. ranks not available offline)
        return None


def inspect_version(
    ref: "str | os.PathLike[str] | ShardSet",
    *,
    split: str = "train",
    samples: int = 3,
    catalog: Catalog | str | os.PathLike[str] | None = None,
    chars: int = 600,
    **plain: Any,
) -> str:
    """The report on ``split`` of ``ref``: header, ``samples`` decoded documents, length histogram, shards.

    ``chars`` caps the characters shown per document. ``plain`` takes the
    plain-directory options of ``open_shards`` (``dtype``, ``pattern``, ...);
    documents of plain directories are shown as token ids (no tokenizer is known).
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise ValueError(f"samples must be a non-negative integer, not {samples!r}")
    shards = open_shards(ref, split=split, catalog=catalog, **plain)
    tok = _decoder(shards)
    total = shards.num_tokens
    out: list[str] = []
    out.append(f"{shards.name}  split {split!r}")
    out.append(f"  directory  {shards.directory}")
    tok_desc = f"tokenizer {shards.tokenizer} (vocab {_n(shards.vocab_size or 0)})" if shards.tokenizer else "tokenizer unknown"
    out.append(f"  format     {shards.format.name}, {shards.dtype.name} tokens, {tok_desc}")
    if shards.boundary_token is not None:
        where = {"bos": "before", "eos": "after", "both": "(BOS, with an EOS after) before"}.get(shards.placement, "at")
        name = ""
        if tok is not None:
            name = f"{tok.decode([shards.boundary_token])!r} "
        out.append(f"  boundary   {name}(id {shards.boundary_token}) {where} each document")
    has_index = all(shards.has_index(k) for k in range(shards.num_shards))
    starts = shards.all_doc_starts() if has_index else None
    docs = f"{_count(len(starts), 'document')}, " if starts is not None else ""
    out.append(f"  split      {_count(total, 'token')}, {docs}{_count(shards.num_shards, 'shard')}")

    # -- documents ---------------------------------------------------------------
    out.append("")
    if starts is None or not len(starts):
        out.append("Documents: no document index (.bos.idx) here; pass boundary_token= to derive one")
        lengths = np.empty(0, dtype=np.int64)
    else:
        ends = np.append(starts[1:], total)
        lengths = ends - starts
        picks = sorted(set(np.linspace(0, len(starts) - 1, num=min(samples, len(starts))).round().astype(int).tolist()))
        how = "decoded" if tok is not None else "token ids (no tokenizer known)"
        out.append(f"Documents {', '.join(_n(i) for i in picks)} of {_n(len(starts))}, {how}, first {_n(chars)} characters:")
        for i in picks:
            a, b = int(starts[i]), int(ends[i])
            k, local = shards.locate(a)
            out.append(f"  --- document {_n(i)}: {_count(b - a, 'token')}, from shard {k} token {_n(local)}")
            ids = shards.read(a, min(b, a + chars))  # a token is at least one character
            if tok is not None:
                text = tok.decode(ids)
                body = _printable(text[:chars]) + (" [...]" if b - a > len(ids) or len(text) > chars else "")
            else:
                body = " ".join(str(t) for t in ids.tolist()[: chars // 6]) + " ..."
            out.extend("    " + line for line in body.split("\n"))

    # -- lengths -------------------------------------------------------------------
    out.append("")
    if len(lengths):
        out.append(
            f"Document lengths in tokens (boundary token included): min {_n(lengths.min())}, "
            f"median {_n(np.median(lengths))}, mean {_n(lengths.mean())}, max {_n(lengths.max())}"
        )
        out.extend(length_histogram(lengths))
        out.append("")

    # -- shards --------------------------------------------------------------------
    t = shards.tokens
    out.append(
        f"Tokens per shard ({_count(len(t), 'shard')}): min {_n(t.min())}, median {_n(np.median(t))}, max {_n(t.max())}"
    )
    rows = list(range(len(t)))
    if len(rows) > _SHOW_ALL_SHARDS:
        rows = rows[:20] + [-1] + rows[-5:]
    width = max(len(s.path.name) for s in shards.shards)
    for k in rows:
        if k < 0:
            out.append(f"  ... {_count(len(t) - 25, 'more shard')} ...")
            continue
        ndocs = f"  {_n(len(shards.doc_starts(k))):>9} documents start" if has_index else ""
        out.append(f"  {k:>6}  {shards.shards[k].path.name:<{width}}  {_n(t[k]):>13} tokens{ndocs}")
    return "\n".join(out) + "\n"

