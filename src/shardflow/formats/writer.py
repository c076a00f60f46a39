"""Writing one shard file and its ``.bos.idx``, for any format: header, hash, temporary name, rename.

A ``ShardWriter`` owns everything that makes a shard file correct on disk,
whatever its format: the header the format asks for, the SHA-256 of every byte
written (computed as the bytes pass, on a helper thread beside the copying, so
nothing is read back), a temporary name next to the final one, ``fsync`` and
``os.replace`` on commit, and no temporary file left behind on failure. ``write_index`` does the same for the
``.bos.idx`` sidecar. Callers only decide which tokens go in::

    with ShardWriter(fmt, path, dtype, ntokens) as w:
        w.copy_from(part_file, count, buf)      # or w.write(token_bytes)
        nbytes, sha256 = w.commit()
    data, sha256 = encode_index(starts, ntokens)          # int32 entries, int64 past 2**31 - 1 tokens
    write_index(bosidx.index_path(path), data)
    extra = write_sidecars(fmt, path, dtype, ntokens, starts)   # [(name, bytes, sha256)]; [] for most formats

A writer opened without the count (``ntokens=None``) reserves the header's
bytes, writes the tokens as they come and writes the header at ``commit``
(``os.pwrite``): the same bytes as a writer told the count. The SHA-256 is
still the whole file's. SHA-256 cannot prepend a header to a body already
hashed, so where the header is empty (``bin``, ``megatron``) the tokens are
hashed as they pass, as above, and where it is not (``nanogpt``, ``npy``) the
file is read back and hashed once at commit, from the page cache that the
writes just filled, read and hash overlapped: one pass at the hash's speed,
no more memory than two read blocks, and no hashing while writing (there is
nothing useful to hash before the header is known).
``unit_writer.UnitShardWriter`` cuts documents into such shards.

Every shard is checked as it is written, so that no one reads its tokens back: ``commit`` parses the header
it wrote as a reader does (the token count, the dtype, the file's size) before the rename, and
``write_sidecars`` what the format's own check (``check_sidecars``) finds in the files it wrote. A writer
given a ``TokenCheck`` (``shard_checks.ShardScan``: the ids against the vocabulary, the boundary tokens
against the document starts) feeds it every block of tokens as it passes; its caller calls ``check`` with
the shard's document starts before ``commit``, so a shard that fails is never committed.

The layouts themselves are in ``docs/FORMAT.md``.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any, BinaryIO, Protocol

import numpy as np

from .._io import WRITEBACK_MIN_BYTES, BackgroundSha256, atomic_write_bytes, remove_quietly, start_writeback, tmp_path_for
from ..errors import ConfigError, ValidationError
from . import bosidx
from .base import ShardFormat

__all__ = ["ShardWriter", "TokenCheck", "header_bytes", "encode_index", "write_index", "write_sidecars"]

# A header written last is hashed with the file read back in blocks of this many bytes (two buffers:
# one is read while the other is hashed).
_READBACK_BYTES = 8 << 20


def header_bytes(fmt: ShardFormat, dtype: np.dtype) -> int:
    """The length of ``fmt``'s header for any token count, for a writer that writes it last.

    Raises ``ConfigError`` for a format whose header length depends on the
    count (none does today: ``npy`` pads its header to 128 bytes whatever the shape).
    """
    dtype = np.dtype(dtype)
    size = len(fmt.header(0, dtype))
    if len(fmt.header(fmt.max_tokens, dtype)) != size:
        raise ConfigError(
            f"format {fmt.name!r}: the header's length depends on the token count, so it cannot be written last; "
            "give ShardWriter the shard's token count"
        )
    return size


class TokenCheck(Protocol):
    """The checks of one shard's tokens as they are written (``shard_checks.ShardScan``)."""

    def feed(self, block: np.ndarray) -> None:
        """The next tokens; raises ``ValidationError`` on an id the shard must not hold."""

    def check(self, starts: np.ndarray) -> None:
        """After the last ``feed``: raises ``ValidationError`` if the document starts ``starts`` disagree with them."""


class ShardWriter:
    """One shard being written: ``write``/``copy_from`` the tokens, then ``commit``."""

    def __init__(
        self, fmt: ShardFormat, path: Path, dtype: np.dtype, ntokens: int | None = None, *, check: TokenCheck | None = None
    ) -> None:
        """``ntokens``: the shard's token count, or None to count what is written and write the header at ``commit``.
        ``check``: fed every block of tokens written (its ``check`` is the caller's, before ``commit``)."""
        self.fmt = fmt
        self.check = check
        self.path = Path(path)
        self.dtype = np.dtype(dtype)
        self.ntokens = ntokens
        # The header: known now, or (ntokens None) only at commit, when it fills the reserved bytes.
        self.header: bytes | None = None if ntokens is None else fmt.header(ntokens, self.dtype)
        self._reserved = header_bytes(fmt, self.dtype) if ntokens is None else 0
        # Hash the bytes as they pass whenever the bytes before them are known; else read back at commit.
        self._streaming = self._reserved == 0
        self.tmp = tmp_path_for(self.path)
        self._hash = BackgroundSha256()
        self._buffers: tuple[np.ndarray, np.ndarray] | None = None  # copy_from's: one is read while the other is hashed
        self._turn = 0
        self._file: BinaryIO | None = None
        self._written = 0
        self._offset = 0  # bytes handed to the file so far
        self._committed = False

    def __enter__(self) -> "ShardWriter":
        self._file = open(self.tmp, "wb")
        if self.header is not None:
            self._put(self.header)
        elif self._reserved:
            self._file.write(bytes(self._reserved))  # the header's place, filled at commit
            self._offset = self._reserved
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        if not self._committed:
            remove_quietly(self.tmp)  # a failed write (a full disk) leaves no temporary file

    def _put(self, data: Any) -> None:
        assert self._file is not None, "use ShardWriter as a context manager"
        if self._streaming:
            self._hash.update(data)  # on its thread, while the bytes are written
        self._file.write(data)
        if len(data) >= WRITEBACK_MIN_BYTES:  # a block of tokens, not the header: on its way to the disk now
            self._file.flush()
            start_writeback(self._file.fileno(), self._offset, len(data))
        self._offset += len(data)

    def write(self, tokens: np.ndarray | memoryview | bytes) -> None:
        """Append tokens (an array of the shard's dtype, or its raw little-endian bytes)."""
        data = memoryview(tokens).cast("B") if isinstance(tokens, np.ndarray) else memoryview(tokens)
        self._put(data)
        if self.check is not None:  # while the same bytes are hashed on another core (a failure commits nothing)
            self.check.feed(np.frombuffer(data, dtype=self.dtype))
        self._hash.wait()  # the caller may change its array once this returns
        self._written += len(data) // self.dtype.itemsize

    def copy_from(self, src: BinaryIO, count: int, buf: np.ndarray) -> None:
        """Append ``count`` tokens read from the open file ``src`` (at its position) through ``buf``.

        Plain reads into two bounded buffers, ``buf`` and one more of its size
        (memory-mapping the sources would count every copied page towards the
        process's resident memory): a block is read into one while the block
        before is still being hashed from the other. ``buf`` is the writer's
        until ``commit``.
        """
        if self._buffers is None or self._buffers[0] is not buf:
            self._hash.wait()  # another caller's buffer: nothing of it may be hashing when it is reused
            self._buffers = (buf, np.empty_like(buf))
        done = 0
        while done < count:
            n = min(len(buf), count - done)
            # The buffers alternate block by block, across calls: the last block read into this one
            # was two blocks ago, and _put waited for its hash before hashing the block after it.
            block = self._buffers[self._turn][:n]
            view = memoryview(block).cast("B")
            self._turn ^= 1
            if src.readinto(view) != len(view):
                raise ValidationError(f"{src.name}: shorter than the layout says; the staging area is damaged")
            self._put(view)
            if self.check is not None:
                self.check.feed(block)  # while the same block is hashed on another core
            done += n
        self._written += count

    @property
    def written(self) -> int:
        """Tokens written so far."""
        return self._written

    def commit(self) -> tuple[int, str]:
        """Flush, ``fsync`` and rename into place; returns ``(bytes, sha256)`` of the shard file.

        A writer opened without the count writes its header now (``ntokens``
        and ``header`` are then set) and, unless the format has none, hashes
        the file read back.
        """
        if self.ntokens is not None and self._written != self.ntokens:
            raise ValidationError(f"{self.path}: {self._written} tokens written, the header says {self.ntokens}")
        assert self._file is not None
        self._file.flush()
        if self.header is None:
            header = self.fmt.header(self._written, self.dtype)  # ConfigError past the format's largest count
            if len(header) != self._reserved:
                raise ValidationError(f"{self.path}: a {len(header)}-byte header does not fill the {self._reserved} bytes reserved")
            if header:
                os.pwrite(self._file.fileno(), header, 0)
            self.header, self.ntokens = header, self._written
        self._check_header()
        if not self._streaming:
            self._hash_file()  # before the fsync: the blocks' writeback proceeds meanwhile
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        os.replace(self.tmp, self.path)
        self._committed = True
        return len(self.header) + self.ntokens * self.dtype.itemsize, self._hash.hexdigest()

    def _check_header(self) -> None:
        """The file as a reader opens it (``ShardFormat.open``'s checks), before it is committed: the header says the
        tokens written, of this dtype, and the size is the header's and theirs."""
        assert self._file is not None and self.header is not None and self.ntokens is not None
        offset, count, dtype = self.fmt.read_header(self.tmp, self.dtype)
        size = os.fstat(self._file.fileno()).st_size
        if (offset, count, np.dtype(dtype)) != (len(self.header), self.ntokens, self.dtype) or size != offset + count * dtype.itemsize:
            raise ValidationError(
                f"{self.path}: the header written says {count} tokens of {np.dtype(dtype).name} after {offset} bytes in a "
                f"{size}-byte file, but {self.ntokens} tokens of {self.dtype.name} after {len(self.header)} were written; "
                "nothing was committed"
            )

    def _hash_file(self) -> None:
        """Hash the temporary file read back, header included: a block is read while the one before is hashed."""
        size = self._offset
        block = max(1, min(_READBACK_BYTES, size))
        buffers = (bytearray(block), bytearray(block))
        turn = 0
        with open(self.tmp, "rb") as f:
            done = 0
            while done < size:
                view = memoryview(buffers[turn])[: min(block, size - done)]
                turn ^= 1  # this buffer's last block was two updates ago, hashed before the update after it returned
                if f.readinto(view) != len(view):
                    raise ValidationError(f"{self.tmp}: shorter than the {size} bytes written; the disk lost a write")
                self._hash.update(view)
                done += len(view)
        self._hash.wait()


def encode_index(starts: np.ndarray, ntokens: int | None = None) -> tuple[bytes, str]:
    """The bytes of the ``.bos.idx`` of a shard of ``ntokens`` tokens holding ``starts``, and their SHA-256.

    The entries' width follows from ``ntokens`` (``bosidx.entry_dtype``); None: int32.
    """
    data = bosidx.encode(starts, ntokens)
    return data, hashlib.sha256(data).hexdigest()


def write_index(path: Path, data: bytes) -> None:
    """Write the ``.bos.idx`` bytes ``data`` at ``path`` (temporary name, ``fsync``, ``os.replace``)."""
    atomic_write_bytes(path, data)


def write_sidecars(
    fmt: ShardFormat, shard_path: Path, dtype: np.dtype, ntokens: int, starts: np.ndarray
) -> list[tuple[str, int, str]]:
    """Write the files ``fmt`` keeps beside a shard (``ShardFormat.sidecars``), each atomically.

    Returns ``(file name, bytes, sha256)`` of each, in the format's order; an
    empty list for formats without sidecars.
    """
    out = []
    for path, data in fmt.sidecars(Path(shard_path), ntokens, np.dtype(dtype), np.asarray(starts)).items():
        atomic_write_bytes(path, data)
        out.append((path.name, len(data), hashlib.sha256(data).hexdigest()))
    if out:  # what ``shardflow validate`` checks of them: the format's own reading of the files just written
        problems = fmt.check_sidecars(Path(shard_path), ntokens, np.dtype(dtype), np.asarray(starts))
        if problems:
            raise ValidationError("\n  ".join(problems))
    return out
