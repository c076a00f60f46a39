"""The report of ``shardflow show`` on one split: a few decoded documents, document lengths, tokens per shard.

It is written here alone, for the command (``split_report``) and for the
library (``inspect_version``). A person reads it to eyeball a dataset before
training on it: does the text decode to what was expected, where are the
boundary tokens, are the document lengths plausible, are the shards the sizes
they should be.

For a published version it answers from the manifest (tokens and documents per
shard and split) and the statistics (``stats.json``: document lengths), so its
filesystem work does not grow with the number of shards: it reads the document
index and the tokens of only the few shards its sample documents come from (on
a bucket, only those are fetched). A split of at most ``EXACT_LENGTHS_UP_TO``
shards has its lengths from every document index, exactly (the median among
them); a larger one from the statistics, whose octave counts, extremes and
mean are exact and whose median is known to a quarter octave. A plain
directory of shards (no manifest) is reported from every document index.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from ..catalog import Catalog
from ..errors import ConfigError
from ..manifest import Manifest, SplitEntry
from ..manifest_files import named_files
from ..reader import Version
from ..stats import LENGTH_EDGES, bin_upper, pairs_to_hist, read_stats
from .options import REMOTE_OPTIONS, ReadOptions
from .remote import RemoteShardSet, VersionCache, is_remote_ref, remote_version
from .shards import ShardSet, open_shards

__all__ = ["inspect_version", "split_report", "remote_report_split", "length_histogram", "EXACT_LENGTHS_UP_TO",
           "LENGTHS_HEADING"]

EXACT_LENGTHS_UP_TO = 40
"""The most shards of a published split whose every document index the report reads for exact lengths."""
LENGTHS_HEADING = "Document lengths in tokens"
"""How the report's length section begins (absent where it has no lengths to give)."""

_BAR = 40  # characters of the longest histogram bar
_SHOW_ALL_SHARDS = 40  # a longer shard table is cut to its first 20 and last 5 rows


def _n(x: int | float) -> str:
    return f"{int(x):,}"


def _count(x: int | float, noun: str) -> str:
    """``1 shard``, ``148,378 tokens``."""
    return f"{_n(x)} {noun}{'' if int(x) == 1 else 's'}"


def _printable(text: str) -> str:
    # Keep newlines and tabs; show other control characters escaped so the
    # report cannot garble a terminal.
    return "".join(c if c in "\n\t" or c.isprintable() else repr(c)[1:-1] for c in text)


def _decoder(shards: ShardSet) -> Any | None:
    """The version's tokenizer, or None where it cannot load here (e.g. ranks not available offline)."""
    if shards.version is None:
        return None
    try:
        return shards.version.tokenizer
    except Exception:  # any tokenizer failure only turns samples into token ids
        return None


# -- document lengths ------------------------------------------------------------


def _octave_rows(counts: np.ndarray, *, indent: str = "  ") -> list[str]:
    """Lines of a text histogram of ``counts[b]``, the documents of ``[2**b, 2**(b+1))`` tokens."""
    counts = np.asarray(counts, dtype=np.int64)
    nonzero = np.flatnonzero(counts)
    if not len(nonzero):
        return [f"{indent}(no documents)"]
    counts = counts[: int(nonzero[-1]) + 1]
    top = int(counts.max())
    width = len(_n(2 ** len(counts)))
    lines = []
    for b in range(int(nonzero[0]), len(counts)):
        c = int(counts[b])
        bar = "█" * (max(1, round(_BAR * c / top)) if c else 0)
        lines.append(f"{indent}[{_n(2**b):>{width}}, {_n(2 ** (b + 1)):>{width}})  {bar:<{_BAR}}  {_n(c)}")
    return lines


def length_histogram(lengths: np.ndarray, *, indent: str = "  ") -> list[str]:
    """Lines of a log2-bucketed text histogram of ``lengths`` (all >= 1): the report's length rows."""
    octaves = np.floor(np.log2(np.maximum(np.asarray(lengths, dtype=np.int64), 1))).astype(np.int64)
    return _octave_rows(np.bincount(octaves), indent=indent)


def _exact_lengths(shards: ShardSet) -> list[str]:
    """The length section from every document index of ``shards``."""
    starts = shards.all_doc_starts()
    lengths = np.append(starts[1:], shards.num_tokens) - starts
    return [
        f"{LENGTHS_HEADING} (boundary token included): min {_n(lengths.min())}, median {_n(np.median(lengths))}, "
        f"mean {_n(lengths.mean())}, max {_n(lengths.max())}",
        *length_histogram(lengths),
    ]


def _median_range(hist: np.ndarray) -> tuple[int, int]:
    """The least and greatest median that the quarter-octave histogram ``hist`` allows."""
    n = int(hist.sum())
    cum = np.cumsum(hist)
    # The median is the middle document, or the mean of the two middle ones (0-based ranks (n-1)//2 and n//2).
    low, high = (int(np.searchsorted(cum, rank, side="right")) for rank in ((n - 1) // 2, n // 2))
    return int(LENGTH_EDGES[low]), bin_upper(high)


def _stats_lengths(split_stats: dict[str, Any], entry: SplitEntry) -> list[str]:
    """The length section from the split's statistics (``stats.json``), in the exact section's format."""
    hist = pairs_to_hist(split_stats["histogram"])
    # Every power of two is a bin edge (four bins per octave), so the octave counts are exact.
    octaves = np.array([int(edge).bit_length() - 1 for edge in LENGTH_EDGES], dtype=np.int64)
    counts = np.bincount(octaves, weights=hist, minlength=int(octaves.max()) + 1).astype(np.int64)
    low, high = _median_range(hist)
    high = min(high, int(split_stats["max_length"]))
    low = max(low, int(split_stats["min_length"]))
    median = _n(low) if low == high else f"{_n(low)}-{_n(high)}"
    # The lengths add up to the split's tokens: the mean is exact.
    return [
        f"{LENGTHS_HEADING} (boundary token included): min {_n(split_stats['min_length'])}, median {median}, "
        f"mean {_n(entry.tokens / entry.documents)}, max {_n(split_stats['max_length'])} "
        "(from the statistics: the median to a quarter octave)",
        *_octave_rows(counts),
    ]


def _length_section(shards: ShardSet, entry: SplitEntry | None, stats: dict[str, Any] | None, split: str) -> list[str]:
    """Exact lengths for a plain directory (``entry`` None) or a split of few shards, else from the statistics."""
    if entry is None or shards.num_shards <= EXACT_LENGTHS_UP_TO:
        return _exact_lengths(shards)
    s = (stats or {}).get("splits", {}).get(split)
    if s is not None and (s.get("documents"), s.get("tokens")) == (entry.documents, entry.tokens):
        return _stats_lengths(s, entry)
    # Without statistics, the lengths are in every document index: reading them all is what show does not do.
    return [f"Document lengths: not shown ({shards.name} has no statistics of split {split!r}, and reading the "
            f"document index of each of its {_count(shards.num_shards, 'shard')} is what show avoids)"]


# -- the report ------------------------------------------------------------------


def _documents(shards: ShardSet, entry: SplitEntry | None) -> np.ndarray | None:
    """How many documents start in each shard: the manifest's, else (a plain directory) counted in every index;
    None where a shard has no index (nor a boundary token to derive one)."""
    if entry is not None:
        return np.array([s.entry.documents for s in shards.shards], dtype=np.int64)
    if not all(shards.has_index(k) for k in range(shards.num_shards)):
        return None
    starts = shards.all_doc_starts()
    return np.diff(np.searchsorted(starts, shards.offsets)).astype(np.int64)


def _document(shards: ShardSet, documents: np.ndarray, first: np.ndarray, i: int) -> tuple[int, int, int, int]:
    """Split-wide ``(start, stop)`` of document ``i``, and its shard and token there, from the indexes of at most two
    shards. ``documents[k]``: how many documents start in shard ``k``; ``first[k]``: the number of them before it."""
    k = int(np.searchsorted(first, i, side="right")) - 1
    starts = shards.doc_starts(k)
    j = i - int(first[k])
    local = int(starts[j])
    if j + 1 < len(starts):
        stop = int(shards.offsets[k]) + int(starts[j + 1])
    else:  # it ends where the next document starts: in the next shard that starts one, else at the split's end
        later = np.flatnonzero(documents[k + 1 :])
        if len(later):
            nxt = k + 1 + int(later[0])
            stop = int(shards.offsets[nxt]) + int(shards.doc_starts(nxt)[0])
        else:
            stop = shards.num_tokens
    return int(shards.offsets[k]) + local, stop, k, local


def split_report(
    shards: ShardSet, entry: SplitEntry | None = None, *, split: str, samples: int, stats: dict[str, Any] | None = None,
    chars: int = 600,
) -> str:
    """The report on ``split`` of ``shards``: header, ``samples`` decoded documents, document lengths, tokens and
    documents per shard. ``entry``: the split's manifest entry (None: a plain directory, whose every index is
    read); ``stats``: the version's statistics (None: it has none); ``chars`` caps the characters per document."""
    tok = _decoder(shards)
    total = shards.num_tokens
    documents = _documents(shards, entry)
    ndocs = 0 if documents is None else (entry.documents if entry is not None else int(documents.sum()))
    out = [f"{shards.name}  split {split!r}", f"  directory  {shards.directory}"]
    tok_desc = f"tokenizer {shards.tokenizer} (vocab {_n(shards.vocab_size or 0)})" if shards.tokenizer else "tokenizer unknown"
    out.append(f"  format     {shards.format.name}, {shards.dtype.name} tokens, {tok_desc}")
    if shards.boundary_token is not None:
        where = {"bos": "before", "eos": "after", "both": "(BOS, with an EOS after) before"}.get(shards.placement, "at")
        name = f"{tok.decode([shards.boundary_token])!r} " if tok is not None else ""
        out.append(f"  boundary   {name}(id {shards.boundary_token}) {where} each document")
    docs = f"{_count(ndocs, 'document')}, " if documents is not None else ""
    out.append(f"  split      {_count(total, 'token')}, {docs}{_count(shards.num_shards, 'shard')}")

    out.append("")
    if documents is None or not ndocs:
        out.append("Documents: no document index (.bos.idx) here; pass boundary_token= to derive one")
    else:
        first = np.concatenate(([0], np.cumsum(documents)[:-1])).astype(np.int64)
        picks = sorted(set(np.linspace(0, ndocs - 1, num=min(samples, ndocs)).round().astype(int).tolist()))
        how = "decoded" if tok is not None else "token ids (no tokenizer known)"
        out.append(f"Documents {', '.join(_n(i) for i in picks)} of {_n(ndocs)}, {how}, first {_n(chars)} characters:")
        for i in picks:
            a, b, k, local = _document(shards, documents, first, i)
            out.append(f"  --- document {_n(i)}: {_count(b - a, 'token')}, from shard {k} token {_n(local)}")
            ids = shards.read(a, min(b, a + chars))  # a token is at least one character
            if tok is not None:
                text = tok.decode(ids)
                body = _printable(text[:chars]) + (" [...]" if b - a > len(ids) or len(text) > chars else "")
            else:
                body = " ".join(str(t) for t in ids.tolist()[: chars // 6]) + " ..."
            out.extend("    " + line for line in body.split("\n"))

    out.append("")
    if ndocs:
        out.extend(_length_section(shards, entry, stats, split))
        out.append("")

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
        starting = f"  {_n(documents[k]):>9} documents start" if documents is not None else ""
        out.append(f"  {k:>6}  {shards.shards[k].path.name:<{width}}  {_n(t[k]):>13} tokens{starting}")
    return "\n".join(out) + "\n"


# -- opening what the report reads ----------------------------------------------


def remote_report_split(cache: VersionCache, manifest: Manifest, split: str) -> tuple[RemoteShardSet, dict[str, Any] | None]:
    """Split ``split`` of a version on a bucket (its ``cache`` and ``manifest``, ``runtime.remote.remote_version``),
    as the report reads it: ``(its shards, which decode with the version's tokenizer, the statistics or None)``.
    The statistics and the tokenizer's files are fetched first, each verified as it arrives; the shards and
    indexes, as the report reads them."""
    for f in named_files(manifest):
        # The statistics, and the tokenizer's copy that the samples are decoded with (its size unrecorded).
        if f.sha256 and (f.name in ("stats.json", "stats.vocab.npy") or f.where.startswith("tokenized_info.")):
            cache.ensure(f.name, cache.object_size(f.name) if f.size is None else f.size, f.sha256)
    stats = read_stats(cache.directory, manifest)
    return RemoteShardSet.over(cache, manifest, split, version=Version(cache.directory, manifest)), stats


def inspect_version(
    ref: "str | os.PathLike[str] | ShardSet",
    *,
    split: str = "train",
    samples: int = 3,
    catalog: Catalog | str | os.PathLike[str] | None = None,
    chars: int = 600,
    **plain: Any,
) -> str:
    """The report on ``split`` of ``ref`` that ``shardflow show`` prints below a version's summary.

    ``ref``: a version (``NAME@VERSION``, its directory, or on a bucket), a
    plain directory or glob of shards, or a ``ShardSet`` (reported from every
    index). ``chars`` caps the characters shown per document. ``plain`` takes
    the options of ``open_shards`` (``dtype``, ``pattern``, ... for plain
    directories, whose documents are shown as token ids: no tokenizer is known;
    ``cache_dir`` for a bucket's version, whose files are always verified).
    """
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 0:
        raise ValueError(f"samples must be a non-negative integer, not {samples!r}")
    if is_remote_ref(ref, catalog):
        opts = ReadOptions.collect("inspect_version", REMOTE_OPTIONS - {"split", "catalog"}, None, plain)
        given = opts.plain_given()
        if given:
            raise ConfigError(f"{', '.join(given)} describe plain directories of shards; {os.fspath(ref)} is a published version")
        cache, manifest = remote_version(ref, catalog=catalog, cache_dir=opts.cache_dir)
        shards, stats = remote_report_split(cache, manifest, split)
        return split_report(shards, manifest.splits[split], split=split, samples=samples, stats=stats, chars=chars)
    shards = open_shards(ref, split=split, catalog=catalog, **plain)
    version = None if isinstance(ref, ShardSet) else shards.version
    if version is None:  # a plain directory, or a given ShardSet: from every index
        return split_report(shards, split=split, samples=samples, chars=chars)
    m = version.manifest
    return split_report(shards, m.splits[split], split=split, samples=samples, stats=read_stats(version.directory, m),
                        chars=chars)
