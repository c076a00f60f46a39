"""Validating one written shard, as a job of its own: the shard checks fan out like the writes.

``validate_staged_shard(plan, split, k)`` runs the whole per-shard validation
(``validation.validate_shard``: size, SHA-256, header, token ids, the
``.bos.idx`` and the format's sidecars) against the manifest assembled from the
stages' recorded results, on whichever worker runs the job, and records it in
``layout/<split>-NNNNNN.valid.json`` (written last, the job's commit point).
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
from ..errors import ValidationError
from ..validation import validate_shard
from ..manifest import ShardEntry
from .incremental import open_parent
from .model import BuildPlan
from .publish import staged_manifest
from .staging import Staging, as_plan, shard_check_record
from .write import shard_done

__all__ = ["ShardCheck", "validate_staged_shard", "shard_checked"]


@dataclass(frozen=True, kw_only=True)
class ShardCheck:
    """One validated shard (what the job returns: small metadata)."""

    split: str
    index: int
    tokens: int


def validate_staged_shard(plan: BuildPlan | str | os.PathLike[str], split: str, k: int) -> ShardCheck:
    """Validate written shard ``k`` of ``split`` byte for byte; a shard already validated is not read again."""
    plan = as_plan(plan)
    done = shard_checked(plan, split, k)
    if done is not None:
        return done
    staging = Staging(plan.staging)
    manifest = staged_manifest(plan, embeddings=False)
    entry = manifest.splits[split].shards[k]
    record = shard_check_record(entry)
    path = staging.shard_check(split, k)
    problems = validate_shard(staging.out, manifest, split, k, entry, checksums=True)
    if problems:
        raise ValidationError("\n  ".join([f"validation of shard {k} of split {split!r} failed:", *problems]))
    atomic_write_text(path, json.dumps(record, sort_keys=True))
    return ShardCheck(split=split, index=k, tokens=entry.tokens)


def shard_checked(plan: BuildPlan | str | os.PathLike[str], split: str, k: int) -> ShardCheck | None:
    """Shard ``k``'s check when it needs no reading (a few stats), else None.

    Either it was validated already (its record matches the written shard), or
    it is the parent version's own files, hard-linked (its record is then written).
    """
    plan = as_plan(plan)
    written = shard_done(plan, split, k)
    if written is None:
        return None
    staging = Staging(plan.staging)
    entry = written.entry
    record = shard_check_record(entry)
    path = staging.shard_check(split, k)
    check = ShardCheck(split=split, index=k, tokens=entry.tokens)
    try:
        if json.loads(path.read_text()) == record:
            return check
    except (OSError, ValueError):
        pass
    if written.linked and _parents_own(plan, staging, entry):
        atomic_write_text(path, json.dumps(record, sort_keys=True))
        return check
    return None


def _parents_own(plan: BuildPlan, staging: Staging, entry: ShardEntry) -> bool:
    """Whether every file of ``entry`` is the parent version's file of that name, as its manifest records it."""
    if plan.reuse is None:
        return False
    parent = open_parent(plan.reuse)
    known: dict[str, tuple[int, str]] = {}
    for shards in parent.manifest.splits.values():
        for shard in shards.shards:
            known[shard.file] = (shard.bytes, shard.sha256)
            known.update({f.file: (f.bytes, f.sha256) for f in shard.files})
    directory = Path(plan.reuse.directory)
    for name, size, sha in [(entry.file, entry.bytes, entry.sha256), *((f.file, f.bytes, f.sha256) for f in entry.files)]:
        if known.get(name) != (size, sha):
            return False
        try:
            if not os.path.samefile(staging.out / name, directory / name):
                return False  # a copy (another file system), or another file: read it
            if not parent.untouched_since_publish((directory / name).stat()):
                return False  # written to or replaced since the parent was published: read it
        except OSError:
            return False
    return True
