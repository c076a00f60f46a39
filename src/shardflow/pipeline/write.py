"""Putting the version's files into ``out/``: one shard and its ``.bos.idx`` at a time, and the tokenizer file.

A placed shard (``layout.py``) is hard-linked, not read: a piece a tokenize
job wrote, or the parent version's shard of an unchanged input. A gathered
shard's tokens are ranges of the units' pieces (or of the parent's split)
copied through the format-level ``ShardWriter``, which owns the header, the
hash, the temporary name and the rename. Every shard is checked here, without
reading it back (``check.py``): a gathered one as its tokens are copied, a
placed one by its files being the ones checked when they were written (or the
parent's own); ``layout/SPLIT-K.valid.json`` records how, and
``layout/SPLIT-K.shard.json``, written last, is the shard's commit point.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shutil
from pathlib import Path

import numpy as np

from .._io import atomic_write_text, load_npy, remove_quietly, sha256_file, tmp_path_for
from ..errors import ConfigError, InputError
from ..faults import fault
from ..formats import bosidx, get_format
from ..formats.writer import ShardWriter, encode_index, header_bytes, write_index, write_sidecars
from ..manifest import FileEntry, ShardEntry, version_file
from ..targets import shard_path as shard_path_in_version
from ..tokenizers import Tokenizer
from .check import Checked, identities, parents_own, read_back, record_check, shard_checks
from .incremental import open_parent
from .layout import read_layout
from .model import SPLITS, BuildPlan, ShardResult
from .staging import Staging, as_plan
from .target_files import tokenizer_file_name
from .tokenize import split_decided_late

__all__ = ["write_shard", "shard_done", "gathered_segments", "read_shard_results", "shard_file_name", "write_tokenizer_files", "link_or_copy"]

log = logging.getLogger("shardflow.pipeline")

# Tokens are copied in blocks of this many so memory stays bounded whatever the
# shard size: the writer reads into two such buffers (one read while the other is
# hashed), 2 x 8 Mi tokens = 64 MiB of uint32.
_BLOCK_TOKENS = 8 << 20


def shard_file_name(name: str, split: str, index: int, extension: str) -> str:
    """``SPLIT/NAME_SPLIT_000007.EXT`` (without a target): one directory per split, zero-padded so that
    sorting file names gives manifest order. A trainer target may name its files otherwise."""
    return shard_path_in_version(None, name, split, index, extension)


def link_or_copy(src: Path, dest: Path) -> None:
    """Put ``src``'s file at ``dest`` atomically: a hard link, or a copy across filesystems."""
    tmp = tmp_path_for(dest)
    remove_quietly(tmp)
    try:
        try:
            os.link(src, tmp)
        except OSError:
            shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    except BaseException:
        remove_quietly(tmp)
        raise


def _in_place(staging: Staging, result: ShardResult) -> bool:
    """Whether a shard's files recorded as done are still in ``out/`` with their recorded sizes (a build that
    sends its files to a bucket from the workers: its record, committed after the upload, says so)."""
    if staging.sends:
        return True
    out_dir, entry = staging.out, result.entry
    try:
        return (out_dir / entry.file).stat().st_size == entry.bytes and all(
            (out_dir / f.file).stat().st_size == f.bytes for f in entry.files
        )
    except OSError:
        return False


def _recorded(staging: Staging, split: str, k: int) -> ShardResult | None:
    path = staging.shard_result(split, k)
    try:
        return ShardResult.from_dict(json.loads(path.read_text()), split=split, index=k)
    except FileNotFoundError:
        return None


def read_shard_results(plan: BuildPlan) -> dict[str, list[ShardResult]]:
    """Every shard's recorded result, per split; raises naming the first shard not written."""
    staging = Staging(plan.staging)
    out: dict[str, list[ShardResult]] = {}
    for split, k in read_layout(plan).shard_jobs():
        result = _recorded(staging, split, k)
        if result is None or not _in_place(staging, result):
            raise ConfigError(
                f"{staging.root}: shard {k} of split {split!r} is not written; run write_shard for it first "
                "(build() and the Prefect flow do)"
            )
        out.setdefault(split, []).append(result)
    return out


def _segments(staging: Staging, split: str, lo: int, hi: int) -> list[tuple[int, int, int]]:
    """Tokens ``[lo, hi)`` of a gathered split as ``(source, first source token, count)``.

    A source >= 0 is a work unit's stream of pieces; < 0 a range of a parent split.
    """
    segs = load_npy(staging.segments(split), mmap_mode="r")
    lengths = np.asarray(segs["length"], dtype=np.int64)
    seg_ends = np.cumsum(lengths)
    seg_starts = seg_ends - lengths
    pieces: list[tuple[int, int, int]] = []
    s = int(np.searchsorted(seg_ends, lo, side="right"))
    pos = lo
    while pos < hi:
        seg_off = pos - int(seg_starts[s])
        take = min(int(lengths[s]) - seg_off, hi - pos)
        pieces.append((int(segs["unit"][s]), int(segs["start"][s]) + seg_off, take))
        pos += take
        s += 1
    return pieces


def gathered_segments(plan: BuildPlan, split: str, k: int) -> list[tuple[int, int, int]]:
    """What shard ``k`` of the gathered split ``split`` copies: ``(source, first token, tokens)``, a source >= 0 a
    work unit's stream of pieces, < 0 a range of the parent's split."""
    lo, hi = read_layout(plan).splits[split].cut(k)
    return _segments(Staging(plan.staging), split, lo, hi)


def shard_done(plan: BuildPlan | str | os.PathLike[str], split: str, k: int) -> ShardResult | None:
    """Shard ``k`` of ``split``'s recorded result when it is written with its files in place, else None."""
    staging = Staging(as_plan(plan).staging)
    done = _recorded(staging, split, k)
    return done if done is not None and _in_place(staging, done) else None


def write_shard(plan: BuildPlan | str | os.PathLike[str], split: str, k: int) -> ShardResult:
    """Put shard ``k`` of ``split``, its ``.bos.idx`` and its format's sidecars into ``out/``; returns its result.

    A placed shard is a file already written: a piece of a tokenize job, or
    (an unchanged input of an incremental build) the parent version's shard;
    it is hard-linked under its name, not read. A gathered shard is copied
    from its split's pieces.
    """
    plan = as_plan(plan)
    staging = Staging(plan.staging)
    done = shard_done(plan, split, k)
    if done is not None:
        return done
    cfg = plan.config
    fmt = get_format(cfg.format)
    info = read_layout(plan).splits[split]
    if not 0 <= k < info.shards:
        raise ConfigError(f"{split} has {info.shards} shards; there is no shard {k}")
    shard_path = staging.out / shard_path_in_version(cfg.target, cfg.name, split, k, fmt.extension)
    shard_path.parent.mkdir(parents=True, exist_ok=True)  # the split's directory (schema 2)
    checked: Checked | None = "written"  # a gathered shard: as its tokens were copied (_gather)
    if info.sources is None:
        entry = _gather(plan, staging, split, k, shard_path)
        linked = False
    else:
        unit, p = info.sources[k]
        linked = unit < 0
        if linked:
            entry = _link_parent(plan, split, p, shard_path)
            checked = "parent" if parents_own(plan, staging.out, split, p, entry) else None
        else:
            entry, written = _link_piece(plan, staging, split, unit, p, shard_path)
            checked = "written" if written and identities(staging.out, entry) == list(written) else None
        fault("shard-linked", shard_path)
    if checked is None:  # not known to be the files checked as they were written: every byte read, as validate does
        read_back(plan, staging.out, split, k, entry)
        checked = "read"
    record_check(staging, split, k, entry, checked)
    result = ShardResult(split=split, index=k, entry=entry, linked=linked)
    atomic_write_text(staging.shard_result(split, k), json.dumps(result.to_dict()))
    log.info("%s %s shard %d (%d tokens)", "linked" if result.linked else "placed" if info.sources else "wrote", split, k, entry.tokens)
    return result


def _rel(staging: Staging, path: Path) -> str:
    return path.relative_to(staging.out).as_posix()  # manifest file names are relative to the version directory


def _sidecar_path(shard_path: Path, suffix: str) -> Path:
    return shard_path.with_name(shard_path.stem + suffix)


def _link_piece(plan: BuildPlan, staging: Staging, split: str, unit: int, p: int, shard_path: Path
                ) -> tuple[ShardEntry, tuple[tuple[int, int, int], ...]]:
    """A piece a tokenize job wrote, hard-linked under the shard's name with its index and sidecars; its entry, and
    its files' identities as its job recorded them when it wrote and checked them (none: an older record)."""
    result = staging.unit_result(unit)
    ext = get_format(plan.config.format).extension
    if result is None or p >= len(result.pieces.get(split, ())):
        raise ConfigError(f"{staging.root}: work unit {unit} has no piece {p} of {split}; tokenize it again")
    piece = result.pieces[split][p]
    src = staging.piece(unit, split, p, ext)
    for sfx, _, _ in piece.sidecars:
        link_or_copy(_sidecar_path(src, sfx), _sidecar_path(shard_path, sfx))
    link_or_copy(bosidx.index_path(src), bosidx.index_path(shard_path))
    fault("shard-indexed", shard_path)
    link_or_copy(src, shard_path)
    return ShardEntry(
        file=_rel(staging, shard_path),
        bytes=piece.bytes,
        sha256=piece.sha256,
        tokens=piece.tokens,
        documents=piece.documents,
        index=FileEntry(file=_rel(staging, bosidx.index_path(shard_path)), bytes=piece.index_bytes, sha256=piece.index_sha256),
        sidecars=tuple(
            FileEntry(file=_rel(staging, _sidecar_path(shard_path, sfx)), bytes=n, sha256=sha) for sfx, n, sha in piece.sidecars
        ),
    ), piece.files


def _link_parent(plan: BuildPlan, split: str, k: int, shard_path: Path) -> ShardEntry:
    """Shard ``k`` of the parent's ``split`` (an unchanged input's), hard-linked under the shard's name, not read."""
    assert plan.reuse is not None
    staging = Staging(plan.staging)
    parent = open_parent(plan.reuse)
    info = parent.splits[split].shards[k]
    same = info.entry
    assert same is not None
    dtype = np.dtype(plan.dtype)
    if same.bytes != header_bytes(get_format(plan.config.format), dtype) + same.tokens * dtype.itemsize:
        raise parent.damaged(parent.directory / same.file, "its manifest entry does not fit its format")
    pairs = [(parent.directory / f.file, _sidecar_path(shard_path, Path(f.file).name[len(Path(same.file).stem):])) for f in same.sidecars]
    pairs += [(parent.directory / same.index.file, bosidx.index_path(shard_path)), (parent.directory / same.file, shard_path)]
    for src, dest in pairs:
        link_or_copy(version_file(parent.directory, str(src.relative_to(parent.directory)), "a shard file"), dest)
    # The parent's entry (sizes, SHA-256s, counts) under the files' names in this version.
    return dataclasses.replace(
        same,
        file=_rel(staging, shard_path),
        index=dataclasses.replace(same.index, file=_rel(staging, bosidx.index_path(shard_path))),
        sidecars=tuple(dataclasses.replace(f, file=_rel(staging, dest)) for f, (_, dest) in zip(same.sidecars, pairs)),
    )


def _gather(plan: BuildPlan, staging: Staging, split: str, k: int, shard_path: Path) -> ShardEntry:
    """Copy shard ``k`` of a gathered split from its pieces (and the parent's ranges); write its index and sidecars."""
    cfg = plan.config
    fmt = get_format(cfg.format)
    dtype = np.dtype(plan.dtype)
    lo, hi = read_layout(plan).splits[split].cut(k)
    starts = np.memmap(staging.starts(split), dtype="<i8", mode="r")
    a, b = np.searchsorted(starts, [lo, hi], side="left")
    local = np.asarray(starts[a:b], dtype=np.int64) - lo
    idx_bytes, idx_sha = encode_index(local, hi - lo)
    parent = open_parent(plan.reuse) if plan.reuse else None
    stream = "all" if split_decided_late(plan) else split
    skip = header_bytes(fmt, dtype)
    buf = np.empty(min(_BLOCK_TOKENS, hi - lo), dtype=dtype)
    scan = shard_checks(plan)(shard_path)  # fed every block as it is copied
    with ShardWriter(fmt, shard_path, dtype, hi - lo, check=scan) as writer:
        for n, (source, src_lo, take) in enumerate(_segments(staging, split, lo, hi)):
            if source >= 0:
                _copy_stream(writer, buf, staging, source, stream, src_lo, take, ext=fmt.extension, skip=skip)
            else:
                assert parent is not None
                parent.copy_range(writer, buf, SPLITS[-1 - source], src_lo, take)
            if n == 0:
                fault("shard-mid", writer.tmp)
        scan.check(local)  # the tokens against the index about to be written, before the shard is committed
        nbytes, digest = writer.commit()
    fault("shard-written", shard_path)
    idx_path = bosidx.index_path(shard_path)
    write_index(idx_path, idx_bytes)
    fault("shard-indexed", idx_path)
    # Format-specific files beside the shard (megatron's .idx), derived from the same starts.
    sidecars = tuple(
        FileEntry(file=_rel(staging, shard_path.parent / name), bytes=size, sha256=sha)
        for name, size, sha in write_sidecars(fmt, shard_path, dtype, hi - lo, local)
    )
    return ShardEntry(
        file=_rel(staging, shard_path),
        bytes=nbytes,
        sha256=digest,
        tokens=hi - lo,
        documents=len(local),
        index=FileEntry(file=_rel(staging, idx_path), bytes=len(idx_bytes), sha256=idx_sha),
        sidecars=sidecars,
    )


def _copy_stream(
    writer: ShardWriter, buf: np.ndarray, staging: Staging, unit: int, stream: str, start: int, count: int, *, ext: str, skip: int
) -> None:
    """Append tokens ``[start, start + count)`` of work unit ``unit``'s ``stream`` (its pieces, one after another)."""
    result = staging.unit_result(unit)
    assert result is not None
    pos = 0
    for p, piece in enumerate(result.pieces.get(stream, ())):
        if count and start < pos + piece.tokens:
            within = start - pos
            take = min(piece.tokens - within, count)
            with open(staging.piece(unit, stream, p, ext), "rb") as src:
                src.seek(skip + within * buf.dtype.itemsize)
                writer.copy_from(src, take, buf)
            start += take
            count -= take
        pos += piece.tokens
    if count:
        raise ConfigError(f"{staging.root}: work unit {unit}'s {stream} pieces hold fewer tokens than the layout says")


def write_tokenizer_files(tokenizer: Tokenizer, out: Path) -> str | None:
    """Put the user's tokenizer file into ``out/`` under its own name; returns that name.

    A version carries the file it was tokenized with, so that it decodes anywhere.
    """
    name = tokenizer_file_name(tokenizer)
    if name is None:
        return None
    spec = tokenizer.spec
    assert spec.rank_file is not None
    dest = out / name
    if not (dest.exists() and sha256_file(dest) == spec.rank_file_sha256):
        out.mkdir(exist_ok=True)
        tmp = tmp_path_for(dest)
        try:
            shutil.copyfile(spec.rank_file, tmp)  # a copy, not a link: editing the original must not change a version
            os.replace(tmp, dest)
        except BaseException:
            remove_quietly(tmp)
            raise
        if sha256_file(dest) != spec.rank_file_sha256:
            raise InputError(
                f"{spec.rank_file}: the {'rank' if spec.family == 'tiktoken' else 'tokenizer'} file changed during the "
                "build (its SHA-256 differs from when the "
                "build started); keep it unchanged and run the build again"
            )
    return dest.name
