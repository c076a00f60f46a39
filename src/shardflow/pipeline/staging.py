"""The staging directory of a build: every path in it, its lock, and cleaning up after killed runs.

``<data_root>/<name>/.staging/<16 hex digits>/`` (``staging_name``: of the build key and the catalog's
resolved path, so two catalogs over one data root never share one): ``plan.json``, the units'
pieces and markers under ``parts/``, the layout's and the shards' markers under ``layout/``,
``embed.json``, ``out/``, the future version directory, and ``publish.json``, the version name
``publish`` gave it (the proof that a directory ``vN`` is this build's, if its publish is killed
before the catalog entry). Which stage writes and reads each file:
docs/ARCHITECTURE.md ("The staging directory"). Each file is written under a temporary name and
renamed into place, the ``.json`` marker of a step last, so a run killed anywhere resumes where it
stopped. ``<staging>.lock`` (beside the directory) admits one run at a time.

A staging directory lives until its build is published (``publish`` discards it)
and is resumed by a rerun until then. One that can never be resumed is removed
when any build of the dataset starts (``remove_abandoned``): its build key is
published, or this code cannot resume its plan; never one whose lock is held, nor one
whose plan names another catalog.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np

from .._io import atomic_write_text, file_identity, fsync_dir, is_stale_tmp, load_npy, tmp_path_for
from ..catalog import Catalog, file_lock
from ..provenance import catalog_id, read_publisher
from ..errors import ConfigError, ShardflowError
from ..faults import fault
from ..formats import bosidx
from ..manifest import SCHEMA_VERSION, read_manifest
from .keys import published_build
from .model import BUILD_FORMAT_VERSION, BuildPlan, UnitResult

__all__ = [
    "Staging",
    "staging_name",
    "staged_elsewhere",
    "DOC_DTYPE",
    "SEGMENT_DTYPE",
    "as_plan",
    "load_plan",
    "read_old_plan",
    "write_plan",
    "staging_lock",
    "build_lock",
    "sweep_stale_tmp",
    "adopt_orphan",
    "publish_record",
    "reset_staging",
    "shard_check_record",
    "discard_staging",
    "remove_abandoned",
]

log = logging.getLogger("shardflow.pipeline")

# parts/unit-N.docs.npy: one row per document of the unit.
DOC_DTYPE = np.dtype([("length", "<i8"), ("row", "<i8"), ("score", "<u8")])
# layout/<split>.segments.npy: a segment's ``unit`` is a work unit (>= 0) whose part file holds
# the tokens, or -1 - SPLITS.index(split) for a range of the parent version's split stream
# (an input reused by an incremental build).
SEGMENT_DTYPE = np.dtype([("unit", "<i8"), ("start", "<i8"), ("length", "<i8")])


@dataclass(frozen=True)
class Staging:
    """The paths of one staging directory (nothing is read or written by this class)."""

    root: Path

    def __init__(self, root: str | os.PathLike[str]) -> None:
        object.__setattr__(self, "root", Path(root))

    @property
    def plan_file(self) -> Path:
        return self.root / "plan.json"

    @property
    def parts(self) -> Path:
        return self.root / "parts"

    @property
    def layout_dir(self) -> Path:
        return self.root / "layout"

    @property
    def layout_file(self) -> Path:
        return self.layout_dir / "layout.json"

    @property
    def out(self) -> Path:
        return self.root / "out"

    @property
    def card_file(self) -> Path:
        """The stats-card stage's marker (``pipeline/card_stage.py``)."""
        return self.layout_dir / "card.json"

    @property
    def embed_file(self) -> Path:
        return self.root / "embed.json"

    @property
    def publish_file(self) -> Path:
        """``publish.json``: the catalog (resolved path), version name and build key ``publish`` gave ``out/``,
        written before ``out/`` is renamed to ``vN`` (``adopt_orphan`` takes back only that directory)."""
        return self.root / "publish.json"

    @property
    def lock_file(self) -> Path:
        return self.root.parent / f"{self.root.name}.lock"

    @property
    def sends_file(self) -> Path:
        """``sends.json``: where a build to a bucket on workers that share no filesystem puts its files
        (``bucket/remote_jobs.py`` ``Sends``). With it, this directory holds the jobs' records only: their
        files went to the bucket, each record committed after its upload."""
        return self.root / "sends.json"

    @property
    def bucket_file(self) -> Path:
        """``bucket.json``: ``{"data_root_url": ...}`` of a build to a bucket, built in a scratch mirror of it (its
        manifest's ``dataset_path`` is then the version's URL, not the mirror's path)."""
        return self.root / "bucket.json"

    def data_root_url(self) -> str | None:
        try:
            return str(json.loads(self.bucket_file.read_text())["data_root_url"])
        except FileNotFoundError:
            return None

    @property
    def sends(self) -> bool:
        """Whether this build's files go to a bucket from the workers that wrote them (``sends_file``)."""
        return self.sends_file.exists()

    def unit_files(self, unit: int) -> tuple[Path, Path, Path]:
        """``(directory of its pieces, document table, done marker)`` of work unit ``unit``."""
        stem = self.parts / f"unit-{unit:06d}"
        return stem, stem.with_suffix(".docs.npy"), stem.with_suffix(".json")

    def piece(self, unit: int, stream: str, p: int, extension: str) -> Path:
        """Piece ``p`` of ``stream`` that work unit ``unit`` wrote."""
        return self.unit_files(unit)[0] / f"{stream}-{p:06d}.{extension}"

    def segments(self, split: str) -> Path:
        return self.layout_dir / f"{split}.segments.npy"

    def starts(self, split: str) -> Path:
        return self.layout_dir / f"{split}.starts.i64"

    def shard_result(self, split: str, k: int) -> Path:
        return self.layout_dir / f"{split}-{k:06d}.shard.json"

    def shard_check(self, split: str, k: int) -> Path:
        """The record of shard ``k``'s checks, written by its write-shard job (``pipeline/check.py``)."""
        return self.layout_dir / f"{split}-{k:06d}.valid.json"

    def shard_checked(self, split: str, k: int, entry: Any) -> bool:
        """Whether shard ``k`` passed its checks as the manifest entry ``entry`` describes it, and its files are still
        the ones checked: the size, inode and mtime recorded then, not a byte read (sent to a bucket: its record,
        committed after the upload, is the proof)."""
        fault("validate", self.out / entry.file)
        try:
            record = json.loads(self.shard_check(split, k).read_text())
            if self.sends and record == entry.to_dict():
                return True  # an older run's record of a shard it read back (its files are on the bucket, not here)
            if not isinstance(record, dict) or record.get("entry") != entry.to_dict() or record.get("checked") is None:
                return False
            if self.sends:
                return True
            files = record.get("files")
            return isinstance(files, dict) and all(
                files.get(name) == list(file_identity(self.out / name)) for name in (entry.file, *(f.file for f in entry.files))
            )
        except (OSError, ValueError):
            return False

    def unit_result(self, unit: int) -> UnitResult | None:
        """Unit ``unit``'s recorded counts, or None when it has none (see ``unit_in_place``)."""
        try:
            return UnitResult.from_dict(json.loads(self.unit_files(unit)[2].read_text()))
        except FileNotFoundError:
            return None

    def unit_in_place(self, result: UnitResult, extension: str) -> bool:
        """Whether a recorded unit's files are still there: its document table, and its pieces at their recorded sizes
        (not here when the build sends its files from the workers: they stay with the worker that wrote them)."""
        try:
            if self.sends:
                return self.unit_files(result.unit)[1].exists()
            for stream, pieces in result.pieces.items():
                for p, piece in enumerate(pieces):
                    path = self.piece(result.unit, stream, p, extension)
                    if path.stat().st_size != piece.bytes or bosidx.index_path(path).stat().st_size != piece.index_bytes:
                        return False
            return self.unit_files(result.unit)[1].exists()
        except FileNotFoundError:
            return False

    def unit_docs(self, unit: int) -> np.ndarray:
        return load_npy(self.unit_files(unit)[1], mmap_mode="r")


def staging_name(build_key: str, catalog: Catalog | str | os.PathLike[str]) -> str:
    """The name of a build's staging directory: 16 hex digits of the SHA-256 of its build key and its catalog's
    resolved path. One per build and catalog: a build of the same inputs for another catalog over the same data
    root never resumes (or publishes into the catalog of) this one's."""
    return hashlib.sha256(f"{build_key}\0{catalog_id(catalog)}".encode()).hexdigest()[:16]


def staged_elsewhere(root: Path, cat: Catalog) -> bool:
    """Whether the staging directory ``root`` is another catalog's build: its plan names another catalog.

    Such a directory is never removed, reset or resumed from ``cat`` (a plan that names no catalog, or none,
    is judged as before)."""
    try:
        plan = json.loads(Staging(root).plan_file.read_text())
    except (OSError, ValueError):
        return False
    named = plan.get("catalog") if isinstance(plan, dict) else None
    if not isinstance(named, str) or not named:
        return False
    try:
        return catalog_id(named) != catalog_id(cat)
    except ShardflowError:
        return True


def shard_check_record(entry: Any, checked: str, files: dict[str, Any]) -> dict[str, Any]:
    """What a shard's check record holds: the manifest entry checked (files, sizes, SHA-256s), how it was checked
    (``pipeline/check.py``: ``written``, ``parent``, ``read``), and each file's ``[bytes, inode, mtime_ns]`` then."""
    return {"entry": entry.to_dict(), "checked": checked, "files": {name: list(i) for name, i in files.items()}}


def load_plan(staging: str | os.PathLike[str]) -> BuildPlan:
    """The plan of a staging directory, as ``plan.json`` records it."""
    path = Staging(staging).plan_file
    if not path.exists():
        raise ConfigError(f"{staging}: no plan.json; run plan_build first")
    return BuildPlan.from_dict(json.loads(path.read_text()))


def as_plan(plan: BuildPlan | str | os.PathLike[str]) -> BuildPlan:
    """Stages take the plan itself (orchestrators pass it along) or, for convenience, its staging path."""
    return plan if isinstance(plan, BuildPlan) else load_plan(plan)


def write_plan(plan: BuildPlan) -> None:
    atomic_write_text(Staging(plan.staging).plan_file, json.dumps(plan.to_dict(), indent=1))


def read_old_plan(staging: Staging, key: str) -> dict[str, Any] | None:
    """The plan an earlier run of this build left in its staging directory, if any."""
    if not staging.plan_file.exists():
        return None
    try:
        old = json.loads(staging.plan_file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(old, dict) or old.get("build_key") != key or old.get("build_format_version") != BUILD_FORMAT_VERSION:
        return None
    if old.get("manifest_schema") != SCHEMA_VERSION:  # its out/ has another layout
        return None
    return old


def staging_lock(staging: Staging, name: str, timeout: float | None) -> contextlib.AbstractContextManager[None]:
    return file_lock(staging.lock_file, timeout=timeout, what=f"the build of {name!r} ({staging.root})", remove=True)


@contextlib.contextmanager
def build_lock(plan: BuildPlan, *, timeout: float | None = 0) -> Iterator[BuildPlan]:
    """Hold the lock of this build (its staging directory) while running its steps.

    One process at a time works on a staging directory: a second run of the same
    build fails at once with a message saying another is running (``timeout=0``,
    the default), or waits (``timeout`` seconds, ``None``: no limit). Builds of
    the same dataset with other inputs or options have other staging
    directories and run side by side; the catalog lock orders their publishes.
    ``build`` and the Prefect flow hold it from after ``plan_build`` to the end.

    Yields the plan as it is on disk now (an earlier holder may have re-planned
    it), with ``existing`` set if the build was published while this one
    waited: the caller then has nothing to do.
    """
    staging = Staging(plan.staging)
    with staging_lock(staging, plan.config.name, timeout):
        found = published_build(plan)  # (by the content key too, for a plan that left local files unhashed)
        if found is not None:
            yield dataclasses.replace(plan, existing=f"{plan.config.name}@{found.version}")
        elif staging.plan_file.exists():
            yield dataclasses.replace(load_plan(staging.root), existing=None)
        else:
            yield plan


def sweep_stale_tmp(staging: Staging) -> None:
    """Delete temporary files of killed writers (``.NAME.tmp-PID`` of a process that is gone).

    Everywhere in the staging directory, and directly in the dataset directory
    (the input fingerprint cache).
    """
    found = list(staging.root.rglob(".*.tmp-*")) if staging.root.is_dir() else []
    found += list(staging.root.parent.parent.glob(".*.tmp-*"))
    for stray in found:
        if is_stale_tmp(stray):
            stray.unlink(missing_ok=True)


def publish_record(staging: Staging, cat: Catalog, name: str) -> dict[str, str] | None:
    """The version name ``publish`` gave this staging directory's ``out/`` for ``cat`` (``publish.json``:
    ``catalog``, ``name``, ``version``, ``build_key``), or None: none recorded, or recorded for another catalog."""
    try:
        record = json.loads(staging.publish_file.read_text())
    except (OSError, ValueError):
        return None
    fields = ("catalog", "name", "version", "build_key")
    if not isinstance(record, dict) or not all(isinstance(record.get(k), str) for k in fields):
        return None
    if record["catalog"] != catalog_id(cat) or record["name"] != name or not re.fullmatch(r"v[0-9]+", record["version"]):
        return None
    return {k: record[k] for k in fields}


def adopt_orphan(cat: Catalog, plan: BuildPlan, dataset_dir: Path) -> None:
    """Take back this build's version directory if a killed publish renamed it but never entered it.

    It goes back to ``out/`` of the staging directory (which the rename
    emptied), so the rerun validates and publishes it again instead of
    redoing it. An unlisted directory was never visible: the catalog entry is
    the commit point. Only a directory proven this build's is taken: the
    ``vN`` that this staging directory's ``publish.json`` names for this
    catalog, which this catalog neither lists nor removed, whose publisher
    record (``.vN.publisher.json``) is that same claim, and whose manifest has
    the recorded build key. Any other unlisted directory (another build's,
    another catalog's) is never moved; ``publish`` steps past it.
    """
    staging = Staging(plan.staging)
    out = staging.out
    if out.exists() or not dataset_dir.is_dir():
        return
    name = plan.config.name
    with cat.lock(name):
        recorded = publish_record(staging, cat, name)
        if recorded is None:
            return
        d = dataset_dir / recorded["version"]
        taken = {v.version for v in cat.versions(name)} | {v.version for v in cat.removed(name)}
        if recorded["version"] in taken or d.is_symlink() or not d.is_dir() or read_publisher(d) != recorded:
            return
        try:
            orphan = read_manifest(d)
        except ShardflowError:
            return
        if orphan.build_key == recorded["build_key"]:
            os.replace(d, out)
            fsync_dir(dataset_dir)
            log.info("%s: this build's version, left unpublished by an interrupted publish; publishing it again", d)


def reset_staging(staging: Staging) -> None:
    """Empty a staging directory whose plan changed: nothing in it can be trusted.

    The old plan goes first, so that a run killed while this is deleted starts afresh too.
    """
    staging.plan_file.unlink(missing_ok=True)
    staging.embed_file.unlink(missing_ok=True)
    for sub in (staging.parts, staging.layout_dir, staging.out):
        shutil.rmtree(sub, ignore_errors=True)
    sweep_stale_tmp(staging)


def discard_staging(root: Path) -> None:
    """Delete a staging directory: renamed first (``.KEY.tmp-PID``), so that a process killed while deleting
    leaves a temporary directory that the next ``remove_abandoned`` removes, never half a staging directory."""
    trash = tmp_path_for(root)
    try:
        os.replace(root, trash)
    except FileNotFoundError:
        return
    except OSError:  # (a leftover of this pid's own in the way): delete in place
        trash = root
    shutil.rmtree(trash, ignore_errors=True)


def never_resumed(staging: Staging, published: set[str], cat: Catalog | None = None) -> str | None:
    """Why the build of ``staging`` will never be resumed, or None if a rerun of it may resume it.

    ``published``: the build keys of the dataset's versions in ``cat``. A staging directory whose
    plan names another catalog is that catalog's to judge: None.
    """
    if cat is not None and staged_elsewhere(staging.root, cat):
        return None
    try:
        old = json.loads(staging.plan_file.read_text())
    except (OSError, ValueError):
        old = None
    if not isinstance(old, dict):  # no plan: being written, only begun (kept), or left by a killed clean-up
        names = {staging_name(key, cat) if cat is not None else key[:16] for key in published}
        return "its build is published" if staging.root.name in names else None
    try:  # the key publish recorded (publish.json): the content's, where the plan left local files unhashed
        recorded = json.loads(staging.publish_file.read_text()).get("build_key")
    except (OSError, ValueError, AttributeError):
        recorded = None
    if old.get("build_key") in published or recorded in published:
        return "its build is published"
    versions = (old.get("build_format_version"), old.get("manifest_schema"))
    ours = (BUILD_FORMAT_VERSION, SCHEMA_VERSION)
    if all(isinstance(v, int) for v in versions) and versions != ours and all(v <= o for v, o in zip(versions, ours)):
        return "an older shardflow staged it, and this one does not resume its plans"  # (a rerun would empty it)
    return None


def remove_abandoned(dataset_dir: Path, cat: Catalog, name: str, *, keep: Path | None = None) -> list[Path]:
    """Remove the staging directories of ``name``'s builds that will never be resumed; returns them.

    Removed: one whose build key is published (a publish, or its clean-up, was killed after the
    catalog entry: a rerun would only report the version), one whose plan this shardflow cannot
    resume (a rerun would empty it), and a discarded one whose deleting process died. Kept: ``keep``
    (the caller's own), and every other one, which a rerun of its build resumes; and one whose lock
    is held is never touched (checked with the lock, without waiting), nor one whose plan names another
    catalog (``staged_elsewhere``: several catalogs may share a data root).
    """
    parent = dataset_dir / ".staging"
    if not parent.is_dir():
        return []
    published = {entry.build_key for entry in cat.versions(name)}
    removed: list[Path] = []
    for path in sorted(parent.iterdir()):
        if is_stale_tmp(path) and path.is_dir():  # a discard_staging killed midway
            if staged_elsewhere(path, cat):
                continue  # another catalog's build: its own builds and gc finish it
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
            continue
        if not re.fullmatch(r"[0-9a-f]{16}", path.name) or not path.is_dir() or (keep is not None and path == Path(keep)):
            continue
        staging = Staging(path)
        if never_resumed(staging, published, cat) is None:
            continue
        try:
            with file_lock(staging.lock_file, timeout=0, what=f"the build of {name!r} ({path})", remove=True):
                why = never_resumed(staging, published, cat)  # again, now that no run can start on it
                if why is None:
                    continue
                trash = tmp_path_for(path)
                os.replace(path, trash)  # quick, under the lock; the deleting is not
        except ShardflowError:
            continue  # a live process holds its lock
        except OSError:
            continue
        shutil.rmtree(trash, ignore_errors=True)
        log.info("%s: removed this staging directory: %s", path, why)
        removed.append(path)
    return removed
