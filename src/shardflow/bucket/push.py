"""``shardflow push``: publish a built version to object storage, with the bucket's own catalog as the commit point.

``push_version("rv@v2", data_root_url="s3://b/data", catalog_url="s3://b/catalog")`` validates the
version, claims its prefix (``.shardflow-push.json``), sends every file the manifest names (its shard
table, ``shards.tsv``, among them) and the card, ``metadata.yaml`` last, then lists the version in
``<catalog-url>/<name>.yaml`` with a conditional write: docs/OPERATIONS.md ("Publishing to object
storage") and docs/FORMAT.md ("A version on a bucket").

Each upload is hashed as it streams and committed only with the manifest's SHA-256, which it carries
as user metadata (``sha256``): an ETag is never taken for a hash. The manifest is sent only when
every other file is still there (a ``gc`` may have taken an interrupted push for abandoned), and
created only if absent: a push of the same build from another machine may have sent its own, and
overwriting it could leave the bucket's manifest other than its entry's. The catalog file is built
and read by ``shardflow.catalog.Catalog`` over a scratch mirror of the bucket's keys.
"""

from __future__ import annotations

import dataclasses
import hashlib
import posixpath
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from .._io import sha256_file
from .layout import CLAIM_NAME, VERSION_RE, BucketTarget, Mirror, bucket_target, claim
from ..card import CARD_DIR
from ..catalog import Catalog, VersionEntry, resolve_ref
from ..config import check_name
from ..errors import CatalogError, ShardflowError, ValidationError
from ..faults import fault
from ..manifest import MANIFEST_NAME, Manifest, read_manifest, version_file
from ..manifest_files import named_files
from .fs import filesystem, put_if_absent, read_with_etag, update_object
from .remote_manifest import bucket_manifest
from ..validation import validate_dir

__all__ = ["PushResult", "PushPlan", "push_version", "prepare_push", "plan_push", "push_files", "finish_push", "bucket_target", "BucketTarget", "CLAIM_NAME", "SHA256_METADATA"]
__all__ += ["upload_file"]

SHA256_METADATA = "sha256"
"""The user metadata key holding an uploaded object's SHA-256, checked on the way up."""

_CHUNK = 8 << 20


@dataclass(frozen=True, kw_only=True)
class PushResult:
    """What ``push_version`` did."""

    ref: str
    url: str
    """The version's URL in the bucket."""
    catalog_file: str
    """The bucket catalog's file, ``<catalog-url>/<name>.yaml``."""
    uploaded: int = 0
    uploaded_bytes: int = 0
    copied: int = 0
    """Files copied within the bucket from the parent version (not sent again)."""
    skipped: int = 0
    """Files already in the bucket with the right size and SHA-256 (an earlier, interrupted push)."""
    parent: str | None = None
    """The version in the bucket that files were copied from (None: none was used)."""
    already: bool = False
    """The bucket catalog already listed this build as this version: nothing was sent."""


def _manifest_files(directory: Path, manifest: Manifest) -> dict[str, tuple[int, str]]:
    """``{file: (bytes, sha256)}`` of every file the manifest names, each confined to the version directory."""
    found: dict[str, tuple[int, str]] = {}
    for name, size, sha, what in named_files(manifest):
        path = version_file(directory, name, what)  # refuses '..', absolute names and symlinks out
        if name == MANIFEST_NAME or name == CLAIM_NAME or not isinstance(sha, str) or not sha:
            raise ValidationError(f"{path}: {what} names it without a usable SHA-256, or under a reserved name; "
                                  "restore the manifest or rebuild the version")
        size = path.stat().st_size if size is None else size  # the tokenizer's copy: named without a size
        if found.setdefault(name, (size, sha)) != (size, sha):
            raise ValidationError(f"{path}: the manifest names it twice with different sizes or SHA-256; rebuild the version")
    return found


def _card_files(directory: Path) -> dict[str, tuple[int, str]]:
    """``{file: (bytes, sha256)}`` of the dataset card (``card/``: a view of ``stats.json`` that the manifest does
    not name), hashed now; sent like the rest, so the bucket's copy of a version has its card too."""
    card = directory / CARD_DIR
    if card.is_symlink() or not card.is_dir():
        return {}
    return {p.relative_to(directory).as_posix(): (p.stat().st_size, sha256_file(p))
            for p in sorted(card.rglob("*")) if p.is_file() and not p.is_symlink()}


def _local(ref: str, catalog: Any, checksums: bool) -> tuple[Path, Manifest, VersionEntry]:
    """The local version ``ref`` names, validated (with ``checksums``), and its local catalog entry."""
    name = ref.partition("@")[0] if "@" in ref else None
    if name is not None:
        check_name(name)
    cat = Catalog(catalog)
    directory = resolve_ref(ref, cat)
    manifest = read_manifest(directory)
    check_name(manifest.name)
    if not isinstance(manifest.version, str) or not VERSION_RE.match(manifest.version):
        raise ValidationError(f"{directory / MANIFEST_NAME}: version {manifest.version!r} is not vN; rebuild the version")
    validate_dir(directory, manifest, checksums=checksums, published=True, catalog=cat.path)
    found = cat.entry_for_dir(directory, name=manifest.name)
    if found is None:
        raise CatalogError(f"{directory}: not a version published in the catalog {cat.path}; push NAME@vN of that "
                           "catalog (--catalog), or build it first")
    return directory, manifest, found[1]


def _check_still_there(plan: "PushPlan", listing: dict[str, int]) -> None:
    """Refuse to send the manifest, and so to list the version, when its files are not all under its prefix
    (``listing``: deleted during the push, by a ``shardflow gc`` or ``rm`` that took it for abandoned); a rerun
    sends them again."""
    missing = [name for name, size, _ in plan.files if listing.get(name) != size]
    if missing:
        raise CatalogError(
            f"{plan.result.url}/{missing[0]}{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}: gone "
            "during the push (a shardflow gc or rm took it for abandoned); nothing was listed: push again"
        )


def _listing(fs: Any, key: str) -> dict[str, int]:
    """``{relative name: size}`` of the objects under ``key/``."""
    root = f"{key}/"
    fs.invalidate_cache(key)
    try:
        found = fs.find(root, detail=True)
    except FileNotFoundError:
        return {}
    return {p[len(root):]: int(info.get("size") or 0) for p, info in found.items() if p.startswith(root)}


def _recorded(fs: Any, key: str, size: int, sha: str, listing: dict[str, int], name: str) -> bool:
    """Whether the object ``key`` (listed as ``name``) has ``size`` bytes and records ``sha`` as its SHA-256."""
    if listing.get(name) != size:
        return False
    try:
        return fs.metadata(key).get(SHA256_METADATA) == sha  # type: ignore[no-any-return]
    except FileNotFoundError:
        return False


def _discard(out: Any) -> None:
    """Never commit ``out``: abort its multipart upload (a one-shot upload was never started), and mark it closed so
    that no later ``close()`` (its finalizer's) sends what it holds."""
    out.discard()
    out.closed = True


def _upload(fs: Any, path: Path, key: str, size: int, sha: str) -> None:
    """Stream ``path`` to ``key``, hashing what is sent; commit only if it is the manifest's bytes."""
    digest, sent = hashlib.sha256(), 0
    out = fs.open(key, "wb", Metadata={SHA256_METADATA: sha})
    try:
        with open(path, "rb") as src:
            while chunk := src.read(_CHUNK):
                digest.update(chunk)
                sent += len(chunk)
                out.write(chunk)
        good = sent == size and digest.hexdigest() == sha
    except BaseException:
        _discard(out)
        raise
    if not good:
        _discard(out)
        raise ValidationError(f"{path}: {sent} bytes with SHA-256 {digest.hexdigest()[:16]}... were read, the manifest "
                              f"says {size} bytes, {sha[:16]}...; the file changed during the push: validate the version "
                              "and push again")
    out.close()


def upload_file(fs: Any, path: Path, key: str, size: int, sha: str) -> None:
    """A push's upload of one file (``push --repair``'s too): streamed from ``path`` to ``key``, hashed as it is sent,
    committed only if its bytes are ``size`` and ``sha`` (recorded as the object's ``sha256`` metadata)."""
    _upload(fs, path, key, size, sha)


def _parent_files(fs: Any, mirror: Mirror, cat: Catalog, name: str, manifest: Manifest) -> tuple[str | None, dict[str, tuple[str, int]]]:
    """The bucket's parent version (the manifest's parent if the bucket lists it, else the bucket's latest) and
    ``{sha256: (its key, size)}`` of its files, from its manifest checked against its catalog entry."""
    listed = {v.version: v for v in cat.versions(name)}
    wanted = [p.partition("@")[2] for p in (manifest.parent,) if p and p.partition("@")[0] == name]
    wanted += [v for v in (cat.latest(name),) if v]
    entry = next((listed[v] for v in wanted if v in listed and v != manifest.version), None)
    if entry is None:
        return None, {}
    key = posixpath.normpath(posixpath.join(mirror.target.catalog_key or ".", entry.path))
    if key.startswith("..") or posixpath.isabs(key):
        return None, {}
    local = mirror.path(key)
    try:
        # The manifest published (checked against the entry: else nothing of it is trusted), and its shard table.
        parent = bucket_manifest(mirror.target.url(key), local, sha256=entry.manifest_sha256)
        files = _manifest_files(local, parent)
    except (ShardflowError, FileNotFoundError, OSError):
        return None, {}  # a parent that cannot be read costs uploads, never correctness
    return f"{name}@{entry.version}", {sha: (f"{key}/{file}", size) for file, (size, sha) in files.items()}


def _listed(cat: Catalog, name: str, version: str, build_key: str, file_url: str) -> bool:
    """Whether the bucket catalog lists this build as ``version`` already; refuse another build, or a removed one."""
    listed = cat.entry(name, version)
    removed = any(r.version == version for r in cat.removed(name))
    if listed is not None and listed.build_key == build_key:
        return True
    if listed is not None or removed:
        what = f"another build of {name}@{version} (build key {listed.build_key[:16]}...)" if listed else f"{name}@{version} as removed"
        raise CatalogError(f"{file_url} already lists {what}; versions are immutable: push this build under a new "
                           "version name, or to another catalog")
    return False


def _number(version: str) -> int:
    """``vN``'s N (-1 for any other name)."""
    return int(version[1:]) if VERSION_RE.match(version) else -1


def _commit(target: BucketTarget, catalog_url: str, name: str, version: str, local: VersionEntry) -> bool:
    """Add the version to the bucket catalog (conditional write, retried); False if it was there already."""
    file_url = target.url(target.catalog_file_key(name))

    def listed_with(current: bytes | None) -> bytes | None:
        with tempfile.TemporaryDirectory(prefix="shardflow-push-") as scratch:
            mirror = Mirror(scratch, target, catalog_url)
            cat = mirror.catalog(name, current)
            try:
                if _listed(cat, name, version, local.build_key, file_url):
                    return None
                path = mirror.path(target.version_key(name, version))
                # An older version pushed after a newer one (v1 after v2) is listed, not made latest.
                newer = [v.version for v in cat.versions(name) if _number(v.version) > _number(version)]
                cat.add(name, VersionEntry(
                    version=version, path=str(path), created_at=local.created_at, build_key=local.build_key,
                    parent=local.parent, totals=dict(local.totals), manifest_sha256=local.manifest_sha256,
                ), make_latest=not newer)
            except ShardflowError as exc:
                raise mirror.renamed(exc, cat) from None
            return (cat.path / f"{name}.yaml").read_bytes()

    return update_object(file_url, listed_with, again="push again")


@dataclass(frozen=True, kw_only=True)
class PushPlan:
    """A push claimed and ready to send (``prepare_push``): plain values, so that ``push_files`` can run in
    other processes (Dask workers that see the version directory at the same path)."""

    result: PushResult
    target: BucketTarget
    catalog_url: str
    directory: str
    prefix: str
    """The version's key in the bucket."""
    files: tuple[tuple[str, int, str], ...]
    """``(file, bytes, sha256)`` of every file to send but the manifest, in name order."""
    manifest: tuple[int, str]
    """The manifest's bytes and SHA-256: sent last."""
    by_sha: dict[str, tuple[str, int]]
    """``{sha256: (key, bytes)}`` of the parent version's files in the bucket (copied, not sent)."""
    parent: str | None
    entry: VersionEntry
    """The local catalog's entry, listed in the bucket catalog by ``finish_push``."""


def prepare_push(ref: str, *, data_root_url: str, catalog_url: str, catalog: Any = None,
                 checksums: bool = True) -> PushPlan | PushResult:
    """Steps 1-2 of a push, and what step 3 sends; a ``PushResult`` with ``already`` if the bucket lists it."""
    target = bucket_target(data_root_url, catalog_url)
    directory, manifest, local = _local(ref, catalog, checksums)
    return plan_push(directory, manifest, local, target=target, catalog_url=catalog_url)


def plan_push(directory: Path, manifest: Manifest, local: VersionEntry, *, target: BucketTarget,
              catalog_url: str) -> PushPlan | PushResult:
    """The push of the version staged in ``directory`` (``manifest``, its catalog entry ``local``) to ``target``:
    claimed, and what to send (``PushResult`` with ``already``: the bucket lists it)."""
    catalog_url = catalog_url.rstrip("/")
    name, version = manifest.name, manifest.version
    files = {**_card_files(directory), **_manifest_files(directory, manifest)}
    prefix = target.version_key(name, version)
    result = PushResult(ref=f"{name}@{version}", url=target.url(prefix), catalog_file=target.url(target.catalog_file_key(name)))
    fs, _ = filesystem(target.url(prefix))
    with tempfile.TemporaryDirectory(prefix="shardflow-push-") as scratch:
        mirror = Mirror(scratch, target, catalog_url)
        got = read_with_etag(result.catalog_file)
        cat = mirror.catalog(name, got[0] if got else None)
        try:
            if _listed(cat, name, version, local.build_key, result.catalog_file):
                return dataclasses.replace(result, already=True)
        except ShardflowError as exc:
            raise mirror.renamed(exc, cat) from None
        claim(target, prefix, result.ref, local.build_key, catalog_url)
        parent, by_sha = _parent_files(fs, mirror, cat, name, manifest)
    return PushPlan(
        result=result, target=target, catalog_url=catalog_url, directory=str(directory), prefix=prefix,
        files=tuple((f, size, sha) for f, (size, sha) in sorted(files.items())),
        manifest=((directory / MANIFEST_NAME).stat().st_size, sha256_file(directory / MANIFEST_NAME)),
        by_sha=by_sha, parent=parent, entry=local,
    )


def push_files(plan: PushPlan, files: Sequence[tuple[str, int, str]]) -> list[str]:
    """Send ``files`` (some of ``plan.files``): for each, ``uploaded``, ``copied`` (within the bucket, from the
    parent) or ``skipped`` (there already, with its SHA-256)."""
    target, directory = plan.target, Path(plan.directory)
    fs, _ = filesystem(target.url(plan.prefix))
    listing = _listing(fs, f"{target.bucket}/{plan.prefix}")
    parent_listings: dict[str, dict[str, int]] = {}

    def one(file: str, size: int, sha: str) -> str:
        key = f"{target.bucket}/{plan.prefix}/{file}"
        if _recorded(fs, key, size, sha, listing, file):
            return "skipped"
        source = plan.by_sha.get(sha)
        if source is not None and source[1] == size:
            src_key = f"{target.bucket}/{source[0]}"
            base, _, rel = src_key.rpartition("/")
            if base not in parent_listings:
                parent_listings[base] = _listing(fs, base)
            if _recorded(fs, src_key, size, sha, parent_listings[base], rel):
                try:
                    fs.copy(src_key, key)  # server-side; the object's metadata (its SHA-256) comes with it
                    return "copied"
                except FileNotFoundError:
                    pass  # deleted since it was checked (an rm of the parent): sent instead
        _upload(fs, version_file(directory, file, "the manifest"), key, size, sha)
        return "uploaded"

    return [one(*f) for f in files]


def finish_push(plan: PushPlan, done: Sequence[str]) -> PushResult:
    """The manifest (last: a listing never shows a manifest whose files are not all there), then the bucket
    catalog entry; ``done``: ``push_files``'s answers for ``plan.files``, in order."""
    fault("push-files", plan.result.url)
    target, (size, sha) = plan.target, plan.manifest
    fs, _ = filesystem(target.url(plan.prefix))
    key = f"{target.bucket}/{plan.prefix}/{MANIFEST_NAME}"
    entry, listing = plan.entry, _listing(fs, f"{target.bucket}/{plan.prefix}")
    _check_still_there(plan, listing)
    if _recorded(fs, key, size, sha, listing, MANIFEST_NAME):
        done = [*done, "skipped"]
    else:
        path = Path(plan.directory) / MANIFEST_NAME
        data = path.read_bytes()
        if (len(data), hashlib.sha256(data).hexdigest()) != (size, sha):
            raise ValidationError(f"{path}: changed during the push; validate the version and push again")
        # Created only if absent: a push of the same build from another machine (the claim holds one build key)
        # may have sent its own manifest, which differs from ours in its creation time. Overwriting it could
        # leave the bucket's manifest other than the one its catalog entry records.
        created = put_if_absent(target.url(f"{plan.prefix}/{MANIFEST_NAME}"), data, metadata={SHA256_METADATA: sha})
        fs.invalidate_cache(f"{target.bucket}/{plan.prefix}")  # written past s3fs: its listing of the prefix is stale
        if created:
            done = [*done, "uploaded"]
        else:
            entry, done = _twin_entry(fs, key, plan), [*done, "skipped"]
    fault("push-uploaded", plan.result.url)
    name, version = plan.result.ref.split("@")
    committed = _commit(target, plan.catalog_url, name, version, entry)
    sizes = [f[1] for f in plan.files] + [size]
    return dataclasses.replace(
        plan.result, uploaded=done.count("uploaded"), copied=done.count("copied"), skipped=done.count("skipped"),
        uploaded_bytes=sum(n for n, how in zip(sizes, done) if how == "uploaded"),
        parent=plan.parent if "copied" in done else None, already=not committed,
    )


def _twin_entry(fs: Any, key: str, plan: PushPlan) -> VersionEntry:
    """The catalog entry of the manifest another push of this build put at ``key`` first: the same files, so the
    version it lists is ours too (its creation time is the other build's); refused if it names other files."""
    data = fs.cat_file(key)
    with tempfile.TemporaryDirectory(prefix="shardflow-push-") as scratch:
        try:  # (with its shard table, if it names one: the other push sent it before its manifest)
            theirs: Manifest | None = bucket_manifest(plan.result.url, scratch, data=data)
        except ShardflowError:
            theirs = None  # not a manifest, or not one whose table is there: refused below, as one of other files
    ours = read_manifest(plan.directory)
    if theirs is None or theirs.build_key != ours.build_key or set(named_files(theirs)) != set(named_files(ours)):
        raise CatalogError(
            f"s3://{key}: another push of {plan.result.ref} sent a manifest of other files first; if no push is "
            f"running, delete everything under s3://{key.rpartition('/')[0]}/ and push again"
        )
    return dataclasses.replace(plan.entry, created_at=theirs.created_at, parent=theirs.parent,
                               totals=dict(theirs.totals), manifest_sha256=hashlib.sha256(data).hexdigest())


def push_version(ref: str, *, data_root_url: str, catalog_url: str, catalog: Any = None, workers: int = 8,
                 checksums: bool = True) -> PushResult:
    """Publish the local version ``ref`` under ``<data_root_url>/<name>/<version>/`` and list it in the bucket
    catalog ``<catalog_url>/<name>.yaml`` (docs/OPERATIONS.md), sending ``workers`` files at once. Safe to
    rerun: it resumes, or says ``already``. ``checksums=False`` skips hashing the version before anything is sent
    (a build that has just validated it); each upload is still hashed as it is sent and committed only with the
    manifest's SHA-256."""
    plan = prepare_push(ref, data_root_url=data_root_url, catalog_url=catalog_url, catalog=catalog, checksums=checksums)
    if isinstance(plan, PushResult):
        return plan
    # One run of files per thread, not one call per file: each call lists the prefix once (per file, n listings).
    step = max(1, -(-len(plan.files) // max(1, workers)))
    runs = [plan.files[i:i + step] for i in range(0, len(plan.files), step)]
    with ThreadPoolExecutor(max_workers=max(1, len(runs))) as pool:
        done = [how for hows in pool.map(lambda run: push_files(plan, run), runs) for how in hows]
    return finish_push(plan, done)
