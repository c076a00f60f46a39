"""``shardflow push NAME@vN --repair --catalog s3://...``: a bucket version's objects checked by content, and
those that are not the manifest's restored from a verified local copy.

A push of a version the bucket catalog lists answers "already pushed" from the catalog entry, and a build of
it says "nothing new": neither reads the objects, so neither mends one that was damaged after publishing.
``repair_bucket_version`` reads the manifest (checked against the catalog entry's SHA-256) and every object it
names, streamed and hashed, ``workers`` at once; each one missing, or whose size or SHA-256 is not the
manifest's, is sent again from the first local copy whose size and SHA-256 are (the ``sources`` directories,
then the scratch mirror of builds to the bucket, then the runtime cache of the version), as a push sends a file
(hashed on the way, committed only with the manifest's bytes, its SHA-256 as the object's metadata). What no
local copy has is rebuilt: the version built again from the inputs and options its manifest records, in a
temporary directory under the scratch, published nowhere (``bucket/rebuild.py``), and each rebuilt file whose
size and SHA-256 are the manifest's sent as a copy is (not with ``no_rebuild``). A damaged manifest is restored
last, from a copy whose SHA-256 is the catalog entry's (a rebuild's has its own creation time). What is still
not restored is named, with why and how to restore it: docs/OPERATIONS.md ("Publishing to object storage").
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from .._io import sha256_file
from ..errors import ConfigError, ShardflowError, ValidationError
from ..manifest import MANIFEST_NAME, FileEntry, Manifest, check_relative_file
from ..manifest_files import named_files
from ..runtime.remote import READ_BLOCK, default_cache_dir
from ..runtime.remote_store import cache_key, resolve_catalog, retrying
from .build import default_scratch
from .fs import filesystem, is_remote
from .push import upload_file
from .remote_manifest import bucket_manifest
from .rebuild import RebuildError, rebuild_version

__all__ = ["RepairResult", "repair_bucket_version"]


@dataclass(frozen=True, kw_only=True)
class RepairResult:
    """What ``repair_bucket_version`` did."""

    ref: str
    url: str
    """The version's URL in the bucket."""
    checked: int
    """Objects read and hashed (the manifest included)."""
    restored: tuple[tuple[str, str, str], ...] = ()
    """``(file, what was wrong with the bucket's object, the local copy sent in its place)``; for a file of
    ``rebuilt``, the sources it was rebuilt from in place of the copy."""
    rebuilt: tuple[str, ...] = ()
    """The files of ``restored`` sent from a rebuild of the version (no local copy had them)."""


def _digest(fs: Any, key: str, url: str) -> tuple[int, str] | None:
    """The object's ``(bytes, SHA-256)``, read in full from the bucket (nothing cached is asked); None: no object."""

    def read() -> tuple[int, str] | None:
        fs.invalidate_cache(key)  # the store's answer, not a size s3fs remembers
        h, n = hashlib.sha256(), 0
        try:
            with fs.open(key, "rb", block_size=READ_BLOCK, cache_type="none") as src:
                while block := src.read(READ_BLOCK):
                    h.update(block)
                    n += len(block)
        except FileNotFoundError:
            return None
        return n, h.hexdigest()

    return retrying(url, read)  # type: ignore[no-any-return]


def _problem(got: tuple[int, str] | None, size: int | None, sha: str) -> str | None:
    """What is wrong with an object of ``got`` (bytes, SHA-256) against the manifest's ``size`` and ``sha``; None: nothing."""
    if got is None:
        return "missing"
    if size is not None and got[0] != size:
        return f"{got[0]} bytes, but the manifest says {size}"
    if got[1] != sha:
        return f"SHA-256 {got[1][:16]}..., but the manifest says {sha[:16]}..."
    return None


def _verified_copy(places: Sequence[Path], name: str, size: int | None, sha: str) -> Path | None:
    """The first ``place/name`` that is a file of ``size`` bytes (when known) and SHA-256 ``sha``."""
    for place in places:
        path = place / name
        try:
            if not path.is_file() or (size is not None and path.stat().st_size != size):
                continue
            if sha256_file(path) == sha:
                return path
        except OSError:
            continue
    return None


def _parse(data: bytes, url: str, places: Sequence[Path], looked: str) -> Manifest:
    """The manifest ``data`` of the version at ``url``, with its shard table if it names one: a verified copy of
    the table here (``places``), else the bucket's object, verified. A table that is neither stops the repair
    here: the manifest's shards are listed in it, so nothing else can be checked without it."""
    lacking: list[FileEntry] = []

    def table_copy(entry: FileEntry) -> Path | None:
        found = _verified_copy(places, entry.file, entry.bytes, entry.sha256)
        if found is None:
            lacking.append(entry)
        return found

    with tempfile.TemporaryDirectory(prefix="shardflow-repair-") as scratch:
        try:
            return bucket_manifest(url, scratch, data=data, table_copy=table_copy)
        except ShardflowError as exc:
            if not lacking or f"{url}/{lacking[0].file}" not in str(exc):
                raise
            why = str(exc).partition(f"{url}/{lacking[0].file}: ")[2].split("; ")[0] or str(exc)
            raise ValidationError(
                f"{url}/{lacking[0].file}: the shard table the manifest names is not the manifest's on the bucket "
                f"({why}), and no copy here has its size and SHA-256 (looked in {looked}); the manifest lists the "
                "version's shards in it, so nothing else can be checked without it: copy the version directory from "
                "the machine that built or pushed it (its shards.tsv is enough) and run this again with --from DIR"
            ) from None


def _named(lacking: Sequence[tuple[str, str]], shown: int = 5) -> str:
    """`` (and N more objects: a, b, ...)`` after the first of ``lacking``; empty for one."""
    if len(lacking) < 2:
        return ""
    names = ", ".join(file for file, _ in lacking[1:shown + 1])
    return f" (and {len(lacking) - 1} more objects: {names}{', ...' if len(lacking) > shown + 1 else ''})"


def repair_bucket_version(ref: str, *, catalog_url: str, sources: Sequence[str | os.PathLike[str]] = (),
                          scratch: str | os.PathLike[str] | None = None, cache_dir: str | os.PathLike[str] | None = None,
                          workers: int = 8, progress: Callable[[int, int], Callable[[int], None]] | None = None,
                          no_rebuild: bool = False, on_rebuild: Callable[[str], None] | None = None) -> RepairResult:
    """Check every object of the bucket version ``ref`` (``NAME@vN`` or ``NAME@latest`` in the bucket catalog
    ``catalog_url``) by content, and restore those that are not the manifest's from verified local copies, or
    else from a rebuild of the version (module docstring; ``no_rebuild``: not). ``progress(objects, bytes)``: as
    ``validate_dir``'s; ``on_rebuild(line)``: told before a rebuild starts (it takes as long as the build did).
    Raises ``ValidationError`` naming what could not be restored, and why (after restoring the rest)."""
    if is_remote(ref) or "@" not in ref:
        raise ConfigError(f"{ref}: push --repair takes NAME@vN (or NAME@latest) and --catalog s3://BUCKET/PREFIX, the "
                          "bucket catalog that lists it")
    root = default_cache_dir(cache_dir)
    url, (name, entry, catalog_url) = resolve_catalog(ref, catalog_url, root)
    ref = f"{name}@{entry.version}"
    fs, key = filesystem(url)
    key = key.rstrip("/")
    # Where a verified copy may be: given directories; the scratch mirror of builds to this bucket (the
    # version built on this machine, or fetched as a parent); the runtime cache (validate, readers on this node).
    places = [*(Path(s).expanduser() for s in sources), default_scratch(scratch) / key, root / "versions" / cache_key(url)]
    looked = ", ".join(str(p) for p in places)
    again = (f"--no-rebuild: run this again without it, or make one and run this again with --from DIR: build the version's sources again with the options its "
             f"manifest records (shardflow show {ref} --catalog {catalog_url}) into a local data root (--data-root "
             f"DIR --catalog DIR2, not this bucket: its catalog lists the build, so a build to it does nothing); builds "
             f"are deterministic, so that version's files are these bytes; then shardflow push {ref} --repair "
             f"--catalog {catalog_url} --from DIR/{name}/vK (that build's version directory)")

    manifest_url = f"{url}/{MANIFEST_NAME}"

    def read_manifest_object() -> bytes | None:
        fs.invalidate_cache(f"{key}/{MANIFEST_NAME}")
        try:
            return fs.cat_file(f"{key}/{MANIFEST_NAME}")  # type: ignore[no-any-return]
        except FileNotFoundError:
            return None

    data = retrying(manifest_url, read_manifest_object)
    wrong_manifest: str | None = None
    if data is None:
        wrong_manifest = "missing"
    elif entry.manifest_sha256 and (digest := hashlib.sha256(data).hexdigest()) != entry.manifest_sha256:
        wrong_manifest = f"SHA-256 {digest[:16]}..., but the catalog records {entry.manifest_sha256[:16]}..."
    manifest_copy: Path | None = None
    if wrong_manifest is not None:
        manifest_copy = _verified_copy(places, MANIFEST_NAME, None, entry.manifest_sha256) if entry.manifest_sha256 else None
        if manifest_copy is None:
            raise ValidationError(
                f"{manifest_url}: {wrong_manifest}, and no copy here has the SHA-256 that the catalog {catalog_url} "
                f"records for {ref}'s manifest (looked in {looked}); a manifest is only ever the one published: copy "
                f"the version directory from the machine that built or pushed {ref}, and run this again with --from DIR"
            )
        data = manifest_copy.read_bytes()
    assert data is not None
    manifest = _parse(data, url, places, looked)
    if (manifest.name, manifest.version) != (name, entry.version):
        raise ValidationError(f"{manifest_url}: the manifest calls itself {manifest.name!r}@{manifest.version!r}, but the "
                              f"catalog {catalog_url} lists this directory as {ref}")

    files: dict[str, tuple[int | None, str]] = {}
    for file, size, sha, where in named_files(manifest):
        check_relative_file(file, f"{manifest_url}: {where}")  # nothing outside the version
        if not isinstance(sha, str) or not sha:
            raise ValidationError(f"{url}/{file}: {where} names it without a SHA-256; it cannot be checked by content")
        files[file] = (size, sha)
    done = progress(len(files), sum(size or 0 for size, _ in files.values())) if progress is not None else None

    def check(file: str) -> str | None:
        size, sha = files[file]
        found = _digest(fs, f"{key}/{file}", f"{url}/{file}")
        if done is not None:
            done(found[0] if found else 0)
        return _problem(found, size, sha)

    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        problems = dict(zip(files, pool.map(check, files)))
    restored: list[tuple[str, str, str]] = []
    lacking: list[tuple[str, str]] = []
    for file, why in problems.items():
        if why is None:
            continue
        size, sha = files[file]
        copy = _verified_copy(places, file, size, sha)
        if copy is None:
            lacking.append((file, why))
            continue
        upload_file(fs, copy, f"{key}/{file}", copy.stat().st_size, sha)
        restored.append((file, why, str(copy)))
    rebuilt: list[str] = []
    not_rebuilt = ""
    if lacking and not no_rebuild:
        scratch_root = default_scratch(scratch)
        scratch_root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=".repair-", dir=scratch_root) as tmp:

            def tokenizer_file(file: str) -> Path | None:
                """A verified copy of the version's tokenizer file: here, or the bucket's object if it is intact."""
                size, sha = files.get(file, (None, ""))
                found = _verified_copy(places, file, size, sha)
                if found is not None or problems.get(file, "missing") is not None:
                    return found
                dest = Path(tmp, "tokenizer", file)
                dest.parent.mkdir(parents=True, exist_ok=True)
                retrying(f"{url}/{file}", lambda: fs.get_file(f"{key}/{file}", str(dest)))
                return _verified_copy([dest.parent], file, size, sha)

            def starting() -> None:
                if on_rebuild is not None:
                    on_rebuild(f"{len(lacking)} object{'s' if len(lacking) > 1 else ''} of {ref} with no verified "
                               f"copy here; rebuilding the version from its recorded inputs in {tmp} (published nowhere)")

            try:
                rebuild = rebuild_version(manifest, Path(tmp, "build"), tokenizer_file=tokenizer_file,
                                          workers=min(max(1, workers), os.cpu_count() or 1), starting=starting)
            except RebuildError as exc:
                not_rebuilt = (f"it cannot be rebuilt: {exc}; put back the inputs and tokenizer file the build read "
                               f"({manifest_url} records each input's path, size and SHA-256, and the options) and "
                               "run this again, or")
            else:
                still: list[tuple[str, str]] = []
                for file, why in lacking:
                    size, sha = files[file]
                    copy = _verified_copy([rebuild.directory], file, size, sha)
                    if copy is None:
                        still.append((file, why))
                        continue
                    upload_file(fs, copy, f"{key}/{file}", copy.stat().st_size, sha)
                    restored.append((file, why, ", ".join(rebuild.sources)))
                    rebuilt.append(file)
                lacking = still
                not_rebuilt = (f"a rebuild from its recorded inputs made other bytes of it (tools that tokenize "
                               f"otherwise? {manifest_url} records those of the build):")
    if manifest_copy is not None and wrong_manifest is not None:  # last, as a push sends it
        upload_file(fs, manifest_copy, f"{key}/{MANIFEST_NAME}", manifest_copy.stat().st_size, entry.manifest_sha256)
        restored.append((MANIFEST_NAME, wrong_manifest, str(manifest_copy)))
    if lacking:
        file, why = lacking[0]
        fixed = f"{len(restored)} restored; " if restored else ""
        if not_rebuilt:  # what would make the bytes again: the inputs as they were, or a copy of the files
            again = f"{not_rebuilt} copy the version's files from a machine that has them and run this again with --from DIR"
        raise ValidationError(f"{url}/{file}: {why}{_named(lacking)}; {fixed}no verified copy of it here (looked in "
                              f"{looked}), and {again}")
    return RepairResult(ref=ref, url=url, checked=len(files) + 1, restored=tuple(restored), rebuilt=tuple(rebuilt))
