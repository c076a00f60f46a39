"""The one way bucket code reads the manifest of a version on a bucket: ``metadata.yaml`` and its shard table.

A version of many shards lists them in a shard table beside its manifest (``shards.tsv``, manifest schema
4: ``shardflow.shard_table``), so a manifest's bytes alone are not enough to read it: ``read_manifest`` of a
scratch directory holding ``metadata.yaml`` alone refuses a schema-4 manifest ("shards.tsv: missing").
``bucket_manifest`` fetches the manifest (or takes the bytes the caller has, checked against the catalog's
SHA-256 when given) and, if it names a table, the table, through the runtime's ``VersionCache.ensure``:
streamed into the scratch directory, its size and SHA-256 checked against the manifest's entry, retried on
transient errors. Readers of a version (``runtime/remote.py``, ``VersionCache.load_manifest``) do the same.
Messages name the bucket's URLs, not the scratch.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Callable

from .._io import atomic_write_bytes
from ..errors import ShardflowError, ValidationError
from ..manifest import MANIFEST_NAME, FileEntry, Manifest, read_manifest
from ..runtime.remote import VersionCache
from ..runtime.remote_store import renamed, retrying
from .fs import filesystem

__all__ = ["bucket_manifest"]


def bucket_manifest(version_url: str, scratch: Path | str, *, data: bytes | None = None, sha256: str = "",
                    table_copy: Callable[[FileEntry], Path | None] | None = None) -> Manifest:
    """The manifest of the version at ``version_url`` (``s3://B/data/NAME/vN``), with its shard table if it has one.

    ``scratch``: a local directory (made if missing) where ``metadata.yaml`` and the table are written.
    ``data``: the manifest's bytes when the caller has them already (read with a condition, or a verified local
    copy); else they are fetched. ``sha256``: the SHA-256 the catalog records for the manifest (empty: not
    checked); other bytes raise ``ValidationError``. ``table_copy(entry)``: a local file that may be the table
    (``push --repair``'s verified copies), used if its size and SHA-256 are the entry's, else the bucket's object
    is fetched. Raises ``ShardflowError`` (the URL named) for a manifest or table that cannot be read or trusted.
    """
    url = version_url.rstrip("/")
    scratch = Path(scratch)
    manifest_url = f"{url}/{MANIFEST_NAME}"
    if data is None:
        fs, root = filesystem(url)
        data = retrying(manifest_url, lambda: fs.cat_file(f"{root.rstrip('/')}/{MANIFEST_NAME}"))
    assert data is not None
    if sha256 and hashlib.sha256(data).hexdigest() != sha256:
        raise ValidationError(f"{manifest_url}: not the manifest its catalog entry records (its SHA-256 differs); "
                              "versions are immutable: restore it (shardflow push NAME@vN --repair --catalog CATALOG_URL)")
    scratch.mkdir(parents=True, exist_ok=True)
    path = scratch / MANIFEST_NAME
    atomic_write_bytes(path, data)
    cache = VersionCache(url, scratch, verify=False)

    def table_file(entry: FileEntry) -> Path:
        copy = table_copy(entry) if table_copy is not None else None
        if copy is not None:
            return copy  # checked against the entry by read_manifest, as a fetched one
        return cache.ensure(entry.file, entry.bytes, entry.sha256)  # fetched, its size and SHA-256 checked

    try:
        return read_manifest(path, table_file=table_file)
    except ShardflowError as exc:
        raise renamed(renamed(exc, path, manifest_url), scratch, url) from None
