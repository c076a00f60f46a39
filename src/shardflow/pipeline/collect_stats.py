"""Collecting a build's statistics: per unit while it is tokenized, merged into ``stats.json`` after the layout.

``tokenize_unit`` leaves ``parts/unit-N.stats.npz`` before the unit's marker (one file: each file
written costs an fsync), as the tokens pass, with no extra pass over them; ``write_stats`` adds the
units up per input, exactly, and writes ``stats.vocab.npy`` input by input (``VocabFileWriter``:
the header last, the bytes ``np.save`` gives), so the flow's machine holds O(vocabulary), never
every input's rows (at 10 TB, 11 k objects x up to 100 k ids) and never a document. The files,
the ``lengths`` of a ``val_count`` split, and a reused input's statistics: docs/FORMAT.md
("Statistics"). Nothing here depends on the number of workers.

``BuildConfig.stats`` False (``--no-stats``, the benchmark's baseline) turns
collection off: the version then has no ``stats.json`` and its manifest no
``stats`` section.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
from bisect import bisect_left, bisect_right
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._io import NPY_LOCK, atomic_write_bytes, atomic_write_text, fsync_dir, load_npy, remove_quietly, sha256_file, tmp_path_for
from ..errors import ConfigError, InputError
from ..faults import fault
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
    merge_columns,
    sparse_vocab,
)
from ..tokenizers import Tokenizer
from .doc_lengths import LONG_DOCUMENT, SHORT_DOCUMENT, InputLengths, merge_ranges, parent_ranges, range_stats, sum_ranges
from .incremental import open_parent
from .model import BuildPlan
from .staging import Staging

__all__ = ["collecting", "UnitCollector", "unit_stats_in_place", "write_stats", "VocabFileWriter", "TOP_IDS"]

log = logging.getLogger("shardflow.pipeline")

TOP_IDS = 20
"""How many of the most frequent ids ``stats.json`` lists with their decoded text."""
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
               batch_bytes: int = DEFAULT_BATCH_BYTES, val: np.ndarray | None = None) -> None:
        """Write the unit's statistics file (before its marker).

        ``val``: which of ``docs`` went to the val split (all False without one), as the unit's
        pieces were routed; None when their split is decided only after every unit (``val_count``):
        the unit then records no length statistics per split.
        """
        by_column = _column_counts(inp, wu, column, docs, batch_rows, batch_bytes) if column else {}
        lengths: dict[str, dict[str, Any]] = {}
        if val is not None:
            all_lengths = np.asarray(docs["length"], dtype=np.int64)
            val = np.asarray(val, dtype=bool)
            lengths = {"train": range_stats(all_lengths[~val]), "val": range_stats(all_lengths[val])}
        buf = io.BytesIO()
        np.savez(buf, vocab=sparse_vocab(self.vocab),
                 column=np.frombuffer(json.dumps(by_column, sort_keys=True).encode("utf-8"), dtype=np.uint8),
                 runs=self.runs.to_array(),
                 lengths=np.frombuffer(json.dumps(lengths).encode("utf-8"), dtype=np.uint8))
        atomic_write_bytes(_unit_path(staging, unit), buf.getvalue())


def _vocab_header(nrows: int) -> bytes:
    """The ``.npy`` header ``np.save`` writes for ``nrows`` ``VOCAB_DTYPE`` rows (format 1.0, C order)."""
    buf = io.BytesIO()
    np.lib.format.write_array_header_1_0(
        buf, {"descr": np.lib.format.dtype_to_descr(VOCAB_DTYPE), "fortran_order": False, "shape": (nrows,)}
    )
    return buf.getvalue()


class VocabFileWriter:
    """``stats.vocab.npy`` written input by input, never held whole: rows appended, the header written last.

    The row count is known only after the last input, so the header's bytes
    are reserved first and filled at ``commit``. numpy (1.26 and later, as
    required) pads a header to leave room for 21 digits of the shape, so its
    length is the same for every row count below 2**63: the file is byte for
    byte what ``np.save`` writes for the concatenated rows. Then it is synced,
    hashed (read back: SHA-256 cannot prepend a header to a body already
    hashed) and renamed into place. Memory: the caller's rows of one input.
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.tmp = tmp_path_for(self.path)
        self.rows = 0
        self._reserved = len(_vocab_header(0))
        self._file = open(self.tmp, "wb")
        self._file.write(bytes(self._reserved))  # the header's place, filled at commit

    def append(self, rows: np.ndarray) -> None:
        """Write ``rows`` (``VOCAB_DTYPE``; the caller keeps them sorted by (input, id))."""
        self._file.write(np.ascontiguousarray(rows, dtype=VOCAB_DTYPE).tobytes())
        self.rows += len(rows)

    def commit(self) -> dict[str, Any]:
        """Write the header, sync, hash, rename; the manifest's ``stats.files`` entry of the file."""
        header = _vocab_header(self.rows)
        if len(header) != self._reserved:  # not with numpy >= 1.26, whose header length is fixed
            raise ConfigError(
                f"{self.path}: numpy writes a {len(header)}-byte .npy header for {self.rows} rows, not the "
                f"{self._reserved} bytes reserved; upgrade numpy (shardflow needs numpy>=1.26)"
            )
        self._file.seek(0)
        self._file.write(header)
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        entry = {"file": self.path.name, "bytes": self.tmp.stat().st_size, "sha256": sha256_file(self.tmp)}
        fault("atomic-write", self.path)  # the fault point of every other atomic write
        os.replace(self.tmp, self.path)
        fsync_dir(self.path.parent)
        return entry

    def abort(self) -> None:
        """Close and delete the temporary file (a failed build leaves no partial statistics behind)."""
        self._file.close()
        remove_quietly(self.tmp)

    def __enter__(self) -> VocabFileWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is not None:
            self.abort()


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


def _unit_stats(
    staging: Staging, unit: int
) -> tuple[np.ndarray, dict[str, list[int]], RepeatRuns, dict[str, dict[str, Any]]]:
    """A unit's token counts, column counts, runs, and length statistics per split (those it knew)."""
    path = _unit_path(staging, unit)
    if not path.exists():
        raise ConfigError(
            f"{staging.root}: work unit {unit} has no statistics file ({path.name}); "
            f"delete {staging.root} and build again, or build with --no-stats"
        )
    with NPY_LOCK, np.load(path) as z:  # each member's header is parsed as it is read
        runs = RepeatRuns.from_array(z["runs"]) if "runs" in z.files else RepeatRuns()
        lengths = json.loads(z["lengths"].tobytes().decode("utf-8")) if "lengths" in z.files else {}
        return z["vocab"], json.loads(z["column"].tobytes().decode("utf-8")), runs, lengths


def _parent_stats(plan: BuildPlan) -> tuple[dict[str, Any], np.ndarray] | None:
    """The parent's statistics (for the inputs an incremental build reuses), checked against its manifest.

    Its ``stats.vocab.npy`` is memory-mapped, not loaded: the parent's rows of every input are
    O(inputs x vocabulary), and only the reused inputs' rows are read (``_parent_rows``).
    """
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
    return json.loads((directory / STATS_NAME).read_text()), load_npy(directory / VOCAB_NAME, mmap_mode="r")


def _parent_rows(vocab: np.ndarray, input_index: int) -> np.ndarray:
    """The rows of the parent's input ``input_index`` (rows sorted by input, then id).

    A binary search over the memory-mapped column: O(log rows) rows read, where a boolean mask
    would read the whole file once per reused input. (np.searchsorted would first copy the
    strided column whole.)
    """
    column = vocab["input"]
    lo = bisect_left(column, input_index)
    hi = bisect_right(column, input_index, lo)
    return np.asarray(vocab[lo:hi])


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
    fixes them: ``pipeline/card_stage.py`` merges the statistics before the shards are written).
    """
    if not collecting(plan):
        return None
    staging = Staging(plan.staging)
    cfg = plan.config
    reused = plan.reuse.inputs if plan.reuse else {}
    parent = _parent_stats(plan) if reused else None
    parent_inputs = {e["relname"]: (n, e) for n, e in enumerate(parent[0]["inputs"])} if parent else {}
    # A parent's own gaps (it reused a version without statistics) are this version's too.
    complete = not reused or (parent is not None and parent[0].get("complete", True))
    if reused and not complete:
        log.warning("the parent version has %s statistics: the reused inputs' vocabulary and column counts are "
                    "missing", "incomplete" if parent is not None else "no")
    lengths = InputLengths(plan, staging, manifest)
    units_of: dict[int, list[int]] = {}
    for u, wu in enumerate(plan.units):
        units_of.setdefault(wu.input, []).append(u)
    vocab_size = tokenizer.vocab_size
    total_vocab = np.zeros(vocab_size, dtype=np.int64)
    inputs = []
    # Each input's rows go to the file as they are merged: memory is O(vocabulary), not O(inputs x vocabulary).
    with VocabFileWriter(out / VOCAB_NAME) as vocab_file:
        for i, inp in enumerate(plan.inputs):
            entry = manifest.inputs[i]
            known: dict[str, dict[str, Any]] = {}  # this input's length statistics per split, as its units or parent said
            if i in reused:
                found = parent_inputs.get(inp.relname)
                if found is not None and parent is not None:
                    pn, pentry = found
                    counts = dense_vocab(_parent_rows(parent[1], pn), vocab_size)
                    column = pentry.get("by_column", {})
                    runs = RepeatRuns.from_dict(pentry.get("repeated_token_runs"))
                    known = parent_ranges(parent[0], pentry, entry)
                else:  # the parent has no statistics (or none of this input): its counts are unknown here
                    counts, column, runs = np.zeros(vocab_size, dtype=np.int64), {}, RepeatRuns()
                    complete = False
            else:
                counts = np.zeros(vocab_size, dtype=np.int64)
                col = ColumnCounts()
                runs = RepeatRuns()
                unit_ranges = []
                for u in units_of.get(i, []):
                    rows, by_value, unit_runs, unit_lengths = _unit_stats(staging, u)
                    runs.merge(unit_runs)
                    dense = dense_vocab(rows, vocab_size)
                    if len(dense) > len(counts):
                        counts = np.concatenate([counts, np.zeros(len(dense) - len(counts), dtype=np.int64)])
                    counts[: len(dense)] += dense
                    col.merge(by_value)
                    unit_ranges.append(unit_lengths)
                column = col.to_dict()
                known = {s: sum_ranges([r[s] for r in unit_ranges]) for s in entry["splits"] if all(s in r for r in unit_ranges)}
                for s, got in known.items():
                    rng = entry["splits"][s]
                    if (got["documents"], got["tokens"]) != (int(rng["documents"]), int(rng["tokens"])):
                        raise ConfigError(
                            f"{staging.root}: the units of {inp.relname} count {got['documents']} documents and "
                            f"{got['tokens']} tokens of split {s!r} in their statistics files, the layout "
                            f"{rng['documents']} and {rng['tokens']}; delete {staging.root} and build again"
                        )
            splits = {s: known[s] if s in known else range_stats(lengths.of_input(i, s, rng)) for s, rng in entry["splits"].items()}
            if len(counts) > len(total_vocab):
                total_vocab = np.concatenate([total_vocab, np.zeros(len(counts) - len(total_vocab), dtype=np.int64)])
            total_vocab[: len(counts)] += counts
            vocab_file.append(sparse_vocab(counts, i))
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
        vocab_entry = vocab_file.commit()
    stats = _assemble(plan, manifest, inputs, total_vocab, tokenizer, complete=complete, shard_tokens=shard_tokens)
    atomic_write_text(out / STATS_NAME, _dumps(stats))
    stats_entry = {"file": STATS_NAME, "bytes": (out / STATS_NAME).stat().st_size, "sha256": sha256_file(out / STATS_NAME)}
    return {"files": [stats_entry, vocab_entry]}


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
        merged = merge_ranges([inp["splits"][s] for inp in inputs if s in inp["splits"]])
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
