"""Characters the fast backend classes differently from the reference, and encoding around them.

gigatoken 0.10 splits text with the Unicode 17 character tables; the
tokenizers library splits it with older ones. A letter first assigned in
Unicode 17 (CJK Extension J, Sidetic, Tai Yo, ... 4,657 code points) is then
``\\p{L}`` to one and unassigned to the other, and the two split ``"𲎰's"``
differently, so the ids differ. No probe list can hold every such character,
so once per tokenizer ``find_disputed`` encodes every code point of planes
0-3 and 14 (the assigned ones, and those a newer Unicode may assign) in a few
contexts on both backends, and ``encode_routed`` encodes the documents that
hold one of the characters it found with the reference. Each document's ids
are then the reference's, whichever backend ran, at the cost of one regular
expression scan (RE2, in Arrow) per batch.
"""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .base import _encode_gigatoken

__all__ = ["find_disputed", "disputed_pattern", "encode_routed"]

# Each character after a letter and before an apostrophe (a contraction), after a digit
# and before a space: the neighbours whose classes the split patterns ask about.
_CONTEXT = "a{c}'s 1{c} "
_CHUNK = 128

ReferenceBatch = Callable[[list[str]], list[list[int]]]


@functools.lru_cache(maxsize=1)
def _candidates() -> tuple[str, ...]:
    """Planes 0-3 and 14, less surrogates and private use: where any Unicode version assigns characters."""
    ranges = ((0, 0xD800), (0xF900, 0x40000), (0xE0000, 0xE1000))
    return tuple(chr(c) for lo, hi in ranges for c in range(lo, hi))


def _differing(fast: Any, reference: ReferenceBatch, texts: list[str]) -> list[int]:
    if not texts:
        return []
    got, expected = fast.encode_batch_list(texts), reference(texts)
    return [i for i, (a, b) in enumerate(zip(got, expected)) if list(a) != list(b)]


def find_disputed(fast: Any, reference: ReferenceBatch) -> tuple[int, ...]:
    """The code points on which gigatoken's ``fast`` and the ``reference`` batch encoding disagree.

    Chunks of characters first (about a second for Llama 3's vocabulary, on two cores),
    then each character of a chunk that differs on its own. A chunk that
    differs while none of its characters does alone counts whole.
    """
    chars = _candidates()
    chunks = [chars[i : i + _CHUNK] for i in range(0, len(chars), _CHUNK)]
    bad_chunks = _differing(fast, reference, ["".join(_CONTEXT.format(c=c) for c in chunk) for chunk in chunks])
    disputed: set[int] = set()
    for n in bad_chunks:
        chunk = chunks[n]
        alone = {ord(chunk[i]) for i in _differing(fast, reference, [_CONTEXT.format(c=c) for c in chunk])}
        disputed |= alone or {ord(c) for c in chunk}
    return tuple(sorted(disputed))


def disputed_pattern(code_points: Sequence[int]) -> str | None:
    """An RE2 character class matching ``code_points`` (ranges merged), or None for none."""
    if not code_points:
        return None
    parts: list[str] = []
    start = prev = code_points[0]
    for c in [*code_points[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(f"\\x{{{start:X}}}" if start == prev else f"\\x{{{start:X}}}-\\x{{{prev:X}}}")
        if c is not None:
            start = prev = c
    return "[" + "".join(parts) + "]"


def encode_routed(
    fast: Any, lock: threading.Lock, texts: pa.Array | Sequence[str], pattern: str | None, reference: ReferenceBatch
) -> tuple[np.ndarray, np.ndarray]:
    """gigatoken's flat ``(tokens, offsets)``, with the documents matching ``pattern`` encoded by ``reference``."""
    tokens, offsets = _encode_gigatoken(fast, lock, texts)
    if pattern is None or len(offsets) < 2:
        return tokens, offsets
    array = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else pa.array(list(texts), type=pa.large_string())
    hits = np.flatnonzero(pc.match_substring_regex(array, pattern).to_numpy(zero_copy_only=False))
    if not len(hits):
        return tokens, offsets
    redo = reference([array[int(i)].as_py() for i in hits])
    lengths = np.diff(offsets)
    lengths[hits] = [len(ids) for ids in redo]
    new_offsets = np.zeros_like(offsets)
    np.cumsum(lengths, out=new_offsets[1:])
    out = np.empty(int(new_offsets[-1]), dtype=np.uint32)
    prev = 0
    for i, ids in zip(hits.tolist(), redo):
        # The documents between two routed ones are copied in one block.
        out[new_offsets[prev] : new_offsets[i]] = tokens[offsets[prev] : offsets[i]]
        out[new_offsets[i] : new_offsets[i + 1]] = ids
        prev = i + 1
    out[new_offsets[prev] :] = tokens[offsets[prev] :]
    return out, new_offsets
