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
are then the reference's, whichever backend ran.

Finding the characters takes about a second per vocabulary, so the result is
kept in a small file under ``$SHARDFLOW_CACHE_DIR`` (default
``~/.cache/shardflow``), keyed by the vocabulary, the libraries' versions and
Python's Unicode version: each process and worker after the first reads it.
Finding the documents is one vectorized pass over each batch's UTF-8 bytes
(``Disputed.hits``): only the lead bytes of the disputed characters are
looked at, which costs a few milliseconds per 10 MB of text.

The families' probe checks (does the fast backend agree with the reference
on the probe strings) are kept the same way (:func:`cached_answer`): a few
tenths of a second at every process's start otherwise.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import string
import threading
import unicodedata
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from .._arrow import large_strings

__all__ = ["Disputed", "Substrings", "Routes", "find_disputed", "disputed_pattern", "encode_routed", "cached_answer",
           "note_routed"]

log = logging.getLogger("shardflow.tokenizers")
_NOTED: set[tuple[str, str]] = set()
_NOTED_LOCK = threading.Lock()

CACHE_ENV = "SHARDFLOW_CACHE_DIR"

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


def _cache_file(key: str, kind: str = "disputed") -> Path:
    try:
        giga = importlib.metadata.version("gigatoken")
    except importlib.metadata.PackageNotFoundError:
        giga = None
    full = json.dumps([key, giga, unicodedata.unidata_version, 1])
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "shardflow")
    return root / f"{kind}-{hashlib.sha256(full.encode()).hexdigest()[:24]}.json"


def note_routed(name: str, disputed: Sequence[int], library: str) -> None:
    """Say, at INFO and once per process and tokenizer, what routing around ``disputed`` means: not a problem,
    the way each document's ids stay exactly the reference library's."""
    if not disputed:
        return
    with _NOTED_LOCK:
        if (name, library) in _NOTED:
            return
        _NOTED.add((name, library))
    log.info("tokenizer %s: gigatoken encodes the documents, but for exactness %s encodes those holding any of "
             "%s characters it classes differently (letters of newer Unicode tables), so every id is %s's",
             name, library, f"{len(disputed):,}", library)


def cached_answer(kind: str, key: str, compute: Callable[[], Any]) -> Any:
    """``compute()``'s answer (JSON), kept on disk by ``kind`` and ``key`` with gigatoken's and Unicode's versions.

    The key must name everything else the answer depends on (the vocabulary
    file's SHA-256, the reference library's version). A missing or unreadable
    file is computed again; a read-only cache directory only costs the time.
    """
    path = _cache_file(key, kind)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass  # not computed yet, or unreadable: compute it
    answer = compute()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(answer))
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: computed again next time
    return answer


def find_disputed(fast: Any, reference: ReferenceBatch, *, cache_key: str | None = None) -> tuple[int, ...]:
    """The code points on which gigatoken's ``fast`` and the ``reference`` batch encoding disagree.

    Chunks of characters first (about a second for Llama 3's vocabulary, on two cores),
    then each character of a chunk that differs on its own. A chunk that
    differs while none of its characters does alone counts whole.
    ``cache_key`` (the vocabulary file's SHA-256 and the reference library's
    version, say) keeps the answer on disk for the next process.
    """
    if not cache_key:
        return _find_disputed(fast, reference)
    found = cached_answer("disputed", cache_key, lambda: list(_find_disputed(fast, reference)))
    try:
        return tuple(int(c) for c in found)
    except (TypeError, ValueError):  # a damaged file: compute again
        return _find_disputed(fast, reference)


def _find_disputed(fast: Any, reference: ReferenceBatch) -> tuple[int, ...]:
    chars = _candidates()
    chunks = [chars[i : i + _CHUNK] for i in range(0, len(chars), _CHUNK)]
    bad_chunks = _differing(fast, reference, ["".join(_CONTEXT.format(c=c) for c in chunk) for chunk in chunks])
    disputed: set[int] = set()
    for n in bad_chunks:
        chunk = chunks[n]
        alone = {ord(chunk[i]) for i in _differing(fast, reference, [_CONTEXT.format(c=c) for c in chunk])}
        disputed |= alone or {ord(c) for c in chunk}
    return tuple(sorted(disputed))


class Disputed:
    """A set of code points, and which documents of a batch hold one of them (from the UTF-8 bytes)."""

    def __init__(self, code_points: Sequence[int]) -> None:
        self.code_points = tuple(code_points)
        self._table = np.zeros(0x110000, dtype=bool)
        self._table[list(self.code_points)] = True
        # The UTF-8 lead bytes of the disputed characters: only bytes at least the
        # smallest of them are looked at further.
        self._min_lead = min(chr(c).encode("utf-8")[0] for c in self.code_points)

    def __repr__(self) -> str:
        return f"Disputed({len(self.code_points)} code points)"

    def hits(self, texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Indices of the documents of ``texts`` (a string array without nulls) holding a disputed character."""
        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        n = len(texts)
        off_dtype = np.int64 if pa.types.is_large_string(texts.type) else np.int32
        bufs = texts.buffers()
        if n == 0 or bufs[2] is None:
            return np.empty(0, dtype=np.int64)
        offsets = np.frombuffer(bufs[1], dtype=off_dtype)[texts.offset : texts.offset + n + 1].astype(np.int64)
        data = np.frombuffer(bufs[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
        pos = np.flatnonzero(data >= self._min_lead)
        if not len(pos):
            return np.empty(0, dtype=np.int64)
        lead = data[pos]
        starts = lead >= 0xC0  # continuation bytes (0x80-0xBF) start no character
        pos, lead = pos[starts], lead[starts].astype(np.int64)
        # Decode each character from its lead byte and up to three continuation bytes
        # (gathered at those positions only; an index past the end reads the last byte).
        last = len(data) - 1
        b1, b2, b3 = (data[np.minimum(pos + k, last)].astype(np.int64) & 0x3F for k in (1, 2, 3))
        cp = np.where(
            lead >= 0xF0,
            ((lead & 0x07) << 18) | (b1 << 12) | (b2 << 6) | b3,
            np.where(lead >= 0xE0, ((lead & 0x0F) << 12) | (b1 << 6) | b2, ((lead & 0x1F) << 6) | b1),
        )
        found = pos[self._table[np.minimum(cp, 0x10FFFF)]]
        if not len(found):
            return np.empty(0, dtype=np.int64)
        return np.unique(np.searchsorted(offsets - offsets[0], found, side="right") - 1)


class Substrings:
    """Texts the fast backend treats differently wherever they appear, and which documents of a batch hold one.

    A SentencePiece model's control pieces (``<s>``, ``</s>``): gigatoken splits
    them out of the text, while the reference never matches them in text.
    """

    def __init__(self, texts: Sequence[str]) -> None:
        self.texts = tuple(sorted({t for t in texts if t}))
        # One RE2 alternation of the literal texts: a single pass over the batch, where one
        # match_substring per text would pass over it once per text. RE2 takes any ASCII
        # punctuation escaped as a literal, and every other character as itself.
        self._pattern = "|".join("".join("\\" + c if c in string.punctuation else c for c in t) for t in self.texts)

    def __repr__(self) -> str:
        return f"Substrings({len(self.texts)} texts)"

    def hits(self, texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Indices of the documents of ``texts`` (a string array without nulls) holding one of the texts."""
        import pyarrow.compute as pc

        if isinstance(texts, pa.ChunkedArray):
            texts = texts.combine_chunks()
        if not self.texts or not len(texts):
            return np.empty(0, dtype=np.int64)
        found = pc.match_substring_regex(texts, self._pattern).to_numpy(zero_copy_only=False)
        return np.flatnonzero(found.astype(bool))


class Routes:
    """Several rules of what ``encode_routed`` routes; a document any of them hits is routed."""

    def __init__(self, parts: Sequence[Disputed | Substrings]) -> None:
        self.parts = tuple(parts)

    def __repr__(self) -> str:
        return f"Routes({', '.join(map(repr, self.parts))})"

    def hits(self, texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
        found = [part.hits(texts) for part in self.parts]
        return np.unique(np.concatenate(found)) if found else np.empty(0, dtype=np.int64)


Routed = Disputed | Substrings | Routes


def disputed_pattern(code_points: Sequence[int], substrings: Sequence[str] = ()) -> Routed | None:
    """What ``encode_routed`` routes: the code points and the ``substrings`` (None for neither)."""
    parts: list[Disputed | Substrings] = []
    if code_points:
        parts.append(Disputed(code_points))
    if any(substrings):
        parts.append(Substrings(substrings))
    return None if not parts else parts[0] if len(parts) == 1 else Routes(parts)


def encode_routed(
    fast: Any, lock: threading.Lock, texts: pa.Array | Sequence[str], disputed: Routed | None, reference: ReferenceBatch
) -> tuple[np.ndarray, np.ndarray]:
    """gigatoken's flat ``(tokens, offsets)``, with the documents ``disputed`` hits encoded by ``reference``."""
    tokens, offsets = _encode_gigatoken(fast, lock, texts)
    if disputed is None or len(offsets) < 2:
        return tokens, offsets
    array = texts if isinstance(texts, (pa.Array, pa.ChunkedArray)) else large_strings(list(texts))
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    hits = disputed.hits(array)
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


def _encode_gigatoken(fast: Any, lock: threading.Lock, texts: pa.Array | Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Batch-encode with a ``gigatoken.Tokenizer``, whichever family loaded it, as flat arrays.

    ``lock`` must be held per tokenizer object: gigatoken's is not re-entrant
    ("Already borrowed" when two threads call it). Serializing costs little:
    two threads encoding at once through one object ran at 0.97x of one
    thread here (and gigatoken's ``parallel`` batch mode used one core on
    this 2-core machine), so the worker threads share one core's encoding
    either way; processes (``--runner dask``) each have their own.
    """
    arg: Any
    if isinstance(texts, (pa.Array, pa.ChunkedArray)):
        arg = _arrow_to_awkward(texts)
    else:
        arg = list(texts)
    if len(arg) == 0:
        return np.empty(0, dtype=np.uint32), np.zeros(1, dtype=np.int64)
    with lock:
        result = fast.encode_batch(arg)
    layout = result.layout
    offsets = np.asarray(layout.offsets.data, dtype=np.int64)
    tokens = np.asarray(layout.content.data)
    if offsets[0] != 0:
        tokens = tokens[offsets[0] : offsets[-1]]
        offsets = offsets - offsets[0]
    else:
        tokens = tokens[: offsets[-1]]
    return tokens.astype(np.uint32, copy=False), offsets


def _arrow_to_awkward(texts: pa.Array | pa.ChunkedArray) -> Any:
    """Wrap an Arrow string array's buffers as an awkward string array, no copy of the text.

    gigatoken reads the flat UTF-8 buffer and offsets directly, which avoids
    building one Python ``str`` per document.
    """
    import awkward as ak  # installed with gigatoken

    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    if texts.null_count:
        raise ValueError("encode_batch needs an array without nulls; filter them first")
    if pa.types.is_large_string(texts.type):
        off_dtype = np.int64
    elif pa.types.is_string(texts.type):
        off_dtype = np.int32
    else:
        raise TypeError(f"expected a string array, got {texts.type}")
    bufs = texts.buffers()
    n = len(texts)
    offsets = np.frombuffer(bufs[1], dtype=off_dtype)[texts.offset : texts.offset + n + 1].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8) if bufs[2] is not None else np.zeros(0, dtype=np.uint8)
    chars = ak.contents.NumpyArray(data, parameters={"__array__": "char"})
    return ak.Array(ak.contents.ListOffsetArray(ak.index.Index64(offsets), chars, parameters={"__array__": "string"}))
