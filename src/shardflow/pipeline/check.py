"""The checks of a build's shards, run as they are written, and the record that says which ran.

No shard is read back to check it. Each is checked where its bytes pass:

* A tokenize job's pieces (``formats/unit_writer.UnitShardWriter``) and a gathered shard
  (``write.py``, through ``formats/writer.ShardWriter``) feed every block of tokens they write to a
  ``ShardScan`` (``shard_checks.py``, ``shard_checks(plan)``: every id below the vocabulary size, the
  boundary tokens exactly at the document starts that the ``.bos.idx`` will hold, whole documents),
  checked before the file is committed; the writer checks the header it wrote and the format's
  sidecars as a reader reads them; the SHA-256 of every file is taken as it is written.
* A placed shard is its piece, hard-linked: checked when its tokenize job wrote it, and its files are
  still those (size, inode and mtime as the unit's record has them, ``Piece.files``).
* A shard an incremental build hard-linked from its parent version, with its index and sidecars, is
  the parent's own files (``parents_own``): the same inode, with the size and SHA-256 that the parent's
  manifest records and that were validated when the parent was published, not modified since (its
  mtime is not later than the parent's ``metadata.yaml``, written last).

A shard that is none of these (a piece written to or replaced since its job wrote it, a copy across
file systems, a parent file rewritten since, a unit recorded by an older run) is read back and
validated in full (``read_back``: ``validation.validate_shard_entry``, what ``shardflow validate``
runs). The write-shard job records which check it passed, with its files' identities as checked, in
``layout/<split>-NNNNNN.valid.json`` (``record_check``), before its commit marker. ``finalize`` reads no
shard: each record must match its manifest entry and the files' sizes, inodes and mtimes
(``Staging.shard_checked``); a file changed or replaced after its write has another mtime or inode, and
then every shard is validated in full, byte for byte. A change in place that restores the size and
mtime is what ``shardflow validate`` finds (docs/ARCHITECTURE.md, threat model).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Callable, Literal

from .._io import atomic_write_text, file_identity
from ..errors import ConfigError, ValidationError
from ..formats import bosidx, get_format
from ..manifest import ShardEntry
from ..shard_checks import ShardContext, ShardScan
from ..tokenizers import load_tokenizer
from ..validation import validate_shard_entry
from .incremental import open_parent
from .model import BuildPlan
from .staging import Staging, as_plan, shard_check_record

__all__ = ["Checked", "shard_context", "shard_checks", "shard_files", "identities", "parents_own", "read_back", "record_check"]

Checked = Literal["written", "parent", "read"]
"""How a shard was checked: as written (or its piece was), as the parent's own files, or read back in full."""


def shard_context(plan: BuildPlan | str | os.PathLike[str], split: str = "", k: int = 0, *,
                  vocab_size: int | None = None) -> ShardContext:
    """What checking a shard of this build needs besides its entry, from the plan alone (any shard: ``split``
    and ``k`` are not needed). ``vocab_size``: the tokenizer's, when the caller has it loaded.

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
    if vocab_size is None:
        vocab_size = load_tokenizer(cfg.tokenizer, backend=cfg.backend).vocab_size
    return ShardContext(
        format_name=get_format(cfg.format).name,
        dtype=plan.dtype,
        vocab_size=vocab_size,
        boundary=main[1],
        placement=b.placement,
        bos_id=b.bos_id,
        eos_id=b.eos_id,
        whole_documents=True,
    )


def shard_checks(plan: BuildPlan, *, vocab_size: int | None = None) -> Callable[[Path], ShardScan]:
    """The checks of a shard of this build as it is written: ``shard_checks(plan)(path)`` for the shard at ``path``
    (a writer's ``check``: ``UnitShardWriter``, ``ShardWriter``)."""
    ctx = shard_context(plan, vocab_size=vocab_size)

    def scan(path: Path) -> ShardScan:
        return ShardScan(ctx, path, bosidx.index_path(path))

    return scan


def shard_files(entry: ShardEntry) -> list[str]:
    """The names of a shard's files: the shard, its ``.bos.idx``, its sidecars (the order of ``Piece.files``)."""
    return [entry.file, *(f.file for f in entry.files)]


def identities(out: Path, entry: ShardEntry) -> list[tuple[int, int, int]]:
    """``(bytes, inode, mtime_ns)`` of each of the shard's files in ``out`` (``shard_files`` order); raises ``OSError``."""
    return [file_identity(out / name) for name in shard_files(entry)]


def record_check(staging: Staging, split: str, k: int, entry: ShardEntry, checked: Checked) -> None:
    """Record that shard ``k`` of ``split`` passed its checks (``checked``: how), with its files as they are now."""
    files = dict(zip(shard_files(entry), identities(staging.out, entry)))
    atomic_write_text(staging.shard_check(split, k), json.dumps(shard_check_record(entry, checked, files), sort_keys=True))


def read_back(plan: BuildPlan, out: Path, split: str, k: int, entry: ShardEntry) -> None:
    """Validate shard ``k`` of ``split`` in ``out`` byte for byte against ``entry`` (size, SHA-256, header, token ids,
    ``.bos.idx``, sidecars): for a shard whose files are not known to be the ones checked as they were written."""
    problems = validate_shard_entry(out, shard_context(plan), split, k, entry, checksums=True)
    if problems:
        raise ValidationError("\n  ".join([f"validation of shard {k} of split {split!r} failed:", *problems]))


def parents_own(plan: BuildPlan, out: Path, split: str, parent_k: int, entry: ShardEntry) -> bool:
    """Whether every file of ``entry`` in ``out`` is the file of the parent's shard ``parent_k`` of ``split``, as its
    manifest records it, unchanged since the parent was published."""
    if plan.reuse is None:
        return False
    parent = open_parent(plan.reuse)
    theirs = parent.splits[split].shards[parent_k].entry
    assert theirs is not None
    directory = Path(plan.reuse.directory)
    pairs = [(theirs.file, theirs.bytes, theirs.sha256), *((f.file, f.bytes, f.sha256) for f in theirs.files)]
    ours = [(entry.bytes, entry.sha256), *((f.bytes, f.sha256) for f in entry.files)]
    if len(ours) != len(pairs):
        return False
    for name, (their_name, size, sha), mine in zip(shard_files(entry), pairs, ours):
        if mine != (size, sha):
            return False
        try:
            if not os.path.samefile(out / name, directory / their_name):
                return False  # a copy (another file system), or another file: read it
            if not parent.untouched_since_publish((directory / their_name).stat()):
                return False  # written to or replaced since the parent was published: read it
        except OSError:
            return False
    return True
