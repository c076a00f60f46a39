"""Which catalog published a version directory, and whether it vouches for what the directory holds.

Several catalogs may share one data root; a version belongs to the catalog that
published it. ``publish`` first claims its name ``vN`` with a record beside it,
``<data_root>/<name>/.vN.publisher.json`` (``claim_publisher``: the catalog's
path, relative to the record where it can be, the name, the version, the build
key; created only if absent), so no other catalog publishes there, adopts it, or
removes it. A version opened by path is checked against the catalog given, else
against the catalog its record names (``vouch_for``), trusted only if this user
or root owns it: the record lies in the data root, which others may write.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ._io import fsync_dir, sha256_file, tmp_path_for
from .catalog import Catalog, VersionEntry, default_catalog
from .errors import ShardflowError
from .manifest import MANIFEST_NAME, Manifest

__all__ = [
    "PUBLISHER_SUFFIX",
    "catalog_id",
    "publisher_record",
    "read_publisher",
    "claim_publisher",
    "Vouch",
    "vouch_for",
    "published_manifest_problems",
]


def catalog_id(catalog: Catalog | str | os.PathLike[str] | None) -> str:
    """A catalog's identity in the records that name it: its directory's resolved path."""
    path = catalog.path if isinstance(catalog, Catalog) else default_catalog(catalog)
    return str(path.resolve())


PUBLISHER_SUFFIX = ".publisher.json"
"""The publisher record of the version directory ``vN``: ``.vN.publisher.json`` beside it (``publisher_record``)."""
_PUBLISHER_FIELDS = ("catalog", "name", "version", "build_key")


def publisher_record(directory: Path | str) -> Path:
    """``<dataset dir>/.vN.publisher.json``: which catalog published (or is publishing) the version directory ``vN``.

    Beside the version, not in it: a version's files (and so its bytes and golden digests) stay what they were."""
    directory = Path(directory)
    return directory.parent / f".{directory.name}{PUBLISHER_SUFFIX}"


def read_publisher(directory: Path | str) -> dict[str, str] | None:
    """The publisher record of ``directory`` (``catalog``, ``name``, ``version``, ``build_key``), or None when
    there is none, or it is not one shardflow writes. ``catalog`` is returned absolute and resolved (the record
    holds it relative to its own directory where it can, so a data root and catalog moved together keep it)."""
    path = publisher_record(directory)
    try:
        if path.is_symlink() or path.stat().st_size > 64 << 10:
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or not all(isinstance(data.get(k), str) and data[k] for k in _PUBLISHER_FIELDS):
        return None
    try:
        where = str((path.parent.resolve() / data["catalog"]).resolve())
    except (OSError, ValueError, RuntimeError):
        return None
    return {**{k: data[k] for k in _PUBLISHER_FIELDS}, "catalog": where}


def claim_publisher(directory: Path, *, catalog: Catalog, name: str, build_key: str) -> bool:
    """Create the publisher record of ``directory`` (``<data_root>/<name>/vN``) for ``catalog`` if there is none.

    True: the name ``vN`` is now this publish's (the record is written to a temporary file, then hard-linked
    into place, which fails if another publisher, of any catalog, claimed it first). False: it is taken.
    """
    path = publisher_record(directory)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = tmp_path_for(path)
    try:
        where = os.path.relpath(catalog_id(catalog), path.parent.resolve())  # as a catalog entry's path: relative
    except ValueError:  # another drive (Windows)
        where = catalog_id(catalog)
    record = {"catalog": where, "name": name, "version": Path(directory).name, "build_key": build_key}
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(json.dumps(record, sort_keys=True))
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, path)
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
    fsync_dir(path.parent)
    return True


def _owned_here(path: Path) -> bool:
    """Whether this user or root owns ``path`` (a catalog that a record in the data root names is trusted only then)."""
    try:
        return path.stat().st_uid in (os.geteuid(), 0)
    except OSError:
        return False


@dataclass(frozen=True)
class Vouch:
    """What the catalogs say about a version directory (``vouch_for``)."""

    problems: tuple[str, ...] = ()
    """Why its manifest is not the one the catalog that lists it published (empty: it is, or none lists it)."""
    catalog: Path | None = None
    """The catalog that lists it (None: none of those looked at does)."""
    looked_at: tuple[str, ...] = ()
    """The catalogs looked at, as a message names them."""

    def unlisted(self, directory: Path | str) -> str:
        """One line: no catalog lists ``directory``, and which were looked at."""
        return f"{directory}: no catalog lists this version directory (looked at: {'; '.join(self.looked_at)})"


def _entry_of(cat: Catalog, directory: Path, name: Any) -> tuple[str, VersionEntry] | None:
    # The entry whose directory this is, over the whole catalog: never the one the manifest's own
    # ``name`` points at, or an edited manifest would choose what it is checked against.
    # The manifest's name is only where to look first (one file, not the whole catalog): a match
    # is still by directory, so it finds the same entry the full search would.
    try:
        found = cat.entry_for_dir(directory, name=name) if isinstance(name, str) else None
        return found or cat.entry_for_dir(directory)
    except (ShardflowError, OSError):
        return None


def vouch_for(directory: Path | str, manifest: Manifest, catalog: Any = None) -> Vouch:
    """Check ``metadata.yaml`` of ``directory`` against the catalog that published it.

    That is the catalog given (``catalog``, else ``$SHARDFLOW_CATALOG`` or ``./manifests``) if it
    lists the directory; else the one its publisher record names (``.vN.publisher.json``), if this
    user or root owns that catalog's file: the record lies in the data root, where whoever can write
    it could point it at a catalog of their own (give such a catalog with ``--catalog`` to trust it).
    """
    directory = Path(directory)
    where = directory.resolve()
    looked: list[str] = []
    found = None
    try:
        cat = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
        looked.append(str(cat.path))
        found = _entry_of(cat, where, manifest.name)
    except ShardflowError as exc:  # a URL given as a local catalog, say
        looked.append(f"{catalog} ({exc})")
        cat = None
    if found is None:
        record = read_publisher(where)
        named = Path(record["catalog"]) if record is not None else None
        if named is not None and named.is_absolute() and (cat is None or named.resolve() != cat.path.resolve()):
            cat = Catalog(named)
            try:
                owned = _owned_here(cat.dataset_file(record["name"])) and _owned_here(cat.path)  # type: ignore[index]
            except ShardflowError:
                owned = False
            if owned:
                looked.append(f"{cat.path} (named by {publisher_record(where)})")
                found = _entry_of(cat, where, manifest.name)
            else:
                looked.append(f"{cat.path} (named by {publisher_record(where)}, but neither this user nor root owns "
                              "it: give it with --catalog to trust it)")
    if found is None or cat is None:
        return Vouch(looked_at=tuple(looked))
    path = directory / MANIFEST_NAME
    vouch = Vouch(catalog=cat.path, looked_at=tuple(looked))
    if (manifest.name, manifest.version) != (found[0], found[1].version):
        return replace(vouch, problems=(
            f"{path}: the manifest calls itself {manifest.name!r}@{manifest.version!r}, but the catalog {cat.path} "
            f"published this directory as {found[0]}@{found[1].version}; versions are immutable: restore the file, "
            "or rebuild",
        ))
    if found[1].manifest_sha256 and sha256_file(path) != found[1].manifest_sha256:
        return replace(vouch, problems=(
            f"{path}: the manifest was changed after {found[0]}@{found[1].version} was published (its SHA-256 is not "
            f"the one recorded in the catalog {cat.path}); versions are immutable: restore the file, or rebuild",
        ))
    return vouch


def published_manifest_problems(
    directory: Path | str, manifest: Manifest, catalog: Any = None, *, standalone: bool = True
) -> list[str]:
    """Whether ``metadata.yaml`` is still the one published: its SHA-256 against the catalog's record.

    A manifest edited after publication (even consistently with the files, or
    together with them) no longer has the SHA-256 the catalog entry of its
    version recorded. The entry is the one whose directory this is (the
    reference being opened), in the catalog that published it (``vouch_for``),
    and the manifest's name and version must be that entry's. Without a checksum
    (older catalogs) only the name and version are checked. A directory that no
    catalog lists is a problem unless ``standalone`` (its files are then checked
    against its own manifest only).
    """
    vouch = vouch_for(directory, manifest, catalog)
    if vouch.catalog is None and not standalone:
        return [
            f"{vouch.unlisted(directory)}, so its manifest cannot be checked against the one published; validate it "
            "by reference (NAME@vN --catalog CATALOG), or pass --standalone to check its files against its own "
            "manifest only"
        ]
    return list(vouch.problems)
