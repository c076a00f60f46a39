"""Where a version lives in a bucket, and who may write it: the bucket's keys, a scratch mirror of them, the claim.

``bucket_target`` checks a data root and a catalog URL (``s3://``, one bucket, plain prefixes) and names
their keys; ``Mirror`` is a local directory laid out like those keys, where ``Catalog`` reads and writes the
bucket's catalog file; ``claim`` reserves ``<data-root>/<name>/<vN>/`` for one build and one catalog (the
object ``CLAIM_NAME``, specified in docs/FORMAT.md). ``bucket/push.py`` publishes through them, and
``bucket/lifecycle.py`` removes through them.
"""

from __future__ import annotations

import datetime as _dt
import json
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from ..catalog import Catalog
from ..errors import CatalogError, ConfigError, ShardflowError
from .fs import filesystem, redacted, update_object

__all__ = ["CLAIM_NAME", "VERSION_RE", "BucketTarget", "bucket_target", "Mirror", "claim"]

CLAIM_NAME = ".shardflow-push.json"
"""The object that reserves a version's prefix for one build (its build key) and catalog, created before any upload."""
VERSION_RE = re.compile(r"^v[0-9]+$")


@dataclass(frozen=True, kw_only=True)
class BucketTarget:
    """The bucket, and the keys of the data root and the catalog (no leading or trailing '/')."""

    scheme: str
    bucket: str
    data_key: str
    catalog_key: str

    def url(self, key: str) -> str:
        return f"{self.scheme}://{self.bucket}/{key}"

    def version_key(self, name: str, version: str) -> str:
        return "/".join(p for p in (self.data_key, name, version) if p)

    def catalog_file_key(self, name: str) -> str:
        return "/".join(p for p in (self.catalog_key, f"{name}.yaml") if p)


def bucket_target(data_root_url: str, catalog_url: str, *,
                  options: tuple[str, str] = ("--data-root-url", "--catalog-url")) -> BucketTarget:
    """Both URLs checked: ``s3://``, one bucket, no ``.``/``..``/empty parts (``options``: their names in messages)."""
    parsed = []
    for option, url in zip(options, (data_root_url, catalog_url)):
        if odd := sorted(set("%#?") & set(url)):
            # Clients disagree on them (quoted or not, a fragment, a query): the catalog, the manifest and the
            # shards of one version would land under different keys, or the catalog elsewhere than asked.
            raise ConfigError(f"{option} {redacted(url)}: {' '.join(repr(c) for c in odd)} in a bucket URL of a "
                              "version or a catalog is refused (S3 clients read it in different ways); give a "
                              "prefix without it")
        p = urlparse(url)
        if p.scheme.lower() != "s3" or not p.netloc:
            raise ConfigError(f"{option} {redacted(url)}: give an s3:// URL, s3://BUCKET/PREFIX (other stores have no "
                              "conditional writes to commit a version with)")
        filesystem(url)  # refuses credentials in the URL; names the pip line when s3fs is missing
        key = p.path.strip("/")
        if key and any(part in ("", ".", "..") for part in key.split("/")):
            raise ConfigError(f"{option} {redacted(url)}: the prefix {key!r} has an empty, '.' or '..' part; give a plain "
                              "prefix such as s3://BUCKET/data")
        parsed.append((p.netloc, key))
    (bucket, data_key), (cat_bucket, catalog_key) = parsed
    if bucket != cat_bucket:
        raise ConfigError(f"{options[0]} and {options[1]} are in different buckets ({bucket}, {cat_bucket}); a catalog "
                          "entry's path is relative to the catalog, so both must be in one bucket")
    return BucketTarget(scheme="s3", bucket=bucket, data_key=data_key, catalog_key=catalog_key)


class Mirror:
    """A scratch directory laid out like the bucket's keys, where ``Catalog`` reads and writes the bucket's catalog
    file and its relative paths come out as they are in the bucket."""

    def __init__(self, root: str, target: BucketTarget, catalog_url: str) -> None:
        self.root, self.target, self.catalog_url = Path(root) / target.bucket, target, catalog_url.rstrip("/")

    def path(self, key: str) -> Path:
        return self.root / key if key else self.root

    def catalog(self, name: str, data: bytes | None) -> Catalog:
        cat = Catalog(self.path(self.target.catalog_key))
        cat.path.mkdir(parents=True, exist_ok=True)
        if data is not None:
            (cat.path / f"{name}.yaml").write_bytes(data)
        return cat

    def renamed(self, exc: ShardflowError, cat: Catalog) -> ShardflowError:
        """``exc`` naming the bucket's URL, not the scratch copy."""
        return type(exc)(str(exc).replace(str(cat.path), self.catalog_url))


def claim(target: BucketTarget, prefix: str, ref: str, build_key: str, catalog_url: str) -> None:
    """Reserve the version's prefix for this build and catalog; refuse one another build, or catalog, holds.

    One data root serves one catalog: a prefix listed by two catalogs would be deleted by one's ``rm`` (or ``gc``)
    under the other's entry. A claim written before the catalog was recorded in it is taken as this catalog's.

    A claim this build holds already (a rerun resuming, or the same build pushed from another machine) is written
    again, with the time: its age is what ``shardflow gc`` reads as the push's last sign of life, and a rerun a day
    after an interrupted push must not look abandoned while it skips the files that are there.
    """
    url = target.url(f"{prefix}/{CLAIM_NAME}")
    record = {"ref": ref, "build_key": build_key, "catalog": catalog_url}

    def renewed(current: bytes | None) -> bytes:
        if current is None:
            return json.dumps(record).encode()
        try:
            held, held_catalog = (json.loads(current).get(k) for k in ("build_key", "catalog"))
        except (ValueError, AttributeError):
            held = held_catalog = None
        if held == build_key and held_catalog not in (None, catalog_url):
            raise CatalogError(
                f"{target.url(prefix)} holds {ref} for the catalog {held_catalog}: one data root serves one catalog "
                f"(an rm in either would delete what the other lists); publish under another data root, or read it "
                f"from {held_catalog}"
            )
        if held != build_key:
            raise CatalogError(
                f"{target.url(prefix)} is claimed by another build of {ref} (build key {str(held)[:16]}...), not yet in "
                "the bucket catalog: another push is running, or one was interrupted. If none is running, delete "
                f"everything under it (aws s3 rm --recursive {target.url(prefix)}/) and push again"
            )
        return json.dumps({**record, "renewed": _utc_now()}).encode()

    update_object(url, renewed, again="push again")


def _utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="microseconds").replace("+00:00", "Z")
