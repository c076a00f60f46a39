"""Small file helpers shared by the writers: atomic writes and checksums.

Every file shardflow publishes is written to a temporary name in the same
directory and moved into place with ``os.replace``, so a reader sees either the
old file or the complete new one, never a prefix of it.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from pathlib import Path
from typing import Any

from .faults import fault

__all__ = ["safe_load_yaml", "atomic_write_bytes", "atomic_write_text", "sha256_file", "file_identity", "fsync_dir", "tmp_path_for", "remove_quietly", "is_stale_tmp", "start_writeback", "WRITEBACK_MIN_BYTES", "NPY_LOCK", "load_npy"]

def safe_load_yaml(text: str) -> Any:
    """Parse YAML with a *safe* loader only: libyaml's when available (several times
    faster on a manifest of thousands of shards: docs/PERFORMANCE.md), else PyYAML's pure-Python one."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader, never the full loader



def tmp_path_for(path: Path) -> Path:
    """The temporary name a file is written under before ``os.replace``."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


def is_stale_tmp(path: Path) -> bool:
    """Whether ``path`` is a temporary file (``tmp_path_for``) of a process that no longer runs."""
    name = path.name
    if not (name.startswith(".") and ".tmp-" in name):
        return False
    pid_text = name.rsplit(".tmp-", 1)[1]
    if not pid_text.isdigit():
        return False
    pid = int(pid_text)
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, owned by another user
    return False


_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>: start writeback of the range's dirty pages, do not wait
_sync_file_range: Any = None  # libc's sync_file_range once looked up; False where there is none
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
WRITEBACK_MIN_BYTES = 1 << 20
"""Writers hand their bytes to :func:`start_writeback` in pieces of at least this many (a call per small batch costs more)."""


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Have the kernel start writing bytes ``[offset, offset + nbytes)`` of ``fd`` to disk, without waiting.

    Every shard and part file is ``fsync``'ed before it is renamed into place.
    Left to the end, that ``fsync`` waits for the whole file to reach the disk
    (docs/PERFORMANCE.md). Started block by block while the file is
    still being written, the writeback overlaps the copying and hashing, and
    the ``fsync`` waits only for the last blocks. Durability is unchanged: the
    ``fsync`` still runs. Linux's ``sync_file_range(SYNC_FILE_RANGE_WRITE)``;
    elsewhere, or where the kernel refuses it (a sandbox), a no-op. Only whole
    pages are asked for: a page the next write still fills is left for the
    next call (on file systems with stable pages, a page under writeback makes
    the next write to it wait). Returns whether the kernel took the request.
    """
    global _sync_file_range
    if _sync_file_range is None:
        _sync_file_range = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                func = ctypes.CDLL(None, use_errno=True).sync_file_range
                func.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
                func.restype = ctypes.c_int
                _sync_file_range = func
            except (OSError, AttributeError):
                pass
    end = (offset + nbytes) // _PAGE * _PAGE
    if not _sync_file_range or end <= offset:
        return False
    if _sync_file_range(fd, offset, end - offset, _SYNC_FILE_RANGE_WRITE) == 0:
        return True
    import ctypes
    import errno

    if ctypes.get_errno() in (errno.ENOSYS, errno.EPERM):
        _sync_file_range = False  # not allowed here at all: no more calls
    return False  # otherwise (a pipe, say) only no head start for this file


NPY_LOCK = threading.Lock()
"""Held while numpy reads a ``.npy`` header (``load_npy``, and around an ``.npz``'s reads).

numpy parses the header with ``ast.literal_eval``, and CPython 3.11.7 (this
project's interpreter here) can fail two such parses running at once on two
threads with ``SystemError: AST constructor recursion depth mismatch``
(CPython gh-106905): a build's card stage reads the units' statistics while
the shard jobs open their segment tables. A header is a few hundred bytes.
"""


def load_npy(path: Any, **kwargs: Any) -> Any:
    """``numpy.load(path, **kwargs)`` holding :data:`NPY_LOCK` (a memory map or an array; not for ``.npz``)."""
    import numpy as np

    with NPY_LOCK:
        return np.load(path, **kwargs)


def fsync_dir(path: Path) -> None:
    """Flush a directory entry (a rename) to disk; a no-op where unsupported."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so that readers never see a partial file."""
    path = Path(path)
    tmp = tmp_path_for(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        fault("atomic-write", path)
        os.replace(tmp, path)
    except BaseException:
        # A failed write (a full disk) must not leave its temporary file behind.
        remove_quietly(tmp)
        raise
    fsync_dir(path.parent)


def remove_quietly(path: Path) -> None:
    """Delete ``path`` if it exists; errors are ignored (used while handling another error)."""
    try:
        os.unlink(path)
    except OSError:
        pass


def atomic_write_text(path: Path, text: str) -> None:
    """``atomic_write_bytes`` for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def file_identity(path: Path | str) -> tuple[int, int, int]:
    """``(bytes, inode, mtime_ns)`` of the file at ``path`` itself (``lstat``: a symlink is not followed).

    What tells, without reading it, that a file is still the one a record describes: a file written to since
    has another mtime, one replaced another inode (the record of a version's files at publish is the same)."""
    st = os.lstat(path)
    return st.st_size, st.st_ino, st.st_mtime_ns


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in bounded chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        # hashlib.file_digest releases the GIL on large reads and reuses one buffer.
        h = hashlib.file_digest(f, "sha256")
    return h.hexdigest()


class BackgroundSha256:
    """SHA-256 of a stream of blocks, each hashed on a helper thread while the caller handles the next one.

    Hashing (docs/PERFORMANCE.md) is the slowest step of copying or
    checking a shard; hashlib releases the GIL on large buffers, so on another
    core it overlaps the caller's reads, writes and numpy checks instead of
    following them. Blocks are hashed in the order given. A block must stay
    unchanged until the next ``update`` (or ``hexdigest``) returns, which
    first waits for it: a caller alternates two buffers.
    """

    _INLINE = 1 << 20  # smaller blocks (a header) are hashed on the spot: a thread would cost more

    def __init__(self) -> None:
        self._hash = hashlib.sha256()
        self._busy: threading.Thread | None = None

    def wait(self) -> None:
        """Return once every block given is hashed (its memory may then change)."""
        if self._busy is not None:
            self._busy.join()
            self._busy = None

    def update(self, data: Any) -> None:
        """Hash ``data`` after everything given before; returns once the previous block is hashed."""
        self.wait()
        if len(data) < self._INLINE:
            self._hash.update(data)
            return
        self._busy = threading.Thread(target=self._hash.update, args=(data,), name="shardflow-sha256", daemon=True)
        self._busy.start()

    def hexdigest(self) -> str:
        self.wait()
        return self._hash.hexdigest()
