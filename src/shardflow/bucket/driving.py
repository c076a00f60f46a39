"""What the driver of a build to a bucket holds while it runs: the build key's lease, and the version it sends to.

``bucket_lock(places, sends=...)`` is ``drive``'s lock for a build to a bucket (``run_request`` passes
it). Inside this machine's ``build_lock`` it takes the bucket's lease of the build key
(``bucket/lease.py``): a second build of the same inputs, from any machine, waits for the first and
reports its version, or takes over once the first's lease has expired, and finds the jobs the first
committed on the bucket. With ``sends`` (workers that share no filesystem: ``DaskExecutor``), it then
claims the version's prefix on the bucket before any job runs, so that workers can send each shard
to its final key, and records where in ``sends.json`` (``prepare_sends``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterator

from .._io import atomic_write_bytes
from ..catalog import Catalog
from ..config import BuildConfig
from ..errors import CatalogError, ConfigError, ShardflowError
from ..pipeline.model import BuildPlan
from ..pipeline.staging import Staging, build_lock, reset_staging, write_plan
from .build import BucketPlaces, input_content
from .fs import filesystem, read_with_etag
from .layout import CLAIM_NAME, VERSION_RE, Mirror, claim
from .lease import Lease, wait_for_lease
from .remote_jobs import Sends, fetch_records, read_sends, work_id, write_sends
from .remote_manifest import bucket_manifest

__all__ = ["bucket_lock", "prepare_sends", "published_version", "listed_versions", "staging_url"]

log = logging.getLogger("shardflow.pipeline")


class _NoLease:
    """What ``_leased`` yields with a plan that has nothing to do (another build published it)."""

    on_renew: list[Any] = []


_NO_LEASE: Any = _NoLease()


def published_version(places: BucketPlaces, plan: BuildPlan) -> str | None:
    """The version the bucket's catalog lists for this build, if any: by its build key, or, for a plan that keyed
    objects by their storage identity (the key the catalog records is of their SHA-256, which the workers take),
    a recent version of the same options whose manifest records the same inputs."""
    name = plan.config.name
    with _bucket_catalog(places, name) as cat, tempfile.TemporaryDirectory(prefix="shardflow-lease-") as tmp:
        if cat is None:
            return None
        found = cat.find_build(name, plan.build_key)
        if found is not None or all(inp.sha256 for inp in plan.inputs):
            return None if found is None else found.version
        ours = {(inp.relname, inp.size, f"object:{inp.identity}" if inp.identity else inp.sha256) for inp in plan.inputs}
        for entry in sorted(cat.versions(name), key=lambda v: v.created_at, reverse=True)[:3]:
            try:  # the manifest the catalog entry records, with its shard table if it names one
                manifest = bucket_manifest(places.version_url(f"{name}@{entry.version}"), Path(tmp) / entry.version,
                                           sha256=entry.manifest_sha256)
            except (OSError, ShardflowError):
                continue
            theirs = {input_content(e) for e in manifest.inputs if isinstance(e, dict)}
            if theirs == ours and BuildConfig.from_dict(manifest.config) == plan.config:
                return entry.version
    return None


@contextlib.contextmanager
def _bucket_catalog(places: BucketPlaces, name: str) -> Iterator[Catalog | None]:
    """The bucket's catalog of ``name`` as it is now, read through a scratch mirror (None: it has none)."""
    got = read_with_etag(places.target.url(places.target.catalog_file_key(name)))
    if got is None:
        yield None
        return
    with tempfile.TemporaryDirectory(prefix="shardflow-bucket-") as tmp:
        yield Mirror(tmp, places.target, places.catalog_url).catalog(name, got[0])


def listed_versions(places: BucketPlaces, name: str) -> set[str]:
    """The versions the bucket's catalog lists now."""
    with _bucket_catalog(places, name) as cat:
        return set() if cat is None else {v.version for v in cat.versions(name)}


def staging_url(places: BucketPlaces, plan: BuildPlan) -> str:
    """The bucket prefix of this build's job records: the same from every machine, and another for a plan that cut
    other units (``remote_jobs.work_id``)."""
    return places.target.url(places.target.version_key(plan.config.name, f".staging/{work_id(plan, places.catalog_url)}"))


def _claim_of(places: BucketPlaces, name: str, version: str) -> dict[str, Any] | None:
    got = read_with_etag(places.target.url(f"{places.target.version_key(name, version)}/{CLAIM_NAME}"))
    if got is None:
        return None
    try:
        record = json.loads(got[0])
    except ValueError:
        record = None
    return record if isinstance(record, dict) else {}


def _ours(record: dict[str, Any] | None, plan: BuildPlan) -> bool:
    """Whether a claim is free or this build's (by its planned key; a publish that began re-keys it, keeping that)."""
    return record is None or plan.build_key in (record.get("build_key"), record.get("planned_key"))


def _claim(places: BucketPlaces, plan: BuildPlan, version: str) -> bool:
    """Claim ``version`` for ``plan`` (renewing a claim it holds); False if another build holds it."""
    name = plan.config.name
    record = _claim_of(places, name, version)
    if not _ours(record, plan):
        return False
    if record is not None and record.get("build_key") != plan.build_key:
        return True  # re-keyed by a publish of this build that began: ours, left as it is
    try:
        claim(places.target, places.target.version_key(name, version), f"{name}@{version}", plan.build_key,
              places.catalog_url)
    except CatalogError:
        return False  # taken meanwhile by another build
    return True


def _taken(places: BucketPlaces, name: str) -> set[str]:
    """The versions the bucket's catalog lists or has removed: names no build may claim again."""
    with _bucket_catalog(places, name) as cat:
        return set() if cat is None else {v.version for v in cat.versions(name)} | {r.version for r in cat.removed(name)}


def prepare_sends(places: BucketPlaces, plan: BuildPlan) -> Sends:
    """Claim the version this build sends its files to (the one an earlier run of it claimed, from any machine,
    else the next free one), record it in ``sends.json`` here and on the bucket, and take in the jobs' records
    that earlier runs committed on the bucket."""
    name, staging = plan.config.name, Staging(plan.staging)
    if plan.config.embed is not None:
        raise ConfigError("--embed: a build to a bucket on Dask workers that share no filesystem does not compute "
                          "embeddings yet; build without --embed, or with --runner threads")
    url, taken = staging_url(places, plan), _taken(places, name)

    def usable(sends: Sends | None) -> bool:
        # This work's prefix, a version no catalog entry names (listed by another build, or removed), still claimed
        # by this build: a gc that took it for abandoned, or an rm, leaves nothing sent to it to trust.
        return (sends is not None and sends.staging_url == url and sends.version not in taken
                and _claim(places, plan, sends.version))

    sends = read_sends(staging)
    if (sends is None and any(staging.parts.glob("unit-*.json"))) or (sends is not None and not usable(sends)):
        # Staged by a run whose workers shared this filesystem (its pieces are here, where no worker reads them),
        # or sent to a version this build cannot keep: started afresh here.
        reset_staging(staging)
        staging.sends_file.unlink(missing_ok=True)
        write_plan(plan)
        sends = None
    if sends is None:
        got = read_with_etag(f"{url}/sends.json")
        theirs = Sends.from_dict(json.loads(got[0])) if got else None
        if usable(theirs):
            sends = theirs
        else:
            if theirs is not None:  # its shards went to a version this build cannot keep: sent again
                _drop_shard_records(url)
            sends = _new_sends(places, plan, url, taken)
        write_sends(staging, sends)
    found = fetch_records(staging, sends)
    if found:
        log.info("%s: %d jobs committed by an earlier run of this build were found on the bucket; they are not run "
                 "again", name, found)
    return sends


def _drop_shard_records(url: str) -> None:
    fs, root = filesystem(url)
    try:
        stale = [p for p in fs.find(f"{root}/layout") if p.endswith((".shard.json", ".valid.json"))]
    except FileNotFoundError:
        return
    if stale:
        fs.rm(stale)


def _new_sends(places: BucketPlaces, plan: BuildPlan, url: str, taken: set[str]) -> Sends:
    """The next version prefix this build can claim, recorded on the bucket (under the build key's lease: no other
    run of this work writes ``sends.json`` meanwhile)."""
    name = plan.config.name
    number = 1 + max((int(v[1:]) for v in taken if VERSION_RE.match(v)), default=0)
    for _ in range(100):
        if _claim(places, plan, f"v{number}"):
            break
        number += 1
    else:
        raise CatalogError(f"{places.data_root_url}/{name}: no free version prefix after 100 tries; "
                           "`shardflow gc` removes abandoned claims")
    version = f"v{number}"
    sends = Sends(version=version, version_url=places.target.url(places.target.version_key(name, version)),
                  staging_url=url, target=places.target, catalog_url=places.catalog_url, build_key=plan.build_key)
    fs, path = filesystem(f"{url}/sends.json")
    fs.pipe_file(path, json.dumps(sends.to_dict(), sort_keys=True).encode())
    return sends


def _renew_claim(places: BucketPlaces, plan: BuildPlan) -> Any:
    """What the lease's thread also renews: this build's version claim, every 10 minutes, so that ``gc`` never takes
    a long build's prefix for abandoned (its age is the claim's)."""
    last = [0.0]

    def renew() -> None:
        sends = read_sends(Staging(plan.staging))
        if sends is not None and time.monotonic() - last[0] > 600:
            _claim(places, plan, sends.version)
            last[0] = time.monotonic()

    return renew


def bucket_lock(places: BucketPlaces, *, sends: bool) -> Callable[..., ContextManager[BuildPlan]]:
    """``drive``'s lock for a build to ``places``: this machine's build lock, then the bucket's lease of the build
    key (waiting for a build of the same key elsewhere), then, with ``sends``, the version claimed up front."""

    @contextlib.contextmanager
    def lock(plan: BuildPlan, *, timeout: float | None = 0) -> Iterator[BuildPlan]:
        with build_lock(plan, timeout=timeout) as plan:
            if plan.existing:
                yield plan
                return
            with _leased(places, plan) as (plan, lease):
                staging = Staging(plan.staging)
                if plan.existing:
                    _discard_prefix(staging_url(places, plan))  # (left by a publish killed after its catalog entry)
                else:
                    atomic_write_bytes(staging.bucket_file, json.dumps({"data_root_url": places.data_root_url}).encode())
                    if sends:
                        prepare_sends(places, plan)
                        lease.on_renew.append(_renew_claim(places, plan))
                    elif staging.sends:  # staged by workers that sent their files: nothing of it is here
                        reset_staging(staging)
                        staging.sends_file.unlink()
                        write_plan(plan)
                yield plan

    return lock


def _discard_prefix(url: str) -> None:
    fs, root = filesystem(url)
    try:
        fs.rm(root, recursive=True)
    except FileNotFoundError:
        pass


@contextlib.contextmanager
def _leased(places: BucketPlaces, plan: BuildPlan) -> Iterator[tuple[BuildPlan, Lease]]:
    """Hold the build key's lease; if another build holds it, wait until it publishes (then yield the plan with
    ``existing``) or its lease expires (then take it over)."""
    name, key = plan.config.name, plan.build_key
    lease: Lease | None = Lease.acquire(places.target, name, key)
    if lease is None:
        got = wait_for_lease(places.target, name, key, done=lambda: published_version(places, plan))
        if isinstance(got, str):
            yield dataclasses.replace(plan, existing=f"{name}@{got}"), _NO_LEASE
            return
        lease = got
    with lease:
        # The holder may have published just before this lease was taken: then there is nothing to do.
        version = published_version(places, plan)
        yield (dataclasses.replace(plan, existing=f"{name}@{version}") if version else plan), lease
