"""Dataset statistics: mergeable records collected while tokenizing, and the version's ``stats.json``.

Everything here merges exactly, so the numbers do not depend on how the work
was cut or how many workers ran it, and an incremental version can add its
parent's per-input records to its own new ones:

* document lengths (in tokens, boundary tokens included: the distance between
  two ``.bos.idx`` entries) go into a histogram with fixed bins, four per
  octave; the lower edge of bin ``k`` is ``floor(2 ** (k / 4))`` computed on
  integers (``isqrt(isqrt(2 ** k))``), so every machine bins alike and
  histograms add bin by bin;
* vocabulary usage is a full count per id (``np.bincount`` as the tokens
  pass), kept sparse: ``(input, id, count)`` rows in ``stats.vocab.npy``. A
  top-K list would not merge exactly; full counts do, and the top ids are
  derived from them at the end;
* tokens and documents per value of ``--stats-column`` are exact integer sums
  keyed by the value's text.

This module is pure: no staging paths, no plan. ``pipeline/collect_stats.py`` collects
and writes; ``card.py`` and the command line read.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

from .errors import ManifestError, ValidationError
from .manifest import version_file

__all__ = [
    "MIN_REPEAT_RUN",
    "RepeatRuns",
    "STATS_NAME",
    "VOCAB_NAME",
    "STATS_VERSION",
    "BINS_PER_OCTAVE",
    "LENGTH_EDGES",
    "VOCAB_DTYPE",
    "length_histogram",
    "hist_to_pairs",
    "pairs_to_hist",
    "hist_quantile",
    "ColumnCounts",
    "merge_columns",
    "sparse_vocab",
    "read_stats",
    "stats_problems",
    "text_histogram",
    "summary_lines",
    "odd_line",
]

STATS_NAME = "stats.json"
VOCAB_NAME = "stats.vocab.npy"
STATS_VERSION = 1
BINS_PER_OCTAVE = 4

# Bin lower edges from 1 token to 2**40 tokens; lengths are >= 1 (every document has a boundary token).
LENGTH_EDGES: np.ndarray = np.unique(
    np.array([math.isqrt(math.isqrt(2**k)) for k in range(0, 40 * BINS_PER_OCTAVE + 1)], dtype=np.int64)
)

# stats.vocab.npy and parts/unit-N.vocab.npy: sorted by (input, id); ``input`` is 0 in a unit's file.
VOCAB_DTYPE = np.dtype([("input", "<u4"), ("id", "<u4"), ("count", "<i8")])


def length_histogram(lengths: np.ndarray) -> np.ndarray:
    """Counts per bin of ``LENGTH_EDGES`` (int64, one entry per bin)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) == 0:
        return np.zeros(len(LENGTH_EDGES), dtype=np.int64)
    bins = np.searchsorted(LENGTH_EDGES, lengths, side="right") - 1
    return np.bincount(np.maximum(bins, 0), minlength=len(LENGTH_EDGES)).astype(np.int64)


def hist_to_pairs(hist: np.ndarray) -> list[list[int]]:
    """``[[lower edge, count], ...]`` of the non-empty bins: how ``stats.json`` stores a histogram."""
    nz = np.flatnonzero(hist)
    return [[int(LENGTH_EDGES[i]), int(hist[i])] for i in nz]


def pairs_to_hist(pairs: Iterable[Iterable[int]]) -> np.ndarray:
    """The dense histogram of ``hist_to_pairs``' output."""
    hist = np.zeros(len(LENGTH_EDGES), dtype=np.int64)
    for edge, count in pairs:
        k = int(np.searchsorted(LENGTH_EDGES, int(edge)))
        if k >= len(LENGTH_EDGES) or LENGTH_EDGES[k] != int(edge):
            raise ValidationError(f"histogram edge {edge} is not a bin edge of shardflow's length histogram")
        hist[k] += int(count)
    return hist


def bin_upper(k: int) -> int:
    """The largest length in bin ``k``."""
    return int(LENGTH_EDGES[k + 1] - 1) if k + 1 < len(LENGTH_EDGES) else int(2**62)


def hist_quantile(hist: np.ndarray, q: float) -> int:
    """The upper edge of the bin holding the ``q`` quantile: a bound within a quarter octave."""
    total = int(hist.sum())
    if total == 0:
        return 0
    k = int(np.searchsorted(np.cumsum(hist), math.ceil(q * total)))
    return bin_upper(min(k, len(hist) - 1))


@dataclass
class ColumnCounts:
    """Documents and tokens per value of the ``--stats-column`` (an exact, mergeable sum)."""

    values: dict[str, list[int]] = field(default_factory=dict)

    def add(self, keys: np.ndarray, lengths: np.ndarray) -> None:
        uniq, inverse = np.unique(keys, return_inverse=True)
        docs = np.bincount(inverse, minlength=len(uniq))
        toks = np.bincount(inverse, weights=lengths, minlength=len(uniq))
        for v, d, t in zip(uniq.tolist(), docs.tolist(), toks.tolist()):
            cur = self.values.setdefault(str(v), [0, 0])
            cur[0] += int(d)
            cur[1] += int(t)

    def merge(self, other: Mapping[str, Iterable[int]]) -> None:
        for v, (d, t) in other.items():
            cur = self.values.setdefault(v, [0, 0])
            cur[0] += int(d)
            cur[1] += int(t)

    def to_dict(self) -> dict[str, list[int]]:
        return {k: list(self.values[k]) for k in sorted(self.values)}


MIN_REPEAT_RUN = 64
"""Runs of one token this long or longer are counted in ``stats.json`` (``odd``)."""


@dataclass
class RepeatRuns:
    """Runs of one token repeated at least ``MIN_REPEAT_RUN`` times in a row (``the the the ...``, a line of
    ``=``): how many, and the longest (its length and token id; the smallest id among equally long ones), so
    merges give the same answer in any order."""

    runs: int = 0
    longest: int = 0
    token: int = -1

    def add(self, tokens: np.ndarray) -> None:
        same = np.flatnonzero(tokens[1:] == tokens[:-1])  # i: token i+1 repeats token i (rare in text)
        if len(same) < MIN_REPEAT_RUN - 1:
            return
        # Consecutive positions in `same` make one run of (their number + 1) tokens.
        first = np.concatenate([[0], np.flatnonzero(np.diff(same) != 1) + 1])
        length = np.diff(np.concatenate([first, [len(same)]])) + 1
        for k in np.flatnonzero(length >= MIN_REPEAT_RUN).tolist():
            self._longest(int(length[k]), int(tokens[same[first[k]]]))
            self.runs += 1

    def _longest(self, length: int, token: int) -> None:
        if length > self.longest or (length == self.longest and token < self.token):
            self.longest, self.token = length, token

    def merge(self, other: RepeatRuns) -> None:
        self.runs += other.runs
        if other.runs:
            self._longest(other.longest, other.token)

    def to_array(self) -> np.ndarray:
        return np.array([self.runs, self.longest, self.token], dtype=np.int64)

    @classmethod
    def from_array(cls, a: np.ndarray) -> RepeatRuns:
        return cls(runs=int(a[0]), longest=int(a[1]), token=int(a[2]))

    def to_dict(self) -> dict[str, int]:
        return {"min_run": MIN_REPEAT_RUN, "runs": self.runs, "longest": self.longest, "token_id": self.token}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> RepeatRuns:
        if not d:
            return cls()
        return cls(runs=int(d["runs"]), longest=int(d["longest"]), token=int(d["token_id"]))


def merge_columns(parts: Iterable[Mapping[str, Iterable[int]]]) -> dict[str, list[int]]:
    total = ColumnCounts()
    for p in parts:
        total.merge(p)
    return total.to_dict()


def sparse_vocab(counts: np.ndarray, input_index: int = 0) -> np.ndarray:
    """A dense count per id as ``VOCAB_DTYPE`` rows (non-zero ids only, ascending)."""
    ids = np.flatnonzero(counts)
    out = np.empty(len(ids), dtype=VOCAB_DTYPE)
    out["input"] = input_index
    out["id"] = ids
    out["count"] = counts[ids]
    return out


def dense_vocab(rows: np.ndarray, size: int) -> np.ndarray:
    """Counts per id (length at least ``size``) from ``VOCAB_DTYPE`` rows."""
    n = max(size, int(rows["id"].max()) + 1 if len(rows) else 0)
    return np.bincount(rows["id"].astype(np.int64), weights=rows["count"], minlength=n).astype(np.int64)


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def read_stats(directory: Path | str, manifest: Any = None) -> dict[str, Any] | None:
    """A version's ``stats.json`` (None when it has none: built before statistics, or with them off)."""
    path = Path(directory) / STATS_NAME
    if manifest is not None and "stats" not in manifest.extra:
        return None
    if not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))


def stats_problems(directory: Path, manifest: Any, *, checksums: bool) -> list[str]:
    """The statistics files the manifest's ``stats`` section names: present, of their size and SHA-256,
    and counting what the splits hold."""
    section = manifest.extra.get("stats")
    if section is None:
        return []
    if not isinstance(section, dict) or not isinstance(section.get("files"), list):
        return [f"{directory}: the manifest's 'stats' section must hold a list 'files' of {{file, bytes, sha256}}"]
    problems = []
    for entry in section["files"]:
        name = entry.get("file") if isinstance(entry, dict) else None
        if name not in (STATS_NAME, VOCAB_NAME):
            problems.append(f"{directory}: the manifest's 'stats' section names {name!r}, not a statistics file")
            continue
        try:  # the one confinement check: no symlink out of the version
            path = version_file(directory, name, "the 'stats' section")
        except ManifestError as exc:
            problems.append(str(exc))
            continue
        if not path.is_file():
            problems.append(f"{path}: missing; the manifest names it in 'stats'")
        elif path.stat().st_size != entry.get("bytes"):
            problems.append(f"{path}: {path.stat().st_size} bytes, but the manifest says {entry.get('bytes')}")
        elif checksums and _sha256(path) != entry.get("sha256"):
            problems.append(f"{path}: SHA-256 does not match the manifest; the statistics were changed")
    if problems:
        return problems
    try:
        stats = json.loads((directory / STATS_NAME).read_text(encoding="utf-8"))
        for split, entry in manifest.splits.items():
            got = stats["splits"][split]
            if (got["documents"], got["tokens"]) != (entry.documents, entry.tokens):
                problems.append(
                    f"{directory / STATS_NAME}: split {split!r} has {got['documents']} documents / {got['tokens']} "
                    f"tokens, the manifest says {entry.documents} / {entry.tokens}"
                )
    except (ValueError, KeyError, TypeError) as exc:
        problems.append(f"{directory / STATS_NAME}: not the statistics of this version ({exc!r})")
    return problems


def text_histogram(pairs: list[list[int]], *, width: int = 40, octave_rows: bool = True) -> list[str]:
    """A compact terminal histogram of a stored length histogram: one row per octave (2^k to 2^(k+1) - 1)."""
    hist = pairs_to_hist(pairs)
    if not hist.any():
        return ["  (no documents)"]
    rows: list[tuple[str, int]] = []
    if octave_rows:
        # Merge the quarter-octave bins into octaves: the terminal has fewer lines than a plot has bars.
        octave = np.floor(np.log2(LENGTH_EDGES)).astype(np.int64)
        per = np.bincount(octave, weights=hist, minlength=int(octave.max()) + 1).astype(np.int64)
        nz = np.flatnonzero(per)
        for o in range(int(nz[0]), int(nz[-1]) + 1):
            rows.append((f"{2**o:>9,}-{2**(o + 1) - 1:<9,}", int(per[o])))
    top = max(c for _, c in rows)
    total = int(hist.sum())
    lines = []
    for label, count in rows:
        bar = "#" * (round(width * count / top) if count else 0)
        if count and not bar:
            bar = "."
        lines.append(f"  {label} {bar:<{width}} {count:>8,} ({100 * count / total:4.1f}%)")
    return lines


_TWICE_ESCAPED_BYTE = re.compile(r"\\\\(x[0-9a-f]{2})")


def token_repr(text: str) -> str:
    """A token's recorded text as ``show`` and the card print it: Python's ``repr``, but a byte that is no UTF-8
    on its own (recorded as ``\\x9d``, the decoder's backslash escape) shown escaped once, ``'\\x9d'``, not twice."""
    return _TWICE_ESCAPED_BYTE.sub(r"\\\1", repr(text))


def summary_lines(stats: dict[str, Any], *, top: int = 8) -> list[str]:
    """What ``shardflow show`` prints of a version's statistics: length histograms, top sources, vocabulary."""
    lines = []
    for split, s in stats["splits"].items():
        lines.append(
            f"  {split} document lengths (tokens): min {s['min_length']:,}, mean {s['mean_length']:,.1f}, "
            f"p50 <= {s['p50_at_most']:,}, p99 <= {s['p99_at_most']:,}, max {s['max_length']:,}"
        )
        lines += text_histogram(s["histogram"], width=30)
    if stats.get("by_column"):
        col = stats["by_column"]
        what, rows = f"{col['column']!r} value", [(v["value"], v["tokens"], v["documents"]) for v in col["values"]]
    else:
        what = "input"
        rows = sorted(((i["relname"], i["tokens"], i["documents"]) for i in stats["inputs"]), key=lambda r: (-r[1], r[0]))
    total = max(1, stats["totals"]["tokens"])
    lines.append(f"  top sources (by {what}, of {len(rows)}):")
    for label, tokens, docs in rows[:top]:
        lines.append(f"    {tokens:>14,} tokens {100 * tokens / total:5.1f}%  {docs:>10,} docs  {label}")
    voc = stats["vocabulary"]
    lines.append(
        f"  vocabulary: {voc['used']:,} of {voc['size']:,} ids used ({100 * voc['share_used']:.1f}%); most frequent: "
        + ", ".join(f"{token_repr(t['text'])} {100 * t['share']:.1f}%" for t in voc["top"][:5])
    )
    sk = stats["documents_skipped"]
    lines.append(
        f"  skipped: {sk['null_texts']:,} null, {sk['empty_texts']:,} empty, {sk['invalid_utf8']:,} invalid UTF-8, "
        f"{sk['bad_records']:,} bad records; {stats['documents_replaced']:,} with invalid UTF-8 replaced"
    )
    lines.append(f"  odd: {odd_line(stats)}")
    return lines


def odd_line(stats: dict[str, Any]) -> str:
    """One line on what may have got in by mistake: near-empty and huge documents, runs of one token."""
    odd = stats.get("odd")
    if not odd:
        return "not recorded (statistics from an earlier shardflow)"
    short, long, runs = odd["short_documents"], odd["long_documents"], odd["repeated_token_runs"]
    text = (
        f"{short['documents']:,} documents of at most {short['at_most_tokens']} tokens, "
        f"{long['documents']:,} of at least {long['at_least_tokens']:,}; "
        f"{runs['runs']:,} runs of one token repeated {runs['min_run']}+ times"
    )
    if runs["runs"]:
        text += f" (longest: {runs.get('token_text', '')!r} x {runs['longest']:,}, id {runs['token_id']})"
    return text
