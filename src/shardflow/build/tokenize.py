"""Tokenizing one work unit into its part files: the tokens with boundaries inserted, and a document table.

Reads the unit's rows in batches of about ``batch_bytes`` of text (memory is
bounded by the batch, not the unit), encodes each batch with the fast
backend (one document per batch is re-encoded with the reference library, to
guard exactness on live data), inserts the plan's boundary tokens before (BOS)
and/or after (EOS) every document, and appends to ``parts/unit-N.tok``. As the tokens pass, the unit's statistics
are collected (``build/stats.py``: counts per token id, per ``--stats-column``
value) and written beside them. The unit's ``.json`` is written last: it is the
unit's commit point.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from .._io import WRITEBACK_MIN_BYTES, atomic_write_text, load_npy, remove_quietly, start_writeback, tmp_path_for
from ..config import BuildConfig
from ..errors import ConfigError, InputError
from ..faults import fault
from ..sources import InputFile, WorkUnit, iter_text_batches, split_scores
from ..sources.storage import current_identity, hash_input, hashing_reads
from ..tokenizers import Tokenizer, check_identity, load_tokenizer
from .model import Boundaries, BuildPlan, UnitResult
from .staging import DOC_DTYPE, Staging, as_plan
from .stats import UnitCollector, collecting, unit_stats_in_place

__all__ = ["tokenize_unit", "unit_done", "with_boundaries", "check_unchanged"]

log = logging.getLogger("shardflow.build")


def check_unchanged(inp: InputFile) -> None:
    """Refuse an object on object storage whose version is no longer the one planned (one HEAD request)."""
    if not inp.identity:
        return
    size, ident = current_identity(inp.path)
    if (size, ident) != (inp.size, inp.identity):
        raise InputError(
            f"{inp.path}: the object changed during the build (planned as {inp.identity}, {inp.size} bytes; "
            f"now {ident or 'unknown'}, {size} bytes); build again to include the new version"
        )


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
        and staging.unit_in_place(done, np.dtype(plan.dtype).itemsize)
        and unit_stats_in_place(staging, unit, plan)
    ):
        return done
    return None


def tokenize_unit(plan: BuildPlan | str | os.PathLike[str], unit: int) -> UnitResult:
    """Tokenize work unit ``unit`` into ``parts/``; a unit already done is not redone."""
    plan = as_plan(plan)
    staging = Staging(plan.staging)
    tok_path, docs_path, done_path = staging.unit_files(unit)
    done = unit_done(plan, unit)
    if done is not None:
        return done
    if done_path.exists():
        log.warning("unit %d: its recorded result has no token file of the right size; tokenizing it again", unit)
    done_path.unlink(missing_ok=True)
    wu = plan.units[unit]
    inp = plan.inputs[wu.input]
    tokenizer = load_tokenizer(plan.config.tokenizer, backend=plan.config.backend)
    if plan.boundaries is None:
        raise ConfigError(f"{plan.staging}: the plan records no boundary tokens; plan the build again (plan_build)")
    tmp_tok, tmp_docs = tmp_path_for(tok_path), tmp_path_for(docs_path)
    extra: dict[str, str] = {}
    collector = UnitCollector(tokenizer.vocab_size) if collecting(plan) else None
    try:
        check_unchanged(inp)
        with hashing_reads(inp.path) as read:
            counts = _tokenize_into(
                tmp_tok, tmp_docs, plan.config, wu, inp, tokenizer, np.dtype(plan.dtype), plan.boundaries,
                collect=collector,
            )
        if not inp.sha256 and wu.start == 0 and wu.first_row == 0:
            # Planned from the storage's identity only: this worker hashes the object for the manifest,
            # from the bytes it just read when it read them all in order (JSON Lines), else reading it again.
            extra["input_sha256"] = read.digest(inp.size) or hash_input(inp.path)
        check_unchanged(inp)  # what was read and hashed is the version that was planned
    except BaseException:
        # A failed unit (bad input, a full disk) leaves no temporary files behind.
        remove_quietly(tmp_tok)
        remove_quietly(tmp_docs)
        raise
    os.replace(tmp_tok, tok_path)
    os.replace(tmp_docs, docs_path)
    fault("tokenize-tokens", tok_path)
    if collector is not None:
        collector.commit(
            staging, unit, column=plan.config.stats_column, inp=inp, wu=wu, docs=load_npy(docs_path),
            batch_rows=_rows_per_batch(plan.config, wu), batch_bytes=plan.config.batch_bytes,
        )
    result = UnitResult(unit=unit, **counts, **extra)
    atomic_write_text(done_path, json.dumps(result.to_dict()))  # the unit's commit point
    log.info("tokenized unit %d of %s: %d documents, %d tokens", unit, inp.relname, result.documents, result.tokens)
    fault("tokenize-done", done_path)
    return result


def _tokenize_into(
    tmp_tok: Path,
    tmp_docs: Path,
    cfg: BuildConfig,
    wu: WorkUnit,
    inp: InputFile,
    tokenizer: Tokenizer,
    dtype: np.dtype,
    boundaries: Boundaries,
    *,
    collect: UnitCollector | None = None,
) -> dict[str, int]:
    """Tokenize one unit into its temporary token file and document table; returns its counts."""
    limit = np.iinfo(dtype).max
    counts = dict(rows=0, documents=0, tokens=0, nulls=0, empties=0, invalid_utf8=0, skipped_invalid=0, max_id=0, bad_records=0)
    doc_chunks: list[np.ndarray] = []
    written = sent = 0  # bytes written to the token file; handed to the writeback so far
    with open(tmp_tok, "wb") as out:
        for batch in iter_text_batches(
            inp, wu, text_column=cfg.text_column, batch_rows=_rows_per_batch(cfg, wu), utf8_errors=cfg.utf8_errors,
            on_bad_record=cfg.on_bad_record, batch_bytes=cfg.batch_bytes,
        ):
            counts["rows"] += len(batch.rows) + batch.nulls + batch.empties + batch.skipped_invalid + batch.bad_records
            counts["bad_records"] += batch.bad_records
            counts["nulls"] += batch.nulls
            counts["empties"] += batch.empties
            counts["invalid_utf8"] += batch.invalid_utf8
            counts["skipped_invalid"] += batch.skipped_invalid
            if len(batch.rows) == 0:
                continue
            # One reference encoding per batch guards the fast backend's exactness on live data.
            check_identity(tokenizer, [batch.texts[0].as_py()], where=f"{inp.path} row {int(batch.rows[0])}")
            tokens, offsets = tokenizer.encode_batch(batch.texts)
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
            out.write(tokens_out.data)
            written += tokens_out.nbytes
            if written - sent >= WRITEBACK_MIN_BYTES:  # the fsync below then waits for less
                out.flush()
                start_writeback(out.fileno(), sent, written - sent)
                sent = written
            if collect is not None:
                collect.add_tokens(tokens_out, max_id=max(counts["max_id"], *boundaries.ids))
            docs = np.empty(len(batch.rows), dtype=DOC_DTYPE)
            docs["length"] = np.diff(offsets) + boundaries.per_document
            docs["row"] = batch.rows
            docs["score"] = split_scores(inp.relname, batch.rows, cfg.seed)
            doc_chunks.append(docs)
            counts["documents"] += len(docs)
            counts["tokens"] += len(tokens_out)
            fault("tokenize-batch", tmp_tok)
        out.flush()
        os.fsync(out.fileno())
    counts["max_id"] = max(counts["max_id"], *boundaries.ids) if counts["documents"] else counts["max_id"]
    docs_all = np.concatenate(doc_chunks) if doc_chunks else np.empty(0, dtype=DOC_DTYPE)
    with open(tmp_docs, "wb") as f:
        np.save(f, docs_all)
        f.flush()
        os.fsync(f.fileno())
    return counts


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
