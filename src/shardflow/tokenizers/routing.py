"""Characters the fast backend classes differently from the reference, and encoding around them.

gigatoken 0.10 splits text with the Unicode 17 character tables; the
tokenizers library splits it with older ones. A letter first assigned in
Unicode 17 (CJK Extension J, Sidetic, Tai Yo, ... 4,657 code points) is then
``\\p{L}`` to one and unassigned to the other, and the two split ``"𲎰's"``
differently, so the ids differ. No probe list can hold every such character,
so every code point of planes 0-3 and 14 (the assigned ones, and those a
newer Unicode may assign) is compared in a few contexts on both backends
(``probing.Probed``: a block of 128 code points at a time, the first time a
document holds one of its characters), and ``encode_routed`` encodes the
documents that hold a character found to differ with the reference. Each
document's ids are then the reference's, whichever backend ran.

Finding the documents is a vectorized pass over each batch's UTF-8 bytes
(``utf8_code_points``): the largest byte of each KiB first, then only the
characters from the smallest lead byte that matters on (0xE0 for Llama 3's
file: its 3- and 4-byte characters) are decoded, a few milliseconds per 10 MB
of text.

The families' probe checks (does the fast backend agree with the reference
on the probe strings) are kept on disk (:func:`cached_answer`, under
``$SHARDFLOW_CACHE_DIR``, default ``~/.cache/shardflow``), keyed by the
vocabulary and the libraries' versions: a few tenths of a second at every
process's start otherwise. So are the blocks probed (``probing``).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import logging
import os
import string
import struct
import threading
import unicodedata
import weakref
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np
import pyarrow as pa

from .._arrow import large_strings

__all__ = ["Substrings", "Routes", "Routed", "encode_routed", "cached_answer", "cached_ranks", "cache_file", "keep_json",
           "fast_lock", "note_routed", "utf8_code_points", "documents_at"]

log = logging.getLogger("shardflow.tokenizers")
_NOTED: set[tuple[str, str]] = set()
_NOTED_LOCK = threading.Lock()
_FAST_LOCKS: weakref.WeakKeyDictionary[Any, threading.Lock] = weakref.WeakKeyDictionary()
_FAST_LOCKS_LOCK = threading.Lock()

CACHE_ENV = "SHARDFLOW_CACHE_DIR"

ReferenceBatch = Callable[[list[str]], list[list[int]]]


class Routed(Protocol):
    """What ``encode_routed`` routes: ``probing.Probed``, ``Substrings``, or ``Routes`` of them."""

    def hits(self, texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Indices of the documents of ``texts`` (a string array without nulls) to encode with the reference."""


def fast_lock(fast: Any) -> threading.Lock:
    """The one lock of a gigatoken object, held by whoever calls it: every ``Tokenizer`` sharing it, and its probe.

    gigatoken's object is not re-entrant ("Already borrowed" when two threads call it); two
    tokenizers loaded with other backend names (``auto``, ``gigatoken``) share one object."""
    with _FAST_LOCKS_LOCK:
        lock = _FAST_LOCKS.get(fast)
        if lock is None:
            lock = _FAST_LOCKS[fast] = threading.Lock()
        return lock


def cache_file(key: str, kind: str) -> Path:
    """The file under ``$SHARDFLOW_CACHE_DIR`` that keeps ``kind``'s answer for ``key``, gigatoken's and Unicode's versions."""
    try:
        giga = importlib.metadata.version("gigatoken")
    except importlib.metadata.PackageNotFoundError:
        giga = None
    full = json.dumps([key, giga, unicodedata.unidata_version, 1])
    root = Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "shardflow")
    return root / f"{kind}-{hashlib.sha256(full.encode()).hexdigest()[:24]}.json"


def keep_json(path: Path, answer: Any) -> None:
    """Write ``answer`` as JSON to ``path`` atomically; a read-only cache directory only costs the time."""
    _keep(path, json.dumps(answer).encode())


def _keep(path: Path, data: bytes) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{threading.get_ident()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only home: computed again next time


def note_routed(name: str, disputed: Sequence[int], library: str) -> None:
    """Say, at INFO and once per process and tokenizer, what routing around ``disputed`` (the characters found
    so far) means: not a problem, the way each document's ids stay exactly the reference library's."""
    if not disputed:
        return
    with _NOTED_LOCK:
        if (name, library) in _NOTED:
            return
        _NOTED.add((name, library))
    log.info("tokenizer %s: gigatoken encodes the documents, but for exactness %s encodes those holding a character "
             "it classes differently (letters of newer Unicode tables; %s such characters found so far), so every id "
             "is %s's", name, library, f"{len(disputed):,}", library)


def cached_answer(kind: str, key: str, compute: Callable[[], Any]) -> Any:
    """``compute()``'s answer (JSON), kept on disk by ``kind`` and ``key`` with gigatoken's and Unicode's versions.

    The key must name everything else the answer depends on (the vocabulary
    file's SHA-256, the reference library's version). A missing or unreadable
    file is computed again; a read-only cache directory only costs the time.
    """
    path = cache_file(key, kind)
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        pass  # not computed yet, or unreadable: compute it
    answer = compute()
    keep_json(path, answer)
    return answer


Ranks = dict[bytes, int]


def cached_ranks(kind: str, key: str, compute: Callable[[], tuple[Ranks, dict[str, Any]]]) -> tuple[Ranks, dict[str, Any]]:
    """``compute()``'s ranks (token bytes to rank) and facts (JSON), kept on disk like :func:`cached_answer`.

    A rank file's 100,000 ranks took tiktoken 0.07 s to parse (and shardflow's
    checked reader of a ``.tiktoken`` path 0.11 s), at every process's start;
    read back from here, 0.035 s (docs/PERFORMANCE.md). The file holds the
    SHA-256 of the rest; then the facts' length (8 bytes, little-endian) and
    JSON; then each token's length and rank (uint32, little-endian) and the
    tokens' bytes end to end. Nothing is unpickled: a damaged or inconsistent
    copy is computed again, never loaded. The key must name what the ranks
    depend on (the file's SHA-256, the library's version).
    """
    path = cache_file(key, kind).with_suffix(".ranks")
    try:
        kept = _read_ranks(path.read_bytes())
        if kept is not None:
            return kept
    except OSError:
        pass  # not computed yet, or unreadable: compute it
    ranks, facts = compute()
    tokens = list(ranks)
    head = json.dumps({"tokens": len(tokens), "facts": facts}).encode()
    lengths = np.fromiter(map(len, tokens), dtype="<u4", count=len(tokens))
    values = np.fromiter(ranks.values(), dtype="<u4", count=len(tokens))
    body = b"".join([struct.pack("<Q", len(head)), head, lengths.tobytes(), values.tobytes(), *tokens])
    _keep(path, hashlib.sha256(body).digest() + body)
    return ranks, facts


def _read_ranks(data: bytes) -> tuple[Ranks, dict[str, Any]] | None:
    """What :func:`cached_ranks` wrote, or None for bytes that are not exactly that."""
    body = memoryview(data)[32:]
    if len(data) < 40 or hashlib.sha256(body).digest() != data[:32]:
        return None
    (head,) = struct.unpack_from("<Q", body)
    try:
        header = json.loads(bytes(body[8 : 8 + head]))
        n, facts = int(header["tokens"]), header["facts"]
        rest = bytes(body[8 + head :])
        lengths = np.frombuffer(rest, dtype="<u4", count=n)
        values = np.frombuffer(rest, dtype="<u4", count=n, offset=4 * n).tolist()
    except (ValueError, TypeError, KeyError):
        return None
    blob = rest[8 * n :]
    ends = np.cumsum(lengths, dtype=np.int64)
    if not n or int(ends[-1]) != len(blob) or not isinstance(facts, dict):
        return None
    ends_list = ends.tolist()
    starts = [0, *ends_list[:-1]]
    return dict(zip([blob[a:b] for a, b in zip(starts, ends_list)], values)), facts


def utf8_code_points(texts: pa.Array | pa.ChunkedArray, min_lead: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(positions, code points, offsets)`` of the characters of ``texts`` whose UTF-8 lead byte is ``min_lead`` or more.

    ``texts`` is a string array without nulls; a position is the character's first byte in the
    text buffer counted from the first document's, and ``offsets`` (rebased to 0) are the
    documents', for ``documents_at``. Only the bytes from ``min_lead`` on are looked at further.
    """
    if isinstance(texts, pa.ChunkedArray):
        texts = texts.combine_chunks()
    n = len(texts)
    off_dtype = np.int64 if pa.types.is_large_string(texts.type) else np.int32
    bufs = texts.buffers()
    empty = np.empty(0, dtype=np.int64)
    if n == 0 or bufs[2] is None or min_lead > 0xFF:
        return empty, empty, np.zeros(1, dtype=np.int64)
    offsets = np.frombuffer(bufs[1], dtype=off_dtype)[texts.offset : texts.offset + n + 1].astype(np.int64)
    data = np.frombuffer(bufs[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    offsets -= offsets[0]
    pos = _at_least(data, min_lead)
    if not len(pos):
        return empty, empty, offsets
    lead = data[pos]
    starts = (lead >= 0xC0) | (lead < 0x80)  # continuation bytes (0x80-0xBF) start no character
    pos, lead = pos[starts], lead[starts].astype(np.int64)
    # Decode each character from its lead byte and up to three continuation bytes
    # (gathered at those positions only; an index past the end reads the last byte).
    last = len(data) - 1
    b1, b2, b3 = (data[np.minimum(pos + k, last)].astype(np.int64) & 0x3F for k in (1, 2, 3))
    two = np.where(lead >= 0xC0, ((lead & 0x1F) << 6) | b1, lead)  # and ASCII, where min_lead asks for it
    cp = np.where(
        lead >= 0xF0,
        ((lead & 0x07) << 18) | (b1 << 12) | (b2 << 6) | b3,
        np.where(lead >= 0xE0, ((lead & 0x0F) << 12) | (b1 << 6) | b2, two),
    )
    return pos, np.minimum(cp, 0x10FFFF), offsets


SCAN_ROW = 1024
"""Bytes a row of ``_at_least``'s first pass: rows whose largest byte is under the lead byte sought are skipped."""


def _at_least(data: np.ndarray, min_lead: int) -> np.ndarray:
    """The positions of ``data``'s bytes that are ``min_lead`` or more, sorted.

    A comparison and ``flatnonzero`` over every byte cost 35-130 ms per 32 MB here, the largest
    byte of each row of ``SCAN_ROW`` 3-13 ms; a byte of 0xE0 or more (a 3- or 4-byte character)
    is in 0.8% of the rows of the non-repeating source-file corpus, 20% of make_corpus.py's prose
    (docs/PERFORMANCE.md)."""
    n = len(data) // SCAN_ROW * SCAN_ROW
    rows = data[:n].reshape(-1, SCAN_ROW)
    # Many rows to look at (one in 8: prose with typographic quotes): one pass over them all costs less
    # than gathering them. Every 16th row says so first.
    if not n or np.count_nonzero(rows[::16].max(axis=1) >= min_lead) * 8 > len(rows[::16]):
        return np.flatnonzero(data >= min_lead)
    hot = np.flatnonzero(rows.max(axis=1) >= min_lead)
    if len(hot) * 8 > len(rows):
        return np.flatnonzero(data >= min_lead)
    at = np.flatnonzero(rows[hot] >= min_lead)
    return np.concatenate([hot[at // SCAN_ROW] * SCAN_ROW + at % SCAN_ROW, np.flatnonzero(data[n:] >= min_lead) + n])


def documents_at(offsets: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """The indices of the documents (``offsets``, rebased to 0) holding the bytes at ``positions``, each once, sorted."""
    if not len(positions):
        return np.empty(0, dtype=np.int64)
    return np.unique(np.searchsorted(offsets, positions, side="right") - 1)


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

    def __init__(self, parts: Sequence[Routed]) -> None:
        self.parts = tuple(parts)

    def __repr__(self) -> str:
        return f"Routes({', '.join(map(repr, self.parts))})"

    def hits(self, texts: pa.Array | pa.ChunkedArray) -> np.ndarray:
        found = [part.hits(texts) for part in self.parts]
        return np.unique(np.concatenate(found)) if found else np.empty(0, dtype=np.int64)


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
