"""Builds whose versions live on a bucket: ``--data-root s3://B/data --catalog s3://B/catalog``.

Such a build runs as a local one does, in a scratch mirror of the bucket on the build's machine
(``<scratch>/<bucket>/<key>``: a catalog entry's relative path, ``../data/NAME/vN``, is then the
same there and in the bucket), and is then published by ``shardflow.bucket.push``
(``prepare_publish``, ``push_files`` on the workers, ``finish_push``; or ``publish_to_bucket`` in
one process). Before the build, ``sync_catalog`` merges the bucket's catalog file into the
scratch's, and ``fetch_parent`` fetches a parent published from another machine, verified, so
that its unchanged inputs are reused. What each step decides: docs/OPERATIONS.md ("Building to
object storage").
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .._io import atomic_write_bytes
from ..catalog import Catalog
from ..config import BuildConfig
from ..errors import ConfigError, ShardflowError
from ..manifest import MANIFEST_NAME, read_manifest
from ..manifest_files import named_files
from .fs import is_remote, read_with_etag
from .push import BucketTarget, PushPlan, PushResult, bucket_target, prepare_push, push_version

__all__ = ["input_content", "BucketPlaces", "bucket_places", "sync_catalog", "fetch_parent", "prepare_publish", "publish_to_bucket", "SCRATCH_ENV", "default_scratch"]

log = logging.getLogger("shardflow.pipeline")

SCRATCH_ENV = "SHARDFLOW_SCRATCH"


def default_scratch(scratch: str | os.PathLike[str] | None = None) -> Path:
    """``scratch``, else ``$SHARDFLOW_SCRATCH``, else ``~/.cache/shardflow/scratch``; absolute, local."""
    text = os.fspath(scratch) if scratch else os.environ.get(SCRATCH_ENV) or "~/.cache/shardflow/scratch"
    if is_remote(text):
        raise ConfigError(f"--scratch {text}: the scratch directory of a build to a bucket must be a local (or "
                          "shared) directory, not a URL")
    return Path(text).expanduser().absolute()


@dataclass(frozen=True, kw_only=True)
class BucketPlaces:
    """Where a build to a bucket publishes, and the scratch mirror it builds in."""

    target: BucketTarget
    data_root_url: str
    catalog_url: str
    data_root: Path
    """The scratch mirror of ``data_root_url``: the build's local data root."""
    catalog: Path
    """The scratch mirror of ``catalog_url``: the build's local catalog."""

    def version_url(self, ref: str) -> str:
        """``NAME@vN``'s prefix in the bucket, ``s3://B/data/NAME/vN``."""
        return self.target.url(self.target.version_key(*ref.split("@")))


def bucket_places(data_root: str | None, catalog: str | None, scratch: str | os.PathLike[str] | None = None
                  ) -> BucketPlaces | None:
    """The places of a build to a bucket, or None when both are local (or unset: the local defaults).

    Both must then be ``s3://`` URLs in one bucket: a local catalog cannot list a
    version on a bucket, nor a bucket catalog a version on one machine's disk.
    """
    remote = [bool(value) and is_remote(str(value)) for value in (data_root, catalog)]
    if not any(remote):
        return None
    if not all(remote):
        local = "--catalog" if remote[0] else "--data-root"
        raise ConfigError(f"{local} {(catalog if remote[0] else data_root) or '(unset)'}: a build to a bucket needs both "
                          "--data-root and --catalog on it, in one bucket, e.g. --data-root s3://BUCKET/data "
                          "--catalog s3://BUCKET/catalog")
    assert data_root is not None and catalog is not None
    target = bucket_target(data_root, catalog, options=("--data-root", "--catalog"))
    mirror = default_scratch(scratch) / target.bucket
    return BucketPlaces(
        target=target, data_root_url=data_root.rstrip("/"), catalog_url=catalog.rstrip("/"),
        data_root=mirror / target.data_key if target.data_key else mirror,
        catalog=mirror / target.catalog_key if target.catalog_key else mirror,
    )


def sync_catalog(places: BucketPlaces, name: str) -> set[str]:
    """Merge the bucket's catalog file of ``name`` into the scratch catalog (docs/OPERATIONS.md says what
    that decides); the versions the bucket lists."""
    got = read_with_etag(places.target.url(places.target.catalog_file_key(name)))
    with tempfile.TemporaryDirectory(prefix="shardflow-sync-") as tmp:
        theirs = Catalog(tmp)
        if got is not None:
            (Path(tmp) / f"{name}.yaml").write_bytes(got[0])
        try:
            listed = {v.version: v.build_key for v in theirs.versions(name)} if got else {}
            their_sha = {v.version: v.manifest_sha256 for v in theirs.versions(name)} if got else {}
            removed = {r.version for r in theirs.removed(name)} if got else set()
        except ShardflowError as exc:
            raise type(exc)(str(exc).replace(str(theirs.path), places.catalog_url)) from None
    local = Catalog(places.catalog)
    local.path.mkdir(parents=True, exist_ok=True)
    with local.lock(name):
        ours = local.versions(name) if name in local.datasets() else []
        if got is None and not ours:
            return set()
        kept = [e for e in ours if e.version not in listed and e.version not in removed]
        for entry in ours:
            if entry not in kept and listed.get(entry.version) != entry.build_key:
                # Lost to another build (or removed from the bucket): not this version's data any more.
                log.warning("%s@%s built here was not published: the bucket's catalog gives that version to "
                            "another build, or removed it; discarding the local copy", name, entry.version)
                shutil.rmtree(local.version_dir(entry), ignore_errors=True)
                local.files_record(name, entry.version).unlink(missing_ok=True)
            elif entry not in kept and their_sha.get(entry.version) not in ("", entry.manifest_sha256):
                _take_their_manifest(places, local, name, entry)
        if got is not None:
            atomic_write_bytes(local.path / f"{name}.yaml", got[0])
        else:
            (local.path / f"{name}.yaml").unlink()
        for entry in kept:  # built here, not yet in the bucket: pushed by this run
            local.add(name, replace(entry, path=str(local.version_dir(entry))))
    return set(listed)


def _take_their_manifest(places: BucketPlaces, local: Catalog, name: str, entry: Any) -> None:
    """The local version ``entry`` is the build the bucket lists, published from another machine first: the same
    files, but its own manifest (another creation time), which the bucket's entry does not record. The bucket's
    manifest (checked against that entry) replaces it, so that later builds here reuse the version as their parent;
    where that fails, the local copy is discarded (a later build fetches the bucket's)."""
    from ..runtime.remote import remote_version

    ref, directory = f"{name}@{entry.version}", local.version_dir(entry)
    with tempfile.TemporaryDirectory(prefix="shardflow-sync-") as tmp:
        try:
            # (Read with its shard table, if it names one, fetched and verified: ``VersionCache.load_manifest``.)
            cache, theirs = remote_version(ref, catalog=places.catalog_url, cache_dir=tmp)
            if set(named_files(theirs)) != set(named_files(read_manifest(directory))):
                raise ShardflowError("the bucket's manifest names other files")
            # The same files, the shard table among them (its name, size and SHA-256): this copy's table is theirs,
            # byte for byte, so the manifest alone is replaced.
            staged = directory / f".{MANIFEST_NAME}.tmp"
            shutil.copyfile(cache.directory / MANIFEST_NAME, staged)
            os.chmod(staged, 0o444)  # read-only, as publishing leaves every file of a version
            os.replace(staged, directory / MANIFEST_NAME)
        except (ShardflowError, OSError, TypeError, ValueError, KeyError) as exc:
            log.warning("%s built here was published from another machine first, and the bucket's manifest could not "
                        "replace this copy's (%s); discarding the local copy", ref, exc)
            shutil.rmtree(directory, ignore_errors=True)
            local.files_record(name, entry.version).unlink(missing_ok=True)


def fetch_parent(places: BucketPlaces, config: BuildConfig) -> str | None:
    """Fetch the bucket's latest version of ``config.name`` into the scratch when this machine has no copy of it
    and it can be this build's incremental parent: built with the same output options, from other inputs (an
    input added, removed or changed: compared by SHA-256, an object by its storage identity). Its ``NAME@vN`` if
    the scratch has it (built here, or fetched): without it, plan with ``reuse=False`` (there is no parent to
    reuse, and nothing more to say about it).

    Every file its manifest names (its shard table too, if it has one) is downloaded, verified against the
    manifest's SHA-256 as it arrives (the manifest against the bucket catalog's entry), into ``.fetch-vN/``
    beside it (a rerun after an interruption keeps what was verified), then the version's directory appears at once, its manifest written last, where the
    scratch catalog (the bucket's, ``sync_catalog``) lists it. Planning then reuses it as it reuses a version
    built here, and the push copies its equal shards within the bucket. Downloading tokens costs bandwidth;
    tokenizing the text again, which it saves, costs CPU (several times longer at a tokenizer's rate).
    """
    from ..pipeline.incremental import NO_REUSE_ENV

    name, cat = config.name, Catalog(places.catalog)
    if os.environ.get(NO_REUSE_ENV, "").strip() not in ("", "0") or config.val_count or name not in cat.datasets():
        return None  # (an exact --val-count never reuses a parent: pipeline/incremental.py)
    latest = cat.latest(name)
    entry = cat.entry(name, latest) if latest else None
    if entry is None:
        return None
    ref, directory = f"{name}@{latest}", cat.version_dir(entry)
    root = places.data_root.resolve()
    if not directory.is_relative_to(root) or directory == root:
        return None  # not a version directory of the data root
    if directory.exists():
        return ref  # built (or fetched) here already
    from ..runtime.remote import fetch_version, remote_version

    ours = _input_contents(config, places.data_root)  # (bad input fails here, as planning would, in one message)
    staging = directory.with_name(f".fetch-{directory.name}")
    try:
        _, manifest = remote_version(ref, catalog=places.catalog_url, cache_dir=staging)
        theirs = {input_content(e) for e in manifest.inputs if isinstance(e, dict)}
        if BuildConfig.from_dict(manifest.config).reuse_fields() != config.reuse_fields() or theirs == ours:
            # Other output options: nothing of it is reused. The same inputs, byte for byte: the build the
            # bucket lists already (planning says "nothing new").
            shutil.rmtree(staging, ignore_errors=True)
            return None
        _, cached, manifest = fetch_version(ref, catalog=places.catalog_url, cache_dir=staging, verify=False)
    except (ShardflowError, OSError, TypeError, ValueError, KeyError) as exc:
        log.warning("not fetching %s from %s to reuse it: %s", ref, places.data_root_url, exc)
        return None
    tmp = staging / f"version-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    files = {str(f.name) for f in named_files(manifest)}
    for file in sorted(files):
        dest = tmp / file
        dest.parent.mkdir(parents=True, exist_ok=True)
        os.link(cached / file, dest)  # the same filesystem: staging is beside the version
    # Written last, and a fresh file: a parent file newer than its manifest would be hashed again when reused.
    shutil.copyfile(cached / MANIFEST_NAME, tmp / MANIFEST_NAME)
    try:
        os.replace(tmp, directory)
    except OSError:
        if not (directory / MANIFEST_NAME).is_file():
            raise
        shutil.rmtree(tmp, ignore_errors=True)  # another build on this scratch fetched it meanwhile
    shutil.rmtree(staging, ignore_errors=True)
    log.info("fetched %s (%d files) from %s into the scratch: its unchanged inputs are reused, not tokenized again",
             ref, len(files) + 1, places.version_url(ref))
    return ref


def _input_contents(config: BuildConfig, data_root: Path) -> set[tuple[str, int, str]]:
    """``(relname, size, content)`` of the build's inputs: a local file's SHA-256, an object's storage identity.

    The local files are hashed with planning's stat-keyed cache (``fingerprint_inputs``, the same cache
    directory), so planning does not read them again; objects are identified from their listing, as
    planning identifies them.
    """
    from ..sources import discover_inputs, fingerprint_inputs

    inputs = fingerprint_inputs(discover_inputs(config.sources), cache_dir=data_root / config.name)
    return {(inp.relname, inp.size, f"object:{inp.identity}" if inp.identity else inp.sha256) for inp in inputs}


def input_content(entry: dict[str, Any]) -> tuple[str, int, str]:
    """An input of a manifest (its ``inputs`` entry) as ``_input_contents`` gives ours."""
    identity = entry.get("identity")
    return entry.get("relname"), entry.get("size"), f"object:{identity}" if identity else entry.get("sha256")


def prepare_publish(places: BucketPlaces, ref: str, *, listed: set[str]) -> PushPlan | None:
    """A push of the version ``ref`` built in the scratch, claimed and ready for ``push_files`` and ``finish_push``
    (None: the bucket lists it already)."""
    if ref.partition("@")[2] in listed:
        return None
    plan = prepare_push(ref, data_root_url=places.data_root_url, catalog_url=places.catalog_url, catalog=places.catalog,
                        checksums=False)
    return plan if isinstance(plan, PushPlan) else None


def publish_to_bucket(places: BucketPlaces, ref: str, *, listed: set[str], workers: int) -> PushResult | None:
    """Push the version ``ref`` built in the scratch (None: the bucket lists it already, nothing is sent)."""
    if ref.partition("@")[2] in listed:
        return None
    # The build validated the version moments ago; every upload is still hashed against the manifest.
    return push_version(ref, data_root_url=places.data_root_url, catalog_url=places.catalog_url,
                        catalog=places.catalog, workers=workers, checksums=False)
