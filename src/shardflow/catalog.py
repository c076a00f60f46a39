"""The catalog: which versions of which datasets are published, and where.

One YAML file per dataset, ``<catalog>/<name>.yaml``, lists its versions in
publication order (location, totals, parent, build key) and names the
``latest``. It is the last thing a publish writes: a version is visible once its
catalog entry exists, and not before. Updates take an exclusive ``flock`` on
``<catalog>/.<name>.lock`` and replace the file atomically, so concurrent
publishers never corrupt it. A version taken out by ``shardflow rm``
(``shardflow.lifecycle``) stays listed under ``removed``: its name is never given
again, and a reference to it says it was removed.

References: ``NAME@VERSION`` (``wikitext@v3``, or ``wikitext@3``), ``NAME@latest``,
``NAME`` (same as latest), or the path of a version directory or its
``metadata.yaml``.

Catalog files are read with the bounded safe loader (``_yaml``: size limits,
no alias bombs) and checked field by field; a malformed one is refused with
one message naming the file and the field.

A published version's ``metadata.yaml`` is checked against the SHA-256 its
catalog entry recorded (``provenance.published_manifest_problems``) whenever it is opened.

Several catalogs may share one data root: which one published a version
directory, and whether it vouches for it, is ``shardflow.provenance``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterator

import yaml

from ._io import atomic_write_text, is_stale_tmp, sha256_file
from ._yaml import YamlRefused, describe_yaml_error, load_yaml_file
from .config import check_name
from .errors import CatalogError, ConfigError
from .faults import fault
from .manifest import MANIFEST_NAME, Manifest

__all__ = [
    "CATALOG_SCHEMA_VERSION",
    "VersionEntry",
    "RemovedVersion",
    "Catalog",
    "default_catalog",
    "default_data_root",
    "resolve_ref",
    "file_lock",
    "FILE_STATS_NAME",
    "recorded_file_stats",
    "is_catalog_ref",
    "highest_version",
    "resolve_version",
    "asked_name_problem",
]

FILE_STATS_NAME = ".published"
"""The catalog's directory of records ``NAME@VERSION.json``: ``{"files": {FILE: [size, inode, mtime_ns]}}``
of each version's shard files as published (kept beside the catalog, so version directories are unchanged)."""

CATALOG_SCHEMA_VERSION = 1
MAX_CATALOG_BYTES = 64 << 20
"""The largest catalog file read (one entry is about 400 bytes)."""


# ``scheme:/`` or ``scheme://``: a URL, also after ``Path()`` collapsed its ``//`` (a one-letter scheme
# would be a Windows drive, ``C:/``).
_URL_LIKE = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]+:/")


def _local_dir(value: str | os.PathLike[str] | None, env: str, default: str, what: str) -> Path:
    """``value``, else ``$env``, else ``./default``, absolute; a URL is refused (see ``default_data_root``)."""
    given, source = (value, "") if value else (os.environ.get(env), f"${env}=")
    text = os.fspath(given) if given else default
    if _URL_LIKE.match(text):
        hint = f"unset {env}, or give" if source else "give"
        raise ConfigError(
            f"{source}{text}: the {what} must be a local or shared filesystem path, not a URL: the library builds "
            f"and publishes in a local directory (to publish to a bucket: shardflow build --data-root s3://BUCKET/data "
            f"--catalog s3://BUCKET/catalog, or shardflow push); {hint} a directory instead, e.g. /mnt/shared/{default}"
        )
    return Path(text).expanduser().absolute()


def default_catalog(catalog: str | os.PathLike[str] | None = None) -> Path:
    """``catalog``, else ``$SHARDFLOW_CATALOG``, else ``./manifests``; a URL is refused (``ConfigError``)."""
    return _local_dir(catalog, "SHARDFLOW_CATALOG", "manifests", "catalog")


def default_data_root(data_root: str | os.PathLike[str] | None = None) -> Path:
    """``data_root``, else ``$SHARDFLOW_DATA_ROOT``, else ``./data``.

    A URL (``s3://bucket/data``) is refused with a ``ConfigError``: ``Path()`` would make it the
    relative path ``s3:/bucket/data`` and a build would write a local directory named ``s3:``.
    A build to a bucket runs in a local scratch mirror and pushes (``shardflow.bucket.build``).
    """
    return _local_dir(data_root, "SHARDFLOW_DATA_ROOT", "data", "data root")


_HELD: set[int] = set()
"""The file descriptors of the ``file_lock`` locks this process holds."""


def _let_go_of_inherited_locks() -> None:
    """In a forked child: the parent's locks are its own. A child shares the parent's ``flock`` through each
    inherited descriptor, so without this a lock the parent held at the fork (a reader's download on a thread,
    a DataLoader worker forked meanwhile) stayed held after the parent let go, and a child waiting for that
    file waited for itself. Each such descriptor now points at ``/dev/null`` (still open: the code that closes
    it, should it run in the child, closes no other file)."""
    if not _HELD:
        return
    null = os.open(os.devnull, os.O_RDONLY)
    for fd in list(_HELD):
        os.dup2(null, fd)
    os.close(null)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_let_go_of_inherited_locks)


@contextlib.contextmanager
def file_lock(
    path: Path, *, timeout: float | None = 60.0, what: str = "the catalog", remove: bool = False
) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path``; wait up to ``timeout`` seconds (``0``: fail at once).

    With ``remove``, the lock file is deleted on release (while still locked), so
    nothing is left behind. A waiter may then hold a lock on the deleted file, so
    after locking, the file must still be the one at ``path``; if not, lock again.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except OSError as exc:
                    if exc.errno not in (errno.EAGAIN, errno.EACCES):
                        raise
                    if deadline is not None and time.monotonic() >= deadline:
                        raise CatalogError(
                            f"{what} is locked by another process ({path}); another build or publish of this "
                            "dataset is running. Wait for it to finish and run the command again"
                        ) from None
                    time.sleep(0.05)
            try:
                current = os.stat(path).st_ino
            except FileNotFoundError:
                current = None
            if current != os.fstat(fd).st_ino:
                continue  # its holder deleted it on release: lock the file now at ``path``
            _HELD.add(fd)
            try:
                yield
            finally:
                if remove:
                    with contextlib.suppress(OSError):
                        os.unlink(path)
            return
        finally:
            _HELD.discard(fd)
            os.close(fd)  # closing releases the lock, also when the process dies


@dataclass(frozen=True, kw_only=True)
class RemovedVersion:
    """A version that ``shardflow rm`` took out of the catalog (``removed`` in the catalog file)."""

    version: str
    path: str
    """Its directory, as its entry had it (relative to the catalog directory when possible)."""
    build_key: str = ""
    removed_at: str = ""


@dataclass(frozen=True, kw_only=True)
class VersionEntry:
    """One published version as the catalog lists it."""

    version: str
    path: str
    """The version directory, relative to the catalog directory when possible."""
    created_at: str
    build_key: str
    parent: str | None = None
    totals: dict[str, Any] = field(default_factory=dict)
    manifest_sha256: str = ""
    """SHA-256 of the version's ``metadata.yaml`` as published (empty in older catalogs): an edited
    manifest is detected against it."""
    files_sha256: str = ""
    """SHA-256 of the version's record in ``<catalog>/.published/`` (``files_record``): size, inode and mtime of each
    shard file when it was published, which an incremental build checks instead of reading them
    (empty in older catalogs)."""

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class Catalog:
    """The catalog directory: one ``<name>.yaml`` per dataset."""

    def __init__(self, path: str | os.PathLike[str] | None = None) -> None:
        self.path = default_catalog(path)

    def __repr__(self) -> str:
        return f"Catalog({str(self.path)!r})"

    def dataset_file(self, name: str) -> Path:
        """``<catalog>/<name>.yaml``: the file that lists the dataset's versions."""
        return self.path / f"{check_name(name)}.yaml"

    def lock(self, name: str, *, timeout: float | None = 60.0) -> contextlib.AbstractContextManager[None]:
        return file_lock(self.path / f".{check_name(name)}.lock", timeout=timeout, what=f"the catalog entry of {name!r}")

    def datasets(self) -> list[str]:
        if not self.path.is_dir():
            return []
        return sorted(p.stem for p in self.path.glob("*.yaml") if not p.name.startswith("."))

    def _load(self, name: str) -> dict[str, Any]:
        path = self.dataset_file(name)
        if not path.exists():
            return {"schema_version": CATALOG_SCHEMA_VERSION, "name": name, "latest": None, "versions": []}
        try:
            data = load_yaml_file(path, max_bytes=MAX_CATALOG_BYTES)
        except YamlRefused as exc:
            raise CatalogError(f"{path}: the catalog file is refused: {exc}; restore it from a backup") from None
        except yaml.YAMLError as exc:
            raise CatalogError(f"{path}: the catalog file is not valid YAML ({describe_yaml_error(exc)})") from None
        if not isinstance(data, dict) or data.get("schema_version") != CATALOG_SCHEMA_VERSION:
            raise CatalogError(
                f"{path}: unknown catalog schema_version {data.get('schema_version') if isinstance(data, dict) else None!r}; "
                f"this shardflow reads {CATALOG_SCHEMA_VERSION}"
            )
        _check_catalog(data, path)
        return data

    def versions(self, name: str) -> list[VersionEntry]:
        """The published versions of ``name``, oldest first."""
        known = set(VersionEntry.__dataclass_fields__)
        return [VersionEntry(**{k: x for k, x in v.items() if k in known}) for v in self._load(name)["versions"]]

    def latest(self, name: str) -> str | None:
        return self._load(name).get("latest")

    def version_dir(self, entry: VersionEntry | RemovedVersion) -> Path:
        path = Path(entry.path)
        return path if path.is_absolute() else (self.path / path).resolve()

    def files_record(self, name: str, version: str) -> Path:
        """Where the size, inode and mtime of ``name@version``'s shard files as published are recorded."""
        return self.path / FILE_STATS_NAME / f"{check_name(name)}@{version}.json"

    def entry(self, name: str, version: str) -> VersionEntry | None:
        """The catalog entry of ``name@version`` (None if it lists no such version)."""
        for entry in self.versions(name):
            if entry.version == version:
                return entry
        return None

    def find_build(self, name: str, build_key: str) -> VersionEntry | None:
        """The published version of ``name`` built from exactly these inputs and options, if any."""
        for entry in self.versions(name):
            if entry.build_key == build_key:
                return entry
        return None

    def removed(self, name: str) -> list[RemovedVersion]:
        """The versions of ``name`` that ``shardflow rm`` removed, oldest removal first."""
        known = set(RemovedVersion.__dataclass_fields__)
        return [RemovedVersion(**{k: x for k, x in v.items() if k in known}) for v in self._load(name).get("removed", [])]

    def next_version(self, name: str) -> str:
        """The name the next published version of ``name`` gets: v1, v2, ...; a removed version's name is never
        given again (a reference to it must not come to mean other data)."""
        listed = [v.version for v in self.versions(name)] + [v.version for v in self.removed(name)]
        numbers = [int(v[1:]) for v in listed if v[1:].isdigit()]
        return f"v{max(numbers, default=0) + 1}"

    def add(self, name: str, entry: VersionEntry, *, make_latest: bool = True) -> None:
        """Append a version and make it ``latest`` (unless ``make_latest`` is False). Call with ``lock(name)`` held."""
        data = self._load(name)
        if any(v["version"] == entry.version for v in data["versions"]):
            raise CatalogError(f"{name}@{entry.version} is already in the catalog; versions are immutable")
        version_dir = Path(entry.path)
        try:
            rel = os.path.relpath(version_dir, self.path)
        except ValueError:  # another drive (Windows): keep it absolute
            rel = str(version_dir)
        data["versions"].append({**entry.to_dict(), "path": rel})
        if make_latest or not data.get("latest"):
            data["latest"] = entry.version
        self._write(name, data)

    def remove(self, name: str, version: str, *, removed_at: str) -> VersionEntry:
        """Take ``name@version`` out of the catalog (the commit point of ``shardflow rm``); returns its entry.

        Call with ``lock(name)`` held. When it was ``latest``, ``latest`` becomes the remaining
        version with the highest number (None when none remains); otherwise ``latest`` stays.
        The version stays listed under ``removed``, with its
        directory: its name is never given again, a rerun of an interrupted removal finds
        the directory there, and a reference to it says it was removed.
        """
        data = self._load(name)
        kept = [v for v in data["versions"] if v["version"] != version]
        if len(kept) == len(data["versions"]):
            raise CatalogError(f"no version {version!r} of {name!r} in the catalog {self.path}")
        entry = next(VersionEntry(**{k: x for k, x in v.items() if k in VersionEntry.__dataclass_fields__})
                     for v in data["versions"] if v["version"] == version)
        data["versions"] = kept
        if data.get("latest") not in {v["version"] for v in kept}:
            data["latest"] = highest_version([v["version"] for v in kept])
        data["removed"] = [*data.get("removed", []),
                           {"version": version, "path": entry.path, "build_key": entry.build_key, "removed_at": removed_at}]
        self._write(name, data)
        return entry

    def _write(self, name: str, data: dict[str, Any]) -> None:
        """Replace ``<name>.yaml`` with ``data``, atomically (under the lock)."""
        self.path.mkdir(parents=True, exist_ok=True)
        # Temporary files of a writer that was killed mid-update (this runs under the lock).
        for stray in self.path.glob(f".{name}.yaml.tmp-*"):
            if is_stale_tmp(stray):
                stray.unlink(missing_ok=True)
        fault("catalog-write", self.dataset_file(name))
        atomic_write_text(self.dataset_file(name), yaml.safe_dump(data, sort_keys=False, width=120))

    def entry_for_dir(self, directory: Path, name: str | None = None) -> tuple[str, VersionEntry] | None:
        """The catalog entry ``(name, entry)`` whose version directory is ``directory``, if any.

        ``name``: look only at that dataset (the manifest's name), not the whole catalog.
        """
        directory = Path(directory).resolve()
        names = self.datasets()
        if name is not None:
            names = [name] if name in names else []
        for name in names:
            try:
                versions = self.versions(name)
            except CatalogError:
                continue
            for entry in versions:
                if self.version_dir(entry) == directory:
                    return name, entry
        return None

    def resolve(self, ref: str) -> Path:
        """The version directory a reference names; ``CatalogError`` says why not."""
        return resolve_ref(ref, catalog=self)


def _check_catalog(data: dict[str, Any], path: Path) -> None:
    """Refuse a catalog file whose fields are not what shardflow writes: one message naming the field."""

    def bad(where: str, key: str, what: str, value: Any) -> CatalogError:
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        return CatalogError(f"{path}: {where}field {key!r} must be {what}, not {shown}; restore the catalog file from a backup")

    def text(d: dict[str, Any], key: str, where: str, *, optional: bool = False) -> None:
        if key not in d and not optional:
            raise CatalogError(f"{path}: {where}missing field {key!r}; restore the catalog file from a backup")
        value = d.get(key)
        if (value is not None or not optional) and (not isinstance(value, str) or "\0" in value):
            raise bad(where, key, "a string" + (" or null" if optional else ""), value)

    versions = data.get("versions")
    if not isinstance(versions, list):
        raise bad("", "versions", "a list of versions", versions)
    text(data, "latest", "", optional=True)
    for i, entry in enumerate(versions):
        where = f"versions[{i}]: "
        if not isinstance(entry, dict):
            raise CatalogError(f"{path}: {where}an entry must be a mapping, not {entry!r:.60}; restore the catalog file from a backup")
        for key in ("version", "path", "created_at", "build_key"):
            text(entry, key, where)
        text(entry, "parent", where, optional=True)
        text(entry, "manifest_sha256", where, optional=True)
        text(entry, "files_sha256", where, optional=True)
        if not isinstance(entry.get("totals", {}), dict):
            raise bad(where, "totals", "a mapping", entry["totals"])
    removed = data.get("removed", [])
    if not isinstance(removed, list):
        raise bad("", "removed", "a list of removed versions", removed)
    for i, entry in enumerate(removed):
        where = f"removed[{i}]: "
        if not isinstance(entry, dict):
            raise CatalogError(f"{path}: {where}an entry must be a mapping, not {entry!r:.60}; restore the catalog file from a backup")
        for key in ("version", "path"):
            text(entry, key, where)
        for key in ("build_key", "removed_at"):
            text(entry, key, where, optional=True)


def highest_version(versions: list[str]) -> str | None:
    """The version with the highest number (``v10`` after ``v9``; a name not ``vN`` before any that is, the
    last listed of equals), or None for none."""
    if not versions:
        return None

    def number(version: str) -> int:
        return int(version[1:]) if version[:1] == "v" and version[1:].isdigit() else -1

    return max(reversed(versions), key=number)


def is_catalog_ref(ref: Any) -> bool:
    """Whether ``ref`` is a ``NAME@REF`` string (``wiki@latest``, ``wiki@v3``): always resolved through the
    catalog, never read as a folder of that name (``./wiki@latest`` is the folder)."""
    return isinstance(ref, str) and "@" in ref and "/" not in ref and os.sep not in ref


def resolve_ref(ref: str | os.PathLike[str], catalog: Catalog | str | os.PathLike[str] | None = None) -> Path:
    """Resolve ``NAME@VERSION``, ``NAME@latest``, ``NAME`` or a path to a version directory."""
    return resolve_version(ref, catalog)[0]


def resolve_version(
    ref: str | os.PathLike[str], catalog: Catalog | str | os.PathLike[str] | None = None
) -> tuple[Path, str | None]:
    """``resolve_ref``, and the dataset name the reference asked the catalog for (None: a path was given).

    ``NAME@REF`` always goes through the catalog (``is_catalog_ref``); any other reference is a
    version directory (or its ``metadata.yaml``) where one is, else a name in the catalog.
    """
    ref_str = os.fspath(ref)
    if not is_catalog_ref(ref):
        path = Path(ref_str).expanduser()
        if path.name == MANIFEST_NAME and path.is_file():
            return path.parent.resolve(), None
        if path.is_dir() and (path / MANIFEST_NAME).is_file():
            return path.resolve(), None
        if os.sep in ref_str and "@" not in ref_str:
            raise CatalogError(f"{ref_str}: no {MANIFEST_NAME} there; a path reference must be a version directory")
    cat = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
    name, _, version = ref_str.partition("@")
    version = version or "latest"
    if name not in cat.datasets():
        known = ", ".join(cat.datasets()) or "none"
        raise CatalogError(f"no dataset {name!r} in the catalog {cat.path} (datasets: {known})")
    versions = cat.versions(name)
    if version == "latest":
        version = cat.latest(name) or ""
    elif version.isdigit():
        version = f"v{version}"
    for entry in versions:
        if entry.version == version:
            return cat.version_dir(entry), name
    known = ", ".join(v.version for v in versions) or "none"
    for gone in cat.removed(name):
        if gone.version == version:
            raise CatalogError(f"{name}@{version} was removed (shardflow rm, {gone.removed_at or 'date unknown'}); "
                               f"the catalog {cat.path} lists {name}'s versions: {known}")
    if not version:
        raise CatalogError(f"{name!r} has no versions left in the catalog {cat.path} (all were removed); build it again")
    raise CatalogError(f"no version {version!r} of {name!r} in the catalog {cat.path} (versions: {known})")


def asked_name_problem(asked: str | None, manifest: Manifest, directory: Path | str) -> str | None:
    """Why the version found for ``NAME@REF`` is not the dataset asked for (its manifest's ``name`` is another), or None.

    ``asked``: the name ``resolve_version`` gave (None for a path, which names no dataset)."""
    if asked is None or manifest.name == asked:
        return None
    return (f"{Path(directory) / MANIFEST_NAME}: the manifest calls itself {manifest.name!r}, but the reference asked the "
            f"catalog for {asked!r}; another dataset is never served under the name asked for: restore the file, or rebuild")


def recorded_file_stats(cat: Catalog, name: str, entry: VersionEntry) -> dict[str, tuple[int, int, int]] | None:
    """``{file: (size, inode, mtime_ns)}`` of a version's shard files as published, checked against the
    catalog entry's ``files_sha256``; None where the entry records none (older versions) or the record
    does not match it."""
    if not entry.files_sha256:
        return None
    path = cat.files_record(name, entry.version)
    try:
        if path.is_symlink() or sha256_file(path) != entry.files_sha256:
            return None
        files = json.loads(path.read_text(encoding="utf-8"))["files"]
        return {str(k): (int(v[0]), int(v[1]), int(v[2])) for k, v in files.items()}
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
