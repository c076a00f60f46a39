"""What a reader holds of a published version: a pin against ``shardflow rm``, and the stats its files were published with.

A reader of a local version (``shardflow.reader.open_version``, so ``TokenDataset``,
``StreamingTokenDataset``, ``MixtureDataset``, ``open_shards`` and ``EmbeddingStore``)
*pins* it: a shared ``flock`` on the version directory itself, opened read-only (so a
read-only mount is pinned too), held for as long as the reader object lives. A
DataLoader worker started by ``fork`` shares the parent's descriptor, hence its lock; one
started by ``spawn`` unpickles the dataset and pins the version again
(``VersionPin.__setstate__``). ``shardflow rm`` and ``gc`` try the same lock exclusively
without waiting (``exclusive``) and refuse a pinned version, naming the processes
that pin it from their pin files, ``<dataset>/.pins/vN/PID-N@HOST`` beside the version
(best effort: none is written where the data root is read-only; the lock is what
counts). ``flock`` is per node on filesystems that do not share it between nodes: a job
on another node does not pin the version there (docs/OPERATIONS.md).

``published_stats`` gives each file's size and mtime as published (the record
``pipeline/publish.py`` ``_seal`` writes beside the catalog, checked against the catalog
entry's ``files_sha256``), which ``ShardSet`` compares with the file when it first maps
a shard or reads its index: a file with another mtime is hashed there, and refused if
its bytes are not the published ones (a file changed in place after publish). The inode is left out (a data root copied with its mtimes, ``cp -a`` or ``rsync -a``,
still reads), and so is the ctime (an incremental build's hard links change it).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import gc
import itertools
import os
import socket
import time
import weakref
from pathlib import Path
from typing import Any, Iterator

from .catalog import Catalog, recorded_file_stats
from .errors import CatalogError, ShardflowError
from .manifest import Manifest, version_file

__all__ = [
    "PINS_DIR", "VersionPin", "exclusive", "forget_pins", "pin_holders", "pinned", "pins_of", "published_stats",
    "removed_error",
]

PINS_DIR = ".pins"
"""Beside the version directories of a dataset: ``.pins/vN/PID-N@HOST``, one file per pinning reader."""

PIN_WAIT = 30.0
"""Seconds a reader waits for the pin while ``rm`` or ``gc`` holds the version exclusively (a brief step: the
catalog entry taken out and the directory renamed)."""

_TRASH_SUFFIX = ".removed"  # lifecycle.TRASH_SUFFIX (lifecycle imports this module)
_serial = itertools.count()
_UNSUPPORTED = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL, errno.EBADF, errno.ENOSYS)


def pins_of(directory: Path) -> Path:
    """The directory of ``directory``'s pin files: ``.pins/vN`` beside it (also for its trash name ``.vN.removed``,
    which ``shardflow rm`` renames it to before deleting it)."""
    name = directory.name
    if name.startswith(".") and name.endswith(_TRASH_SUFFIX):
        name = name[1 : -len(_TRASH_SUFFIX)]
    return directory.parent / PINS_DIR / name


def removed_error(ref: str, directory: Path, what: str = "") -> CatalogError:
    """The one message of a reader whose version was removed (``shardflow rm``) under it."""
    where = f"{what}: " if what else ""
    return CatalogError(
        f"{where}{ref} was removed (shardflow rm) while it was being read: its directory {directory} is gone. "
        "Open a version the catalog lists (shardflow ls NAME), or rebuild it"
    )


def _lock(fd: int, how: int, wait: float) -> bool:
    """``flock(fd, how)``, retried without blocking for ``wait`` seconds; False where the filesystem has no flock.

    Raises ``BlockingIOError`` when another process still holds a conflicting lock after ``wait``.
    """
    deadline = time.monotonic() + wait
    while True:
        try:
            fcntl.flock(fd, how | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)
        except OSError as exc:
            if exc.errno in _UNSUPPORTED:
                return False
            raise


def _release(fd: int, pin_file: Path | None, pid: int) -> None:
    # Closing releases the lock once no other descriptor of it is open (a forked worker's copy keeps it):
    # never LOCK_UN, which would release it for every process sharing the descriptor.
    with contextlib.suppress(OSError):
        os.close(fd)
    if pin_file is not None and os.getpid() == pid:
        with contextlib.suppress(OSError):
            pin_file.unlink()
        for empty in (pin_file.parent, pin_file.parent.parent):
            with contextlib.suppress(OSError):
                empty.rmdir()  # only when empty: another reader's pin file keeps it


class VersionPin:
    """A shared ``flock`` on a version directory, held until this object is collected (or ``release``).

    Pickled, it is its directory and reference: unpickling (a spawned DataLoader worker) pins again.
    Where the filesystem has no ``flock`` or the directory cannot be opened, it holds nothing (``held``
    False): reading never fails for want of a pin. A directory that is gone, or that ``rm`` renamed
    while this waited for it, is a ``CatalogError`` saying the version was removed.
    """

    def __init__(self, directory: Path, ref: str) -> None:
        self.directory = Path(directory)
        self.ref = ref
        self._finalizer: weakref.finalize | None = None
        self._take()

    def _take(self) -> None:
        try:
            fd = os.open(self.directory, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            raise removed_error(self.ref, self.directory) from None
        except OSError:
            return  # not openable here (permissions): read unpinned
        try:
            held = _lock(fd, fcntl.LOCK_SH, PIN_WAIT)
        except BlockingIOError:
            os.close(fd)
            raise CatalogError(
                f"{self.ref}: {self.directory} has been held exclusively for {PIN_WAIT:.0f} s (shardflow rm or gc "
                "removing it?); check with shardflow ls, and open it again"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        if not held:
            os.close(fd)
            return
        try:
            same = os.stat(self.directory).st_ino == os.fstat(fd).st_ino
        except OSError:
            same = False
        if not same:  # renamed to its trash name by rm while this waited: the directory locked is not the version
            os.close(fd)
            raise removed_error(self.ref, self.directory)
        self._finalizer = weakref.finalize(self, _release, fd, self._write_pin_file(), os.getpid())

    def _write_pin_file(self) -> Path | None:
        """``.pins/vN/PID-N@HOST`` beside the version, naming this process to ``rm``; None where it cannot be written."""
        path = pins_of(self.directory) / f"{os.getpid()}-{next(_serial)}@{socket.gethostname()}"
        for _ in range(2):  # a releasing reader may remove the empty directories between the mkdir and the create
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))
                return path
            except FileNotFoundError:
                continue
            except OSError:
                return None
        return None

    @property
    def held(self) -> bool:
        return self._finalizer is not None and self._finalizer.alive

    def release(self) -> None:
        """Release the pin now (else when this object is collected)."""
        if self._finalizer is not None:
            self._finalizer()

    def __getstate__(self) -> dict[str, Any]:
        return {"directory": self.directory, "ref": self.ref}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["directory"], state["ref"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"VersionPin({self.ref!r}, {str(self.directory)!r}, held={self.held})"


def pin_holders(directory: Path) -> list[str]:
    """Who pins ``directory``, from its pin files: ``pid N`` (this node) or ``pid N on HOST``; stale files of
    processes gone from this node are removed and not named."""
    here = socket.gethostname()
    found: list[str] = []
    try:
        files = sorted(pins_of(directory).iterdir())
    except OSError:
        return []
    for path in files:
        ident, _, host = path.name.partition("@")
        pid = ident.partition("-")[0]
        if not pid.isdigit():
            continue
        if host == here:
            try:
                os.kill(int(pid), 0)
            except ProcessLookupError:
                with contextlib.suppress(OSError):
                    path.unlink()
                continue
            except OSError:
                pass  # another user's process: alive
        who = f"pid {pid}" + ("" if host == here else f" on {host}")
        if who not in found:
            found.append(who)
    return found


def _exclusive_now(fd: int) -> bool:
    """Whether ``flock(fd, LOCK_EX)`` was had at once (also where the filesystem has no flock: no pin to see)."""
    try:
        return _lock(fd, fcntl.LOCK_EX, 0)
    except BlockingIOError:
        pass
    # Readers this process dropped but has not collected yet (a Version and its splits refer to each other)
    # still hold their pins: collect them before deciding.
    gc.collect()
    try:
        return _lock(fd, fcntl.LOCK_EX, 0)
    except BlockingIOError:
        return False


def _refusal(directory: Path, ref: str, flag: str) -> str:
    holders = pin_holders(directory)
    who = (", ".join(holders) if holders else
           "a process no pin file names (on another node, or where the data root is read-only; "
           f"`fuser -v {directory}` on each node finds it)")
    return (f"{ref} is being read: pinned by {who}. Wait for that job to end (or stop it), or pass {flag} to "
            "remove it anyway: its readers then fail at the next shard they open")


def pinned(directory: Path, ref: str, *, flag: str = "--force") -> str | None:
    """Why ``directory`` may not be removed now (a reader pins it: one line naming the holders and ``flag``), or
    None. Probed without waiting; nothing stays held."""
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return None
    try:
        return None if _exclusive_now(fd) else _refusal(directory, ref, flag)
    finally:
        os.close(fd)


@contextlib.contextmanager
def exclusive(directory: Path, ref: str, *, force: bool = False, flag: str = "--force") -> Iterator[None]:
    """Hold ``directory`` exclusively (``flock`` without waiting) while the body removes it; refuse a pinned one.

    The refusal is one ``CatalogError`` (``pinned``'s message). ``force``: go on anyway (the readers
    fail at the next shard they map). A directory already gone, or a filesystem without ``flock``, is not
    held (there is nothing to see). A reader that opens the version meanwhile waits, then finds it removed.
    """
    try:
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        yield
        return
    try:
        if not _exclusive_now(fd) and not force:
            raise CatalogError(_refusal(directory, ref, flag))
        yield
    finally:
        os.close(fd)


def forget_pins(directory: Path) -> None:
    """Delete ``directory``'s pin files (after it was removed: whoever pinned it has nothing left to pin)."""
    pins = pins_of(directory)
    if pins.is_dir():
        for path in pins.iterdir():
            with contextlib.suppress(OSError):
                path.unlink()
    for empty in (pins, pins.parent):
        with contextlib.suppress(OSError):
            empty.rmdir()


def published_stats(
    directory: Path, manifest: Manifest, catalog: Catalog | str | os.PathLike[str] | None, *, current: bool = False
) -> dict[str, tuple[int, int]] | None:
    """``{file: (size, mtime_ns)}`` of the version's shard files (shards, indexes, sidecars) as published.

    From the record that the entry of ``directory`` in ``catalog`` (the catalog that lists it; None: none
    does) vouches for (``recorded_file_stats``); None where there is no such entry or it records none
    (versions published before the record, or a record that does not match the entry: ``shardflow
    validate`` covers those). One file read, no stat per shard. ``current``: the files' stats now
    instead, one stat each, taken before ``verify=True`` hashes them (a data root copied without its
    mtimes then reads after a full check).
    """
    if current:
        out: dict[str, tuple[int, int]] = {}
        for entry in manifest.splits.values():
            for shard in entry.shards:
                for name in (shard.file, *(f.file for f in shard.files)):
                    st = version_file(directory, name, "a shard file").stat()
                    out[name] = (st.st_size, st.st_mtime_ns)
        return out
    if catalog is None:
        return None
    try:
        cat = catalog if isinstance(catalog, Catalog) else Catalog(catalog)
        found = cat.entry_for_dir(directory, name=manifest.name) if isinstance(manifest.name, str) else None
        found = found or cat.entry_for_dir(directory)
    except (ShardflowError, OSError):
        return None
    if found is None:
        return None
    recorded = recorded_file_stats(cat, found[0], found[1])
    if recorded is None:
        return None
    return {name: (size, mtime) for name, (size, _inode, mtime) in recorded.items()}
