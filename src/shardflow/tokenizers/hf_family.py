"""The Hugging Face family: a ``tokenizer.json``, or a directory holding one, with gigatoken as the fast backend.

``load_tokenizer("path/to/tokenizer.json")`` (or the directory) returns an
``HFTokenizer`` whose ``encode_batch`` is, token for token, the reference:

* The reference is the ``tokenizers`` library (backend ``hf``):
  ``Tokenizer.from_file`` with ``encode_special_tokens = True`` and
  ``encode(text, add_special_tokens=False)``, the file's truncation and
  padding switched off. A document's ``<|begin_of_text|>`` or ``<s>`` is the
  ordinary text it spells, never the special id: only shardflow inserts
  boundary tokens. (Added tokens the file does not mark special are still
  split out of the text, as the library does.)
* The fast backend is gigatoken, which loads the byte-level BPE and
  SentencePiece-style (byte fallback) BPE files. It always splits added tokens
  out of the text, so it loads a copy of the file without the special ones.
  It must agree with the reference on the probe strings (``PROBE_STRINGS``,
  ``COMMON_SPECIAL_TEXTS`` and every added token's text, alone and inside
  words) before it is used. ``--backend auto`` falls back to the reference,
  and logs why, when gigatoken cannot load the file or disagrees;
  ``--backend gigatoken`` is then refused, naming ``--backend hf``. A
  document holding a character that gigatoken's newer Unicode tables class
  differently (a Unicode 17 letter) is encoded by the reference (``routing``).

The boundary defaults: ``default_bos`` / ``default_eos`` are read from
``tokenizer_config.json`` beside the file (``bos_token`` / ``eos_token``, a
string or an AddedToken mapping with ``content``), else from
``special_tokens_map.json``, else from the file's post-processor (in a
TemplateProcessing ``single`` template, a special token before ``$A`` is the
BOS and one after it the EOS; Roberta/Bert processing: ``cls`` / ``sep``).

A version carries a byte copy of the tokenizer.json (decoding needs only it);
the build key covers its SHA-256 and the defaults the side files gave.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa

from .._arrow import byte_lengths
from .._bytelevel import bytes_to_unicode
from ..errors import ConfigError
from ..overlap import ahead
from .base import Tokenizer, TokenizerFamily, TokenizerSpec, checked_fast, dist_version, file_stamp, name_of_file
from .panics import is_library_panic, library_panic_error, one_line, panic_notice_held

__all__ = ["HF", "HFFamily", "HFTokenizer", "TOKENIZER_JSON"]

log = logging.getLogger("shardflow.tokenizers")

TOKENIZER_JSON = "tokenizer.json"
# Read for the BOS/EOS defaults, in this order; neither travels with a version.
_SIDE_FILES = ("tokenizer_config.json", "special_tokens_map.json")

Token = tuple[str, int]


@dataclass(frozen=True)
class _Source:
    """One tokenizer.json as loaded once: the reference tokenizer and the facts read from the files."""

    path: Path
    config: dict[str, Any]
    ref: Any  # tokenizers.Tokenizer, the reference
    spec: TokenizerSpec
    bos: Token | None
    eos: Token | None
    added: dict[str, int]  # every added token's content -> id, special or not
    special_ids: frozenset[int]
    max_id: int


class HFTokenizer(Tokenizer):
    """One tokenizer.json with one backend; ``encode_batch`` is ``encode_ordinary`` exactly."""

    reference_backend = "hf"
    libraries = ("tokenizers",)
    _source: _Source

    # -- boundary tokens ------------------------------------------------------------
    @property
    def default_bos(self) -> Token | None:
        return self._source.bos

    @property
    def default_eos(self) -> Token | None:
        return self._source.eos

    def _boundary_where(self) -> str:
        return f"none in {', '.join(_SIDE_FILES)} or the post-processor of {self._source.path}"

    def token_id(self, text: str) -> int | None:
        """An added or vocabulary token's id by its spelling (``<|begin_of_text|>``, ``Ġthe``), or the id of a one-token text."""
        found = self._source.ref.token_to_id(text)
        if found is not None:
            return int(found)
        ids = self.encode_ordinary(text)
        return ids[0] if len(ids) == 1 and self.decode(ids) == text else None

    def token_text(self, token_id: int) -> str | None:
        token_id = int(token_id)
        if not 0 <= token_id <= self._source.max_id or self._source.ref.id_to_token(token_id) is None:
            return None
        return self.decode([token_id])

    def key_facts(self) -> list[Any]:
        # The side files choose the boundary defaults, and only the tokenizer.json's SHA-256 is in the spec.
        return [*super().key_facts(), self.spec.family, self._source.bos, self._source.eos]

    @property
    def max_token_value(self) -> int:
        """The largest id the file defines, added tokens included (Llama 3: 128255)."""
        return self._source.max_id

    @property
    def special_ids(self) -> frozenset[int]:
        """The ids of the added tokens the file marks special: no text ever encodes to one."""
        return self._source.special_ids

    # -- encoding -------------------------------------------------------------------
    def encode_ordinary(self, text: str) -> list[int]:
        """The reference: ``encode(text, add_special_tokens=False)`` with special-token text as ordinary text."""
        return list(self._source.ref.encode(text, add_special_tokens=False).ids)

    def reference_batch(self, texts: list[str]) -> list[list[int]]:
        return _reference_lists(self._source.ref, texts)

    def encode_batch(self, texts: pa.Array | Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens uint32, offsets int64)`` as ``Tokenizer.encode_batch``; on the reference, sub-batch by sub-batch.

        The reference backend encodes ``SUB_BATCH_BYTES`` of text per library call and keeps
        only each sub-batch's ids, as one array, so that a batch never holds its ``Encoding``
        objects all at once (``_reference_arrays``).
        """
        if self._fast is not None:
            return super().encode_batch(texts)
        return _reference_arrays(self._source.ref, texts)

    def decode(self, tokens: Sequence[int] | np.ndarray) -> str:
        """The tokenizers library's ``decode``, special tokens kept (invalid UTF-8 is replaced)."""
        return self._source.ref.decode(np.asarray(tokens, dtype=np.int64).tolist(), skip_special_tokens=False)

    def decode_bytes(self, tokens: Sequence[int] | np.ndarray) -> bytes:
        """The bytes the ids stand for: exact for byte-level files; otherwise the UTF-8 of ``decode``."""
        table = self._byte_table
        ids = np.asarray(tokens, dtype=np.int64).tolist()
        if table is None:
            return self.decode(ids).encode("utf-8")
        try:
            return b"".join(table[i] for i in ids)
        except KeyError:
            raise KeyError(f"token id {next(i for i in ids if i not in table)} is not in tokenizer {self.name!r}") from None

    @functools.cached_property
    def _byte_table(self) -> dict[int, bytes] | None:
        """id -> bytes for a byte-level file (its ``decoder`` is ByteLevel), else None."""
        if not _has_type(self._source.config.get("decoder"), "ByteLevel"):
            return None
        inverse = {ch: b for b, ch in bytes_to_unicode().items()}
        table: dict[int, bytes] = {}
        for token, tid in self._source.ref.get_vocab(with_added_tokens=False).items():
            try:
                table[int(tid)] = bytes(inverse[ch] for ch in token)
            except KeyError:
                return None  # a vocabulary not spelled in the byte-level alphabet
        for content, tid in self._source.added.items():
            table[tid] = content.encode("utf-8")
        return table


class HFFamily(TokenizerFamily):
    """Paths to a Hugging Face ``tokenizer.json`` (any ``*.json``), or to a directory holding one."""

    name = reference_backend = "hf"
    serves = "tokenizer.json"
    path_hint = "a path to a Hugging Face tokenizer.json (or a directory holding one)"

    def matches(self, name_or_path: str) -> bool:
        # Any directory: one without a tokenizer.json is told so, not called an unknown name.
        return name_or_path.endswith(".json") or Path(name_or_path).expanduser().is_dir()

    def stamp(self, name_or_path: str) -> tuple[Any, ...]:
        path = Path(name_or_path).expanduser()
        json_path = path / TOKENIZER_JSON if path.is_dir() else path
        return file_stamp([json_path, *(json_path.parent / side for side in _SIDE_FILES)])

    def load(self, name_or_path: str, backend: str) -> Tokenizer:
        stamp = self.stamp(name_or_path)
        source = _load_source(name_or_path, stamp)
        make = functools.partial(HFTokenizer, spec=source.spec, source=source)
        return self.pick_backend(name_or_path, backend, make, lambda: _fast_backend(name_or_path, stamp), "the tokenizers library")


@functools.lru_cache(maxsize=4)
def _fast_backend(name: str, stamp: tuple[Any, ...]) -> tuple[Any | None, str, Any | None]:
    """gigatoken for a tokenizer.json, checked: ``(fast, "", routed pattern)``, or ``(None, why not, None)``."""
    source = _load_source(name, stamp)
    try:
        fast = _gigatoken_ordinary(source.config)
    except ImportError:
        return None, "gigatoken is not installed (pip install gigatoken)", None
    except Exception as exc:  # a model type or option gigatoken does not implement
        return None, f"gigatoken cannot load it ({one_line(exc)})", None
    ref = source.ref
    key = f"hf {source.spec.rank_file_sha256} tokenizers {dist_version('tokenizers')}"
    return checked_fast(name, fast, lambda t: list(ref.encode(t, add_special_tokens=False).ids),
                        functools.partial(_reference_lists, ref), own=sorted(source.added), key=key, library="the tokenizers library")


SUB_BATCH_BYTES = 1 << 20
"""Text per call of the tokenizers library on the reference path (UTF-8 bytes of an Arrow array, characters of a list).

The library returns one ``Encoding`` per document, about 70 bytes a token (ids, type ids, token
strings, offsets, masks) where shardflow keeps 4. Calls of 1 MiB hold about 20 MB of them and cost
no time (docs/PERFORMANCE.md). A document larger than this is one call of its own."""


def _sub_batches(texts: pa.Array | pa.ChunkedArray | Sequence[str]) -> Iterator[list[str]]:
    """``texts`` as consecutive lists of ``str`` of about ``SUB_BATCH_BYTES`` each (at least one document)."""
    arrow = isinstance(texts, (pa.Array, pa.ChunkedArray))
    if arrow:
        # The lengths come from the offsets; only one sub-batch at a time becomes Python strings.
        sizes = byte_lengths(texts)
    else:
        texts = list(texts)
        sizes = np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts))
    ends = np.cumsum(sizes)
    start = 0
    while start < len(sizes):
        reached = int(ends[start - 1]) if start else 0
        stop = max(start + 1, int(np.searchsorted(ends, reached + SUB_BATCH_BYTES, side="right")))
        yield texts.slice(start, stop - start).to_pylist() if arrow else texts[start:stop]  # type: ignore[union-attr]
        start = stop


def _encodings(ref: Any, texts: list[str]) -> list[Any]:
    # encode_batch_fast skips the offsets, which nothing here reads; same ids.
    encode = getattr(ref, "encode_batch_fast", ref.encode_batch)
    return encode(texts, add_special_tokens=False)


def _reference_lists(ref: Any, texts: list[str]) -> list[list[int]]:
    """The reference ids of each text, as lists, the ``Encoding`` objects of one sub-batch alive at a time."""
    out: list[list[int]] = []
    for chunk in _sub_batches(texts):
        out += [e.ids for e in _encodings(ref, chunk)]  # its own scope: no Encoding outlives the call's list
    return out


def _reference_arrays(ref: Any, texts: pa.Array | pa.ChunkedArray | Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """The reference ids of ``texts`` as flat ``(tokens uint32, offsets int64)``, built sub-batch by sub-batch.

    Each sub-batch's ``Encoding`` objects become one uint32 array and are dropped. The library encodes the
    next sub-batch (the GIL released) while this one's ids are copied out (``overlap.ahead``): at most three
    sub-batches' ``Encoding`` objects are alive."""
    parts: list[np.ndarray] = []
    lengths: list[np.ndarray] = []
    for encodings in ahead(_encodings(ref, chunk) for chunk in _sub_batches(texts)):
        ids = [np.array(e.ids, dtype=np.uint32) for e in encodings]
        del encodings  # a document's list of Python ints lives only while it is copied
        lengths.append(np.fromiter((len(a) for a in ids), dtype=np.int64, count=len(ids)))
        parts.append(np.concatenate(ids))
        del ids  # else alive through the next sub-batch
    offsets = np.zeros(sum(len(n) for n in lengths) + 1, dtype=np.int64)
    if lengths:
        np.cumsum(np.concatenate(lengths), out=offsets[1:])
    tokens = np.concatenate(parts) if parts else np.empty(0, dtype=np.uint32)
    return tokens, offsets


HF = HFFamily()


def _gigatoken_ordinary(config: dict[str, Any]) -> Any:
    """A ``gigatoken.Tokenizer`` for a parsed tokenizer.json that encodes special-token text as ordinary text.

    gigatoken always splits the file's added tokens out of the text and has no
    switch for it, so the special ones are removed from the copy it loads. The
    non-special added tokens stay: the reference (the tokenizers library with
    ``encode_special_tokens = True``) still splits those out too.
    """
    import gigatoken

    ordinary = dict(config)
    ordinary["added_tokens"] = [t for t in config.get("added_tokens") or [] if not t.get("special")]
    return gigatoken.Tokenizer.from_json(json.dumps(ordinary, ensure_ascii=False))


def _tokenizer_json(name: str) -> Path:
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / TOKENIZER_JSON).is_file():
            raise ConfigError(f"tokenizer directory {str(path)!r} holds no {TOKENIZER_JSON}; pass a directory that holds one, or the file")
        return path / TOKENIZER_JSON
    if not path.is_file():
        raise ConfigError(f"tokenizer file {str(path)!r} does not exist; pass an existing tokenizer.json or a directory holding one")
    return path


@functools.lru_cache(maxsize=4)
def _load_source(name: str, stamp: tuple[Any, ...]) -> _Source:
    """Read and check a tokenizer.json once per ``stamp``: the reference tokenizer, its added tokens and defaults."""
    try:
        import tokenizers
    except ImportError:
        raise ConfigError("a tokenizer.json needs the tokenizers library: pip install 'tokenizers>=0.22'") from None
    path = _tokenizer_json(name)
    data = path.read_bytes()
    problem: str | None = None
    config: Any = None
    ref: Any = None
    try:
        config = json.loads(data)
    except ValueError as exc:  # a truncated copy, most often
        problem = f"not JSON, or cut short: {one_line(exc)}"
    else:
        if not isinstance(config, dict) or not isinstance(config.get("model"), dict):
            problem = "it has no 'model' section"
        else:
            try:
                with panic_notice_held():
                    ref = tokenizers.Tokenizer.from_str(data.decode("utf-8"))
            except Exception as exc:  # an unknown model type, a hand-edited field: the library says which
                problem = one_line(exc)
            except BaseException as exc:  # a panic (not an Exception) reading it
                if not is_library_panic(exc):
                    raise
                problem = f"the tokenizers library panicked reading it: {one_line(exc)}"
    if problem is not None:
        raise ConfigError(
            f"tokenizer file {str(path)!r} is not a valid tokenizer.json ({problem}); "
            "pass a file saved by the Hugging Face tokenizers library"
        )
    # The reference is the whole-document encoding: a file may carry truncation or padding for a model's inputs.
    ref.no_truncation()
    ref.no_padding()
    ref.encode_special_tokens = True
    _refuse_backtracking(ref, path)
    added = {str(t["content"]): int(t["id"]) for t in config.get("added_tokens") or []}
    special_ids = frozenset(int(t["id"]) for t in config.get("added_tokens") or [] if t.get("special"))
    vocab = ref.get_vocab(with_added_tokens=True)
    max_id = max([*vocab.values(), *added.values()], default=-1)
    if max_id < 0:
        raise ConfigError(f"tokenizer file {str(path)!r} defines no tokens")
    bos, eos = _defaults(path, config, ref)
    spec = TokenizerSpec(
        name=name_of_file(path) if not Path(name).expanduser().is_dir() else Path(name).expanduser().resolve().name,
        rank_file=str(path.resolve()),
        rank_file_sha256=_sha256_bytes(data),
        pretokenizer=None,
        local_file=True,
        family="hf",
    )
    return _Source(path=path, config=config, ref=ref, spec=spec, bos=bos, eos=eos, added=added, special_ids=special_ids, max_id=max_id)


RUN_PROBE = 1024
"""Characters in each run that ``_refuse_backtracking`` encodes (Llama 3's file: about 5 ms for all of them)."""
_RUN_CHARS = ("a", "Z", "0", " ", "\n", "\t", ".", "_", "'", "\u00e9", "\u4e2d", "\U0001f642")


def _refuse_backtracking(ref: Any, path: Path) -> None:
    """Refuse a file whose pre-tokenizer's regular expression backtracks catastrophically, now, in one line.

    Such a pattern (a Split's ``(a+)+$``) makes the regex engine give up on a long enough run of one
    character, and the tokenizers library then panics: mid-build, with its backtrace, had the run come
    in a document. Runs of ``RUN_PROBE`` of each of a few characters, then one other, are encoded here
    with that notice held back (``panic_notice_held``). A pattern that gives up only on longer or
    other text still stops the build in one line, naming the file, where it is encoded (``Tokenizer``).
    """
    probes = [c * RUN_PROBE + end for c in _RUN_CHARS for end in ("!", "\x00")]
    try:
        with panic_notice_held():
            _reference_lists(ref, probes)
        return
    except Exception:  # not a panic: an encoding error of the library's is the documents' to meet
        return
    except BaseException as exc:
        if not is_library_panic(exc):
            raise
        first = exc
    for probe in probes:  # which run: one at a time
        try:
            with panic_notice_held():
                ref.encode(probe, add_special_tokens=False)
        except Exception:
            continue
        except BaseException as exc:
            if not is_library_panic(exc):
                raise
            raise library_panic_error(str(path), f"encoding a run of {RUN_PROBE} {probe[0]!r} then {probe[-1]!r}", exc) from None
    raise library_panic_error(str(path), "encoding runs of one character", first) from None


def _sha256_bytes(data: bytes) -> str:
    # Hashed from the bytes that were parsed, so the recorded SHA-256 is of the file loaded.
    return hashlib.sha256(data).hexdigest()


# -- boundary defaults ------------------------------------------------------------


def _defaults(path: Path, config: dict[str, Any], ref: Any) -> tuple[Token | None, Token | None]:
    """(BOS, EOS) from tokenizer_config.json, else special_tokens_map.json, else the post-processor; per role."""
    found: dict[str, Token | None] = {"bos": None, "eos": None}
    for side in _SIDE_FILES:
        side_path = path.parent / side
        if not side_path.is_file():
            continue
        try:
            side_config = json.loads(side_path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{side_path}: not valid JSON ({one_line(exc)}); fix it or remove it") from None
        if not isinstance(side_config, dict):
            continue
        for role in ("bos", "eos"):
            if found[role] is None:
                found[role] = _named_token(ref, side_config.get(f"{role}_token"), f"{side_path} {role}_token")
    template_bos, template_eos = _template_defaults(config.get("post_processor"))
    return found["bos"] or template_bos, found["eos"] or template_eos


def _named_token(ref: Any, value: Any, where: str) -> Token | None:
    """A side file's ``bos_token``/``eos_token`` (a string or an AddedToken mapping) as ``(text, id)``."""
    text = value.get("content") if isinstance(value, dict) else value
    if not isinstance(text, str) or not text:
        return None
    token_id = ref.token_to_id(text)
    if token_id is None:
        log.warning("%s names %r, which is not a token of the tokenizer; ignored", where, text)
        return None
    return text, int(token_id)


def _template_defaults(post: Any) -> tuple[Token | None, Token | None]:
    """(BOS, EOS) of a post-processor: the special tokens around ``$A`` in its single-sequence template."""
    if not isinstance(post, dict):
        return None, None
    kind = post.get("type")
    if kind == "Sequence":
        for inner in post.get("processors") or []:
            found = _template_defaults(inner)
            if found != (None, None):
                return found
        return None, None
    if kind in ("RobertaProcessing", "BertProcessing"):
        return _pair(post.get("cls")), _pair(post.get("sep"))
    if kind != "TemplateProcessing":
        return None, None
    specials = post.get("special_tokens") or {}
    before: Token | None = None
    after: Token | None = None
    seen_sequence = False
    for piece in post.get("single") or []:
        if not isinstance(piece, dict):
            continue
        if "Sequence" in piece:
            seen_sequence = True
        elif "SpecialToken" in piece:
            name = piece["SpecialToken"].get("id")
            entry = specials.get(name) or {}
            ids, tokens = entry.get("ids") or [], entry.get("tokens") or []
            if len(ids) != 1:
                continue  # a multi-token "special" is no single boundary token
            token = (str(tokens[0]) if tokens else str(name), int(ids[0]))
            if not seen_sequence and before is None:
                before = token
            elif seen_sequence and after is None:
                after = token
    return before, after


def _pair(value: Any) -> Token | None:
    """A Roberta/Bert processing ``[text, id]`` as ``(text, id)``."""
    if isinstance(value, list) and len(value) == 2:
        return str(value[0]), int(value[1])
    return None


# -- byte-level decoding ----------------------------------------------------------


def _has_type(component: Any, kind: str) -> bool:
    """Whether a tokenizer.json component (decoder, ...) is of ``kind`` or a Sequence containing one."""
    if not isinstance(component, dict):
        return False
    if component.get("type") == kind:
        return True
    inner = component.get("decoders") or component.get("processors") or []
    return any(_has_type(c, kind) for c in inner)


