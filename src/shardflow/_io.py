"""Small file helpers shared by the writers: atomic writes and checksums.

Every file shardflow publishes is written to a temporary name in the same
directory and moved into place with ``os.replace``, so a reader sees either the
old file or the complete new one, never a prefix of it.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_write_bytes", "atomic_write_text", "sha256_file", "fsync_dir", "tmp_path_for"]

# 8 MiB reads keep hashlib in its fast path while using little memory.
_CHUNK = 8 << 20


def tmp_path_for(path: Path) -> Path:
    """The temporary name a file is written under before ``os.replace``."""
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")


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
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def atomic_write_text(path: Path, text: str) -> None:
    """``atomic_write_bytes`` for UTF-8 text."""
    atomic_write_bytes(path, text.encode("utf-8"))


def iter_chunks(path: Path, chunk: int = _CHUNK) -> Iterator[bytes]:
    """The bytes of a file in chunks of at most ``chunk`` bytes."""
    with open(path, "rb") as f:
        while True:
            block = f.read(chunk)
            if not block:
                return
            yield block


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in bounded chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        # hashlib.file_digest releases the GIL on large reads and reuses one buffer.
        h = hashlib.file_digest(f, "sha256")
    return h.hexdigest()
