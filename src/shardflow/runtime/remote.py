"""Published versions on object storage (``s3://...``), read through a verified local cache.

    ds = TokenDataset("s3://bucket/data/wiki/v3", seq_len=1024)                     # a version URL
    ds = TokenDataset("wiki@latest", catalog="s3://bucket/catalog", seq_len=1024)  # a catalog in the bucket

What a user sees (URLs, the cache directory, retries, errors): docs/RUNTIME.md ("Opening"). The
manifest (and the catalog file) is read from the bucket at every open; each file it names is
fetched on first use into ``cache_dir`` under ``versions/<bucket>/<tail>-<hash of the URL>/``, so two
versions or buckets never share a file.

Every download goes to a temporary name beside its file, is hashed as it arrives, and is renamed
into place only if its size and SHA-256 are the manifest's. Beside each verified file a marker
``.<file>.ok`` records its SHA-256, size, inode and mtime: a cached file is trusted without
rehashing only while all four match (``verify=True`` rehashes every cached file once per process).

Processes sharing a cache coordinate with ``flock``: ``.<file>.lock`` (exclusive) while one of them
downloads, so each file is fetched once, and ``.<file>.pin`` (shared) while one uses a shard; a
shard is evicted only when no process pins it (``try_evict`` takes the pin exclusively without
waiting). A download's lock belongs to the process that took it: a worker forked while a thread downloads
does not keep it (``catalog.file_lock``). Prefetching and eviction are in ``shardflow.runtime.prefetch``.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import logging
import os
import threading
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

from .._io import atomic_write_bytes, remove_quietly, sha256_file
from ..catalog import VersionEntry, file_lock, is_catalog_ref
from ..errors import ConfigError, ShardflowError, ValidationError
from ..manifest import MANIFEST_NAME, Manifest, check_relative_file, read_manifest
from ..manifest_files import named_files
from ..shardset import ShardSet
from .options import REMOTE_OPTIONS, ReadOptions
from .remote_store import cache_key, filesystem, is_remote, renamed, resolve_catalog, retrying

__all__ = [
    "is_remote", "is_remote_ref", "default_cache_dir", "VersionCache", "RemoteShardSet", "open_remote_split", "fetch_version",
    "remote_version",
]

log = logging.getLogger(__name__)

READ_BLOCK = 8 << 20
"""Bytes per ranged GET while downloading (bounded memory, few requests)."""
FETCH_WORKERS = 8
"""Concurrent downloads when many files are fetched at once (every index, or a whole version)."""
REPAIR_COMMAND = "shardflow push NAME@VERSION --repair --catalog CATALOG_URL"
"""The command that restores a bucket version's damaged objects; callers that know the version and its catalog
put them in its place."""
REPAIR_HINT = (f"Repair the bucket's copy: {REPAIR_COMMAND} (the catalog that lists it; it restores the object from a "
               "verified local copy, or from a rebuild of the version's inputs; docs/OPERATIONS.md)")
"""What to do about an object of a published version that is not the manifest's (damaged, changed or gone)."""


def is_remote_ref(ref: Any, catalog: Any) -> bool:
    """Whether ``ref`` (with ``catalog``) names a version on object storage: a version URL, or a catalog URL."""
    if not isinstance(ref, (str, os.PathLike)):
        return False
    if is_remote(os.fspath(ref)):
        return True
    # NAME@REF is the catalog's even where a folder of that name exists (``./NAME@REF`` is the folder).
    return isinstance(catalog, (str, os.PathLike)) and is_remote(os.fspath(catalog)) and (
        is_catalog_ref(ref) or not Path(os.fspath(ref)).exists())


# A cache that cannot take a file: a person must free space or point the cache elsewhere (not retried).
_CACHE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})


@contextlib.contextmanager
def _cache_writes(url: str, directory: Path) -> Iterator[None]:
    """A full, read-only or forbidden cache directory as one message naming it and what to do, not an OSError."""
    try:
        yield
    except OSError as exc:
        if isinstance(exc, ShardflowError) or exc.errno not in _CACHE_ERRNOS:
            raise
        raise ConfigError(
            f"{url}: cannot be cached in {directory} ({exc.strerror or exc}); free space there, set "
            "cache_limit_bytes, or give another cache_dir (or $SHARDFLOW_CACHE)"
        ) from None


def default_cache_dir(cache_dir: str | os.PathLike[str] | None = None) -> Path:
    """``cache_dir``, else ``$SHARDFLOW_CACHE``, else ``~/.cache/shardflow``."""
    value = os.fspath(cache_dir) if cache_dir is not None else os.environ.get("SHARDFLOW_CACHE") or "~/.cache/shardflow"
    if is_remote(value):
        raise ConfigError(f"cache_dir={value!r}: the cache is a local directory (the node's disk), not a URL")
    return Path(value).expanduser().absolute()


def _hidden(path: Path, what: str) -> Path:
    return path.with_name(f".{path.name}.{what}")


class VersionCache:
    """One remote version's files in the local cache: fetched once, verified, shared between processes."""

    def __init__(self, url: str, directory: Path, *, verify: bool = False) -> None:
        self.url = url
        self.directory = directory
        self.verify = verify
        self._local: dict[str, Any] = {}

    def __getstate__(self) -> dict[str, Any]:
        # The filesystem client, pins and locks belong to one process: a copy sent to a worker makes its own.
        return {"url": self.url, "directory": self.directory, "verify": self.verify, "_local": {}}

    def _state(self) -> dict[str, Any]:
        state = self._local
        if state.get("pid") != os.getpid():
            for fd, _ in state.get("pins", {}).values():  # inherited through fork: the parent's pins
                os.close(fd)
            state.clear()
            state.update(pid=os.getpid(), pins={}, lock=threading.Lock(), verified=set(), fs=None)
        return state

    def prepare(self) -> None:
        """Make this process's state (pins, client) now, before threads share it; a forked child makes its own."""
        self._state()

    def _fs(self) -> tuple[Any, str]:
        state = self._state()
        if state["fs"] is None:
            state["fs"] = filesystem(self.url)
        fs, root = state["fs"]
        return fs, root.rstrip("/")

    def object_url(self, name: str) -> str:
        return f"{self.url}/{name}"

    # -- the manifest ----------------------------------------------------------

    def load_manifest(self, entry: tuple[str, VersionEntry, str] | None = None) -> Manifest:
        """Read ``metadata.yaml`` from the bucket (checked against the catalog ``entry`` when given)."""
        fs, root = self._fs()
        url = self.object_url(MANIFEST_NAME)
        data = retrying(url, lambda: fs.cat_file(f"{root}/{MANIFEST_NAME}"))
        path = self.directory / MANIFEST_NAME
        with _cache_writes(url, self.directory):
            self.directory.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(path, data)
        try:
            # Also refuses file names with '..', or absolute ones. A shard table (schema 4) is fetched into the
            # cache beside it, verified against the manifest's entry.
            manifest = read_manifest(path, table_file=lambda e: self.ensure(e.file, e.bytes, e.sha256))
        except ShardflowError as exc:
            raise renamed(exc, path, url) from None
        if entry is not None:
            name, found, catalog_url = entry
            if (manifest.name, manifest.version) != (name, found.version):
                raise ValidationError(
                    f"{url}: the manifest calls itself {manifest.name!r}@{manifest.version!r}, but the catalog "
                    f"{catalog_url} lists this directory as {name}@{found.version}; restore it from a verified copy: "
                    f"shardflow push {name}@{found.version} --repair --catalog {catalog_url}"
                )
            if found.manifest_sha256 and hashlib.sha256(data).hexdigest() != found.manifest_sha256:
                raise ValidationError(
                    f"{url}: the manifest is not the one published as {name}@{found.version} (its SHA-256 is not the "
                    f"one recorded in the catalog {catalog_url}); versions are immutable: restore it from a verified copy: "
                    f"shardflow push {name}@{found.version} --repair --catalog {catalog_url}"
                )
        return manifest

    # -- files -----------------------------------------------------------------

    def _trusted(self, path: Path, size: int, sha: str) -> bool:
        try:
            st = path.stat()
            marker = json.loads(_hidden(path, "ok").read_text())
        except (OSError, ValueError):
            return False
        if marker != {"sha256": sha, "bytes": size, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns} or st.st_size != size:
            return False
        return not self.verify or str(path) in self._state()["verified"]

    def _mark(self, path: Path, sha: str) -> None:
        st = path.stat()
        marker = {"sha256": sha, "bytes": st.st_size, "ino": st.st_ino, "mtime_ns": st.st_mtime_ns}
        atomic_write_bytes(_hidden(path, "ok"), json.dumps(marker).encode())
        self._state()["verified"].add(str(path))

    def ensure(self, name: str, size: int, sha: str, *, refetch: bool = False) -> Path:
        """The local path of the version's file ``name``, fetched and verified first unless the cache holds it.

        ``refetch``: fetched from the bucket and verified whatever the cache holds (``shardflow validate``: the
        bucket's bytes are what is checked); a cached copy is replaced only by one that verifies."""
        path = self.directory / name
        if not refetch and self._trusted(path, size, sha):
            return path
        with _cache_writes(self.object_url(name), self.directory):
            return self._ensure(name, path, size, sha, refetch=refetch)

    def _ensure(self, name: str, path: Path, size: int, sha: str, *, refetch: bool = False) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        with file_lock(_hidden(path, "lock"), timeout=None, what=f"the cached file {path}", remove=True):
            if not refetch and self._trusted(path, size, sha):  # another process fetched it while this one waited
                return path
            with contextlib.suppress(OSError):
                if not refetch and path.stat().st_size == size and sha256_file(path) == sha:  # verified, marker gone
                    self._mark(path, sha)
                    return path
            for stray in path.parent.glob(f".{path.name}.tmp-*"):  # of a download that died (this one holds the lock)
                remove_quietly(stray)
            if refetch:  # the object as the store holds it now, not a size or ETag this process remembers
                fs, root = self._fs()
                fs.invalidate_cache(f"{root}/{name}")
            self._fetch(name, path, size, sha)
        return path

    def _fetch(self, name: str, path: Path, size: int, sha: str) -> None:
        fs, root = self._fs()
        url = self.object_url(name)
        tmp = _hidden(path, f"tmp-{os.getpid()}")
        problem = ""
        for attempt in range(2):
            if attempt:
                # Info, not a warning: a second bad copy raises, naming the object, and one good copy is no problem.
                log.info("%s: %s; fetching it again", url, problem)
                fs.invalidate_cache(f"{root}/{name}")  # ask the store again, not a remembered size
            try:
                got = retrying(url, lambda: self._download(fs, f"{root}/{name}", tmp, size))
            except BaseException:
                remove_quietly(tmp)
                raise
            if got == (size, sha):
                os.replace(tmp, path)
                self._mark(path, sha)
                log.info("fetched %s (%d bytes)", url, size)
                return
            remove_quietly(tmp)
            problem = (
                f"{got[0]} bytes, but the manifest says {size}"
                if got[0] != size
                else f"SHA-256 {got[1]}, but the manifest says {sha}"
            )
        raise ValidationError(
            f"{url}: {problem} (fetched twice); the object is not the file the manifest {self.object_url(MANIFEST_NAME)} "
            f"lists: it was damaged or changed after publishing. {REPAIR_HINT}"
        )

    @staticmethod
    def _download(fs: Any, key: str, tmp: Path, size: int) -> tuple[int, str]:
        """Stream the object into ``tmp``, hashing as it arrives: ``(its size, SHA-256)``; none of it if its size is wrong."""
        h = hashlib.sha256()
        n = 0
        with fs.open(key, "rb", block_size=READ_BLOCK, cache_type="none") as src, open(tmp, "wb") as dst:
            if src.size != size:
                return int(src.size), ""
            while n < size and (block := src.read(min(READ_BLOCK, size - n))):
                h.update(block)
                dst.write(block)
                n += len(block)
        return n, h.hexdigest()

    # -- pins and eviction -----------------------------------------------------

    def object_size(self, name: str) -> int:
        """The bytes of the version's object ``name``, from the bucket."""
        fs, root = self._fs()
        return int(retrying(self.object_url(name), lambda: fs.size(f"{root}/{name}")))

    def download(self, files: Sequence[tuple[str, int, str]], *, refetch: bool = False, workers: int = FETCH_WORKERS,
                 done: Callable[[int], None] | None = None) -> None:
        """Fetch the version's files ``(name, bytes, sha256)`` into the cache, verified, ``workers`` at once
        (``refetch``: as ``ensure``); ``done(bytes)`` is told of each file as it is in place."""

        def one(name: str, size: int, sha: str) -> None:
            with self.pinned([name]):  # no other process evicts it mid-download
                self.ensure(name, size, sha, refetch=refetch)
            if done is not None:
                done(size)

        self.prepare()
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            for future in [pool.submit(one, *f) for f in files]:
                future.result()

    def pin(self, name: str) -> None:
        """Hold a shared lock on the file's pin (counted per process): no process evicts it meanwhile."""
        state = self._state()
        with state["lock"]:
            fd, count = state["pins"].get(name, (None, 0))
            if fd is None:
                path = _hidden(self.directory / name, "pin")
                path.parent.mkdir(parents=True, exist_ok=True)
                fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
                fcntl.flock(fd, fcntl.LOCK_SH)  # waits only for an eviction in progress
            state["pins"][name] = (fd, count + 1)

    def unpin(self, name: str) -> None:
        state = self._state()
        with state["lock"]:
            fd, count = state["pins"].pop(name, (None, 0))
            if fd is None:
                return
            if count > 1:
                state["pins"][name] = (fd, count - 1)
            else:
                os.close(fd)

    @contextlib.contextmanager
    def pinned(self, names: Sequence[str]) -> Iterator[None]:
        for name in names:
            self.pin(name)
        try:
            yield
        finally:
            for name in names:
                self.unpin(name)

    def try_evict(self, name: str) -> bool:
        """Delete the cached file unless a process (this one included) pins it or is downloading it."""
        if name in self._state()["pins"]:
            return False
        path = self.directory / name
        fd = os.open(_hidden(path, "pin"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            remove_quietly(_hidden(path, "ok"))  # the marker first: a file without one is never trusted unread
            remove_quietly(path)
            return True
        finally:
            os.close(fd)


class RemoteShardSet(ShardSet):
    """A split of a remote version: a ``ShardSet`` over the cache directory that fetches each file before opening it."""

    cache: VersionCache
    limit: int | None = None
    """Bytes of opened shards this process keeps (``hold_at_most``); None: every shard it opens stays."""

    @classmethod
    def over(cls, cache: VersionCache, manifest: Manifest, split: str, *, version: Any = None) -> "RemoteShardSet":
        """``version``: a ``shardflow.reader.Version`` of the cache's directory, for callers that decode (its
        tokenizer files fetched first)."""
        shards = cls.from_manifest(cache.directory, manifest, split, version=version)
        shards.cache = cache
        return shards

    def data_files(self, k: int) -> list[tuple[str, int, str]]:
        """``(name, bytes, sha256)`` of shard ``k``'s file and sidecars: what reading its tokens needs."""
        entry = self.shards[k].entry
        assert entry is not None
        return [(entry.file, entry.bytes, entry.sha256), *((f.file, f.bytes, f.sha256) for f in entry.sidecars)]

    def data_bytes(self, k: int) -> int:
        return sum(size for _, size, _ in self.data_files(k))

    def fetch(self, k: int) -> None:
        for name, size, sha in self.data_files(k):
            self.cache.ensure(name, size, sha)

    def _open(self, k: int) -> Any:
        # Pinned from the check to the mapping; once mapped, the data outlives an unlink by another process.
        with self.cache.pinned([name for name, _, _ in self.data_files(k)]):
            self.fetch(k)
            return super()._open(k)

    def shard(self, k: int) -> Any:
        if self.limit is None or self._views[k] is not None:
            return super().shard(k)
        # Under a limit, one thread of this process at a time opens a shard, stores its view and evicts: another
        # thread's eviction never takes a shard opened but not yet stored (then never released again).
        pid, lock = self.__dict__.get("_held_lock") or (None, None)
        if pid != os.getpid() or lock is None:
            pid, lock = self.__dict__["_held_lock"] = (os.getpid(), threading.Lock())
        with lock:
            view = super().shard(k)
            self._keep_within(k)
        return view

    def hold_at_most(self, limit: int | None) -> None:
        """Random access under ``cache_limit_bytes``: keep at most ``limit`` bytes of the shards this process
        opened (their files and sidecars; the small ``.bos.idx`` files are fetched apart and not counted)
        mapped and cached; past it, the ones opened first are dropped and evicted (unless another process pins
        them). One shard larger than ``limit`` is refused here."""
        largest = max((self.data_bytes(k) for k in range(self.num_shards)), default=0)
        if limit is not None and largest > limit:
            raise ConfigError(
                f"cache_limit_bytes={limit:,} cannot hold the largest shard of {self.name} ({largest:,} bytes); "
                "raise it to hold at least that shard (random access fetches one shard at a time)"
            )
        self.limit = limit

    def _keep_within(self, k: int) -> None:
        """Count shard ``k``, just opened by ``shard`` (``last_token``'s maps are not kept, so not counted)."""
        held = self.__dict__.setdefault("_held", OrderedDict())
        held[k] = self.data_bytes(k)
        total = sum(held.values())
        while total > self.limit and len(held) > 1:  # type: ignore[operator]
            old, size = held.popitem(last=False)
            self.release(old)
            for name, _, _ in self.data_files(old):
                self.cache.try_evict(name)
            total -= size

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_held", None)  # this process's open shards: a worker's copy opens its own
        state.pop("_held_lock", None)
        return state

    def doc_starts(self, k: int, *, cache: bool = True) -> Any:
        entry = self.shards[k].entry
        if self._starts[k] is None and entry is not None:
            self.cache.ensure(entry.index.file, entry.index.bytes, entry.index.sha256)
        return super().doc_starts(k, cache=cache)

    def release(self, k: int) -> None:
        """Drop shard ``k``'s memory map (its file may then be evicted and its disk space freed)."""
        self._views[k] = None

    def fetch_indexes(self) -> None:
        """Fetch every shard's ``.bos.idx`` (concurrently): BOS alignment reads them all at open."""
        self._parallel([(e.index.file, e.index.bytes, e.index.sha256) for e in (s.entry for s in self.shards) if e is not None])

    def _parallel(self, files: list[tuple[str, int, str]]) -> None:
        self.cache.download(files)


def open_remote_split(ref: str | os.PathLike[str], *, options: ReadOptions | None = None, **kwargs: Any) -> RemoteShardSet:
    """Split ``split`` of a version on object storage, its manifest read and nothing else fetched yet.

    ``ref`` is a version URL (the directory of ``metadata.yaml``, or that file),
    or ``NAME@VERSION`` / ``NAME@latest`` with ``catalog`` a catalog URL. The
    options are ``open_shards``'s and ``cache_dir``; those of plain directories
    (``dtype=``...) are refused.
    """
    opts = ReadOptions.collect("open_remote_split", REMOTE_OPTIONS, options, kwargs)
    given = opts.plain_given()
    if given:
        raise ConfigError(f"{', '.join(given)} describe plain directories of shards; {os.fspath(ref)} is a published version")
    cache, manifest = _open_version(ref, opts.catalog, opts.cache_dir, opts.verify)
    return RemoteShardSet.over(cache, manifest, opts.split)


def _open_version(ref: str | os.PathLike[str], catalog: Any, cache_dir: Any, verify: bool) -> tuple[VersionCache, Manifest]:
    """The cache of the version ``ref`` names (a version URL, or ``NAME@VERSION`` in the catalog URL ``catalog``),
    and its manifest, read from the bucket (checked against the catalog entry)."""
    root = default_cache_dir(cache_dir)
    ref_str = os.fspath(ref)
    entry = None
    if is_remote(ref_str):
        url = ref_str.rstrip("/")
        url = url[: -len(MANIFEST_NAME) - 1] if url.endswith("/" + MANIFEST_NAME) else url
    else:
        url, entry = resolve_catalog(ref_str, os.fspath(catalog), root)
    cache = VersionCache(url, root / "versions" / cache_key(url), verify=verify)
    return cache, cache.load_manifest(entry)


def remote_version(ref: str | os.PathLike[str], *, catalog: Any = None,
                   cache_dir: str | os.PathLike[str] | None = None) -> tuple[VersionCache, Manifest]:
    """A version on object storage, its manifest alone read (checked against the bucket catalog's entry when
    ``ref`` is ``NAME@VERSION``): ``(its cache, which fetches and verifies a file on demand, its manifest)``."""
    return _open_version(ref, catalog, cache_dir, verify=True)


def fetch_version(ref: str | os.PathLike[str], *, catalog: Any = None, cache_dir: str | os.PathLike[str] | None = None,
                  verify: bool = True, refetch: bool = False, workers: int = FETCH_WORKERS,
                  progress: Callable[[int, int], Callable[[int], None]] | None = None) -> tuple[str, Path, Manifest]:
    """Every file of a version on object storage, in the cache: ``(its URL, the cache's version directory, its
    manifest)``. Each file is verified against the manifest's SHA-256 as it arrives (``verify``: cached files
    are hashed again too; ``refetch``: every file is fetched again, the cache trusted for nothing, as
    ``shardflow validate`` does), so the directory is a checked copy of the bucket's bytes, for ``validate_dir``.
    ``workers`` files at once; ``progress(files, bytes)``, given, is called once with the totals and returns what
    is told of each file's bytes as it is in place."""
    cache, manifest = _open_version(ref, catalog, cache_dir, verify)
    files: dict[str, tuple[int, str]] = {}
    for name, size, sha, where in named_files(manifest):
        check_relative_file(name, f"{cache.object_url(MANIFEST_NAME)}: {where}")  # nothing outside the version
        if not isinstance(sha, str) or not sha:
            raise ValidationError(f"{cache.object_url(name)}: {where} names it without a SHA-256; rebuild the version")
        files[name] = (cache.object_size(name) if size is None else size, sha)  # None: the tokenizer's copy
    done = progress(len(files), sum(size for size, _ in files.values())) if progress is not None else None
    cache.download([(name, size, sha) for name, (size, sha) in files.items()], refetch=refetch, workers=workers, done=done)
    return cache.url, cache.directory, manifest
