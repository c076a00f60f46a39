"""Lines of a byte stream in bounded memory: what the JSON Lines reader splits its input with.

A line is read in 1 MiB blocks. One that grows past the caller's limit is
never held: its bytes are dropped as they are read and it comes out as an
``Oversized`` (its length only), so a single 200 MB line, or a compressed
stream that expands into one, costs a block, not the line.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

__all__ = ["BLOCK", "Oversized", "read_lines", "range_lines"]

BLOCK = 1 << 20


class Oversized:
    """A line longer than the reader's limit, read past without being held: ``len()`` is its length in bytes."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size

    def __len__(self) -> int:
        return self.size


def read_lines(f: BinaryIO, length: int | None, limit: int | None = None) -> Iterator[bytes | Oversized]:
    """The lines of ``f`` (without their newline), reading at most ``length`` bytes (None: to the end).

    A line that grows past ``limit`` bytes is not held: its bytes are dropped as
    they are read, and it comes out as an ``Oversized`` (so one 200 MB line, or
    a compressed stream that expands into one, costs a block, not the line).
    A line split over blocks may come out up to one block past ``limit``.
    """
    pending: list[bytes] = []  # the start of a line longer than a block, without copying it again and again
    held = 0  # bytes in pending
    skipped: int | None = None  # the length so far of an oversized line being read past
    while length is None or length > 0:
        block = f.read(BLOCK if length is None else min(BLOCK, length))
        if not block:
            break
        if length is not None:
            length -= len(block)
        if skipped is not None:
            nl = block.find(b"\n")
            if nl < 0:
                skipped += len(block)
                continue
            yield Oversized(skipped + nl)
            skipped = None
            block = block[nl + 1 :]
            if not block:
                continue
        if b"\n" not in block:
            pending.append(block)
            held += len(block)
            if limit is not None and held > limit:
                skipped, pending, held = held, [], 0
            continue
        if pending:
            pending.append(block)
            block = b"".join(pending)
            pending, held = [], 0
        lines = block.split(b"\n")
        tail = lines.pop()
        if tail:
            pending.append(tail)
            held = len(tail)
        yield from lines
    if skipped is not None:
        yield Oversized(skipped)
    elif pending:
        yield b"".join(pending)


class Prefixed:
    """``head``, then the rest of ``f``: what a line reader reads after a boundary was searched for."""

    def __init__(self, head: bytes, f: BinaryIO) -> None:
        self._head, self._f = head, f

    def read(self, n: int) -> bytes:
        if self._head:
            out, self._head = self._head[:n], self._head[n:]
            return out
        return self._f.read(n)


def range_lines(f: BinaryIO, start: int, stop: int, limit: int | None = None) -> tuple[Iterator[bytes | Oversized], int]:
    """The lines of an uncompressed file that begin in ``[start, stop)``, and where the first begins.

    A line begins at 0 and after every newline. Past ``start`` the first begins
    after the first newline at or after ``start - 1``; the last may run past
    ``stop``, and is read to its end. Lines beginning at ``stop`` or later are the
    next range's. A range inside one long line holds no line.
    """
    head = b""
    first = start
    if start > 0:
        f.seek(start - 1)
        first = start - 1
        while True:
            block = f.read(BLOCK)
            if not block:
                return iter(()), first
            k = block.find(b"\n")
            if k >= 0:
                first += k + 1
                head = block[k + 1 :]
                break
            first += len(block)

    def lines() -> Iterator[bytes | Oversized]:
        pos = first
        for line in read_lines(Prefixed(head, f), None, limit):  # type: ignore[arg-type]
            if pos >= stop:
                return
            yield line
            pos += len(line) + 1

    return lines(), first
