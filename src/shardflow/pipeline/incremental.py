"""Incremental builds: which inputs a build takes unchanged from its parent version, and reading them.

``plan_reuse`` decides, when a build is planned, which inputs need no work
units because the parent version (the catalog's latest, built with the same
options) holds them byte for byte. ``ParentVersion`` is everything the later
stages read from that parent: document starts for the layout, token ranges
for shards that mix reused and new tokens, and whole shards to hard-link.
Everything read from the parent is checked against its manifest first (sizes
and SHA-256), because copied tokens become part of the new version's hashes.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import logging
import os
import stat
import threading
from pathlib import Path
from typing import Any

import numpy as np

from ..catalog import Catalog, recorded_file_stats
from ..provenance import published_manifest_problems
from ..config import BuildConfig
from ..errors import ShardflowError, ValidationError
from ..formats.writer import ShardWriter
from ..manifest import MANIFEST_NAME, Manifest, ShardEntry, read_manifest, version_file
from ..shardset import ShardSet
from ..sources import InputFile
from ..tokenizers import Tokenizer
from .model import Boundaries, Reuse, ReusedInput

__all__ = [
    "NO_REUSE_ENV", "VAL_COUNT_NOTICE", "OLD_SCHEMA_NOTICE", "ManifestCache", "plan_reuse", "recorded_hashes", "ParentVersion",
    "open_parent",
]

log = logging.getLogger("shardflow.pipeline")

# Set to 1 to rebuild everything instead of reusing unchanged inputs' shards from the parent version.
NO_REUSE_ENV = "SHARDFLOW_NO_REUSE"

# The one line a rebuild with --val-count prints where it could have reused the parent's unchanged inputs.
VAL_COUNT_NOTICE = (
    "--val-count %d holds out an exact number of documents over the whole corpus, so this rebuild tokenizes "
    "every input again (%d unchanged since %s); --val-fraction rebuilds tokenize only new or changed files"
)


# The one line a build prints when its parent was written before per-input shards (manifest schema < 3).
OLD_SCHEMA_NOTICE = (
    "%s has manifest schema %d, whose shards mix inputs: this build tokenizes its unchanged inputs again, once; "
    "builds after it reuse them"
)


class ManifestCache:
    """Manifests of a dataset's versions, each read once while one build is planned (``plan_reuse`` and the
    fingerprints read the latest one)."""

    def __init__(self, cat: Catalog, name: str) -> None:
        self.cat, self.name = cat, name
        self._read: dict[str, Manifest] = {}

    def read(self, directory: Path | str) -> Manifest:
        key = str(directory)
        if key not in self._read:
            self._read[key] = read_manifest(directory)
        return self._read[key]

    def latest_inputs(self) -> list[dict[str, Any]]:
        """The ``inputs`` entries of the catalog's latest version ([]: none, or it cannot be read)."""
        latest = self.cat.latest(self.name)
        if not latest:
            return []
        try:
            return [e for e in self.read(self.cat.resolve(f"{self.name}@{latest}")).inputs if isinstance(e, dict)]
        except (ShardflowError, OSError, TypeError, ValueError, KeyError) as exc:
            log.warning("not taking input hashes from %s@%s: %s", self.name, latest, exc)
            return []


def recorded_hashes(inputs: list[InputFile], manifests: ManifestCache) -> list[InputFile]:
    """Objects on object storage that the latest version read: their SHA-256 as its manifest recorded it.

    An object with the same URL, size and storage identity (ETag, version id) as
    an input of the latest version is that version's bytes, so its hash is known
    without reading it, and the plan's build key is the content key: a rebuild of
    unchanged objects finds the published version, as a local rebuild does.
    """
    if all(inp.sha256 or not inp.identity for inp in inputs):
        return inputs
    recorded = manifests.latest_inputs()
    known = {(e.get("path"), e.get("size"), e.get("identity")): e.get("sha256") for e in recorded if e.get("identity")}
    return [
        dataclasses.replace(inp, sha256=str(known.get((inp.path, inp.size, inp.identity)) or ""))
        if inp.identity and not inp.sha256
        else inp
        for inp in inputs
    ]


def plan_reuse(
    config: BuildConfig,
    inputs: list[InputFile],
    tokenizer: Tokenizer,
    dtype: np.dtype,
    cat: Catalog,
    prefer: str | None,
    *,
    boundaries: Boundaries,
    manifests: ManifestCache | None = None,
) -> Reuse | None:
    """Which inputs an incremental build can take from the parent version unchanged (None: none).

    The parent is the catalog's latest version (or ``prefer``, the parent an
    interrupted run of this build had chosen). Its output-determining options
    must equal ours except for the inputs; an input is reused when the parent
    has one with the same name, size and SHA-256. With ``val_fraction`` (or no
    validation split) a document's split depends only on the seed, its input's
    name and its row, so a reused input's documents land in the same splits in
    the same order. ``val_count`` selects an exact number of documents over the
    whole corpus, so an added input can move held-out documents of unchanged ones:
    it never reuses, and says so in one line (``VAL_COUNT_NOTICE``) where it could have.
    """
    versions = [v.version for v in cat.versions(config.name)]
    version = prefer.partition("@")[2] if prefer else None
    if version not in versions:
        version = cat.latest(config.name)
    if not version:
        return None
    ref = f"{config.name}@{version}"
    try:
        directory = cat.resolve(ref)
        parent = manifests.read(directory) if manifests is not None else read_manifest(directory)
        parent_config = BuildConfig.from_dict(parent.config)
    except (ShardflowError, TypeError, ValueError, KeyError) as exc:
        log.warning("not reusing %s: %s", ref, exc)
        return None
    untrusted = parent_problem(cat, config.name, version, directory, parent)
    if untrusted:
        # Never a dead end: the inputs it holds are tokenized again, so this build's bytes are a full build's.
        log.warning("not reusing %s, tokenizing its inputs again: %s", ref, untrusted)
        return None
    if parent.schema_version < 3 or any("shards" not in e for e in parent.inputs):
        # Its shards are cut across inputs: none is one input's own to link. Tokenized again, once (said
        # before the options are compared: such a parent's unit size is usually the old default's).
        log.warning(OLD_SCHEMA_NOTICE, ref, parent.schema_version)
        return None
    ours = config.reuse_fields()
    theirs = parent_config.reuse_fields()
    info = parent.tokenized_info
    try:
        # The whole boundary: placement, and the BOS and EOS (text and id) the parent placed.
        parent_boundaries: Boundaries | None = Boundaries.from_section(parent.boundary)
    except (TypeError, ValueError, KeyError):
        parent_boundaries = None
    if (
        ours != theirs
        or parent.format_name != config.format
        or parent.dtype != dtype.name
        or info.get("family", "tiktoken") != tokenizer.spec.family
        or info.get("tokenizer_file_sha256", info.get("rank_file_sha256")) != tokenizer.spec.rank_file_sha256
        or info.get("vocab_size") != tokenizer.vocab_size
        or parent_boundaries != boundaries
    ):
        return None
    known = {(e["relname"], e["size"], e["sha256"]): e for e in parent.inputs if ReusedInput.REQUIRED <= set(e)}
    # An object on object storage is planned by its storage identity (no content hash yet): the same
    # object version (ETag or version id, and size) as the parent's, recorded in its manifest, is the same bytes.
    known.update(
        {(e["relname"], e["size"], f"object:{e['identity']}"): e for e in parent.inputs if ReusedInput.REQUIRED <= set(e) and e.get("identity")}
    )
    reused = {}
    for i, inp in enumerate(inputs):
        entry = known.get((inp.relname, inp.size, inp.key_identity))
        if entry is not None:
            reused[i] = ReusedInput.from_entry(entry)
    if not reused:
        return None
    if config.val_count:
        # An exact count can't be both exact and stable under added inputs: keep it exact, and say why.
        log.warning(VAL_COUNT_NOTICE, config.val_count, len(reused), ref)
        return None
    return Reuse(parent=ref, directory=str(directory), build_key=parent.build_key, inputs=reused)


def parent_problem(cat: Catalog, name: str, version: str, directory: Path, manifest: Manifest) -> str | None:
    """Why the parent ``name@version`` cannot be trusted without reading its shards (None: it can).

    The catalog is the root of trust: the parent's manifest must be the one its
    catalog entry recorded (``published_manifest_problems``, looked up by the
    reference, not by the manifest's name), and each of its shard files must be
    a regular file inside it with the size, inode and mtime recorded when it was
    published (``Catalog.files_record``). Nothing is read but that record: bytes
    changed in place with size and mtime restored are left to
    ``shardflow validate`` of the parent. Later, as the build reads the parent,
    a file modified after the parent's manifest was written is read and checked
    by SHA-256 again (``ParentVersion``), as for versions published before the record.
    """
    entry = cat.entry(name, version)
    if entry is None or cat.version_dir(entry) != Path(directory).resolve():
        return f"the catalog does not list {directory} as {name}@{version}"
    problems = published_manifest_problems(directory, manifest, cat)
    if problems:
        return problems[0]
    recorded = recorded_file_stats(cat, name, entry)
    if recorded is None:
        if entry.files_sha256:
            return f"its record of published files ({cat.files_record(name, version)}) does not match the catalog"
        return None
    for split in manifest.splits.values():
        for shard in split.shards:
            for fname in (shard.file, *(f.file for f in shard.files)):
                try:
                    path = version_file(directory, fname, "a shard file")
                    st = os.lstat(path)
                except (ShardflowError, OSError) as exc:
                    return str(exc)
                if stat.S_ISLNK(st.st_mode) or (st.st_size, st.st_ino, st.st_mtime_ns) != recorded.get(fname):
                    return f"{path} changed since {name}@{version} was published (size, inode or mtime)"
    return None


# Parent shards already checked against their SHA-256 in this process: (path, inode, size, mtime).
_verified: set[tuple[str, int, int, int]] = set()
_verified_lock = threading.Lock()


class ParentVersion:
    """The parent version of an incremental build, opened once and checked as it is read."""

    def __init__(self, reuse: Reuse) -> None:
        self.ref = reuse.parent
        self.directory = Path(reuse.directory)
        try:
            self.manifest: Manifest = read_manifest(self.directory)
        except (OSError, ShardflowError) as exc:
            raise ValidationError(
                f"{self.directory}: the parent version {self.ref} this build reuses cannot be read ({exc}); "
                f"removed meanwhile: run the build again (it plans from the catalog's latest); damaged: rebuild "
                f"without reusing it, {NO_REUSE_ENV}=1"
            ) from None
        if self.manifest.build_key != reuse.build_key:
            raise ValidationError(
                f"{self.directory}: the manifest of {self.ref} changed since this build was planned (another build "
                f"key); versions are immutable. Check it with `shardflow validate {self.ref}`"
            )
        # The parent's splits, read through the one shard-set type; every file is checked
        # against its manifest entry (``ShardInfo.entry``) before its bytes are used.
        self.splits = {split: ShardSet.from_manifest(self.directory, self.manifest, split) for split in self.manifest.splits}


    def damaged(self, path: Path, what: str) -> ValidationError:
        return ValidationError(
            f"{path}: {what}; the parent version {self.ref} this build reuses is damaged. Check it with "
            f"`shardflow validate {self.ref}`, or rebuild without reusing it: {NO_REUSE_ENV}=1"
        )

    def doc_starts(self, split: str, first: int, ntokens: int) -> np.ndarray:
        """Document starts (parent split coordinates) in tokens ``[first, first + ntokens)`` of the parent."""
        shards = self.splits[split]
        end = first + ntokens
        pieces = []
        k = int(np.searchsorted(shards.offsets, first, side="right")) - 1
        while k < shards.num_shards and shards.offsets[k] < end:
            info = shards.shards[k]
            assert info.entry is not None and info.index is not None
            try:
                raw = info.index.read_bytes()
            except OSError as exc:
                raise self.damaged(info.index, f"cannot read the index ({exc.strerror})") from None
            if hashlib.sha256(raw).hexdigest() != info.entry.index.sha256:
                raise self.damaged(info.index, "the index does not match its SHA-256 in the manifest")
            starts = shards.doc_starts(k, cache=False).astype(np.int64) + shards.offsets[k]
            pieces.append(starts[(starts >= first) & (starts < end)])
            k += 1
        return np.concatenate(pieces) if pieces else np.empty(0, dtype=np.int64)

    def published_ns(self) -> int | None:
        """When the parent was published (the mtime of its ``metadata.yaml``, written last); None if unreadable."""
        try:
            return (self.directory / MANIFEST_NAME).stat().st_mtime_ns
        except OSError:
            return None

    def untouched_since_publish(self, st: os.stat_result) -> bool:
        """Whether a parent file with stat ``st`` was not written to or replaced since the parent was published.

        Its bytes were validated then (size and SHA-256 against the manifest);
        the same rule lets a hard-linked parent shard go unread (``check.py``).
        Planning checked each against its size, inode and mtime recorded at
        publish (``parent_problem``); this re-check, by mtime against the
        manifest's, catches a file changed since.
        """
        published = self.published_ns()
        return published is not None and st.st_mtime_ns <= published

    def _verified_shard(self, path: Path, shard: ShardEntry, itemsize: int) -> int:
        """Check a parent shard against its manifest entry (size, and SHA-256 once per process); its header size.

        Tokens copied from the parent into a new shard are hashed as part of the new
        shard, so a damaged parent must be caught here, before its bytes are copied.
        A shard not modified since the parent was published is not read again
        (:meth:`untouched_since_publish`): that saved reading the parent's last
        shard in full on every incremental build that appends to it.
        """
        try:
            st = path.stat()
        except OSError as exc:
            raise self.damaged(path, f"cannot read the shard ({exc.strerror})") from None
        if st.st_size != shard.bytes:
            raise self.damaged(path, f"{st.st_size} bytes, but its manifest says {shard.bytes}")
        key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns)
        with _verified_lock:
            known = key in _verified
        if not known and not self.untouched_since_publish(st):
            with open(path, "rb") as f:
                digest = hashlib.file_digest(f, "sha256").hexdigest()
            if digest != shard.sha256:
                raise self.damaged(path, "the shard does not match its SHA-256 in the manifest")
            with _verified_lock:
                _verified.add(key)
        return shard.bytes - shard.tokens * itemsize

    def copy_range(self, writer: ShardWriter, buf: np.ndarray, split: str, start: int, count: int) -> None:
        """Append tokens ``[start, start + count)`` of the parent's ``split`` stream, across its shard boundaries."""
        shards = self.splits[split]
        if start + count > shards.num_tokens:
            raise self.damaged(self.directory, f"split {split!r} has fewer tokens than this build expects")
        pos, end = start, start + count
        while pos < end:
            k, within = shards.locate(pos)
            info = shards.shards[k]
            assert info.entry is not None
            header_bytes = self._verified_shard(info.path, info.entry, buf.dtype.itemsize)
            take = min(end, int(shards.offsets[k + 1])) - pos
            with open(info.path, "rb") as src:
                src.seek(header_bytes + within * buf.dtype.itemsize)
                writer.copy_from(src, take, buf)
            pos += take


@functools.lru_cache(maxsize=8)
def _open_parent(directory: str, parent: str, build_key: str) -> ParentVersion:
    return ParentVersion(Reuse(parent=parent, directory=directory, build_key=build_key, inputs={}))


def open_parent(reuse: Reuse) -> ParentVersion:
    """The parent version of ``reuse``, opened once per process.

    Cached by its build key: a published version never changes, and the key
    is checked against its manifest when it is opened.
    """
    return _open_parent(reuse.directory, reuse.parent, reuse.build_key)
