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
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

from .._io import atomic_write_text
from ..errors import ValidationError
from ..validation import validate_shard
from .model import BuildPlan
from .publish import staged_manifest
from .staging import Staging, as_plan, shard_check_record

__all__ = ["ShardCheck", "validate_staged_shard"]


@dataclass(frozen=True, kw_only=True)
class ShardCheck:
    """One validated shard (what the job returns: small metadata)."""

    split: str
    index: int
    tokens: int


def validate_staged_shard(plan: BuildPlan | str | os.PathLike[str], split: str, k: int) -> ShardCheck:
    """Validate written shard ``k`` of ``split`` byte for byte; a shard already validated is not read again."""
    plan = as_plan(plan)
    staging = Staging(plan.staging)
    manifest = staged_manifest(plan, embeddings=False)
    entry = manifest.splits[split].shards[k]
    record = shard_check_record(entry)
    path = staging.shard_check(split, k)
    try:
        if json.loads(path.read_text()) == record and (staging.out / entry.file).stat().st_size == entry.bytes:
            return ShardCheck(split=split, index=k, tokens=entry.tokens)
    except (OSError, ValueError):
        pass
    problems = validate_shard(staging.out, manifest, split, k, entry, checksums=True)
    if problems:
        raise ValidationError("\n  ".join([f"validation of shard {k} of split {split!r} failed:", *problems]))
    atomic_write_text(path, json.dumps(record, sort_keys=True))
    return ShardCheck(split=split, index=k, tokens=entry.tokens)
