"""Writing a stream of whole documents into bounded shards, no document across two: ``UnitShardWriter``.

Where ``ShardWriter`` writes one shard whose token count the caller knows,
``UnitShardWriter`` takes documents as they come (a work unit's, as it is
tokenized) and decides the shards itself:

* a document goes into the current shard if the shard stays within ``bound``
  tokens; otherwise the shard is committed and the document starts the next;
* a document longer than ``bound`` gets a shard of its own (the only shard
  past the bound);
* no shard is empty, and no document spans two shards, so every shard starts
  with a document and its ``.bos.idx`` starts with 0.

Each shard is a ``ShardWriter`` opened without its count (the header is
written at its commit); its ``.bos.idx`` and the format's sidecars are written
when it is closed, after the shard file, each atomically. ``close`` commits the
last shard; leaving the ``with`` block without it (a failure) drops the open
shard, as a ``ShardWriter`` left without ``commit``, and keeps the shards
committed before it; no temporary file is left either way::

    with UnitShardWriter(fmt, lambda i: out / f"unit-3-{i:06d}.bin", dtype, bound) as w:
        w.write(tokens, lengths)        # consecutive documents: their tokens, boundaries included, and lengths
        shards = w.close()              # [UnitShard], in order

Given a ``check`` (``check(path)``: a ``writer.TokenCheck`` for the shard at ``path``), every shard's
tokens are fed to its check as they are written, and its document starts checked against them before
the shard is committed: a shard that fails is dropped, as on any error. Each ``UnitShard`` records its
files' identities as committed (``files``: size, inode, mtime), so that whoever uses them later can
tell they are still those files without reading them.

The build's tokenize jobs write their units' shards with it (``pipeline/tokenize.py``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from . import bosidx
from .base import ShardFormat
from .._io import file_identity
from .writer import ShardWriter, TokenCheck, encode_index, header_bytes, write_index, write_sidecars

__all__ = ["UnitShard", "UnitShardWriter"]


@dataclass(frozen=True, kw_only=True)
class UnitShard:
    """One shard a ``UnitShardWriter`` committed, with its ``.bos.idx`` and sidecars."""

    path: Path
    tokens: int
    documents: int
    bytes: int
    sha256: str
    index_bytes: int
    index_sha256: str
    sidecars: tuple[tuple[str, int, str], ...]
    """``(file name, bytes, sha256)`` of each of the format's files beside the shard (megatron's ``.idx``)."""
    files: tuple[tuple[int, int, int], ...] = ()
    """``(bytes, inode, mtime_ns)`` of the shard, its ``.bos.idx`` and its sidecars, in that order, as written."""


class UnitShardWriter:
    """Documents in, shards of at most ``bound`` tokens out (one oversized document alone excepted)."""

    def __init__(
        self, fmt: ShardFormat, path_for: Callable[[int], Path], dtype: np.dtype, bound: int, *,
        check: Callable[[Path], TokenCheck] | None = None,
    ) -> None:
        """``path_for(i)``: where the ``i``-th shard goes (from 0); ``bound``: the most tokens of a shard of several documents;
        ``check(path)``: the checks of the shard at ``path`` as it is written (none: unchecked)."""
        if isinstance(bound, bool) or not isinstance(bound, int) or bound < 1:
            raise ValueError(f"bound must be a positive number of tokens, not {bound!r}")
        if bound > fmt.max_tokens:
            raise ValueError(f"bound {bound} is more tokens than a {fmt.name} shard holds ({fmt.max_tokens})")
        self.fmt = fmt
        self.path_for = path_for
        self.dtype = np.dtype(dtype)
        self.bound = bound
        self.check = check
        header_bytes(fmt, self.dtype)  # a format whose header cannot be written last is refused now, not at the first cut
        self.shards: list[UnitShard] = []
        self._writer: ShardWriter | None = None
        self._starts: list[np.ndarray] = []  # the open shard's document starts, in its own token numbering
        self._fill = 0  # tokens in the open shard
        self._closed = False

    def __enter__(self) -> "UnitShardWriter":
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if self._writer is not None:  # an error before close: the open shard is dropped with its temporary file
            self._writer.__exit__(exc_type, exc, tb)
            self._writer = None

    def add(self, document: np.ndarray) -> None:
        """Append one document (its tokens, boundary tokens included)."""
        document = np.asarray(document)
        self.write(document, np.array([len(document)], dtype=np.int64))

    def write(self, tokens: np.ndarray, lengths: np.ndarray) -> None:
        """Append consecutive documents: ``tokens`` all of theirs, in order; ``lengths`` each one's count (each >= 1).

        ``tokens`` may change once this returns.
        """
        if self._closed:
            raise ValueError("the writer is closed")
        tokens = np.ascontiguousarray(tokens)
        lengths = np.asarray(lengths, dtype=np.int64)
        if tokens.dtype != self.dtype or tokens.ndim != 1:
            raise ValueError(f"tokens must be a flat array of {self.dtype}, not {tokens.ndim}-D {tokens.dtype}")
        if lengths.ndim != 1 or (len(lengths) and int(lengths.min()) < 1):
            raise ValueError("every document has at least one token (its boundary)")
        ends = np.cumsum(lengths)  # each document's end within ``tokens``
        if (int(ends[-1]) if len(ends) else 0) != len(tokens):
            raise ValueError(f"the lengths add up to {int(ends[-1]) if len(ends) else 0} tokens, not the {len(tokens)} given")
        doc, pos = 0, 0  # the next document and its first token
        while doc < len(lengths):
            room = self.bound - self._fill
            # The documents doc..last-1 fit the open shard: those that end within pos + room.
            last = max(doc, int(np.searchsorted(ends, pos + room, side="right")))
            if last == doc:
                if self._fill:
                    self._cut()  # the next document does not fit: it starts the next shard
                    continue
                last = doc + 1  # longer than the bound: a shard of its own (cut before the next document)
            end = int(ends[last - 1])
            self._append(tokens[pos:end], ends[doc:last] - lengths[doc:last] - pos)
            doc, pos = last, end

    def _append(self, piece: np.ndarray, starts: np.ndarray) -> None:
        """Whole documents into the open shard (opened now if none is); ``starts`` relative to ``piece``."""
        if self._writer is None:
            path = self.path_for(len(self.shards))
            writer = ShardWriter(self.fmt, path, self.dtype, check=None if self.check is None else self.check(path))
            writer.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = writer.__enter__()
        self._starts.append(starts + self._fill)
        self._writer.write(piece)
        self._fill += len(piece)

    def _cut(self) -> None:
        """Check the open shard's tokens against its document starts, commit it, then write its ``.bos.idx`` and sidecars."""
        writer = self._writer
        assert writer is not None and self._fill
        starts = np.concatenate(self._starts)
        if writer.check is not None:
            writer.check.check(starts)  # before the commit: a shard that fails is dropped with its temporary file
        nbytes, digest = writer.commit()
        writer.__exit__(None, None, None)
        self._writer = None
        idx, idx_sha = encode_index(starts, self._fill)
        index_path = bosidx.index_path(writer.path)
        write_index(index_path, idx)
        sidecars = write_sidecars(self.fmt, writer.path, self.dtype, self._fill, starts)
        files = (writer.path, index_path, *(writer.path.parent / name for name, _, _ in sidecars))
        self.shards.append(
            UnitShard(
                path=writer.path,
                tokens=self._fill,
                documents=len(starts),
                bytes=nbytes,
                sha256=digest,
                index_bytes=len(idx),
                index_sha256=idx_sha,
                sidecars=tuple(sidecars),
                files=tuple(file_identity(p) for p in files),
            )
        )
        self._starts = []
        self._fill = 0

    def close(self) -> list[UnitShard]:
        """Commit the last shard; returns every shard written, in order (none if no document came)."""
        if not self._closed:
            if self._writer is not None:
                self._cut()
            self._closed = True
        return list(self.shards)
