"""``shardflow rm`` and ``shardflow gc`` on a bucket: versions that ``shardflow push`` (or a build to a bucket) published.

``remove_bucket_version`` takes the entry out of ``NAME.yaml`` with a conditional write (the commit
point, as ``Catalog.remove`` does locally), then deletes the version's objects, the manifest and the
claim object last. ``collect_bucket_garbage`` aborts stale multipart uploads and deletes the
version prefixes no catalog entry lists: removed versions' leftovers, and abandoned pushes older
than ``older_than_hours`` (the threshold stands in for locks). A prefix without a claim object is
not a push's, and a listed version is never touched. It also deletes what builds to the bucket leave
(``bucket/leftovers.py``): staging prefixes of published versions or abandoned builds, and expired
leases, never while a lease is live. Both, with what they refuse: docs/OPERATIONS.md ("Remove
versions and leftovers").
"""

from __future__ import annotations

import datetime as _dt
import posixpath
import tempfile
from dataclasses import dataclass
from typing import Any

from ..catalog import Catalog
from ..config import check_name
from ..errors import CatalogError, ConfigError, ShardflowError
from ..faults import fault
from ..lifecycle import dependents
from ..manifest import MANIFEST_NAME
from .fs import filesystem, read_with_etag, refusing, update_object
from .layout import CLAIM_NAME, VERSION_RE, BucketTarget, Mirror, bucket_target
from .leftovers import BucketGarbage, build_leftovers, list_objects as _objects, utc_stamp as _stamp

__all__ = ["BucketRemoval", "BucketGarbage", "remove_bucket_version", "collect_bucket_garbage"]


@dataclass(frozen=True, kw_only=True)
class BucketRemoval:
    """What ``remove_bucket_version`` did."""

    ref: str
    url: str
    """The version's prefix in the bucket."""
    objects: int
    """Objects deleted."""
    bytes: int
    resumed: bool = False
    """An earlier removal took it out of the catalog; this one deleted what that one left (``objects``: 0 if nothing)."""
    orphaned: tuple[str, ...] = ()
    """Remaining versions that named it as their parent (removed with ``force``)."""


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc).replace(microsecond=0)


def _delete(fs: Any, root: str, names: list[str]) -> None:
    """Delete ``root/<name>`` for ``names``: the manifest, then the claim, last. Until the manifest goes, a rerun
    sees a version there; until the claim goes, no other push takes the prefix while its objects are deleted."""
    last = [n for n in (MANIFEST_NAME, CLAIM_NAME) if n in names]
    first = [f"{root}/{n}" for n in sorted(names) if n not in last]
    if first:
        fs.rm(first)  # bulk deletes, 1000 keys a request
    for name in last:
        fs.rm(f"{root}/{name}")
    fs.invalidate_cache(root)


def _entry_key(target: BucketTarget, path: str) -> str | None:
    """The bucket key an entry's path (relative to the catalog) names; None when it leaves the bucket, is absolute,
    or keeps a ``..`` or ``.`` after normalisation (the catalog's own prefix, or the bucket's root)."""
    if not path or posixpath.isabs(path) or "://" in path:
        return None
    key = posixpath.normpath(posixpath.join(target.catalog_key or ".", path))
    if key in (".", "..") or any(part in ("", ".", "..") for part in key.split("/")):
        return None
    return key


def _catalog_datasets(fs: Any, target: BucketTarget) -> list[str]:
    """The dataset names of the catalog files ``<catalog>/NAME.yaml`` in the bucket."""
    root = "/".join(p for p in (target.bucket, target.catalog_key) if p)
    fs.invalidate_cache(root)
    try:
        listing = fs.ls(root, detail=False)
    except FileNotFoundError:
        return []
    names = [posixpath.basename(p)[:-5] for p in listing if p.endswith(".yaml") and not posixpath.basename(p).startswith(".")]
    return sorted(names)


def _parse(ref: str) -> tuple[str, str]:
    """``NAME@vN`` (or ``NAME@N``) as ``(name, "vN")``; ``latest`` or no version is refused: name it."""
    name, _, version = ref.partition("@")
    check_name(name)
    version = f"v{version}" if version.isdigit() else version
    if not VERSION_RE.match(version):
        raise ConfigError(f"{ref}: name the version to remove, NAME@vN (NAME@latest is refused: name it)")
    return name, version


def _check_version_prefix(url: str, names: dict[str, Any], ref: str, file_url: str) -> None:
    """Never delete a prefix that is not a version: objects there (but a lone claim) mean a manifest among them."""
    if MANIFEST_NAME not in names and set(names) - {CLAIM_NAME}:
        raise CatalogError(
            f"{url}: the catalog places {ref} here, but it holds no {MANIFEST_NAME}, so nothing is deleted; check the "
            f"entry's path in {file_url}, and delete the objects by hand if they are the version's"
        )


def remove_bucket_version(ref: str, *, catalog_url: str, force: bool = False, option: str = "--catalog") -> BucketRemoval:
    """Remove ``ref`` (``NAME@vN``) from the bucket catalog at ``catalog_url``, then its objects (the module
    docstring). Rerun after an interruption, it finishes the deletion. ``option``: the URL's name in messages."""
    target = bucket_target(catalog_url, catalog_url, options=(option, option))
    catalog_url = catalog_url.rstrip("/")
    name, version = _parse(ref)
    ref = f"{name}@{version}"
    file_url = target.url(target.catalog_file_key(name))
    fs, _ = filesystem(file_url)
    taken: dict[str, Any] = {}

    def take_out(current: bytes | None) -> bytes | None:
        if current is None:
            known = ", ".join(_catalog_datasets(fs, target)) or "none"
            raise CatalogError(f"no dataset {name!r} in the catalog {catalog_url} (datasets: {known})")
        with tempfile.TemporaryDirectory(prefix="shardflow-rm-") as scratch:
            mirror = Mirror(scratch, target, catalog_url)
            cat = mirror.catalog(name, current)
            try:
                data, key, taken["orphaned"], taken["resumed"] = _take_out(cat, name, version, force, target, file_url)
            except ShardflowError as exc:
                raise mirror.renamed(exc, cat) from None
        taken["url"], taken["key"] = target.url(key), key
        taken["names"] = _objects(fs, f"{target.bucket}/{key}")
        _check_version_prefix(taken["url"], taken["names"], ref, file_url)  # before the commit, as a local rm checks
        return data

    update_object(file_url, take_out, again="run shardflow rm again")
    url, key, names, resumed, orphaned = (taken[k] for k in ("url", "key", "names", "resumed", "orphaned"))
    fault("bucket-rm-cataloged", url)
    _delete(fs, f"{target.bucket}/{key}", list(names))
    return BucketRemoval(ref=ref, url=url, objects=len(names), bytes=sum(size for size, _ in names.values()),
                         resumed=resumed, orphaned=tuple(orphaned))


def _take_out(cat: Catalog, name: str, version: str, force: bool, target: BucketTarget, file_url: str
              ) -> tuple[bytes | None, str, list[str], bool]:
    """In the mirror of the bucket's catalog file: remove the version (``Catalog.remove``); returns the new file
    (None: an earlier rm had taken it out), the version's key, the remaining children it orphans, and whether resumed."""
    ref = f"{name}@{version}"
    entry = cat.entry(name, version)
    gone = [g for g in cat.removed(name) if g.version == version]
    if entry is None and not gone:
        listed = ", ".join(v.version for v in cat.versions(name)) or "none"
        raise CatalogError(f"no version {version!r} of {name!r} in the catalog {cat.path} (versions: {listed})")
    path = entry.path if entry is not None else gone[-1].path
    key = _entry_key(target, path)
    if key is None or key == target.catalog_key or target.catalog_key.startswith(f"{key}/"):
        raise CatalogError(
            f"{file_url}: {ref} has the path {path!r}, which is not a version's prefix in the bucket {target.bucket} "
            "(it leaves the bucket, keeps '..', or holds the catalog); nothing is deleted: fix the entry's path "
            "(../data/NAME/vN beside a catalog at s3://BUCKET/catalog)"
        )
    if entry is None:
        return None, key, [], True
    orphaned = dependents(cat, name, version)
    if orphaned and not force:
        many = len(orphaned) > 1
        raise CatalogError(
            f"{ref} is the parent of {', '.join(orphaned)}, which remain{'' if many else 's'}. "
            f"{'Their' if many else 'Its'} objects in the bucket are {'their' if many else 'its'} own and would keep "
            f"working, but {'their' if many else 'its'} lineage would name a removed version: remove "
            f"{'them' if many else 'it'} first, or pass --force to remove {ref} anyway"
        )
    cat.remove(name, version, removed_at=_stamp(_now()))
    return (cat.path / f"{name}.yaml").read_bytes(), key, orphaned, False


def _client() -> Any:
    """botocore's S3 client, from the environment (endpoint and keys), as s3fs makes its own."""
    import botocore.session  # installed with s3fs, which ``filesystem`` has checked for

    return botocore.session.get_session().create_client("s3")


def _uploads(client: Any, target: BucketTarget) -> list[tuple[str, str, _dt.datetime | None]]:
    """``(key, upload id, initiated)`` of the incomplete multipart uploads under the data root."""
    prefix = f"{target.data_key}/" if target.data_key else ""
    found = []
    for page in client.get_paginator("list_multipart_uploads").paginate(Bucket=target.bucket, Prefix=prefix):
        for upload in page.get("Uploads") or []:
            found.append((upload["Key"], upload["UploadId"], upload.get("Initiated")))
    return found


def _parts(client: Any, bucket: str, key: str, upload_id: str) -> tuple[int, int] | None:
    """``(parts, bytes)`` an incomplete upload holds; None when it is gone (completed or aborted meanwhile)."""
    parts = size = 0
    try:
        for page in client.get_paginator("list_parts").paginate(Bucket=bucket, Key=key, UploadId=upload_id):
            for part in page.get("Parts") or []:
                parts, size = parts + 1, size + int(part.get("Size") or 0)
    except Exception as exc:  # botocore's ClientError; anything else goes on
        if getattr(exc, "response", {}).get("Error", {}).get("Code") == "NoSuchUpload":
            return None
        raise
    return parts, size


def _abort(client: Any, bucket: str, key: str, upload_id: str) -> None:
    try:
        client.abort_multipart_upload(Bucket=bucket, Key=key, UploadId=upload_id)
    except Exception as exc:  # botocore's ClientError: gone already is what was wanted
        if getattr(exc, "response", {}).get("Error", {}).get("Code") != "NoSuchUpload":
            raise


def _catalog_state(fs: Any, target: BucketTarget, catalog_url: str) -> tuple[dict[str, str], dict[str, str]]:
    """``{key: ref}`` of every version the catalog lists, and ``{key: ref}`` of those it removed."""
    datasets = _catalog_datasets(fs, target)
    listed: dict[str, str] = {}
    removed: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="shardflow-gc-") as scratch:
        mirror = Mirror(scratch, target, catalog_url)
        for name in datasets:
            try:
                check_name(name)
            except ConfigError:
                continue  # not a dataset's catalog file
            got = read_with_etag(target.url(target.catalog_file_key(name)))
            if got is None:
                continue
            cat = mirror.catalog(name, got[0])
            try:
                entries = [(e.path, e.version) for e in cat.versions(name)]
                gone = [(g.path, g.version) for g in cat.removed(name)]
            except ShardflowError as exc:  # a catalog that cannot be read: what it lists is unknown, delete nothing
                raise mirror.renamed(exc, cat) from None
            for found, into in ((entries, listed), (gone, removed)):
                for path, version in found:
                    key = _entry_key(target, path)
                    if key is not None:
                        into.setdefault(key, f"{name}@{version}")
    return listed, removed


def _check_catalog_matches(target: BucketTarget, data_root_url: str, catalog_url: str,
                           unlisted: dict[tuple[str, str], Any], listed: dict[str, str], removed: dict[str, str]) -> None:
    """Refuse a catalog that lists nothing under the data root while whole versions (with a manifest) are there:
    the wrong ``--catalog`` (or ``--data-root``) would otherwise make every version look abandoned."""
    complete = [f"{n}@{v}" for (n, v), files in sorted(unlisted.items())
                if MANIFEST_NAME in files and target.version_key(n, v) not in removed]
    under = f"{target.data_key}/" if target.data_key else ""
    if complete and not any(key.startswith(under) for key in (*listed, *removed)):
        raise CatalogError(
            f"{catalog_url} lists no version under {data_root_url}, which holds versions ({', '.join(complete[:3])}"
            f"{', ...' if len(complete) > 3 else ''}); nothing is deleted: give the catalog they are listed in "
            "(--catalog) and the data root its entries point to (--data-root); delete an abandoned first push by hand"
        )


def _version_prefixes(objects: dict[str, tuple[int, Any]]) -> dict[tuple[str, str], dict[str, tuple[int, Any]]]:
    """The objects under the data root grouped by ``(NAME, vN)``; anything not under such a prefix is left out."""
    groups: dict[tuple[str, str], dict[str, tuple[int, Any]]] = {}
    for rel, info in objects.items():
        parts = rel.split("/")
        if len(parts) < 3 or not VERSION_RE.match(parts[1]):
            continue
        try:
            check_name(parts[0])
        except ConfigError:
            continue
        groups.setdefault((parts[0], parts[1]), {})["/".join(parts[2:])] = info
    return groups


def collect_bucket_garbage(*, data_root_url: str, catalog_url: str, dry_run: bool = False,
                           older_than_hours: float = 24.0) -> list[BucketGarbage]:
    """Abort old incomplete multipart uploads under the data root and delete unlisted version prefixes there, and
    builds' leftover staging prefixes and expired leases (docs/OPERATIONS.md); returns what was removed
    (``dry_run``: what would be, removing nothing)."""
    if not 0 <= older_than_hours <= 1e6:  # NaN too
        raise ConfigError(f"--older-than {older_than_hours:.12g}: give 0 or more hours (at most 1000000)")
    target = bucket_target(data_root_url, catalog_url, options=("--data-root", "--catalog"))
    catalog_url = catalog_url.rstrip("/")
    cutoff = _now() - _dt.timedelta(hours=older_than_hours)
    fs, _ = filesystem(target.url(target.data_key))
    client = _client()
    uploads = refusing(data_root_url, _uploads, client, target)
    root = "/".join(p for p in (target.bucket, target.data_key) if p)
    everything = _objects(fs, root)
    groups = _version_prefixes(everything)
    # The catalog is read after the listing: a version committed meanwhile is listed, and so kept.
    listed, removed = _catalog_state(fs, target, catalog_url)
    unlisted = {g: files for g, files in groups.items() if target.version_key(*g) not in listed}
    _check_catalog_matches(target, data_root_url, catalog_url, unlisted, listed, removed)
    result: list[BucketGarbage] = []
    for key, upload_id, initiated in uploads:
        if initiated is not None and initiated > cutoff:
            continue  # a push may be sending it now
        url = target.url(key)
        held = refusing(url, _parts, client, target.bucket, key, upload_id)
        if held is None:
            continue
        when = _stamp(initiated) if initiated is not None else "at an unknown time"
        result.append(BucketGarbage(url=url, objects=held[0], bytes=held[1], upload=True,
                                    why=f"an incomplete multipart upload (id {upload_id[:16]}...), initiated {when}"))
        if not dry_run:
            refusing(url, _abort, client, target.bucket, key, upload_id)
    for (name, version), files in sorted(unlisted.items()):
        key = target.version_key(name, version)
        gone = removed.get(key)
        if gone is not None:
            why = f"{gone}, removed from the catalog by an interrupted shardflow rm"
        elif CLAIM_NAME not in files:
            continue  # not shardflow's (another program's NAME/vN/... under the data root): a push claims first
        else:
            times = [t for _, t in files.values() if t is not None]
            times += [t for k, _, t in uploads if k.startswith(f"{key}/") and t is not None]
            newest = max(times, default=None)
            if newest is None or newest > cutoff:
                continue  # a push or build may be writing it now
            why = (f"{name}@{version}, not in the catalog, last written {_stamp(newest)}: an abandoned push or build "
                   f"(its {CLAIM_NAME} would refuse a later push of {name}@{version})")
            if not dry_run and _resumed(fs, target, catalog_url, key, cutoff):
                continue
        result.append(BucketGarbage(url=f"{target.url(key)}/", why=why, objects=len(files),
                                    bytes=sum(size for size, _ in files.values())))
        if not dry_run:
            _delete(fs, f"{target.bucket}/{key}", list(files))
    return result + build_leftovers(fs, client, target, catalog_url, everything, listed, uploads, cutoff=cutoff,
                                    dry_run=dry_run)


def _resumed(fs: Any, target: BucketTarget, catalog_url: str, key: str, cutoff: _dt.datetime) -> bool:
    """Whether the abandoned-looking push at ``key`` came back to life since the listing, looked at again just
    before its objects are deleted: a rerun renews its claim (``bucket/layout.py`` ``claim``) and may commit its catalog entry."""
    newest = max((t for _, t in _objects(fs, f"{target.bucket}/{key}").values() if t is not None), default=None)
    return (newest is not None and newest > cutoff) or key in _catalog_state(fs, target, catalog_url)[0]
