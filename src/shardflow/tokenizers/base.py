"""The family-independent tokenizer contract: what the build, the manifest and the reader rely on.

A *family* is one way of naming and loading a vocabulary (tiktoken encodings
and ``.tiktoken`` rank files today). Each family is one module implementing
``TokenizerFamily``; the ``Tokenizer`` it returns is the only thing the rest
of the library sees. Its promise: ``encode_batch`` returns, token for token,
what ``encode_ordinary`` (the family's reference encoding) returns for each
document, whichever backend computes it.

Also here, because any family may need them: the probe strings a fast
backend must agree on before it is used (``checked_fast``), the choice of
backend (``TokenizerFamily.pick_backend``), and ``pack_lists``, which turns lists
of ids into the flat ``(tokens, offsets)`` arrays. The live spot-check the build
runs per batch is ``live_check.py``'s.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import logging
import threading
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from .._arrow import large_strings
from ..errors import ConfigError
from .panics import is_library_panic, library_panic_error
from .probing import Probed
from .routing import Routes, Substrings, cached_answer, encode_routed, fast_lock

__all__ = [
    "Tokenizer",
    "TokenizerSpec",
    "TokenizerFamily",
    "PROBE_STRINGS",
    "COMMON_SPECIAL_TEXTS",
    "unknown_tokenizer_error",
    "no_boundary_error",
]

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
    # Combining marks after characters NFKC rewrites, and NEL: gigatoken dropped them under a
    # SentencePiece model's nfkc / nmt_nfkc normalizer (silently wrong tokens, no error).
    "e\u0301\u0301 \uff21\u0301 \ufb01\u0301 x\u00a0\u0301 na\u00efve\u0301\u0301 \u00e9\u00a8\u0301 \x85 end",
)

# Special-token texts of well-known tokenizers. Families whose files define their
# own specials probe these too: in a document they are ordinary text.
COMMON_SPECIAL_TEXTS: tuple[str, ...] = ("<s>", "</s>", "<|begin_of_text|>", "<|end_of_text|>", "<|endoftext|>")

log = logging.getLogger("shardflow.tokenizers")


def _panics_named(method: Callable[..., Any], doing: str) -> Callable[..., Any]:
    """``method`` of a ``Tokenizer``, a library's panic in it raised as ``library_panic_error`` naming the file."""
    if getattr(method, "_panics_named", False):
        return method

    @functools.wraps(method)
    def call(self: "Tokenizer", *args: Any, **kwargs: Any) -> Any:
        try:
            return method(self, *args, **kwargs)
        except BaseException as exc:
            if not is_library_panic(exc):
                raise
            raise library_panic_error(self.spec.rank_file or self.name, doing, exc) from None

    call._panics_named = True  # type: ignore[attr-defined]
    return call


def _library_call(doing: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """``_panics_named`` as a decorator, for ``Tokenizer``'s own methods (its subclasses' are wrapped as they are defined)."""
    return lambda method: _panics_named(method, doing)


_LIBRARY_CALLS = {
    "encode_ordinary": "encoding text", "reference_batch": "encoding text", "encode_batch": "encoding text",
    "warm": "encoding text", "decode": "decoding tokens", "decode_bytes": "decoding tokens",
}
"""The ``Tokenizer`` methods that call a tokenizer library, and what they do, for ``_panics_named``."""


@dataclass(frozen=True, kw_only=True)
class TokenizerSpec:
    """How to build an encoding: what the manifest records about the tokenizer."""

    name: str
    """The name the user gave (``cl100k_base``) or the vocabulary file's stem."""
    rank_file: str | None
    """Path of the file the vocabulary is read from (a ``.tiktoken`` rank file), when it comes from a file.

    The manifest records its SHA-256, and a user's local file is copied into each version.
    """
    rank_file_sha256: str | None
    pretokenizer: str | None
    """The fast backend's name of the pre-tokenizer (gigatoken's ``gpt2``, ``gpt4``, ``o200k``), when known."""
    local_file: bool = False
    """Whether the user named the file by its path (it then travels with each version)."""
    family: str = "tiktoken"
    """The family that loaded it (``tiktoken``, ``hf``, ``sentencepiece``); the manifest records it for the new families."""


class Tokenizer(ABC):
    """One vocabulary with one backend; ``encode_batch`` is ``encode_ordinary`` exactly.

    A panic of the library under one of its encoding or decoding methods (pyo3's ``PanicException``,
    which no ``except Exception`` catches) is raised as one ``ConfigError`` naming the file
    (``library_panic_error``): every subclass's methods in ``_LIBRARY_CALLS`` are wrapped as it is defined.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        for name, doing in _LIBRARY_CALLS.items():
            if name in cls.__dict__:
                setattr(cls, name, _panics_named(cls.__dict__[name], doing))

    reference_backend: str
    """The backend whose encoding is the reference (``encode_ordinary``); ``live_check`` compares against it."""

    def __init__(
        self, *, spec: TokenizerSpec, backend: str, source: Any = None, fast: Any | None = None, routed: Any | None = None
    ) -> None:
        self.spec = spec
        self.backend = backend
        self._source = source  # what the family loaded: its reference library's object, or that and its files' facts
        self._fast = fast  # gigatoken.Tokenizer, or None on the reference backend
        # gigatoken's object is not re-entrant (see routing.encode_routed): one lock per object, shared by its users.
        self._fast_lock = fast_lock(fast) if fast is not None else threading.Lock()
        self._routed = routed  # documents matching it are encoded by the reference (see routing.py)
        self._warm = False  # warm() done

    # -- facts the manifest records -------------------------------------------------
    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def eot_token(self) -> str:
        """The text of the document-boundary token (``<|endoftext|>``)."""
        return self._boundary()[0]

    @property
    def eot_id(self) -> int:
        """The id of the boundary token, used as BOS (or EOS) between documents."""
        return self._boundary()[1]

    def _boundary(self) -> tuple[str, int]:
        # Today's single boundary token: the EOS the tokenizer defines, else its BOS.
        found = self.default_eos or self.default_bos
        if found is None:
            raise no_boundary_error(self.name, self._boundary_where())
        return found

    def _boundary_where(self) -> str:
        """Where the family looked for a BOS and an EOS, for the error when it found neither."""
        return "it names none"

    @property
    def default_bos(self) -> tuple[str, int] | None:
        """The tokenizer's own beginning-of-document token ``(text, id)``, if it defines one.

        Families read it from their configuration (a tiktoken encoding has only
        ``<|endoftext|>``, which serves as both). ``--bos-token`` overrides it.
        """
        return None

    @property
    def default_eos(self) -> tuple[str, int] | None:
        """The tokenizer's own end-of-document token ``(text, id)``, if it defines one."""
        return None

    def token_id(self, text: str) -> int | None:
        """The id of the token whose text is ``text`` (special and added tokens included), or None."""
        return self.eot_id if text == self.eot_token else None

    def token_text(self, token_id: int) -> str | None:
        """The text of token ``token_id`` as the vocabulary spells it (special tokens included), or None."""
        return self.eot_token if token_id == self.eot_id else None

    def key_facts(self) -> list[Any]:
        """What the build key records about the tokenizer: every fact that determines the output ids.

        The tiktoken family's list must stay as it is (published versions keep
        their keys); a family whose boundary defaults come from files other
        than the vocabulary file adds them.
        """
        return [self.name, self.spec.rank_file_sha256, self.vocab_size]

    @property
    def vocab_size(self) -> int:
        """Number of ids the encoding defines: ``max_token_value + 1``."""
        return self.max_token_value + 1

    @property
    @abstractmethod
    def max_token_value(self) -> int:
        """The largest id the encoding can emit, special tokens included (it picks the shard dtype)."""

    libraries: tuple[str, ...] = ()
    """The reference's packages (``tiktoken``); ``library_versions`` adds gigatoken."""

    def library_versions(self) -> dict[str, str | None]:
        """Versions of the packages that produced the ids (``None`` for one not used), for the manifest."""
        giga = dist_version("gigatoken") if self.backend == "gigatoken" else None
        return {**{name: dist_version(name) for name in self.libraries}, "gigatoken": giga}

    # -- encoding -------------------------------------------------------------------
    @abstractmethod
    def encode_ordinary(self, text: str) -> list[int]:
        """The reference encoding of one text; special-token text in it is encoded as ordinary text."""

    @_library_call("encoding text")
    def warm(self) -> None:
        """Do the fast backend's one-time set-up now, not in the first document batch; once per tokenizer.

        A process's first gigatoken batch pays a one-time set-up on the GIL:
        its thread pool, and the import of awkward that its batches come back
        in (0.12 s here). A tokenize job spends it while its reading thread
        decodes the first batch, which releases the GIL (``pipeline/tokenize.py``).
        No-op without a fast backend.
        """
        if self._fast is not None and not self._warm:
            self.encode_batch(large_strings(["shardflow"]))  # the documents' own path: Arrow text, awkward's view
            self._warm = True

    @_library_call("encoding text")
    def reference_batch(self, texts: list[str]) -> list[list[int]]:
        """``encode_ordinary`` of each text; families use their library's batch call."""
        return [self.encode_ordinary(text) for text in texts]

    @_library_call("encoding text")
    def encode_batch(self, texts: pa.Array | Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
        """Encode documents; returns ``(tokens uint32, offsets int64)``.

        ``tokens[offsets[i]:offsets[i+1]]`` are document i's ids, equal to
        ``encode_ordinary(texts[i])``. ``texts`` is a list of str or a pyarrow
        string array without nulls.
        """
        if self._fast is not None:
            return encode_routed(self._fast, self._fast_lock, texts, self._routed, self.reference_batch)
        if isinstance(texts, (pa.Array, pa.ChunkedArray)):
            texts = texts.to_pylist()
        texts = list(texts)
        return pack_lists(self.reference_batch(texts) if texts else [])

    @abstractmethod
    def decode(self, tokens: Sequence[int] | np.ndarray) -> str:
        """Decode ids to text (invalid UTF-8 is replaced)."""

    @abstractmethod
    def decode_bytes(self, tokens: Sequence[int] | np.ndarray) -> bytes:
        """Decode ids to the exact bytes they stand for."""

    def __repr__(self) -> str:
        return f"Tokenizer(name={self.name!r}, backend={self.backend!r}, vocab_size={self.vocab_size})"


class TokenizerFamily(ABC):
    """One way of naming and loading vocabularies; registered in ``shardflow.tokenizers.FAMILIES``.

    ``load_tokenizer`` asks each registered family in order whether it
    ``matches`` a name and calls ``load`` on the first that does; it caches
    the result per ``(name, backend)`` and serializes loads, so ``load`` may
    run slow one-time checks without locking.
    """

    name: str
    """Short name of the family (``tiktoken``)."""
    reference_backend: str | None = None
    """The backend name of the family's reference library (``tiktoken``, ``hf``, ``sentencepiece``).

    ``load_tokenizer`` refuses the reference backend of another family by name.
    """
    serves: str = ""
    """What the family loads, for that refusal (``tokenizer.json``)."""
    path_hint: str = ""
    """How to name a file of this family, for the unknown-tokenizer message (``a path to a .tiktoken rank file``)."""

    @abstractmethod
    def matches(self, name_or_path: str) -> bool:
        """Whether this family serves ``name_or_path``; cheap, and must not raise for names it does not know.

        A path to a file that does not exist may match (by its extension), so
        that ``load`` can say it is missing.
        """

    @abstractmethod
    def load(self, name_or_path: str, backend: str) -> Tokenizer:
        """The tokenizer on ``backend`` (one of ``config.BACKENDS``, already checked).

        ``auto`` picks the fastest backend that agrees with the reference on
        ``PROBE_STRINGS``, falling back to the reference; a named backend that
        cannot serve the name raises ``ConfigError``, as does a bad file.
        """

    def pick_backend(
        self,
        name_or_path: str,
        backend: str,
        make: Callable[..., Tokenizer],
        fast_backend: Callable[[], tuple[Any, str, Any]],
        library: str,
    ) -> Tokenizer:
        """``make(backend=, fast=, routed=)`` as ``load`` says, ``library`` being the reference.

        ``fast_backend()`` is gigatoken, checked: ``(fast, "", routed)``, or ``(None, why not, None)``.
        """
        reference = str(self.reference_backend)
        if backend == reference:
            return make(backend=reference)
        fast, reason, routed = fast_backend()
        if fast is None:
            if backend == "gigatoken":
                raise ConfigError(f"tokenizer backend 'gigatoken' cannot serve {name_or_path!r}: {reason}; use --backend {reference}")
            log.info("tokenizer %s: using %s (%s)", name_or_path, library, reason)
            return make(backend=reference)
        return make(backend="gigatoken", fast=fast, routed=routed)

    def known_names(self) -> Sequence[str]:
        """Names (not paths) this family loads, listed when a name matches no family."""
        return ()

    def stamp(self, name_or_path: str) -> tuple[Any, ...]:
        """The size and modification time of the files ``load`` reads for ``name_or_path``; () for none.

        ``load_tokenizer`` caches per name, backend and stamp, so a file edited in
        place (a long-running ``shardflow serve``) is loaded anew, not served stale.
        """
        return ()


def unknown_tokenizer_error(name: str, families: Sequence[TokenizerFamily]) -> ConfigError:
    """The error for a name no family serves, listing what each family accepts."""
    known = sorted({n for family in families for n in family.known_names()})
    hints = [family.path_hint for family in families if family.path_hint]
    accepted = f"use one of {', '.join(known)}" + "".join(f" or {hint}" for hint in hints)
    return ConfigError(f"unknown tokenizer {name!r}; {accepted}")


def no_boundary_error(name: str, where: str) -> ConfigError:
    """The error for a tokenizer that defines neither a BOS nor an EOS token (``where`` says where it looked)."""
    return ConfigError(
        f"tokenizer {name!r} defines no BOS or EOS token ({where}); name the boundary token with --eos-token or --bos-token"
    )


# -- helpers shared by families ---------------------------------------------------


@functools.lru_cache(maxsize=None)
def dist_version(name: str) -> str | None:
    """An installed distribution's version (None: not installed); looked up once per process (a few ms each)."""
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def pack_lists(lists: Sequence[Sequence[int]]) -> tuple[np.ndarray, np.ndarray]:
    """One list of ids per document, as flat ``(tokens uint32, offsets int64)``."""
    lengths = np.fromiter((len(x) for x in lists), dtype=np.int64, count=len(lists))
    offsets = np.zeros(len(lists) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = np.empty(int(offsets[-1]), dtype=np.uint32)
    for i, ids in enumerate(lists):
        tokens[offsets[i] : offsets[i + 1]] = ids
    return tokens, offsets


def _disagreement(fast: Any, reference: Callable[[str], list[int]], texts: Sequence[str]) -> str | None:
    """The first of ``texts`` on which gigatoken's ``fast`` differs from ``reference`` (one by one, then as a batch), or None."""
    expected = [reference(text) for text in texts]
    for text, ids in zip(texts, expected):
        if [int(t) for t in fast.encode(text)] != ids:
            return text
    for text, ids, got in zip(texts, expected, fast.encode_batch_list(list(texts))):
        if got != ids:
            return text
    return None


def checked_fast(
    name: str,
    fast: Any,
    reference: Callable[[str], list[int]],
    reference_batch: Callable[[list[str]], list[list[int]]],
    *,
    own: Sequence[str],
    key: str,
    library: str,
    routed: Sequence[str] = (),
) -> tuple[Any | None, str, Any | None]:
    """gigatoken's ``fast`` if it agrees with ``library``, the reference: ``(fast, "", routed)``, else ``(None, why not, None)``.

    The probes are the shared ones and the tokenizer's ``own`` special texts, alone and inside words,
    less those holding a ``routed`` text (the reference encodes their documents); the answer is kept
    on disk by ``key`` (the vocabulary file's SHA-256 and the reference library's version) and the
    probe texts. ``routed`` is then a ``probing.Probed``, with the ``routed`` texts' ``Substrings``.
    """
    texts = [*PROBE_STRINGS, *COMMON_SPECIAL_TEXTS, *own, *(f"a{t}b {t}\n{t}{t}" for t in own)]
    probes = [t for t in texts if not any(r and r in t for r in routed)]
    digest = hashlib.sha256("\0".join(probes).encode("utf-8", "surrogatepass")).hexdigest()[:16]
    bad = cached_answer("probe", f"{key} {digest}", lambda: _disagreement(fast, reference, probes))
    if bad is not None:
        return None, f"gigatoken disagrees with {library} on the probe string {str(bad)[:40]!r}", None
    probed = Probed(fast, reference_batch, key=key, name=name, library=library)
    return fast, "", Routes([probed, Substrings(routed)]) if any(routed) else probed


def file_stamp(paths: Sequence[Path]) -> tuple[Any, ...]:
    """``(path, mtime_ns, size)`` of each file, None for one that does not exist."""
    out: list[Any] = []
    for path in paths:
        try:
            st = path.stat()
        except OSError:
            out.append((str(path), None))
        else:
            out.append((str(path), st.st_mtime_ns, st.st_size))
    return tuple(out)


def name_of_file(path: Path) -> str:
    """A tokenizer's name from its file: the stem, or the directory's name for a generic ``tokenizer.*``."""
    return path.parent.resolve().name if path.stem == "tokenizer" and path.parent.resolve().name else path.stem
