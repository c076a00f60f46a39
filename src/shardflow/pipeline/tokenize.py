"""Tokenizing one work unit into its final shard files (pieces), and a document table.

Reads the unit's rows in batches of about ``batch_bytes`` of text (memory is
bounded by the batch, not the unit), encodes each batch with the fast
backend (one document per batch, the longest within ``live_check.CHECK_BYTES``,
is encoded again by the reference library and compared with the ids written, to
guard exactness on live data), inserts the plan's boundary tokens before (BOS)
and/or after (EOS) every document, routes each document to its split
(``val_fraction`` decides from the document alone; ``val_count`` only after
every unit, so those go to one stream, ``all``) and appends it to that
stream's current piece, ``parts/unit-N/STREAM-P.EXT``: a shard in the
version's format, at most ``shard_tokens`` tokens of whole documents, hashed
as it is written, with its ``.bos.idx``. The layout links pieces into the
version as they are. As the tokens pass, the unit's statistics
are collected (``pipeline/collect_stats.py``: counts per token id, per ``--stats-column``
value) and written beside them. The unit's ``.json`` is written last: it is the
unit's commit point.

An input that planning did not hash (an object on object storage, planned by
its storage identity; a local file, by its stat: ``pipeline/plan.py``) is
hashed by the job of its first unit, from the bytes it reads
(``sources/hashing.py``), between two checks that the input is still the one
planned (``check_unchanged``); the hash goes in the unit's result
(``UnitResult.input_sha256``, which the manifest's key takes) and, for a local
file, in the fingerprint cache, so the next build knows it without a read.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from .._io import atomic_write_text, load_npy, remove_quietly, tmp_path_for
from ..config import BuildConfig
from ..errors import ConfigError, InputError
from ..faults import fault
from ..formats import get_format
from ..formats.unit_writer import UnitShardWriter
from ..overlap import ahead
from ..sources import InputFile, TextBatch, WorkUnit, input_kind, iter_text_batches, split_scores
from ..sources.cuts import cut_in_bytes
from ..sources.fingerprint import local_stat, record_fingerprints
from ..sources.hashing import finish_hash
from ..sources.storage import current_identity, hash_input, hashing_reads
from ..tokenizers import Tokenizer, check_batch, load_tokenizer
from .check import shard_checks
from .model import BuildPlan, Piece, UnitResult
from .staging import DOC_DTYPE, Staging, as_plan
from .collect_stats import UnitCollector, collecting, unit_stats_in_place

__all__ = ["tokenize_unit", "unit_done", "with_boundaries", "check_unchanged", "val_by_fraction", "streams_of", "split_decided_late"]

log = logging.getLogger("shardflow.pipeline")


def check_unchanged(inp: InputFile) -> None:
    """Refuse an input that is no longer the one planned: a local file whose size or mtime changed since planning
    hashed it, or took its stat to leave it to this job to hash (not its ctime or inode, which differ between the
    machines of a cluster on some network filesystems), an object whose storage identity did (one HEAD request)."""
    if inp.stat:
        try:
            now = local_stat(inp.path)
        except FileNotFoundError:
            now = "gone"
        if now.split(":")[:2] != inp.stat.split(":")[:2]:
            raise InputError(
                f"{inp.path}: the file changed during the build ({_size_and_mtime(inp.stat)} when it was hashed, now "
                f"{_size_and_mtime(now)}); build again to include the new version"
            )
    if not inp.identity:
        return
    size, ident = current_identity(inp.path, like=inp.identity)
    if (size, ident) != (inp.size, inp.identity):
        raise InputError(
            f"{inp.path}: the object changed during the build (planned as {inp.identity}, {inp.size} bytes; "
            f"now {ident or 'unknown'}, {size} bytes); build again to include the new version"
        )


def _size_and_mtime(stat: str) -> str:
    """``local_stat``'s first two fields in words (or ``gone``)."""
    return "{} bytes, mtime {} ns".format(*stat.split(":")[:2]) if ":" in stat else stat


def _rows_per_batch(cfg: BuildConfig, unit: WorkUnit) -> int:
    """Rows per batch so that a batch holds about ``batch_bytes`` of text (at most ``batch_rows``)."""
    if unit.rows <= 0 or unit.text_bytes <= 0:  # (-1: rows not counted while planning)
        return cfg.batch_rows
    return max(1, min(cfg.batch_rows, cfg.batch_bytes * unit.rows // unit.text_bytes))


def unit_done(plan: BuildPlan | str | os.PathLike[str], unit: int) -> UnitResult | None:
    """Unit ``unit``'s recorded result when it is committed with its files in place, else None (a few stats)."""
    plan = as_plan(plan)
    staging = Staging(plan.staging)
    done = staging.unit_result(unit)
    if (
        done is not None
        and staging.unit_in_place(done, get_format(plan.config.format).extension)
        and unit_stats_in_place(staging, unit, plan)
    ):
        return done
    return None


def val_by_fraction(scores: np.ndarray, fraction: float) -> np.ndarray:
    """Which documents ``val_fraction`` holds out: ``score / 2**64 < fraction``, computed exactly on integers."""
    return np.asarray(scores) < np.uint64(min(int(fraction * 2.0**64), 2**64 - 1))


def split_decided_late(plan: BuildPlan) -> bool:
    """Whether documents are routed to their splits by the layout, after tokenizing, not by the tokenize job.

    ``val_count`` selects over the whole corpus. And a document's split score
    depends on its row in its input, which a unit cut blind in bytes (a JSON
    Lines object on object storage, ``first_row`` -1) learns only from the
    units before it. Such builds tokenize into one stream, ``all``, and gather
    every split from it: their tokens are written twice (a JSON Lines file
    smaller than a unit is one unit, and is not concerned).
    """
    cfg = plan.config
    if cfg.val_count:
        return True
    # An incremental build decides as a full build of its inputs would, the reused ones included.
    return cfg.has_val and (bool(cut_in_bytes(plan.inputs, plan.units)) or (plan.reuse is not None and plan.reuse.split_late))


def streams_of(plan: BuildPlan) -> tuple[str, ...]:
    """The streams a tokenize job writes documents to (``model.STREAMS``)."""
    if split_decided_late(plan):
        return ("all",)
    return ("train", "val") if plan.config.has_val else ("train",)


def tokenize_unit(plan: BuildPlan | str | os.PathLike[str], unit: int) -> UnitResult:
    """Tokenize work unit ``unit`` into its pieces under ``parts/``; a unit already done is not redone."""
    plan = as_plan(plan)
    staging = Staging(plan.staging)
    unit_dir, docs_path, done_path = staging.unit_files(unit)
    done = unit_done(plan, unit)
    if done is not None:
        return done
    if done_path.exists():
        log.warning("unit %d: its recorded result has no pieces of the right size; tokenizing it again", unit)
    done_path.unlink(missing_ok=True)
    shutil.rmtree(unit_dir, ignore_errors=True)  # pieces of an interrupted run: written again, in full
    wu = plan.units[unit]
    inp = plan.inputs[wu.input]
    tokenizer = load_tokenizer(plan.config.tokenizer, backend=plan.config.backend)
    if plan.boundaries is None:
        raise ConfigError(f"{plan.staging}: the plan records no boundary tokens; plan the build again (plan_build)")
    tmp_docs = tmp_path_for(docs_path)
    extra: dict[str, Any] = {}
    collector = UnitCollector(tokenizer.vocab_size) if collecting(plan) else None
    # Planned unhashed (an object by its storage identity, a local file by its stat): the job of its first unit
    # hashes it for the manifest (and, a local file, for the fingerprint cache), from the bytes it reads.
    hashes = not inp.sha256 and wu.start == 0 and wu.first_row == 0
    local = hashes and not inp.identity
    try:
        check_unchanged(inp)
        before = local_stat(inp.path) if local else ""
        with hashing_reads(inp.path) if hashes else contextlib.nullcontext() as read:
            counts, pieces = _tokenize_into(plan, staging, unit, tmp_docs, tokenizer, collect=collector)
        if local:
            extra["input_sha256"] = finish_hash(read, inp.path, inp.size, mapped=input_kind(inp).mapped)
        elif hashes:
            # An object: from the bytes just read when they were all read in order (JSON Lines), else read again.
            extra["input_sha256"] = read.digest(inp.size) or hash_input(inp.path)
        check_unchanged(inp)  # what was read and hashed is the version that was planned
    except BaseException:
        # A failed unit (bad input, a full disk) leaves no files behind.
        remove_quietly(tmp_docs)
        shutil.rmtree(unit_dir, ignore_errors=True)
        raise
    if local and local_stat(inp.path) == before:  # the next build knows these bytes without reading them
        record_fingerprints(Path(plan.data_root) / plan.config.name, {inp.path: (before, extra["input_sha256"])})
    os.replace(tmp_docs, docs_path)
    fault("tokenize-tokens", docs_path)
    if collector is not None:
        docs = load_npy(docs_path)
        collector.commit(
            staging, unit, column=plan.config.stats_column, inp=inp, wu=wu, docs=docs,
            batch_rows=_rows_per_batch(plan.config, wu), batch_bytes=plan.config.batch_bytes,
            # Each document's split as its pieces were routed (val_fraction 0: none is val); where the
            # layout decides it (split_decided_late), the unit cannot say.
            val=None if split_decided_late(plan) else val_by_fraction(docs["score"], plan.config.val_fraction),
        )
    result = UnitResult(unit=unit, **counts, **extra, pieces=pieces)
    atomic_write_text(done_path, json.dumps(result.to_dict()))  # the unit's commit point
    log.info("tokenized unit %d of %s: %d documents, %d tokens", unit, inp.relname, result.documents, result.tokens)
    fault("tokenize-done", done_path)
    return result


class _Pieces:
    """A unit's documents, each to its stream's ``UnitShardWriter`` (opened at its first document)."""

    def __init__(self, plan: BuildPlan, staging: Staging, unit: int, dtype: np.dtype) -> None:
        self.fmt = get_format(plan.config.format)
        self.plan, self.staging, self.unit, self.dtype = plan, staging, unit, dtype
        self.writers: dict[str, UnitShardWriter] = {}
        self.stack = contextlib.ExitStack()
        self.check = shard_checks(plan)  # each piece checked as it is written, so that none is read back (check.py)

    def write(self, stream: str, tokens: np.ndarray, lengths: np.ndarray) -> None:
        writer = self.writers.get(stream)
        if writer is None:
            ext = self.fmt.extension
            writer = UnitShardWriter(
                self.fmt, lambda p: self.staging.piece(self.unit, stream, p, ext), self.dtype, self.plan.config.shard_tokens,
                check=self.check,
            )
            self.writers[stream] = self.stack.enter_context(writer)
        writer.write(tokens, lengths)

    def close(self) -> dict[str, tuple[Piece, ...]]:
        out = {}
        for stream, writer in self.writers.items():
            out[stream] = tuple(
                Piece(
                    tokens=s.tokens, documents=s.documents, bytes=s.bytes, sha256=s.sha256,
                    index_bytes=s.index_bytes, index_sha256=s.index_sha256,
                    sidecars=tuple((name[len(s.path.stem):], n, sha) for name, n, sha in s.sidecars), files=s.files,
                )
                for s in writer.close()
            )
        self.stack.close()
        return out


def _tokenize_into(
    plan: BuildPlan,
    staging: Staging,
    unit: int,
    tmp_docs: Path,
    tokenizer: Tokenizer,
    *,
    collect: UnitCollector | None = None,
) -> tuple[dict[str, int], dict[str, tuple[Piece, ...]]]:
    """Tokenize one unit into its pieces and temporary document table; returns its counts and pieces."""
    cfg, wu = plan.config, plan.units[unit]
    inp = plan.inputs[wu.input]
    dtype = np.dtype(plan.dtype)
    boundaries = plan.boundaries
    assert boundaries is not None
    limit = np.iinfo(dtype).max
    counts = dict(rows=0, documents=0, tokens=0, nulls=0, empties=0, invalid_utf8=0, skipped_invalid=0, max_id=0, bad_records=0)
    doc_chunks: list[np.ndarray] = []
    routes = streams_of(plan)
    stream = routes[0] if len(routes) == 1 else None  # else each document by its score (val_fraction)
    pieces = _Pieces(plan, staging, unit, dtype)
    with pieces.stack:
        # Three threads a job (overlap.py): batch k+2 read, k+1 encoded, k checked and written. Two batches
        # more per job; on one file, the stage takes 0.88 of the time (docs/PERFORMANCE.md).
        batches = ahead(iter_text_batches(
            inp, wu, text_column=cfg.text_column, batch_rows=_rows_per_batch(cfg, wu), utf8_errors=cfg.utf8_errors,
            on_bad_record=cfg.on_bad_record, batch_bytes=cfg.batch_bytes,
        ))
        tokenizer.warm()  # the encoder's one-time set-up, once per process, while the first batch is read
        for batch, encoded in ahead(_encoded(batches, tokenizer)):
            counts["rows"] += len(batch.rows) + batch.nulls + batch.empties + batch.skipped_invalid + batch.bad_records
            counts["bad_records"] += batch.bad_records
            counts["nulls"] += batch.nulls
            counts["empties"] += batch.empties
            counts["invalid_utf8"] += batch.invalid_utf8
            counts["skipped_invalid"] += batch.skipped_invalid
            if len(batch.rows) == 0:
                continue
            tokens, offsets = encoded
            # One reference encoding per batch guards the fast backend's exactness on live data.
            check_batch(tokenizer, batch.texts, tokens, offsets, where=lambda i: f"{inp.path} row {int(batch.rows[i])}")
            if len(tokens):
                top = int(tokens.max())
                if top > limit:
                    bad = int(np.searchsorted(offsets, int(np.argmax(tokens)), side="right")) - 1
                    raise InputError(
                        f"{inp.path} row {int(batch.rows[bad])}: token id {top} does not fit {dtype.name}; "
                        "refusing to truncate it (this tokenizer needs uint32 shards)"
                    )
                counts["max_id"] = max(counts["max_id"], top)
            tokens_out = with_boundaries(tokens, offsets, dtype, bos=boundaries.bos_id, eos=boundaries.eos_id)
            if collect is not None:
                collect.add_tokens(tokens_out, max_id=max(counts["max_id"], *boundaries.ids))
            docs = np.empty(len(batch.rows), dtype=DOC_DTYPE)
            docs["length"] = np.diff(offsets) + boundaries.per_document
            docs["row"] = batch.rows
            docs["score"] = split_scores(inp.relname, batch.rows, cfg.seed)
            if stream is not None:
                pieces.write(stream, tokens_out, docs["length"])
            else:  # val_fraction: each document to its split, decided here from its score alone
                val = val_by_fraction(docs["score"], cfg.val_fraction)
                per_token = np.repeat(val, docs["length"])
                for name, mask, tok_mask in (("train", ~val, ~per_token), ("val", val, per_token)):
                    if mask.any():
                        pieces.write(name, tokens_out[tok_mask], docs["length"][mask])
            doc_chunks.append(docs)
            counts["documents"] += len(docs)
            counts["tokens"] += len(tokens_out)
            fault("tokenize-batch", staging.unit_files(unit)[0])
        written = pieces.close()
    counts["max_id"] = max(counts["max_id"], *boundaries.ids) if counts["documents"] else counts["max_id"]
    docs_all = np.concatenate(doc_chunks) if doc_chunks else np.empty(0, dtype=DOC_DTYPE)
    with open(tmp_docs, "wb") as f:
        np.save(f, docs_all)
        f.flush()
        os.fsync(f.fileno())
    return counts, written


def _encoded(batches: Generator[TextBatch, None, None], tokenizer: Tokenizer) -> Iterator[tuple[TextBatch, tuple[np.ndarray, np.ndarray] | None]]:
    """Each batch with its ``(tokens, offsets)`` (None for a batch of no document).

    Closes ``batches`` when it ends, early or not: the reading thread stops and the input is closed before the
    encoding thread ends, which the job waits for (``ahead``).
    """
    with contextlib.closing(batches):
        for batch in batches:
            yield batch, tokenizer.encode_batch(batch.texts) if len(batch.rows) else None


def with_boundaries(
    tokens: np.ndarray, offsets: np.ndarray, dtype: np.dtype, *, bos: int | None = None, eos: int | None = None
) -> np.ndarray:
    """The documents' tokens with ``bos`` before and/or ``eos`` after each one (None: not placed).

    Same result as ``np.insert`` of ``bos`` at ``offsets[:-1]`` and ``eos`` at
    ``offsets[1:]``, about twice as fast: one scatter per boundary kind and one
    masked copy of the tokens.
    """
    ndocs = len(offsets) - 1
    per_doc = (bos is not None) + (eos is not None)
    if per_doc == 0:
        raise ValueError("with_boundaries needs bos, eos or both")
    out = np.empty(len(tokens) + per_doc * ndocs, dtype=dtype)
    is_token = np.ones(len(out), dtype=bool)
    # Before document i's tokens come per_doc boundaries for each earlier document
    # (and its own BOS): its BOS lands at offsets[i] + per_doc*i, its EOS right after its last token.
    shift = np.arange(ndocs, dtype=np.int64) * per_doc
    if bos is not None:
        where = offsets[:-1] + shift
        is_token[where] = False
        out[where] = bos
    if eos is not None:
        where = offsets[1:] + shift + (per_doc - 1)
        is_token[where] = False
        out[where] = eos
    out[is_token] = tokens
    return out
