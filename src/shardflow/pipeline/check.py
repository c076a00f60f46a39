"""Validating one written shard, as a job of its own: the shard checks fan out like the writes.

``validate_staged_shard(plan, split, k)`` runs the whole per-shard validation
(``validation.validate_shard_entry``: size, SHA-256, header, token ids, the
``.bos.idx`` and the format's sidecars) against the manifest entry that the
write-shard job recorded, on whichever worker runs the job, and records it in
``layout/<split>-NNNNNN.valid.json`` (written last, the job's commit point).
The job reads O(1) records, never the whole manifest (N jobs x N records): the
plan and its shard's record. No neighbour is read: a build's shards hold whole
documents (manifest schema 3), so each one's boundaries are checked on its own.
``finalize``, still the one writer of the manifest, then checks only that
every shard has such a record matching its manifest entry, and validates what
is not per shard (totals, tokenizer file, embeddings): reading every shard's
bytes again on one machine is what this stage exists to avoid.

A shard that an incremental build hard-linked from its parent version, with
its index and sidecars, is not read again either (``shard_checked``): every
one of its files is the parent's own file (the same inode), with the size and
SHA-256 that the parent's manifest records and that were validated when the
parent was published, and not modified since (its mtime is not later than the
parent's ``metadata.yaml``, written last): a parent file rewritten or replaced
since is read and fails here, as before. (Damage that leaves the mtime alone,
such as media errors, is what ``shardflow validate`` of the parent finds; the
linked file is the parent's, so it is damaged in both.) Only new and
rewritten shards are read.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .._io import atomic_write_text
from ..errors import ConfigError, ValidationError
from ..formats import get_format
from ..manifest import ShardEntry
from ..tokenizers import load_tokenizer
from ..validation import ShardContext, validate_shard_entry
from .incremental import open_parent
from .layout import read_layout
from .model import BuildPlan, ShardResult
from .staging import Staging, as_plan, shard_check_record
from .write import shard_done

__all__ = ["ShardCheck", "validate_staged_shard", "shard_checked", "shard_context"]


@dataclass(frozen=True, kw_only=True)
class ShardCheck:
    """One validated shard (what the job returns: small metadata)."""

    split: str
    index: int
    tokens: int


def validate_staged_shard(plan: BuildPlan | str | os.PathLike[str], split: str, k: int) -> ShardCheck:
    """Validate written shard ``k`` of ``split`` byte for byte; a shard already validated is not read again."""
    plan = as_plan(plan)
    written = _written(plan, split, k)
    done = _checked(plan, written)
    if done is not None:
        return done
    staging = Staging(plan.staging)
    entry = written.entry
    problems = validate_shard_entry(staging.out, shard_context(plan, split, k), split, k, entry, checksums=True)
    if problems:
        raise ValidationError("\n  ".join([f"validation of shard {k} of split {split!r} failed:", *problems]))
    atomic_write_text(staging.shard_check(split, k), json.dumps(shard_check_record(entry), sort_keys=True))
    return ShardCheck(split=split, index=k, tokens=entry.tokens)


def shard_context(plan: BuildPlan | str | os.PathLike[str], split: str, k: int) -> ShardContext:
    """What validating shard ``k`` needs besides its entry, from the plan alone.

    The facts are those the manifest will record (``pipeline/assemble.py`` assembles
    them from the same plan and tokenizer).
    """
    plan = as_plan(plan)
    cfg = plan.config
    b = plan.boundaries
    if b is None:  # plan_build always resolves them (and fills them into an older plan.json)
        raise ConfigError(f"{plan.staging}: the plan records no boundary tokens; plan the build again (plan_build)")
    main = b.bos if b.bos is not None else b.eos
    assert main is not None  # Boundaries checks that its placement has its tokens
    return ShardContext(
        format_name=get_format(cfg.format).name,
        dtype=plan.dtype,
        vocab_size=load_tokenizer(cfg.tokenizer, backend=cfg.backend).vocab_size,
        boundary=main[1],
        placement=b.placement,
        bos_id=b.bos_id,
        eos_id=b.eos_id,
        whole_documents=True,
    )


def _written(plan: BuildPlan, split: str, k: int) -> ShardResult:
    """Shard ``k``'s record, its files in place; raises naming the shard (and the stage to run) otherwise."""
    written = shard_done(plan, split, k)
    if written is not None:
        return written
    info = read_layout(plan).splits.get(split)
    if info is None or not 0 <= k < info.shards:
        shards = 0 if info is None else info.shards
        raise ConfigError(f"{plan.staging}: split {split!r} has {shards} shards; there is no shard {k} to validate")
    raise ConfigError(
        f"{plan.staging}: shard {k} of split {split!r} is not written; run write_shard for it first "
        "(build() and the Prefect flow do)"
    )


def shard_checked(plan: BuildPlan | str | os.PathLike[str], split: str, k: int) -> ShardCheck | None:
    """Shard ``k``'s check when it needs no reading (a few stats), else None.

    Either it was validated already (its record matches the written shard), or
    it is the parent version's own files, hard-linked (its record is then written).
    """
    plan = as_plan(plan)
    written = shard_done(plan, split, k)
    return None if written is None else _checked(plan, written)


def _checked(plan: BuildPlan, written: ShardResult) -> ShardCheck | None:
    """``shard_checked`` for the written shard ``written``."""
    staging = Staging(plan.staging)
    entry = written.entry
    split, k = written.split, written.index
    record = shard_check_record(entry)
    path = staging.shard_check(split, k)
    check = ShardCheck(split=split, index=k, tokens=entry.tokens)
    try:
        if json.loads(path.read_text()) == record:
            return check
    except (OSError, ValueError):
        pass
    if written.linked and _parents_own(plan, staging, split, k, entry):
        atomic_write_text(path, json.dumps(record, sort_keys=True))
        return check
    return None


def _parents_own(plan: BuildPlan, staging: Staging, split: str, k: int, entry: ShardEntry) -> bool:
    """Whether every file of ``entry`` is the file of the parent's shard that the layout linked, as its manifest records it."""
    if plan.reuse is None:
        return False
    source = read_layout(plan).splits[split].sources
    if source is None or source[k][0] >= 0:
        return False
    parent = open_parent(plan.reuse)
    theirs = parent.splits[split].shards[source[k][1]].entry
    assert theirs is not None
    directory = Path(plan.reuse.directory)
    ours = [entry.file, *(f.file for f in entry.files)]
    pairs = [(theirs.file, theirs.bytes, theirs.sha256), *((f.file, f.bytes, f.sha256) for f in theirs.files)]
    if len(ours) != len(pairs):
        return False
    for name, (their_name, size, sha), mine in zip(ours, pairs, [(entry.bytes, entry.sha256), *((f.bytes, f.sha256) for f in entry.files)]):
        if mine != (size, sha):
            return False
        try:
            if not os.path.samefile(staging.out / name, directory / their_name):
                return False  # a copy (another file system), or another file: read it
            if not parent.untouched_since_publish((directory / their_name).stat()):
                return False  # written to or replaced since the parent was published: read it
        except OSError:
            return False
    return True
