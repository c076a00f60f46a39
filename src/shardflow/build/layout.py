"""The shard layout: route every document to its split, and cut each split's token stream into shards.

Input: the tokenized units (``parts/``) and, in an incremental build, the
parent version's ranges of the reused inputs. Output, under ``layout/``: per
split, a list of segments (where its tokens come from, in order) and the
document starts; ``layout.json`` (split sizes and shard counts) last, as the
commit point. Both lists are streamed, so memory does not grow with the corpus.
The layout only reads: a unit that is not tokenized is an error, never tokenized here.
"""

from __future__ import annotations

import json
import logging
import os
from typing import BinaryIO

import numpy as np

from .._io import atomic_write_text, remove_quietly, tmp_path_for
from ..config import BuildConfig
from ..errors import ConfigError, InputError, ValidationError
from ..faults import fault
from ..targets import get_target
from .incremental import NO_REUSE_ENV, open_parent
from .model import SPLITS, BuildPlan, Layout, SplitLayout, SplitRange, UnitResult
from .staging import SEGMENT_DTYPE, Staging, as_plan

__all__ = ["make_layout", "read_layout", "unit_results"]

log = logging.getLogger("shardflow.build")


def unit_results(plan: BuildPlan) -> list[UnitResult]:
    """Every unit's recorded result; raises naming the first unit that is not tokenized."""
    staging = Staging(plan.staging)
    itemsize = np.dtype(plan.dtype).itemsize
    results = []
    for u in range(len(plan.units)):
        result = staging.unit_result(u)
        if result is None or not staging.unit_in_place(result, itemsize):
            inp = plan.inputs[plan.units[u].input]
            raise ConfigError(
                f"{staging.root}: work unit {u} ({inp.relname}) is not tokenized; the layout needs every unit. "
                "Run tokenize_unit for it first (build() and the Prefect flow do)"
            )
        results.append(result)
    return results


def read_layout(plan: BuildPlan) -> Layout:
    """The layout of a staged build; raises if ``make_layout`` has not run."""
    path = Staging(plan.staging).layout_file
    if not path.exists():
        raise ConfigError(f"{plan.staging}: no layout yet; run make_layout first")
    return Layout.from_dict(json.loads(path.read_text()))


def _val_selection(plan: BuildPlan, staging: Staging) -> tuple[int, int] | None:
    """For ``val_count``: the (score, global doc index) of the last selected document.

    Streams over units keeping at most ``val_count`` candidates, so memory is
    bounded by the count asked for, not by the corpus.
    """
    cfg = plan.config
    if not cfg.val_count:
        return None
    best_scores = np.empty(0, dtype=np.uint64)
    best_index = np.empty(0, dtype=np.int64)
    offset = 0
    for u in range(len(plan.units)):
        docs = staging.unit_docs(u)
        scores = np.concatenate([best_scores, np.asarray(docs["score"])])
        index = np.concatenate([best_index, np.arange(offset, offset + len(docs), dtype=np.int64)])
        order = np.lexsort((index, scores))[: cfg.val_count]
        best_scores, best_index = scores[order], index[order]
        offset += len(docs)
    if cfg.val_count >= offset:
        raise InputError(
            f"val_count={cfg.val_count} leaves no training documents: the corpus has {offset} non-empty documents"
        )
    return int(best_scores[-1]), int(best_index[-1])


def _is_val(cfg: BuildConfig, docs: np.ndarray, first_index: int, cut: tuple[int, int] | None) -> np.ndarray:
    scores = np.asarray(docs["score"])
    if cfg.val_fraction:
        # score / 2**64 < fraction, computed exactly on integers
        return scores < np.uint64(min(int(cfg.val_fraction * 2.0**64), 2**64 - 1))
    if cut is not None:
        index = np.arange(first_index, first_index + len(docs), dtype=np.int64)
        s_cut, i_cut = np.uint64(cut[0]), cut[1]
        return (scores < s_cut) | ((scores == s_cut) & (index <= i_cut))
    return np.zeros(len(docs), dtype=bool)


class _Streams:
    """The splits' segment lists and document-start files while the layout is being made."""

    def __init__(self, staging: Staging, splits: tuple[str, ...]) -> None:
        self.staging = staging
        self.splits = splits
        self.segments: dict[str, list[np.ndarray]] = {s: [] for s in splits}
        self.tokens = dict.fromkeys(splits, 0)
        self.documents = dict.fromkeys(splits, 0)
        self.starts_tmp = {s: tmp_path_for(staging.starts(s)) for s in splits}
        self.starts_files: dict[str, BinaryIO] = {}
        for s in splits:
            self.starts_files[s] = open(self.starts_tmp[s], "wb")

    def add(self, split: str, unit: int, starts: np.ndarray, lengths: np.ndarray, doc_starts: np.ndarray) -> None:
        """Append segments (source ``unit``, first tokens ``starts``, ``lengths``) and their document starts.

        ``doc_starts`` are relative to the first appended token.
        """
        seg = np.empty(len(starts), dtype=SEGMENT_DTYPE)
        seg["unit"] = unit
        seg["start"] = starts
        seg["length"] = lengths
        self.segments[split].append(seg)
        # A document starts at its first token with either placement (EOS closes it).
        self.starts_files[split].write((doc_starts + self.tokens[split]).astype("<i8").tobytes())
        self.tokens[split] += int(np.sum(lengths))
        self.documents[split] += len(doc_starts)

    def mark(self) -> dict[str, tuple[int, int]]:
        return {s: (self.tokens[s], self.documents[s]) for s in self.splits}

    def since(self, mark: dict[str, tuple[int, int]]) -> dict[str, SplitRange]:
        return {
            s: SplitRange(
                first_token=mark[s][0],
                tokens=self.tokens[s] - mark[s][0],
                first_document=mark[s][1],
                documents=self.documents[s] - mark[s][1],
            )
            for s in self.splits
        }

    def abort(self) -> None:
        for f in self.starts_files.values():
            f.close()
        for t in self.starts_tmp.values():
            remove_quietly(t)

    def commit(self, shard_tokens: int) -> dict[str, SplitLayout]:
        """Write the segment files and move the start files into place."""
        for f in self.starts_files.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()
        splits = {}
        for split in self.splits:
            segs = np.concatenate(self.segments[split]) if self.segments[split] else np.empty(0, dtype=SEGMENT_DTYPE)
            tmp = tmp_path_for(self.staging.segments(split))
            try:
                with open(tmp, "wb") as f:
                    np.save(f, segs)
                    f.flush()
                    os.fsync(f.fileno())
            except BaseException:
                remove_quietly(tmp)
                for t in self.starts_tmp.values():
                    remove_quietly(t)
                raise
            os.replace(tmp, self.staging.segments(split))
            os.replace(self.starts_tmp[split], self.staging.starts(split))
            tokens = self.tokens[split]
            splits[split] = SplitLayout(tokens=tokens, documents=self.documents[split], shards=-(-tokens // shard_tokens))
        return splits


def make_layout(plan: BuildPlan | str | os.PathLike[str]) -> Layout:
    """Route documents to splits and plan the shards (after every unit is tokenized)."""
    plan = as_plan(plan)
    staging = Staging(plan.staging)
    cfg = plan.config
    if staging.layout_file.exists():
        return read_layout(plan)
    results = unit_results(plan)
    reused = plan.reuse.inputs if plan.reuse else {}
    total_docs = sum(r.documents for r in results) + sum(
        sum(r.documents for r in e.splits.values()) for e in reused.values()
    )
    if total_docs == 0:
        counts = [r.counts() for r in results] + [e.counts for e in reused.values()]
        bad = sum(c.bad_records for c in counts)
        raise InputError(
            f"the corpus has no text to tokenize: every one of its {sum(c.rows for c in counts)} rows in column "
            f"{cfg.text_column!r} is null ({sum(c.null_texts for c in counts)}) or empty "
            f"({sum(c.empty_texts for c in counts)})" + (f" or a skipped bad record ({bad})" if bad else "")
            + "; check --text-column"
        )
    cut = _val_selection(plan, staging)
    staging.layout_dir.mkdir(exist_ok=True)
    streams = _Streams(staging, ("train", "val") if cfg.has_val else ("train",))
    units_of: dict[int, list[int]] = {}
    for u, wu in enumerate(plan.units):
        units_of.setdefault(wu.input, []).append(u)
    per_input: list[dict[str, SplitRange]] = []
    try:
        first_index = 0
        for i in range(len(plan.inputs)):
            mark = streams.mark()
            if i in reused:
                _add_reused(plan, streams, i)
            for u in units_of.get(i, []):
                first_index = _add_unit(cfg, staging, streams, u, first_index, cut)
            # Where this input's documents are in each split's stream: what an
            # incremental build that reuses the input takes from this version.
            per_input.append(streams.since(mark))
        splits = streams.commit(cfg.shard_tokens)
    except BaseException:
        streams.abort()
        raise
    if cfg.has_val and splits["val"].documents == 0:
        log.warning(
            "the val split is empty: val_fraction=%s selects none of the corpus's %d documents; "
            "raise --val-fraction or use --val-count N",
            cfg.val_fraction,
            splits["train"].documents,
        )
    if cfg.target is not None:  # before any shard is written: a split the target's one file cannot hold
        get_target(cfg.target).check_shard_counts(
            {name: info.shards for name, info in splits.items()}, shard_tokens=cfg.shard_tokens, fmt=cfg.format
        )
    layout = Layout(splits=splits, inputs=per_input)
    fault("layout", staging.layout_file)
    atomic_write_text(staging.layout_file, json.dumps(layout.to_dict()))
    return layout


def _add_reused(plan: BuildPlan, streams: _Streams, i: int) -> None:
    """An unchanged input: its tokens are a range of the parent's split stream."""
    assert plan.reuse is not None
    entry = plan.reuse.inputs[i]
    parent = open_parent(plan.reuse)
    for split in streams.splits:
        rng = entry.splits.get(split)
        if not rng or not rng.tokens:
            continue
        starts = parent.doc_starts(split, rng.first_token, rng.tokens)
        if len(starts) != rng.documents or (len(starts) and starts[0] != rng.first_token):
            raise ValidationError(
                f"{plan.reuse.directory}: the .bos.idx files of split {split!r} list {len(starts)} "
                f"document starts for input {entry.relname} (tokens {rng.first_token} to "
                f"{rng.first_token + rng.tokens}), its manifest says {rng.documents}; the parent version "
                f"{plan.reuse.parent} is damaged. Check it with `shardflow validate {plan.reuse.parent}`, or "
                f"rebuild without reusing it: {NO_REUSE_ENV}=1"
            )
        streams.add(split, -1 - SPLITS.index(split), np.array([rng.first_token]), np.array([rng.tokens]), starts - rng.first_token)


def _add_unit(
    cfg: BuildConfig, staging: Staging, streams: _Streams, u: int, first_index: int, cut: tuple[int, int] | None
) -> int:
    """Unit ``u``'s documents, each to its split; returns the next document's corpus-wide index."""
    docs = staging.unit_docs(u)
    n = len(docs)
    if n == 0:
        return first_index
    lengths = np.asarray(docs["length"], dtype=np.int64)
    src_starts = np.zeros(n, dtype=np.int64)
    np.cumsum(lengths[:-1], out=src_starts[1:])
    val = _is_val(cfg, docs, first_index, cut) if cfg.has_val else np.zeros(n, dtype=bool)
    for split, mask in (("train", ~val), ("val", val)):
        if split not in streams.splits or not mask.any():
            continue
        # Runs of consecutive documents of this split become one segment each.
        idx = np.flatnonzero(mask)
        run_start = np.concatenate(([True], np.diff(idx) != 1))
        firsts = idx[run_start]
        lasts = idx[np.concatenate((run_start[1:], [True]))]
        split_lengths = lengths[idx]
        doc_starts = np.zeros(len(idx), dtype=np.int64)
        np.cumsum(split_lengths[:-1], out=doc_starts[1:])
        streams.add(split, u, src_starts[firsts], src_starts[lasts] + lengths[lasts] - src_starts[firsts], doc_starts)
    return first_index + n
