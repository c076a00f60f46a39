"""Collecting a build's statistics: per unit while it is tokenized, merged into ``stats.json`` at finalize.

Per work unit (``tokenize_unit``, as the tokens pass, no extra pass over them):

    parts/unit-N.stats.npz    ``vocab``: count per token id (``VOCAB_DTYPE`` rows, ids with a count
                              only); ``column``: documents and tokens per value of ``--stats-column``
                              (JSON, as UTF-8 bytes); ``runs``: runs of one token repeated
                              ``MIN_REPEAT_RUN``+ times (int64 count, longest, its id)

written before the unit's marker (one file: each file written costs an fsync). At finalize, ``write_stats`` adds them
up per input, takes the document lengths per split and per input from the
layout's document starts (``layout/<split>.starts.i64``: the split each
document went to is known there, so no pass over tokens either), and takes a
reused input's vocabulary and column counts from the parent version's
``stats.json`` and ``stats.vocab.npy``: an incremental version's statistics
equal a full build's. Nothing here depends on the number of workers.

``BuildConfig.stats`` False (``--no-stats``, the benchmark's baseline) turns
collection off: the version then has no ``stats.json`` and its manifest no
``stats`` section.
"""

from __future__ import annotations

import io
import json
import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._io import NPY_LOCK, atomic_write_bytes, atomic_write_text, load_npy, sha256_file
from ..errors import ConfigError, InputError
from ..manifest import Manifest
from ..sources import InputFile, WorkUnit
from ..sources import input_kind
from ..sources.base import DEFAULT_BATCH_BYTES, ParsedColumn
from ..stats import (
    BINS_PER_OCTAVE,
    STATS_NAME,
    STATS_VERSION,
    VOCAB_DTYPE,
    VOCAB_NAME,
    ColumnCounts,
    RepeatRuns,
    dense_vocab,
    hist_quantile,
    hist_to_pairs,
    length_histogram,
    merge_columns,
    pairs_to_hist,
    sparse_vocab,
)
from ..tokenizers import Tokenizer
from .incremental import open_parent
from .model import BuildPlan
from .staging import Staging

__all__ = ["collecting", "UnitCollector", "unit_stats_in_place", "write_stats", "TOP_IDS"]

log = logging.getLogger("shardflow.build")

TOP_IDS = 20
"""How many of the most frequent ids ``stats.json`` lists with their decoded text."""
SHORT_DOCUMENT = 3
"""A document of at most this many tokens (boundary tokens included) is counted as near-empty."""
LONG_DOCUMENT = 1 << 17
"""A document of at least this many tokens is counted as huge (a concatenated dump, a binary file)."""
MAX_COLUMN_VALUES = 1000
"""Values of ``--stats-column`` listed by name in ``stats.json`` (the rest are summed as ``(other)``)."""


def collecting(plan: BuildPlan | None = None) -> bool:
    """Whether the build of ``plan`` collects statistics (``BuildConfig.stats``).

    Without a plan: True, the default. A caller that does not pass its plan then
    counts a unit's tokens even when the build wants no statistics; nothing of them
    reaches the version, since what is written (``write_stats``, the stats-card
    stage) is decided from the plan.
    """
    return True if plan is None else plan.config.stats


def _unit_path(staging: Staging, unit: int) -> Path:
    return staging.unit_files(unit)[0].with_suffix(".stats.npz")


def unit_stats_in_place(staging: Staging, unit: int, plan: BuildPlan | None = None) -> bool:
    """Whether unit ``unit``'s statistics file is there (always true when ``plan`` collects none)."""
    return not collecting(plan) or _unit_path(staging, unit).exists()


class UnitCollector:
    """One unit's statistics while it is tokenized: token counts per id, runs of one repeated token,
    then counts per column value."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab = np.zeros(vocab_size, dtype=np.int64)
        self.runs = RepeatRuns()

    def add_tokens(self, tokens: np.ndarray, *, max_id: int) -> None:
        """Count ``tokens`` (their largest id is ``max_id``, which the caller already knows)."""
        if max_id >= len(self.vocab):  # an id beyond the vocabulary's size (a special token)
            self.vocab = np.concatenate([self.vocab, np.zeros(max_id + 1 - len(self.vocab), dtype=np.int64)])
        # Unbuffered in-place adds on the tokens' own dtype: about twice as fast as np.bincount,
        # which first copies the ids to int64 and scans them for their range.
        np.add.at(self.vocab, tokens, 1)
        # A batch ends at a document's end, and documents are separated by a boundary token that
        # never occurs inside one, so no run spans two batches or two documents.
        self.runs.add(tokens)

    def commit(self, staging: Staging, unit: int, *, column: str | None, inp: InputFile, wu: WorkUnit, docs: np.ndarray, batch_rows: int,
               batch_bytes: int = DEFAULT_BATCH_BYTES) -> None:
        """Write the unit's statistics file (before its marker)."""
        by_column = _column_counts(inp, wu, column, docs, batch_rows, batch_bytes) if column else {}
        buf = io.BytesIO()
        np.savez(buf, vocab=sparse_vocab(self.vocab),
                 column=np.frombuffer(json.dumps(by_column, sort_keys=True).encode("utf-8"), dtype=np.uint8),
                 runs=self.runs.to_array())
        atomic_write_bytes(_unit_path(staging, unit), buf.getvalue())


def _npy_bytes(rows: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, rows)
    return buf.getvalue()


def _column_counts(
    inp: InputFile, wu: WorkUnit, column: str, docs: np.ndarray, batch_rows: int, batch_bytes: int
) -> dict[str, list[int]]:
    """Documents and tokens per value of ``column`` in this unit (one more read of that one column)."""
    kind = input_kind(inp)
    pieces = []
    try:
        # The tokenize stage's budget: a document it read is read here too (a value over it is a null).
        for col in kind.iter_batches(inp, wu, text_column=column, batch_rows=batch_rows, batch_bytes=batch_bytes):
            values = col.values if isinstance(col, ParsedColumn) else col
            pieces.append(pc.cast(values, pa.string()) if not pa.types.is_string(values.type) else values)
    except InputError as exc:
        # The sources word their message for --text-column; this is the statistics column.
        raise InputError(
            str(exc).replace("Pick the text column with --text-column NAME", "Pick the column with --stats-column NAME")
            .replace("pick the text column with --text-column NAME", "pick the column with --stats-column NAME")
            .replace("pick the text field with --text-column NAME", "pick the field with --stats-column NAME")
            + " (the --stats-column)"
        ) from None
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputError(f"{inp.path}: column {column!r} (--stats-column) cannot be read as text ({exc}); pick another column") from None
    values = pa.chunked_array(pieces, type=pa.string()) if pieces else pa.chunked_array([], type=pa.string())
    values = pc.fill_null(values, "(null)")
    # first_row -1: a unit planned in bytes (sources/jsonl.py) numbers its rows from its own first line.
    rows = np.asarray(docs["row"], dtype=np.int64) - max(wu.first_row, 0)
    picked = values.take(pa.array(rows)).combine_chunks().dictionary_encode()
    index = np.asarray(picked.indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    names = picked.dictionary.to_pylist()
    lengths = np.asarray(docs["length"], dtype=np.int64)
    ndocs = np.bincount(index, minlength=len(names))
    ntoks = np.bincount(index, weights=lengths, minlength=len(names))
    return {names[k]: [int(ndocs[k]), int(ntoks[k])] for k in range(len(names)) if ndocs[k]}


def _unit_stats(staging: Staging, unit: int) -> tuple[np.ndarray, dict[str, list[int]], RepeatRuns]:
    path = _unit_path(staging, unit)
    if not path.exists():
        raise ConfigError(
            f"{staging.root}: work unit {unit} has no statistics file ({path.name}); "
            f"delete {staging.root} and build again, or build with --no-stats"
        )
    with NPY_LOCK, np.load(path) as z:  # each member's header is parsed as it is read
        runs = RepeatRuns.from_array(z["runs"]) if "runs" in z.files else RepeatRuns()
        return z["vocab"], json.loads(z["column"].tobytes().decode("utf-8")), runs


class _SplitLengths:
    """Document lengths of a split, by ranges of documents, from the layout's document starts.

    The starts file is mapped, not read: memory follows one input's documents, not the split's.
    """

    def __init__(self, staging: Staging, split: str, tokens: int) -> None:
        path = staging.starts(split)
        self.starts = np.memmap(path, dtype="<i8", mode="r") if path.stat().st_size else np.empty(0, dtype="<i8")
        self.tokens = tokens

    def __getitem__(self, docs: slice) -> np.ndarray:
        a, b = docs.start, min(docs.stop, len(self.starts))
        tail = np.array([self.tokens] if b == len(self.starts) else [], dtype=np.int64)
        ends = np.concatenate([np.asarray(self.starts[a + 1 : b + 1], dtype=np.int64), tail])
        return ends[: b - a] - np.asarray(self.starts[a:b], dtype=np.int64)


def _parent_stats(plan: BuildPlan) -> tuple[dict[str, Any], np.ndarray] | None:
    """The parent's statistics (for the inputs an incremental build reuses), checked against its manifest."""
    if plan.reuse is None:
        return None
    parent = open_parent(plan.reuse)
    section = parent.manifest.extra.get("stats")
    directory = parent.directory
    if not section:
        return None
    files = {e["file"]: e for e in section.get("files", [])}
    for name in (STATS_NAME, VOCAB_NAME):
        if name not in files or sha256_file(directory / name) != files[name]["sha256"]:
            raise parent.damaged(directory / name, "the statistics file does not match its SHA-256 in the manifest")
    return json.loads((directory / STATS_NAME).read_text()), load_npy(directory / VOCAB_NAME)


def _range_stats(lengths: np.ndarray) -> dict[str, Any]:
    hist = length_histogram(lengths)
    return {
        "documents": int(len(lengths)),
        "tokens": int(lengths.sum()),
        "short_documents": int(np.count_nonzero(lengths <= SHORT_DOCUMENT)),
        "long_documents": int(np.count_nonzero(lengths >= LONG_DOCUMENT)),
        "min_length": int(lengths.min()) if len(lengths) else 0,
        "max_length": int(lengths.max()) if len(lengths) else 0,
        "histogram": hist_to_pairs(hist),
    }


def _merge_ranges(parts: list[dict[str, Any]]) -> dict[str, Any]:
    hist = sum((pairs_to_hist(p["histogram"]) for p in parts), start=pairs_to_hist([]))
    nonempty = [p for p in parts if p["documents"]]
    docs = sum(p["documents"] for p in parts)
    tokens = sum(p["tokens"] for p in parts)
    top = max((p["max_length"] for p in nonempty), default=0)
    return {
        "documents": docs,
        "tokens": tokens,
        "short_documents": sum(p.get("short_documents", 0) for p in parts),
        "long_documents": sum(p.get("long_documents", 0) for p in parts),
        "min_length": min((p["min_length"] for p in nonempty), default=0),
        "max_length": top,
        "mean_length": round(tokens / docs, 3) if docs else 0.0,
        # A bin's upper edge bounds the quantile, and so does the longest document.
        "p50_at_most": min(hist_quantile(hist, 0.5), top),
        "p90_at_most": min(hist_quantile(hist, 0.9), top),
        "p99_at_most": min(hist_quantile(hist, 0.99), top),
        "histogram": hist_to_pairs(hist),
    }


def _odd(splits: dict[str, Any], inputs: list[dict[str, Any]], tokenizer: Tokenizer) -> dict[str, Any]:
    """What may have got in by mistake: near-empty and huge documents, long runs of one token."""
    runs = RepeatRuns()
    for inp in inputs:
        runs.merge(RepeatRuns.from_dict(inp.get("repeated_token_runs")))
    longest = runs.to_dict()
    if runs.longest:
        longest["token_text"] = _decoded(tokenizer, runs.token)
    return {
        "short_documents": {"at_most_tokens": SHORT_DOCUMENT, "documents": sum(s["short_documents"] for s in splits.values())},
        "long_documents": {"at_least_tokens": LONG_DOCUMENT, "documents": sum(s["long_documents"] for s in splits.values())},
        "repeated_token_runs": longest,
    }


def _decoded(tokenizer: Tokenizer, token_id: int) -> str:
    try:
        return tokenizer.decode_bytes([token_id]).decode("utf-8", errors="backslashreplace")
    except Exception:  # an id the tokenizer cannot decode alone (a special token of some families)
        text = tokenizer.token_text(token_id)
        return text if text is not None else f"<id {token_id}>"


def write_stats(
    plan: BuildPlan, manifest: Manifest, out: Path, tokenizer: Tokenizer, *, shard_tokens: dict[str, list[int]] | None = None
) -> dict[str, Any] | None:
    """Merge the units' statistics into ``out/stats.json`` and ``out/stats.vocab.npy``; the manifest's section.

    None (and nothing written) when the build collects no statistics. ``shard_tokens``: the tokens
    of each split's shards, when ``manifest`` has no shard entries yet (the layout
    fixes them: ``build/card_stage.py`` merges the statistics before the shards are written).
    """
    if not collecting(plan):
        return None
    staging = Staging(plan.staging)
    cfg = plan.config
    reused = plan.reuse.inputs if plan.reuse else {}
    parent = _parent_stats(plan) if reused else None
    parent_inputs = {e["relname"]: (n, e) for n, e in enumerate(parent[0]["inputs"])} if parent else {}
    complete = not reused or parent is not None
    if reused and parent is None:
        log.warning("the parent version has no statistics: the reused inputs' vocabulary and column counts are missing")
    split_lengths = {s: _SplitLengths(staging, s, e.tokens) for s, e in manifest.splits.items()}
    units_of: dict[int, list[int]] = {}
    for u, wu in enumerate(plan.units):
        units_of.setdefault(wu.input, []).append(u)
    vocab_size = tokenizer.vocab_size
    total_vocab = np.zeros(vocab_size, dtype=np.int64)
    vocab_rows = []
    inputs = []
    for i, inp in enumerate(plan.inputs):
        entry = manifest.inputs[i]
        splits = {}
        for s, rng in entry["splits"].items():
            a = int(rng["first_document"])
            splits[s] = _range_stats(split_lengths[s][a : a + int(rng["documents"])])
        if i in reused:
            found = parent_inputs.get(inp.relname)
            if found is not None and parent is not None:
                pn, pentry = found
                prow = parent[1][parent[1]["input"] == pn]
                counts = dense_vocab(prow, vocab_size)
                column = pentry.get("by_column", {})
                runs = RepeatRuns.from_dict(pentry.get("repeated_token_runs"))
            else:  # the parent has no statistics (or none of this input): its counts are unknown here
                counts, column, runs = np.zeros(vocab_size, dtype=np.int64), {}, RepeatRuns()
                complete = False
        else:
            counts = np.zeros(vocab_size, dtype=np.int64)
            col = ColumnCounts()
            runs = RepeatRuns()
            for u in units_of.get(i, []):
                rows, by_value, unit_runs = _unit_stats(staging, u)
                runs.merge(unit_runs)
                dense = dense_vocab(rows, vocab_size)
                if len(dense) > len(counts):
                    counts = np.concatenate([counts, np.zeros(len(dense) - len(counts), dtype=np.int64)])
                counts[: len(dense)] += dense
                col.merge(by_value)
            column = col.to_dict()
        if len(counts) > len(total_vocab):
            total_vocab = np.concatenate([total_vocab, np.zeros(len(counts) - len(total_vocab), dtype=np.int64)])
        total_vocab[: len(counts)] += counts
        vocab_rows.append(sparse_vocab(counts, i))
        item: dict[str, Any] = {
            "relname": inp.relname,
            "sha256": entry.get("sha256") or inp.sha256,  # an object's hash is its worker's (the manifest's)
            "documents": sum(r["documents"] for r in splits.values()),
            "tokens": sum(r["tokens"] for r in splits.values()),
            "splits": splits,
            "vocabulary_used": int(np.count_nonzero(counts)),
            "repeated_token_runs": runs.to_dict(),
        }
        if cfg.stats_column:
            item["by_column"] = column
        inputs.append(item)
    stats = _assemble(plan, manifest, inputs, total_vocab, tokenizer, complete=complete, shard_tokens=shard_tokens)
    vocab = np.concatenate(vocab_rows) if vocab_rows else np.empty(0, dtype=VOCAB_DTYPE)
    atomic_write_bytes(out / VOCAB_NAME, _npy_bytes(vocab))
    atomic_write_text(out / STATS_NAME, _dumps(stats))
    return {
        "files": [
            {"file": name, "bytes": (out / name).stat().st_size, "sha256": sha256_file(out / name)}
            for name in (STATS_NAME, VOCAB_NAME)
        ]
    }


def _dumps(stats: dict[str, Any]) -> str:
    """Indented JSON, with each ``[edge, count]`` pair (and list of numbers) on one line: readable, not 2,000 lines."""
    text = json.dumps(stats, indent=1, ensure_ascii=False)
    text = re.sub(r"\[\s+(-?\d+),\s+(-?\d+)\s+\]", r"[\1, \2]", text)
    text = re.sub(r"\[((?:\s+-?\d+,)*\s+-?\d+)\s+\]", lambda m: "[" + ", ".join(m.group(1).split()).replace(",,", ",") + "]", text)
    return text + "\n"


def _assemble(
    plan: BuildPlan,
    manifest: Manifest,
    inputs: list[dict[str, Any]],
    vocab: np.ndarray,
    tokenizer: Tokenizer,
    *,
    complete: bool,
    shard_tokens: dict[str, list[int]] | None = None,
) -> dict[str, Any]:
    cfg = plan.config
    totals = manifest.totals
    splits = {}
    for s, entry in manifest.splits.items():
        merged = _merge_ranges([inp["splits"][s] for inp in inputs if s in inp["splits"]])
        merged["shards"] = list(shard_tokens[s]) if shard_tokens is not None else [sh.tokens for sh in entry.shards]
        splits[s] = merged
    used = int(np.count_nonzero(vocab))
    order = np.lexsort((np.arange(len(vocab)), -vocab))[:TOP_IDS]
    total_tokens = int(vocab.sum())
    top = [
        {"id": int(k), "count": int(vocab[k]), "share": round(int(vocab[k]) / total_tokens, 6), "text": _decoded(tokenizer, int(k))}
        for k in order
        if vocab[k]
    ]
    stats: dict[str, Any] = {
        # Nothing here names the build (no name, no build key): the same data gives the same bytes.
        "stats_version": STATS_VERSION,
        "complete": complete,
        "length_unit": "tokens per document, boundary tokens included (the distance between .bos.idx entries)",
        "length_bins": {"per_octave": BINS_PER_OCTAVE, "lower_edge_of_bin_k": "isqrt(isqrt(2**k))"},
        "shard_tokens": cfg.shard_tokens,
        "totals": {"documents": totals["documents"], "tokens": totals["tokens"], "inputs": len(inputs)},
        "splits": splits,
        "documents_skipped": {
            "null_texts": totals.get("null_texts", 0),
            "empty_texts": totals.get("empty_texts", 0),
            "invalid_utf8": totals.get("skipped_invalid_utf8", 0),
            "bad_records": totals.get("bad_records", 0),
        },
        # Documents whose invalid UTF-8 was replaced by U+FFFD (utf8_errors="replace").
        "documents_replaced": totals.get("invalid_utf8", 0) - totals.get("skipped_invalid_utf8", 0),
        # shardflow never truncates a document (a token that does not fit the dtype is refused).
        "documents_truncated": 0,
        "odd": _odd(splits, inputs, tokenizer),
        "vocabulary": {
            "size": tokenizer.vocab_size,
            "used": used,
            "share_used": round(used / tokenizer.vocab_size, 6) if tokenizer.vocab_size else 0.0,
            "counts_file": VOCAB_NAME,
            "top": top,
        },
    }
    if cfg.stats_column:
        merged = merge_columns(inp.get("by_column", {}) for inp in inputs)
        ranked = sorted(merged.items(), key=lambda kv: (-kv[1][1], kv[0]))
        values = [{"value": v, "documents": d, "tokens": t} for v, (d, t) in ranked[:MAX_COLUMN_VALUES]]
        rest = ranked[MAX_COLUMN_VALUES:]
        if rest:
            values.append({"value": "(other)", "documents": sum(d for _, (d, _) in rest), "tokens": sum(t for _, (_, t) in rest)})
        stats["by_column"] = {"column": cfg.stats_column, "values": values, "distinct": len(merged)}
    stats["inputs"] = inputs
    return stats
