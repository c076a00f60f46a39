"""A published version's end: ``shardflow rm`` (remove a version) and ``shardflow gc`` (remove leftovers).

Removing ``NAME@vN`` (``remove_version``), under the dataset's catalog lock:

1. refuse a version that a remaining version names as its parent (unless
   ``force``), one that a running build is reading (its plan's parent), and
   one that a reader pins (``shardflow.pins``: a shared ``flock`` on its
   directory, which this takes exclusively without waiting; unless ``force``);
2. take its entry out of the catalog (``Catalog.remove``): the commit point;
3. rename its directory to ``.vN.removed`` beside it (quick, atomic);

then, without the lock, delete that directory and the version's record of
published files (``<catalog>/.published/NAME@vN.json``). A run killed anywhere
leaves either the version intact or a removed version whose files a rerun of
``rm NAME@vN`` (or ``gc``) deletes. Children never lose files with their parent:
they hold hard links, never symlinks (``publish`` refuses them).

``collect_garbage`` (``shardflow gc``) removes the staging directories that no
rerun would resume (``build.staging.remove_abandoned``) and what interrupted
removals left, but not a leftover a reader still pins (unless ``force``).
See docs/OPERATIONS.md ("Remove versions and leftovers").

Several catalogs may share one data root: neither ever touches a version directory,
a trash or a staging directory of another's (``_elsewhere``: a version's publisher
record, ``.vN.publisher.json``, names its catalog; a staging directory's plan does).
A version's publisher record is deleted last, once nothing of it is left.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from ._io import fsync_dir, is_stale_tmp
from .catalog import Catalog, RemovedVersion, default_data_root
from .provenance import catalog_id, publisher_record, read_publisher
from .config import check_name
from .errors import CatalogError, ConfigError, ShardflowError
from .manifest import MANIFEST_NAME, read_manifest
from .pins import exclusive, forget_pins, pinned

# The build package (``build.staging``: staging paths, their locks, ``remove_abandoned``) is imported where
# staging directories are looked at, so that ``rm`` of a dataset without any runs where only the runtime is installed.

__all__ = ["Removal", "Garbage", "remove_version", "dependents", "collect_garbage", "disk_usage", "trash_path"]

TRASH_SUFFIX = ".removed"
_TRASH = re.compile(r"^\.v[0-9]+\.removed$")
_STAGING = re.compile(r"^[0-9a-f]{16}$")


@dataclass(frozen=True, kw_only=True)
class Removal:
    """What ``remove_version`` did."""

    ref: str
    directory: Path
    """Where the version was."""
    freed: int
    """Bytes deleted that no other file linked (what the disk gets back)."""
    shared: int
    """Bytes of its files that other versions still link (hard links): not freed."""
    resumed: bool = False
    """An earlier removal took it out of the catalog; this one deleted what that one left, if anything (``left``)."""
    left: bool = True
    """Whether there was anything to delete (False: an earlier removal had finished)."""
    orphaned: tuple[str, ...] = ()
    """Remaining versions that named it as their parent (removed with ``force``)."""


@dataclass(frozen=True, kw_only=True)
class Garbage:
    """One thing ``collect_garbage`` removed (or, with ``dry_run``, would remove)."""

    path: Path
    why: str
    freed: int
    """Bytes that removing it frees (files linked from elsewhere not counted)."""
    kept: str = ""
    """Why it was not removed: a reader pins it (one line naming the holders); empty when it was (or would be)."""


def trash_path(directory: Path) -> Path:
    """The name a version directory is renamed to before it is deleted: ``.vN.removed`` beside it."""
    return directory.parent / f".{directory.name}{TRASH_SUFFIX}"


def _elsewhere(directory: Path, cat: Catalog, name: str, build_key: str = "") -> str | None:
    """Whose the version directory ``directory`` (or what is left of it) is, when not ``cat``'s ``name``: None if it is.

    Its publisher record says (``provenance.read_publisher``); without one (versions published before it
    existed), a ``build_key`` given must be its manifest's (in the directory, or its trash).
    """
    record = read_publisher(directory)
    if record is not None:
        if record["catalog"] != catalog_id(cat) or record["name"] != name:
            return f"the catalog {record['catalog']}'s {record['name']}@{record['version']}"
        if build_key and record["build_key"] != build_key:
            return f"another build (build key {record['build_key'][:16]}...)"
        return None
    for path in (directory, trash_path(directory)) if build_key else ():
        if (path / MANIFEST_NAME).is_file():
            try:
                found = read_manifest(path).build_key
            except ShardflowError:
                return None
            return None if found == build_key else f"another build (build key {str(found)[:16]}...)"
    return None


def _drop_record(directory: Path, cat: Catalog, name: str) -> None:
    """Delete the publisher record of ``directory`` once nothing of the version is left, if it is ``cat``'s."""
    if not directory.exists() and not trash_path(directory).exists() and _elsewhere(directory, cat, name) is None:
        publisher_record(directory).unlink(missing_ok=True)


def disk_usage(path: Path) -> tuple[int, int]:
    """``(freed, shared)`` bytes of the files under ``path``: those only it links, and those linked from elsewhere too.

    A file is counted once per inode; it is freed when every one of its links is under ``path``.
    """
    links: dict[tuple[int, int], list[int]] = {}  # (dev, inode) -> [size, links seen, links in all]
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                st = os.lstat(os.path.join(root, name))
            except FileNotFoundError:
                continue
            seen = links.setdefault((st.st_dev, st.st_ino), [st.st_size, 0, st.st_nlink])
            seen[1] += 1
    freed = sum(size for size, seen, total in links.values() if seen >= total)
    shared = sum(size for size, seen, total in links.values() if seen < total)
    return freed, shared


def dependents(cat: Catalog, name: str, version: str) -> list[str]:
    """The remaining versions of ``name`` whose parent is ``name@version`` (incremental builds, embeddings)."""
    ref = f"{name}@{version}"
    return [f"{name}@{v.version}" for v in cat.versions(name) if v.parent == ref and v.version != version]


def _parse(ref: str, cat: Catalog) -> tuple[str, str]:
    """``NAME@vN`` (or ``NAME@N``) as ``(name, "vN")``; ``latest`` or no version is refused: name it."""
    name, _, version = ref.partition("@")
    check_name(name)
    if name not in cat.datasets():
        known = ", ".join(cat.datasets()) or "none"
        raise CatalogError(f"no dataset {name!r} in the catalog {cat.path} (datasets: {known})")
    listed = ", ".join(v.version for v in cat.versions(name)) or "none"
    if not version or version == "latest":
        raise ConfigError(f"{ref}: name the version to remove, NAME@vN ({name}'s versions: {listed})")
    return name, f"v{version}" if version.isdigit() else version


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def _plan_parent(staging: Path) -> str | None:
    """The parent version the build staged in ``staging`` reads (its plan's), if any."""
    from .pipeline.staging import Staging

    try:
        plan = json.loads(Staging(staging).plan_file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(plan, dict):
        return None
    reuse = plan.get("reuse")
    parent = reuse.get("parent") if isinstance(reuse, dict) else None
    return parent if isinstance(parent, str) else None


def _locked(staging: Path, name: str) -> bool:
    """Whether a live build holds the lock of ``staging`` (probed without waiting)."""
    from .pipeline.staging import Staging, staging_lock

    try:
        with staging_lock(Staging(staging), name, timeout=0):
            return False
    except ShardflowError:
        return True


def _refuse_running_builds(dataset_dir: Path, name: str, ref: str, cat: Catalog) -> None:
    """Refuse to remove ``ref`` while a running build links or copies its shards (the plan's parent)."""
    from .pipeline.staging import staged_elsewhere

    parent = dataset_dir / ".staging"
    if not parent.is_dir():
        return
    for staging in sorted(parent.iterdir()):
        if (staging.is_dir() and _plan_parent(staging) == ref and not staged_elsewhere(staging, cat)
                and _locked(staging, name)):  # (another catalog's build reads its own NAME@vN)
            raise CatalogError(
                f"{ref} is being read by a running build ({staging}), whose parent it is; wait for that build to "
                "finish, then run shardflow rm again"
            )


def _to_trash(directory: Path) -> Path:
    """Rename a version directory to its trash name (if it is still there); returns the trash name."""
    trash = trash_path(directory)
    if directory.is_dir():
        if trash.exists():  # an older leftover under the same name: gone first, so the rename can land
            _delete(trash)
        os.replace(directory, trash)
        fsync_dir(directory.parent)
    return trash


def _delete(path: Path) -> None:
    """Delete a directory tree; a file already gone (another ``rm`` or ``gc`` at work) is not an error."""

    def gone_already(_function: Any, _path: str, exc: Any) -> None:
        exc = exc if isinstance(exc, BaseException) else exc[1]  # onexc gets the exception; onerror, exc_info
        if not isinstance(exc, FileNotFoundError):
            raise exc

    if path.exists():
        if sys.version_info >= (3, 12):
            shutil.rmtree(path, onexc=gone_already)
        else:
            shutil.rmtree(path, onerror=gone_already)


def _check_version_dir(directory: Path, ref: str) -> None:
    """Never delete a directory that is not a version: the catalog's path must hold a manifest."""
    if directory.is_dir() and not (directory / MANIFEST_NAME).is_file():
        raise CatalogError(
            f"{directory}: the catalog places {ref} here, but it holds no {MANIFEST_NAME}, so it is not deleted; "
            "check the catalog entry's path, and remove the directory by hand if it is the version's"
        )


def remove_version(
    ref: str, *, catalog: str | os.PathLike[str] | None = None, force: bool = False
) -> Removal:
    """Remove the published version ``ref`` (``NAME@vN``): its catalog entry, then its directory.

    Refused, in one message: a version another remaining version names as its parent (unless
    ``force``: theirs are hard links, they keep working), one a running build reads, one a reader
    pins (unless ``force``: its readers then fail at the next shard they map, saying the version
    was removed), and an unknown one (the message lists the versions). Rerun after an interruption,
    it finishes the job.
    """
    cat = Catalog(catalog)
    name, version = _parse(ref, cat)
    ref = f"{name}@{version}"
    orphaned: list[str] = []
    with cat.lock(name):
        entry = cat.entry(name, version)
        gone = [g for g in cat.removed(name) if g.version == version]
        if entry is None and not gone:
            listed = ", ".join(v.version for v in cat.versions(name)) or "none"
            raise CatalogError(f"no version {version!r} of {name!r} in the catalog {cat.path} (versions: {listed})")
        directory = cat.version_dir(entry if entry is not None else gone[-1])
        other = _elsewhere(directory, cat, name, entry.build_key if entry is not None else gone[-1].build_key)
        if other is not None and entry is not None:
            raise CatalogError(
                f"{directory}: the catalog places {ref} here, but the directory is {other} "
                f"({publisher_record(directory)}), so it is not deleted; check the catalog entry's path"
            )
        if other is not None:  # an earlier removal finished; the name now holds another catalog's version
            cat.files_record(name, version).unlink(missing_ok=True)
            return Removal(ref=ref, directory=directory, freed=0, shared=0, resumed=True, left=False)
        _check_version_dir(directory, ref)
        if entry is not None:
            orphaned = dependents(cat, name, version)
            if orphaned and not force:
                many = len(orphaned) > 1
                raise CatalogError(
                    f"{ref} is the parent of {', '.join(orphaned)}, which remain{'' if many else 's'}. "
                    f"{'Their' if many else 'Its'} shards are hard links and would keep working, but "
                    f"{'their' if many else 'its'} lineage would name a removed version: remove "
                    f"{'them' if many else 'it'} first, or pass --force to remove {ref} anyway"
                )
            _refuse_running_builds(directory.parent, name, ref, cat)
        left = directory.is_dir() or trash_path(directory).is_dir()
        freed, shared = disk_usage(directory if directory.is_dir() else trash_path(directory))
        # Held exclusively from here to the rename: a reader that pins it meanwhile waits, then finds it removed.
        with exclusive(directory if directory.is_dir() else trash_path(directory), ref, force=force):
            if entry is not None:
                cat.remove(name, version, removed_at=_now())  # the commit point: no reader resolves it from here on
            trash = _to_trash(directory)  # under the lock: no publish adopts it as an orphan meanwhile
    _delete(trash)
    forget_pins(directory)
    cat.files_record(name, version).unlink(missing_ok=True)
    _drop_record(directory, cat, name)  # last: until now it kept the name vN from any other catalog
    return Removal(ref=ref, directory=directory, freed=freed, shared=shared, resumed=entry is None, left=left,
                   orphaned=tuple(orphaned))


def _dataset_dirs(root: Path, cat: Catalog) -> Iterator[tuple[str, Path]]:
    """``(name, <root>/<name>)`` of every dataset the catalog lists or the data root holds a directory of."""
    names = set(cat.datasets())
    if root.is_dir():
        for d in root.iterdir():
            try:
                if d.is_dir() and check_name(d.name):
                    names.add(d.name)
            except ConfigError:
                continue  # not a dataset's directory
    for name in sorted(names):
        yield name, root / name


def _removed_leftovers(cat: Catalog, name: str, dataset_dir: Path) -> list[tuple[Path, str]]:
    """What interrupted removals left: a removed version's directory or its trash; trash in the dataset directory."""
    found: dict[Path, str] = {}
    listed = {cat.version_dir(v) for v in cat.versions(name)}
    removed: list[RemovedVersion] = cat.removed(name)
    for gone in removed:
        directory = cat.version_dir(gone)
        if _elsewhere(directory, cat, name, gone.build_key) is not None:
            continue  # the name was given again by another catalog that shares the data root: its version
        if directory.is_dir() and directory not in listed and (directory / MANIFEST_NAME).is_file():
            found[directory] = f"{name}@{gone.version}, removed from the catalog by an interrupted shardflow rm"
        if trash_path(directory).is_dir():
            found[trash_path(directory)] = f"what an interrupted shardflow rm of {name}@{gone.version} left"
    if dataset_dir.is_dir():
        for path in dataset_dir.iterdir():
            if _TRASH.match(path.name) and path.is_dir() and path not in found:
                if _elsewhere(dataset_dir / path.name[1:-len(TRASH_SUFFIX)], cat, name) is not None:
                    continue  # another catalog's interrupted removal: its own rm or gc finishes it
                found[path] = "what an interrupted shardflow rm left"
    return sorted(found.items())


def _abandoned_staging(cat: Catalog, name: str, dataset_dir: Path) -> list[tuple[Path, str]]:
    """The staging directories ``remove_abandoned`` removes now (the same rules), without removing them."""
    from .pipeline.staging import Staging, never_resumed, staged_elsewhere

    parent = dataset_dir / ".staging"
    if not parent.is_dir():
        return []
    published = {entry.build_key for entry in cat.versions(name)}
    found = []
    for path in sorted(parent.iterdir()):
        if not path.is_dir() or staged_elsewhere(path, cat):  # (another catalog's build: the data root is shared)
            continue
        if is_stale_tmp(path):
            found.append((path, "a staging directory whose deleting was interrupted"))
        elif _STAGING.match(path.name):
            why = never_resumed(Staging(path), published, cat)
            if why is not None and not _locked(path, name):
                found.append((path, f"a staging directory no rerun resumes: {why}"))
    return found


def collect_garbage(
    *, data_root: str | os.PathLike[str] | None = None, catalog: str | os.PathLike[str] | None = None,
    dry_run: bool = False, force: bool = False,
) -> list[Garbage]:
    """Remove abandoned staging directories and what interrupted removals left; returns what was removed.

    ``dry_run``: remove nothing, return what would be removed. Staging directories that a rerun
    of their build would resume are kept, and so is every one whose build holds its lock. A removed
    version's directory that a reader still pins is kept and returned with ``kept`` saying so (unless
    ``force``).
    """
    from .pipeline.staging import remove_abandoned  # the build package: only where there is staging to look at

    # Incomplete multipart uploads are a bucket data root's leftovers: collected here once versions can be written to one.
    cat = Catalog(catalog)
    root = default_data_root(data_root)
    result: list[Garbage] = []
    for name, dataset_dir in _dataset_dirs(root, cat):
        leftovers = []
        for path, why in _removed_leftovers(cat, name, dataset_dir):
            kept = None if force else pinned(path, str(path))
            result.append(Garbage(path=path, why=why, freed=0 if kept else disk_usage(path)[0], kept=kept or ""))
            if not kept:
                leftovers.append((path, why))
        staged = {path: why for path, why in _abandoned_staging(cat, name, dataset_dir)}
        sizes = {path: disk_usage(path)[0] for path in staged}
        if dry_run:
            result += [Garbage(path=p, why=why, freed=sizes[p]) for p, why in staged.items()]
            continue
        if leftovers:
            with cat.lock(name):  # as rm: renamed under the lock, deleted after
                trash = [_to_trash(p) if not _TRASH.match(p.name) else p for p, _ in leftovers]
            for path in trash:
                _delete(path)
                forget_pins(path)
            for gone in cat.removed(name):
                cat.files_record(name, gone.version).unlink(missing_ok=True)
                _drop_record(cat.version_dir(gone), cat, name)
        for path in remove_abandoned(dataset_dir, cat, name):
            result.append(Garbage(path=path, why=staged.get(path, "a staging directory no rerun resumes"),
                                  freed=sizes.get(path, 0)))
    return result
