"""A local input hashed by the worker that reads it, from the bytes it reads: each byte read once.

Planning leaves a local file that it need not read unhashed (``pipeline/plan.py``
says which); the job of its first work unit hashes it under
``storage.hashing_reads(path)``, and ``finish_hash`` gives the SHA-256 of the
whole file. How each kind's reads become the hash:

- a JSON Lines file, read in order from its first byte through ``open_input``
  (plain, or a compressed stream's raw bytes): each block is hashed as it is
  read (``open_input`` tees the first stream opened on the file). Planning
  counts a local file's lines, reading it whole, so it is hashed then, in that
  pass (``plan_units``'s ``digests``), and its workers find it hashed.
- a Parquet file, which pyarrow reads footer first and then column by column,
  skipping the columns it does not need: ``ForwardHash``, the file object
  pyarrow is given, keeps a frontier, the end of the bytes hashed so far, in
  file order. A read at the frontier is hashed as it is served; a read past it
  first reads and hashes the bytes in between (the other columns' chunks, the
  only bytes read that tokenizing alone would not read); a read of the footer
  (the bytes from the footer's start to the end, known from the last 8 bytes)
  or behind the frontier is served outside the hash. pyarrow's first read, of
  the file's end (64 KiB, the footer and the data before it), is kept in
  memory, and the hash takes those bytes from it when it gets there
  (``finish_hash``): read once by this job. Planning read the footer once
  more, to cut the units: that is the one second read, 64 KiB per file.
- an Arrow IPC file is memory-mapped (``sources/arrow.py``): tokenizing copies
  nothing through ``read``, and the hash is taken over the same mapping
  (``mapped_sha256``), from the page cache that tokenizing filled.

A file cut into several units is hashed by its first unit's job: its own
bytes as above, then the rest of the file from its frontier (``finish_hash``),
bytes that the other units' jobs read too. That is the one second read left
(all but the first unit of such a file, which is larger than ``unit_bytes``,
256 MiB by default); a file planning hashed (the fingerprint cache knows it,
or a version holds a file of its name and size) is not hashed again.
"""

from __future__ import annotations

import hashlib
import io
import mmap
import os
from pathlib import Path
from typing import Any

from .._io import sha256_file
from .storage import READ_BLOCK, ReadHash, claim_hash

__all__ = ["ForwardHash", "forward_hash", "finish_hash", "mapped_sha256"]

_PARQUET_MAGIC = b"PAR1"


def _pread(fd: int, n: int, at: int) -> bytes:
    """``n`` bytes at ``at`` (fewer only at the end of the file)."""
    parts = []
    while n > 0:
        got = os.pread(fd, n, at)
        if not got:
            break
        parts.append(got)
        n -= len(got)
        at += len(got)
    return b"".join(parts)


def _span(fd: int, at: int, n: int, kept: tuple[int, bytes] | None) -> bytes:
    """``n`` bytes at ``at``, those that ``kept`` holds (the file's end, read before) taken from it."""
    if kept is not None and at + n > kept[0]:
        k_at, k = kept
        head = _pread(fd, k_at - at, at) if at < k_at else b""
        return head + k[max(at - k_at, 0) : at + n - k_at]
    return _pread(fd, n, at)


def _footer_start(fd: int, size: int) -> int:
    """Where a Parquet file's footer (its metadata, its length and the magic) begins; ``size`` if it is not one."""
    tail = _pread(fd, 8, size - 8) if size >= 12 else b""
    if len(tail) != 8 or tail[4:] != _PARQUET_MAGIC:
        return size
    length = int.from_bytes(tail[:4], "little")
    return size - 8 - length if 0 <= length <= size - 12 else size


class ForwardHash(io.RawIOBase):
    """A local Parquet file for pyarrow, hashed in file order as it is read (see the module's docstring)."""

    def __init__(self, path: str, tee: ReadHash) -> None:
        super().__init__()
        self._fd = os.open(path, os.O_RDONLY)
        self._size = os.fstat(self._fd).st_size
        self._tail = _footer_start(self._fd, self._size)
        self._tee = tee
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, pos: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = max(0, base + pos)
        return self._pos

    def read(self, n: int = -1) -> bytes:  # type: ignore[override]
        start = self._pos
        end = self._size if n is None or n < 0 else min(self._size, start + n)
        if end <= start:
            return b""
        tee = self._tee
        if tee.pos <= start and end <= self._tail:
            while tee.pos < start:  # bytes pyarrow skips (other columns): hashed, not kept
                tee.update(_span(self._fd, tee.pos, min(READ_BLOCK, start - tee.pos), tee.kept))
            data = _span(self._fd, start, end - start, tee.kept)
            tee.update(data)
        else:  # the footer, or bytes behind the frontier: served outside the hash
            data = _span(self._fd, start, end - start, tee.kept)
            if end == self._size and tee.kept is None:
                tee.kept = (start, data)  # the file's end (the footer read first): hashed from here at the end
        self._pos = start + len(data)
        return data

    def readinto(self, b: Any) -> int:
        data = self.read(len(b))
        b[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            os.close(self._fd)
        super().close()


def forward_hash(path: str) -> ForwardHash | None:
    """A ``ForwardHash`` of ``path`` when this thread hashes it as it reads it (``hashing_reads``), else None."""
    tee = claim_hash(path)
    return None if tee is None else ForwardHash(path, tee)


def mapped_sha256(path: str) -> str:
    """SHA-256 of a local file over its memory mapping (no ``read`` copies; the pages a reader mapped are reused)."""
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return hashlib.sha256().hexdigest()
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            h = hashlib.sha256()
            view = memoryview(m)
            try:
                for at in range(0, len(m), READ_BLOCK):
                    h.update(view[at : at + READ_BLOCK])  # (hashlib releases the GIL on large buffers)
            finally:
                view.release()
            return h.hexdigest()


def finish_hash(read: ReadHash, path: str, size: int, *, mapped: bool = False) -> str:
    """The SHA-256 of the local file ``path`` (``size`` bytes) that this job read under ``hashing_reads``.

    Read in full, in order: the hash of what was read. Read in part (the first unit of several, or a Parquet file
    whose reader stopped before its footer): the bytes from the frontier to the end are read and hashed now. Not
    read through the hash at all: hashed over its mapping if its kind maps its files (``mapped``, Arrow), else read
    again (counted as a second read, which ``tests/pipeline/test_read_once.py`` would see).
    """
    done = read.digest(size)
    if done:
        return done
    if read.opened and not read.broken and read.pos <= size:
        fd = os.open(path, os.O_RDONLY)
        try:
            while read.pos < size:
                block = _span(fd, read.pos, min(READ_BLOCK, size - read.pos), read.kept)
                if not block:
                    break
                read.update(block)
        finally:
            os.close(fd)
        done = read.digest(size)
        if done:
            return done
    return mapped_sha256(path) if mapped else sha256_file(Path(path))
