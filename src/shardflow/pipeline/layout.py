"""The shard layout: number every shard of every split, and say where each one's tokens come from.

Input: the tokenized units' results (``parts/unit-N.json``: their pieces) and,
in an incremental build, the parent version's manifest. Shards are in corpus
order: input by input, unit by unit, piece by piece.

* A *placed* split (train, and val unless it is gathered) is one shard per
  piece, linked as it is, and the parent's own shards for an unchanged input:
  the layout reads one small record per unit and per parent shard, never a
  document table.
* A *gathered* split is one token stream cut into shards of whole documents:
  a target that needs one file per split (nanogpt), val pieces (small; one
  cheap second write of val tokens only), and every split of a ``val_count``
  build, whose split is decided here over the whole corpus (that one reads
  every document table). Its segments and document starts go under ``layout/``.

``layout.json`` (every shard's source and size) is written last, as the commit
point. The layout only reads: a unit that is not tokenized is an error, never
tokenized here.
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
from ..formats import bosidx, get_format
from ..targets import get_target
from ..sources import split_scores
from .incremental import NO_REUSE_ENV, open_parent
from .model import SPLITS, BuildPlan, Layout, ReusedInput, SplitLayout, SplitRange, UnitResult
from .tokenize import split_decided_late, val_by_fraction
from .staging import SEGMENT_DTYPE, Staging, as_plan

__all__ = ["make_layout", "read_layout", "unit_results", "cut_at_documents", "gathered_splits"]

log = logging.getLogger("shardflow.pipeline")


def unit_results(plan: BuildPlan) -> list[UnitResult]:
    """Every unit's recorded result; raises naming the first unit that is not tokenized."""
    staging = Staging(plan.staging)
    extension = get_format(plan.config.format).extension
    results = []
    for u in range(len(plan.units)):
        result = staging.unit_result(u)
        if result is None or not staging.unit_in_place(result, extension):
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


def row_offsets(plan: BuildPlan, results: list[UnitResult]) -> dict[int, int]:
    """Per unit whose first row was not known when planned (``first_row`` -1): the rows before it in its input.

    Those units (byte ranges of an object on object storage, see
    ``sources/jsonl.py``) numbered their rows from 0; the rows of the units
    before them in the same input, which their results record, place them.
    """
    offsets: dict[int, int] = {}
    seen: dict[int, int] = {}
    for u, wu in enumerate(plan.units):
        if wu.first_row < 0:
            offsets[u] = seen.get(wu.input, 0)
        seen[wu.input] = seen.get(wu.input, 0) + results[u].rows
    return offsets


def _unit_docs(plan: BuildPlan, staging: Staging, u: int, offsets: dict[int, int]) -> np.ndarray:
    """Unit ``u``'s document table, with its rows placed in its input and their split scores, if it needs it."""
    docs = staging.unit_docs(u)
    if u not in offsets:
        return docs
    docs = np.array(docs)
    docs["row"] += offsets[u]
    # The score is a function of the input's name and the row: computed again for the placed rows.
    docs["score"] = split_scores(plan.inputs[plan.units[u].input].relname, docs["row"], plan.config.seed)
    return docs


def _val_selection(plan: BuildPlan, staging: Staging, offsets: dict[int, int]) -> tuple[int, int] | None:
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
        docs = _unit_docs(plan, staging, u, offsets)
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
        return val_by_fraction(scores, cfg.val_fraction)
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

    def commit(self, bound: int, at_least: dict[str, int]) -> dict[str, SplitLayout]:
        """Write the segment files, move the start files into place, and cut each split at whole documents
        (into ``at_least[split]`` shards or more where its documents allow)."""
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
            starts = np.fromfile(self.staging.starts(split), dtype="<i8")
            sizes = cut_at_documents(starts, tokens, bound)
            if tokens and len(sizes) < (want := at_least.get(split, 1)):
                sizes = cut_at_documents(starts, tokens, -(-tokens // want))
            splits[split] = SplitLayout(tokens=tokens, documents=self.documents[split], shards=len(sizes), sizes=sizes)
        return splits


def cut_at_documents(starts: np.ndarray, tokens: int, bound: int) -> tuple[int, ...]:
    """The sizes of the shards a stream of ``tokens`` tokens whose documents start at ``starts`` is cut into.

    The rule of ``UnitShardWriter``: a shard takes documents while it stays
    within ``bound`` tokens; a document longer than that is a shard of its own.
    """
    sizes: list[int] = []
    lo = 0
    while lo < tokens:
        if tokens - lo <= bound:
            hi = tokens
        else:
            j = int(np.searchsorted(starts, lo + bound, side="right")) - 1  # the last document starting within reach
            hi = int(starts[j]) if j >= 0 and starts[j] > lo else 0
            if not hi:  # one document longer than the bound: alone, up to the next document
                k = int(np.searchsorted(starts, lo, side="right"))
                hi = int(starts[k]) if k < len(starts) else tokens
        sizes.append(hi - lo)
        lo = hi
    return tuple(sizes)


def gathered_splits(plan: BuildPlan) -> tuple[str, ...]:
    """The splits whose shards are gathered from pieces (copied) rather than placed (linked)."""
    cfg = plan.config
    splits = ("train", "val") if cfg.has_val else ("train",)
    target = get_target(cfg.target) if cfg.target is not None else None
    if split_decided_late(plan) or (target is not None and (target.one_file_per_split or target.gathers)):
        return splits
    return ("val",) if cfg.has_val else ()


def make_layout(plan: BuildPlan | str | os.PathLike[str]) -> Layout:
    """Number every shard and record its source (after every unit is tokenized)."""
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
    splits_all = ("train", "val") if cfg.has_val else ("train",)
    gathered = gathered_splits(plan)
    late = split_decided_late(plan)
    placed = _Placed(plan, [s for s in splits_all if s not in gathered])
    offsets = row_offsets(plan, results) if late else {}
    cut = _val_selection(plan, staging, offsets)
    staging.layout_dir.mkdir(exist_ok=True)
    streams = _Streams(staging, gathered)
    units_of: dict[int, list[int]] = {}
    for u, wu in enumerate(plan.units):
        units_of.setdefault(wu.input, []).append(u)
    per_input: list[dict[str, SplitRange]] = []
    input_shards: list[dict[str, tuple[int, int]]] = []
    try:
        first_index = 0
        for i in range(len(plan.inputs)):
            mark, shard_mark = streams.mark(), placed.mark()
            if i in reused:
                _add_reused(plan, streams, i)
                placed.add_reused(reused[i])
            for u in units_of.get(i, []):
                placed.add_unit(results[u])
                if late:
                    first_index = _add_unit(cfg, _unit_docs(plan, staging, u, offsets), streams, u, first_index, cut)
                else:
                    for split in gathered:
                        _add_pieces(staging, streams, split, results[u], get_format(cfg.format).extension)
            # Where this input's documents are in each split's stream, and which placed shards are its:
            # what an incremental build that reuses the input takes from this version.
            ranges = {**streams.since(mark), **placed.since(shard_mark)}
            per_input.append({s: ranges[s] for s in splits_all})  # in split order, however each is laid out
            input_shards.append(placed.shards_since(shard_mark))
        assert cfg.shard_tokens is not None
        at_least = {"train": get_target(cfg.target).train_files_at_least} if cfg.target is not None else {}
        splits = {**streams.commit(cfg.shard_tokens, at_least), **placed.splits()}
    except BaseException:
        streams.abort()
        raise
    splits = {s: splits[s] for s in splits_all}
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
    layout = Layout(splits=splits, inputs=per_input, input_shards=input_shards)
    fault("layout", staging.layout_file)
    atomic_write_text(staging.layout_file, json.dumps(layout.to_dict()))
    return layout


class _Placed:
    """The placed splits' shards while the layout is made: one per piece, or a parent shard (O(units) records)."""

    def __init__(self, plan: BuildPlan, splits: list[str]) -> None:
        self.plan = plan
        self.sources: dict[str, list[tuple[int, int]]] = {s: [] for s in splits}
        self.sizes: dict[str, list[int]] = {s: [] for s in splits}
        self.tokens = dict.fromkeys(splits, 0)
        self.documents = dict.fromkeys(splits, 0)

    def add_unit(self, result: UnitResult) -> None:
        for split in self.sources:
            for p, piece in enumerate(result.pieces.get(split, ())):
                self._add(split, (result.unit, p), piece.tokens, piece.documents)

    def add_reused(self, entry: ReusedInput) -> None:
        """An unchanged input: the parent's shards that hold its documents, linked as they are."""
        assert self.plan.reuse is not None
        parent = open_parent(self.plan.reuse)
        for split in self.sources:
            if split not in entry.shards:  # plan_reuse takes only parents that record them (schema 3)
                raise parent.damaged(parent.directory, f"its manifest lists no {split} shards of input {entry.relname}")
            first, count = entry.shards[split]
            shards = parent.splits[split].shards if count else []
            for k in range(first, first + count):
                info = shards[k]
                assert info.entry is not None
                self._add(split, (-1, k), info.entry.tokens, info.entry.documents)

    def _add(self, split: str, source: tuple[int, int], tokens: int, documents: int) -> None:
        self.sources[split].append(source)
        self.sizes[split].append(tokens)
        self.tokens[split] += tokens
        self.documents[split] += documents

    def mark(self) -> dict[str, tuple[int, int, int]]:
        return {s: (self.tokens[s], self.documents[s], len(self.sources[s])) for s in self.sources}

    def since(self, mark: dict[str, tuple[int, int, int]]) -> dict[str, SplitRange]:
        return {
            s: SplitRange(
                first_token=mark[s][0], tokens=self.tokens[s] - mark[s][0],
                first_document=mark[s][1], documents=self.documents[s] - mark[s][1],
            )
            for s in self.sources
        }

    def shards_since(self, mark: dict[str, tuple[int, int, int]]) -> dict[str, tuple[int, int]]:
        return {s: (mark[s][2], len(self.sources[s]) - mark[s][2]) for s in self.sources}

    def splits(self) -> dict[str, SplitLayout]:
        return {
            s: SplitLayout(
                tokens=self.tokens[s], documents=self.documents[s], shards=len(self.sources[s]),
                sources=tuple(self.sources[s]), sizes=tuple(self.sizes[s]),
            )
            for s in self.sources
        }


def _add_pieces(staging: Staging, streams: _Streams, split: str, result: UnitResult, extension: str) -> None:
    """A unit's pieces of ``split`` as one segment of the gathered stream; their document starts from their ``.bos.idx``."""
    pieces = result.pieces.get(split, ())
    total = sum(p.tokens for p in pieces)
    if not total:
        return
    starts, offset = [], 0
    for p, piece in enumerate(pieces):
        idx = bosidx.read(bosidx.index_path(staging.piece(result.unit, split, p, extension)), piece.tokens)
        starts.append(np.asarray(idx, dtype=np.int64) + offset)
        offset += piece.tokens
    streams.add(split, result.unit, np.array([0]), np.array([total]), np.concatenate(starts))


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
    cfg: BuildConfig, docs: np.ndarray, streams: _Streams, u: int, first_index: int, cut: tuple[int, int] | None
) -> int:
    """Unit ``u``'s documents (``docs``, its table), each to its split; returns the next document's corpus-wide index."""
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
