"""Object storage as the runtime reads it: URLs, the fsspec filesystem, one message per failure, and catalogs.

Which paths are URLs, and the filesystem, are ``shardflow.bucket.fs``'s, as for the
build's inputs; here are the runtime's messages (a version's object, not an
input), its retries, its cache keys and catalogs read from a bucket.

A catalog in a bucket is read as ``shardflow.catalog.Catalog`` reads a local
one: its ``<name>.yaml`` is copied into the cache and parsed there, and a
version's ``path`` is taken relative to the catalog URL.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from .._io import atomic_write_bytes
from ..catalog import Catalog, VersionEntry
from ..config import check_name
from ..errors import CatalogError, InputError, ShardflowError, is_transient, missing_credentials, network_unreachable
from ..bucket.fs import filesystem, is_remote

__all__ = [
    "is_remote", "filesystem", "storage_error", "retrying", "cache_key", "renamed", "resolve_catalog", "catalog_names",
    "mirror_catalog",
]

_ATTEMPTS = 3  # requests of one object: the first and two more after transient network errors


def storage_error(url: str, exc: BaseException) -> ShardflowError | None:
    """The one message for a missing object, missing credentials or denied access; None for anything else."""
    detail = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, FileNotFoundError):
        return InputError(f"{url}: no such object ({detail}); check the URL; an object of a listed version that is "
                          "gone is restored by shardflow push NAME@VERSION --repair --catalog CATALOG_URL")
    if missing_credentials(exc):
        return InputError(
            f"{url}: no usable credentials for the object store ({detail}); set AWS_ACCESS_KEY_ID and "
            "AWS_SECRET_ACCESS_KEY or AWS_PROFILE (and AWS_ENDPOINT_URL for an S3-compatible store)"
        )
    if isinstance(exc, PermissionError):
        return InputError(f"{url}: access denied ({detail}); check the credentials and that they may read this bucket")
    return None


def retrying(url: str, action: Any) -> Any:
    """``action()``, again after a transient network error; a storage failure as one message."""
    for attempt in range(_ATTEMPTS):
        try:
            return action()
        except ShardflowError:
            raise
        except Exception as exc:
            error = storage_error(url, exc)
            if error is not None:
                raise error from None
            if attempt + 1 == _ATTEMPTS or not is_transient(exc):
                if network_unreachable(exc):
                    detail = " ".join(str(exc).split()) or type(exc).__name__
                    raise InputError(f"{url}: the object store could not be reached ({detail}), {_ATTEMPTS} tries; "
                                     "check AWS_ENDPOINT_URL and the network, then run again") from None
                raise
            time.sleep(0.5 * 2**attempt)


def cache_key(url: str) -> str:
    """``<bucket>/<last two parts>-<hash>``: readable, and distinct for distinct URLs."""
    parsed = urlparse(url)
    tail = "-".join(p for p in parsed.path.strip("/").split("/")[-2:] if p) or "root"
    return f"{_clean(parsed.netloc)}/{_clean(tail)[:60]}-{hashlib.sha256(url.encode()).hexdigest()[:16]}"


def _clean(part: str) -> str:
    # A safe directory name: no separators, no leading dot, never empty.
    return re.sub(r"[^A-Za-z0-9._-]", "_", part).lstrip(".") or "_"


def renamed(exc: ShardflowError, local: Path, url: str) -> ShardflowError:
    """``exc`` with the cached copy's path replaced by the URL it came from (messages name what the user gave)."""
    return type(exc)(str(exc).replace(str(local), url))


def catalog_names(catalog_url: str) -> list[str]:
    """The datasets of the catalog at ``catalog_url``: its ``<name>.yaml`` objects, sorted (none: an empty prefix)."""
    fs, base = filesystem(catalog_url.rstrip("/"))
    base = base.rstrip("/")

    def ls() -> list[str]:
        try:
            return fs.ls(base, detail=False)  # type: ignore[no-any-return]
        except FileNotFoundError:  # no object under the prefix yet: an empty catalog
            return []

    names = [posixpath.basename(p) for p in retrying(catalog_url, ls)]
    return sorted(n[:-5] for n in names if n.endswith(".yaml") and not n.startswith("."))


def mirror_catalog(catalog_url: str, directory: Path) -> Catalog:
    """The catalog at ``catalog_url``, its files copied into ``directory``: read with ``Catalog``'s own checks (its
    messages name the local copy: see ``renamed``). A version's path stays relative to the catalog URL."""
    catalog_url = catalog_url.rstrip("/")
    fs, base = filesystem(catalog_url)
    directory.mkdir(parents=True, exist_ok=True)
    for name in catalog_names(catalog_url):
        data = retrying(f"{catalog_url}/{name}.yaml", lambda: fs.cat_file(f"{base.rstrip('/')}/{name}.yaml"))
        atomic_write_bytes(directory / f"{name}.yaml", data)
    return Catalog(directory)


def resolve_catalog(ref: str, catalog_url: str, root: Path) -> tuple[str, tuple[str, VersionEntry, str]]:
    """The version URL that ``NAME@VERSION`` names in the catalog at ``catalog_url``, and its entry."""
    name, _, version = ref.partition("@")
    check_name(name)
    catalog_url = catalog_url.rstrip("/")
    fs, base = filesystem(catalog_url)
    base = base.rstrip("/")
    file_url = f"{catalog_url}/{name}.yaml"

    def read() -> bytes | None:
        try:
            return fs.cat_file(f"{base}/{name}.yaml")  # type: ignore[no-any-return]
        except FileNotFoundError:
            return None

    data = retrying(file_url, read)
    if data is None:
        known = catalog_names(catalog_url)
        raise CatalogError(f"no dataset {name!r} in the catalog {catalog_url} (datasets: {', '.join(known) or 'none'})")
    local = root / "catalogs" / cache_key(catalog_url)
    local.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(local / f"{name}.yaml", data)
    cat = Catalog(local)  # the catalog's own parsing and checks, on the file as the bucket holds it
    try:
        versions = cat.versions(name)
        wanted = version or "latest"
        wanted = (cat.latest(name) or "") if wanted == "latest" else (f"v{wanted}" if wanted.isdigit() else wanted)
    except ShardflowError as exc:
        raise renamed(exc, local, catalog_url) from None
    entry = next((v for v in versions if v.version == wanted), None)
    if entry is None:
        known = ", ".join(v.version for v in versions) or "none"
        gone = next((r for r in cat.removed(name) if r.version == wanted), None)
        if gone is not None:
            raise CatalogError(f"{name}@{wanted} was removed (shardflow rm, {gone.removed_at or 'date unknown'}); the "
                               f"catalog {catalog_url} lists {name}'s versions: {known}")
        raise CatalogError(f"no version {wanted!r} of {name!r} in the catalog {catalog_url} (versions: {known})")
    key = posixpath.normpath(posixpath.join(base, entry.path))
    if posixpath.isabs(entry.path) or key.split("/")[0] != base.split("/")[0]:
        raise CatalogError(
            f"{file_url}: {name}@{entry.version} has the path {entry.path!r}, which is not a directory of the bucket "
            "relative to the catalog; upload the catalog together with the data root it was published beside"
        )
    return f"{catalog_url.split('://', 1)[0]}://{key}", (name, entry, catalog_url)
