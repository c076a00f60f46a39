"""What builds to a bucket leave under the data root, for ``shardflow gc`` (``bucket/lifecycle.py`` calls it).

A build to a bucket writes, beside its version's prefix (docs/FORMAT.md, "While a build to a bucket
runs"), the lease of its build key, ``<data>/NAME/.leases/<build key>.json`` (``bucket/lease.py``),
and, when its workers share no filesystem, a staging prefix ``<data>/NAME/.staging/<ID>/`` (its
``sends.json`` names the version it claimed and its build key; ``bucket/remote_jobs.py``). Both go at
the build's end; ``build_leftovers`` finds and deletes what stayed:

* a staging prefix whose ``sends.json`` names a version the catalog lists: a publish's leftovers
  (killed between its catalog entry and the delete), whatever its age;
* a staging prefix whose last sign of life (its newest object or upload, its lease's ``expires_at``) is
  older than the cutoff and whose build key's lease is absent or expired: an abandoned build (without a
  readable ``sends.json``: by age alone). Never one whose lease is live (on this machine's clock, as a
  taker reads it), and it is looked at again just before it is deleted (a build that came back);
* a lease whose ``expires_at`` is older than the cutoff (a crashed holder's; an unreadable record, by its
  object's age), never a live one, deleted only if its ETag is still the one read (a build that took it
  over since has renewed it).

A staging prefix whose ``sends.json`` names another catalog is kept: one data root serves one catalog.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
import time
from dataclasses import dataclass
from typing import Any

from ..config import check_name
from ..errors import ConfigError
from .fs import error_code, read_with_etag, refused, refusing
from .layout import VERSION_RE, BucketTarget
from .lease import LEASE_DIR, LeaseRecord, lease_key

__all__ = ["BucketGarbage", "build_leftovers", "list_objects", "utc_stamp"]


@dataclass(frozen=True, kw_only=True)
class BucketGarbage:
    """One thing ``collect_bucket_garbage`` removed (or, with ``dry_run``, would remove)."""

    url: str
    why: str
    objects: int
    """Objects deleted under the prefix; for an incomplete multipart upload, its parts."""
    bytes: int
    upload: bool = False
    """An incomplete multipart upload (aborted), not a prefix of objects (deleted)."""


def utc_stamp(when: _dt.datetime) -> str:
    """``when`` as ``YYYY-MM-DDTHH:MM:SSZ``."""
    return when.astimezone(_dt.timezone.utc).replace(microsecond=0).isoformat().replace("+00:00", "Z")


def list_objects(fs: Any, root: str) -> dict[str, tuple[int, _dt.datetime | None]]:
    """``{relative name: (size, last modified)}`` of the objects under ``root/`` (``bucket/key``)."""
    fs.invalidate_cache(root)
    try:
        found = fs.find(f"{root}/", detail=True)
    except FileNotFoundError:
        return {}
    start = len(root) + 1
    return {p[start:]: (int(info.get("size") or 0), info.get("LastModified"))
            for p, info in found.items() if p.startswith(f"{root}/") and len(p) > start}


Uploads = list[tuple[str, str, _dt.datetime | None]]
"""``(key, upload id, initiated)`` of the incomplete multipart uploads under the data root."""


def build_leftovers(fs: Any, client: Any, target: BucketTarget, catalog_url: str,
                    objects: dict[str, tuple[int, Any]], listed: dict[str, str], uploads: Uploads, *,
                    cutoff: _dt.datetime, dry_run: bool) -> list[BucketGarbage]:
    """Delete (``dry_run``: only report) the staging prefixes and leases under the data root that no build needs (the
    module docstring). ``objects``: the data root's listing (``list_objects``), taken before ``listed`` (``{key: ref}``
    of the versions the catalog lists) was read; ``client``: botocore's S3 client."""
    staging, leases = _build_objects(objects)
    return (_staging_garbage(fs, target, catalog_url, staging, listed, uploads, cutoff, dry_run)
            + _lease_garbage(client, target, leases, cutoff, dry_run))


_STAGING_DIR = ".staging"
_STAGING_ID = re.compile(r"^[0-9a-f]{16}$")


def _build_objects(objects: dict[str, tuple[int, Any]]
                   ) -> tuple[dict[tuple[str, str], dict[str, tuple[int, Any]]], dict[tuple[str, str], tuple[int, Any]]]:
    """The staging prefixes under the data root, ``{(NAME, ID): {relative name: info}}``, and the lease objects,
    ``{(NAME, build key): info}``; anything else (another program's) is left out."""
    staging: dict[tuple[str, str], dict[str, tuple[int, Any]]] = {}
    leases: dict[tuple[str, str], tuple[int, Any]] = {}
    for rel, info in objects.items():
        parts = rel.split("/")
        if len(parts) < 3 or parts[1] not in (_STAGING_DIR, LEASE_DIR):
            continue
        try:
            check_name(parts[0])
        except ConfigError:
            continue
        if parts[1] == _STAGING_DIR and len(parts) > 3 and _STAGING_ID.match(parts[2]):
            staging.setdefault((parts[0], parts[2]), {})["/".join(parts[3:])] = info
        elif parts[1] == LEASE_DIR and len(parts) == 3 and parts[2].endswith(".json"):
            leases[(parts[0], parts[2][:-5])] = info
    return staging, leases


def _lease_end(target: BucketTarget, name: str, build_key: str) -> float | None:
    """``expires_at`` of the lease of ``build_key``; None when there is none (or no readable record: taken as expired)."""
    try:
        got = read_with_etag(target.url(lease_key(target, name, build_key)))
    except ConfigError:  # not a build key a lease can have
        return None
    record = LeaseRecord.parse(got[0]) if got else None
    return None if record is None else record.expires_at


def _last_sign(target: BucketTarget, name: str, build_key: str, key: str, files: dict[str, tuple[int, Any]],
               uploads: Uploads) -> tuple[bool, _dt.datetime | None]:
    """Whether the build of a staging prefix holds a live lease (on this machine's clock, as a taker reads it), and
    its last sign of life: the newest object or upload under ``key``, or its lease's expiry."""
    times = [t for _, t in files.values() if t is not None]
    times += [t for k, _, t in uploads if k.startswith(f"{key}/") and t is not None]
    end = _lease_end(target, name, build_key) if build_key else None
    if end is not None:
        times.append(_dt.datetime.fromtimestamp(end, _dt.timezone.utc))
    return end is not None and end >= time.time(), max(times, default=None)


def _sends(target: BucketTarget, key: str) -> dict[str, Any]:
    """The staging prefix's ``sends.json`` (the version its build claimed, its build key, its catalog); {} if unreadable."""
    got = read_with_etag(target.url(f"{key}/sends.json"))
    try:
        sends = json.loads(got[0]) if got else {}
    except ValueError:
        return {}
    return sends if isinstance(sends, dict) else {}


def _staging_garbage(fs: Any, target: BucketTarget, catalog_url: str, staging: dict[tuple[str, str], dict[str, Any]],
                     listed: dict[str, str], uploads: Uploads, cutoff: _dt.datetime, dry_run: bool) -> list[BucketGarbage]:
    """Staging prefixes of published versions (whatever their age) and of abandoned builds (older than ``cutoff``,
    no live lease; by age alone without a readable ``sends.json``), each looked at again just before it goes."""
    result: list[BucketGarbage] = []
    for (name, work), files in sorted(staging.items()):
        key = target.version_key(name, f"{_STAGING_DIR}/{work}")
        sends = _sends(target, key) if "sends.json" in files else {}
        if str(sends.get("catalog_url") or catalog_url).rstrip("/") != catalog_url:
            continue  # another catalog's build (one data root serves one catalog): not this gc's to judge
        version, build_key = str(sends.get("version") or ""), str(sends.get("build_key") or "")
        if VERSION_RE.match(version) and target.version_key(name, version) in listed:
            why = f"{name}@{version}'s staging, a build's job records, its version published"
        else:
            live, newest = _last_sign(target, name, build_key, key, files, uploads)
            if live or newest is None or newest > cutoff:
                continue  # a build may be running, or resuming (it takes the expired lease over)
            held = f" (build key {build_key[:16]})" if build_key else ""
            why = (f"abandoned build of {name}{held}, last written {utc_stamp(newest)}: its job records (a rerun of it "
                   "redoes its jobs)")
            if not dry_run:  # a build that came back to life since the listing: its lease or its writes are new
                files = list_objects(fs, f"{target.bucket}/{key}")
                live, newest = _last_sign(target, name, build_key, key, files, uploads)
                if live or newest is None or newest > cutoff:
                    continue
        result.append(BucketGarbage(url=f"{target.url(key)}/", why=why, objects=len(files),
                                    bytes=sum(size for size, _ in files.values())))
        if not dry_run:
            fs.rm([f"{target.bucket}/{key}/{n}" for n in sorted(files)])  # bulk deletes, 1000 keys a request
            fs.invalidate_cache(f"{target.bucket}/{key}")
    return result


def _lease_garbage(client: Any, target: BucketTarget, leases: dict[tuple[str, str], tuple[int, Any]],
                   cutoff: _dt.datetime, dry_run: bool) -> list[BucketGarbage]:
    """Leases that expired before ``cutoff`` (crashed holders'; an unreadable one by its age), never a live one;
    each deleted only if unchanged since it was read (a build that took it over renewed it)."""
    result: list[BucketGarbage] = []
    for (name, build_key), (_, modified) in sorted(leases.items()):
        try:
            key = lease_key(target, name, build_key)
        except ConfigError:
            continue  # no lease of a build: another program's
        url = target.url(key)
        got = read_with_etag(url)
        record = LeaseRecord.parse(got[0]) if got else None
        if got is None or (record is not None and record.expires_at >= time.time()):
            continue  # gone meanwhile, or live
        ended = modified if record is None else _dt.datetime.fromtimestamp(record.expires_at, _dt.timezone.utc)
        if ended is None or ended > cutoff:
            continue
        who = f"held by {record.describe()}" if record else "its record unreadable"
        why = f"lease of a build that ended {utc_stamp(ended)} ({name}, build key {build_key[:16]}, {who})"
        if not dry_run and not _delete_if_unchanged(client, target.bucket, key, got[1], url):
            continue
        result.append(BucketGarbage(url=url, why=why, objects=1, bytes=len(got[0])))
    return result


def _delete_if_unchanged(client: Any, bucket: str, key: str, etag: str, url: str) -> bool:
    """Delete the object if its ETag is still ``etag`` (S3 ``If-Match`` on DeleteObject); False when it changed or
    went. A store that has no conditional delete: the ETag read again, then deleted (a narrow race)."""
    try:
        client.delete_object(Bucket=bucket, Key=key, IfMatch=etag)
        return True
    except Exception as exc:  # botocore's ClientError; network errors go on as they are
        code, status = error_code(exc)
        if status == 412 or code == "NoSuchKey":
            return False
        if code != "NotImplemented" and status != 501:
            if 400 <= status < 500:
                raise refused(url, exc) from None
            raise
    got = read_with_etag(url)
    if got is None or got[1] != etag:
        return False
    refusing(url, client.delete_object, Bucket=bucket, Key=key)
    return True
