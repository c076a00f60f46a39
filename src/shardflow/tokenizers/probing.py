"""Which characters gigatoken classes unlike the reference: probed a block of 128 code points at a time, when met.

The candidates are every code point of planes 0-3 and 14 less surrogates and
private use (where any Unicode version assigns characters): 2,014 blocks of
128, each block one text of its characters in contexts (``_CONTEXT``: after a
letter and before an apostrophe, after a digit and before a space), encoded
on both backends. A block whose texts differ has each of its characters
compared alone, and those that differ are *disputed*; a block that differs
while none of its characters does alone is disputed whole. ``routing``'s
``encode_routed`` encodes the documents holding a disputed character with the
reference.

Probing every block costs 1.3-4.2 s for Llama 3's tokenizer.json on 2 cores,
quiet to loaded (the reference library encodes 3.5 MB of unusual text;
docs/PERFORMANCE.md), which the first load on each machine paid: so
``Probed`` probes a block the first time a batch holds one of its characters
(the blocks below U+0800 when it is made). A block's answer depends on its
own characters only, so the disputed characters of the blocks met are exactly
those a probe of every block finds; a process pays for the blocks its
documents bring (0.7-2 ms each: English text brings a few, Chinese text some
hundreds). The blocks probed, and what they found, are kept
under ``$SHARDFLOW_CACHE_DIR`` (``routing.cache_file``), keyed by the
vocabulary file's SHA-256, the reference library's, gigatoken's and Python's
Unicode versions: another key is another file, so a result of another
tokenizer or library is never read.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Iterable, Sequence

import numpy as np
import pyarrow as pa

from .routing import ReferenceBatch, cache_file, documents_at, fast_lock, keep_json, note_routed, utf8_code_points

__all__ = ["Probed", "BLOCK_BITS", "CANDIDATE_BLOCKS", "EAGER_BLOCKS", "probe_blocks"]

BLOCK_BITS = 7
"""A block is the 128 code points ``b << 7`` to ``(b + 1) << 7``."""
CANDIDATE_BLOCKS = ((0, 0xD800 >> BLOCK_BITS), (0xF900 >> BLOCK_BITS, 0x40000 >> BLOCK_BITS), (0xE0000 >> BLOCK_BITS, 0xE1000 >> BLOCK_BITS))
"""Half-open ranges of blocks: planes 0-3 and 14 less surrogates and private use (2,014 blocks)."""
EAGER_BLOCKS = 0x800 >> BLOCK_BITS
"""Blocks probed when a ``Probed`` is made: U+0000-07FF, the 1- and 2-byte UTF-8 characters (16 blocks, 10-30
ms), so that a batch's scan looks at 3- and 4-byte characters only."""
_N_BLOCKS = 0x110000 >> BLOCK_BITS

# Each character after a letter and before an apostrophe (a contraction), after a digit
# and before a space: the neighbours whose classes the split patterns ask about.
_CONTEXT = "a{c}'s 1{c} "


def _chars(block: int) -> list[str]:
    return [chr(cp) for cp in range(block << BLOCK_BITS, (block + 1) << BLOCK_BITS)]


def _differing(encode_fast: ReferenceBatch, reference: ReferenceBatch, texts: list[str]) -> list[int]:
    if not texts:
        return []
    got, expected = encode_fast(texts), reference(texts)
    return [i for i, (a, b) in enumerate(zip(got, expected)) if list(a) != list(b)]


def probe_blocks(encode_fast: ReferenceBatch, reference: ReferenceBatch, blocks: Sequence[int]) -> list[int]:
    """The disputed code points of ``blocks`` (candidate blocks), by two batch calls of each backend at most."""
    blocks = list(blocks)
    differ = [blocks[i] for i in _differing(encode_fast, reference, ["".join(_CONTEXT.format(c=c) for c in _chars(b)) for b in blocks])]
    alone = [c for b in differ for c in _chars(b)]
    found = {ord(alone[i]) for i in _differing(encode_fast, reference, [_CONTEXT.format(c=c) for c in alone])}
    disputed: list[int] = []
    for b in differ:
        mine = [cp for cp in range(b << BLOCK_BITS, (b + 1) << BLOCK_BITS) if cp in found]
        disputed += mine or list(range(b << BLOCK_BITS, (b + 1) << BLOCK_BITS))  # none alone: the block whole
    return sorted(disputed)


class Probed:
    """The characters gigatoken's ``fast`` classes unlike ``reference``, found as batches bring them; a ``routing.Routed``.

    ``hits(texts)`` first probes the blocks of ``texts``' characters not probed yet (one at a time,
    under a lock; gigatoken's calls under ``fast_lock(fast)``), then says which documents hold a
    disputed character. ``key`` names the vocabulary and the reference library's version for the
    cache on disk (None: no cache); ``name`` and ``library`` are for ``note_routed``.
    """

    def __init__(self, fast: Any, reference: ReferenceBatch, *, key: str | None, name: str, library: str) -> None:
        self._fast, self._reference = fast, reference
        self._name, self._library = name, library
        self._path = cache_file(key, "blocks") if key else None
        self._lock = threading.Lock()
        self._pending = np.zeros(_N_BLOCKS, dtype=bool)
        for lo, hi in CANDIDATE_BLOCKS:
            self._pending[lo:hi] = True
        self._table = np.zeros(0x110000, dtype=bool)
        self._min_lead = 0
        self.probed = 0
        """Blocks this object probed itself (not read from the cache)."""
        known = self._read_cache()
        if known is not None:
            self._learn(*known)
        self._probe(range(EAGER_BLOCKS))

    @property
    def code_points(self) -> tuple[int, ...]:
        """The disputed code points found so far."""
        return tuple(int(c) for c in np.flatnonzero(self._table))

    @property
    def pending(self) -> int:
        """How many candidate blocks are not probed yet."""
        return int(self._pending.sum())

    def __repr__(self) -> str:
        return f"Probed({len(self.code_points)} code points, {self.pending} blocks not probed)"

    def hits(self, texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Indices of the documents of ``texts`` (a string array without nulls) holding a disputed character."""
        # Probing only removes pending blocks, and finds disputed characters in them only: the
        # characters from this lead byte on are all that can be disputed, before and after.
        pos, cp, offsets = utf8_code_points(texts, self._min_lead)
        blocks = cp >> BLOCK_BITS
        new = self._pending[blocks]
        if new.any():
            self._probe(np.unique(blocks[new]).tolist())
        return documents_at(offsets, pos[self._table[cp]])

    def _probe(self, blocks: Iterable[int]) -> None:
        with self._lock:
            todo = [b for b in blocks if self._pending[b]]  # another thread may have probed them meanwhile
            if not todo:
                return
            lock = fast_lock(self._fast)

            def encode_fast(texts: list[str]) -> list[list[int]]:
                with lock:
                    return self._fast.encode_batch_list(texts)

            disputed = probe_blocks(encode_fast, self._reference, todo)
            self.probed += len(todo)
            self._learn(todo, disputed)
            if self._path is not None:
                known = self._read_cache()  # what other processes probed meanwhile, learnt and kept too
                if known is not None:
                    self._learn(*known)
                self._write_cache(known)

    def _learn(self, blocks: Sequence[int], disputed: Sequence[int]) -> None:
        # The table first: a thread that sees a block probed must find its characters in the table.
        self._table[list(disputed)] = True
        self._pending[list(blocks)] = False
        self._min_lead = self._first_lead()
        note_routed(self._name, self.code_points, self._library)

    def _first_lead(self) -> int:
        """The smallest UTF-8 lead byte of a character in a block not probed or disputed (256: none)."""
        first = [int(np.argmax(a)) << s for a, s in ((self._pending, BLOCK_BITS), (self._table, 0)) if a.any()]
        return chr(min(first)).encode("utf-8")[0] if first else 256

    def _read_cache(self) -> tuple[list[int], list[int]] | None:
        """The blocks probed and the code points disputed that the cache file holds, checked; None if none or unreadable."""
        if self._path is None:
            return None
        try:
            found = json.loads(self._path.read_text())
            blocks = [int(b) for b in found["blocks"]]
            disputed = [int(c) for c in found["disputed"]]
        except (OSError, ValueError, TypeError, KeyError):
            return None
        candidate = np.zeros(_N_BLOCKS, dtype=bool)
        for lo, hi in CANDIDATE_BLOCKS:
            candidate[lo:hi] = True
        if any(not 0 <= b < _N_BLOCKS or not candidate[b] for b in blocks) or {c >> BLOCK_BITS for c in disputed} - set(blocks):
            return None  # not a file this code wrote: probed again
        return blocks, disputed

    def _write_cache(self, known: tuple[list[int], list[int]] | None) -> None:
        """Write what this object knows, and what the file knew (another process's blocks), to the cache file."""
        assert self._path is not None
        probed = np.zeros(_N_BLOCKS, dtype=bool)
        for lo, hi in CANDIDATE_BLOCKS:
            probed[lo:hi] = ~self._pending[lo:hi]
        disputed = set(np.flatnonzero(self._table).tolist())
        if known is not None:
            probed[known[0]] = True
            disputed.update(known[1])
        keep_json(self._path, {"blocks": np.flatnonzero(probed).tolist(), "disputed": sorted(disputed)})
