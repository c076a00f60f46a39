"""Tokenizers: one module per tokenizer family, registered here in ``FAMILIES``.

``load_tokenizer(name, backend=...)`` asks each family in ``FAMILIES``, in
order, whether it serves ``name`` (the first that ``matches`` wins) and
returns what that family's ``load`` gives: a ``Tokenizer`` (see ``base``)
whose ``encode_batch`` is, token for token, its reference ``encode_ordinary``
whatever the backend. A name no family serves is refused with a
``ConfigError`` that lists the names and file kinds the families accept.

Families (the reference backend of each is named after its library):

    hf_family             a Hugging Face tokenizer.json, or a directory holding one; reference
                          ``hf`` (the tokenizers library), gigatoken fast backend (``HF``)
    sentencepiece_family  a SentencePiece ``.model`` file; reference ``sentencepiece``,
                          gigatoken fast backend (``SENTENCEPIECE``)
    tiktoken_family       tiktoken encodings by name (``cl100k_base`` offline), ``.tiktoken``
                          rank files; reference ``tiktoken``, gigatoken fast backend (``TIKTOKEN``)

``--backend`` is ``auto``, ``gigatoken`` or the family's reference backend; the
reference backend of another family is refused by name. ``routing`` finds the
characters gigatoken's Unicode tables class differently from a reference's and
sends the documents holding them to the reference (the file families use it).

Adding a family: write one module implementing ``base.TokenizerFamily``
(``name``, ``matches(name_or_path)``, ``load(name_or_path, backend)``, and
``known_names()`` / ``path_hint`` for the error message), returning a
``base.Tokenizer`` subclass, and add its instance to ``FAMILIES``. Put it
before ``TIKTOKEN``, which takes any other existing file as a rank file.
"""

from __future__ import annotations

import functools
import threading

from ..config import BACKENDS  # one definition, importable without pyarrow and tiktoken
from ..errors import ConfigError
from .base import (
    COMMON_SPECIAL_TEXTS,
    PROBE_STRINGS,
    Tokenizer,
    TokenizerFamily,
    TokenizerSpec,
    unknown_tokenizer_error,
)
from .hf_family import HF, HFFamily, HFTokenizer
from .live_check import check_batch, check_identity
from .panics import is_library_panic, library_panic_error
from .sentencepiece_family import (
    SENTENCEPIECE,
    SentencePieceFamily,
    SentencePieceTokenizer,
)
from .tiktoken_family import ENDOFTEXT, TIKTOKEN, TiktokenFamily, TiktokenTokenizer

__all__ = [
    "Tokenizer",
    "TokenizerSpec",
    "TokenizerFamily",
    "FAMILIES",
    "family_for",
    "load_tokenizer",
    "load_reference_tokenizer",
    "check_identity",
    "check_batch",
    "BACKENDS",
    "PROBE_STRINGS",
    "COMMON_SPECIAL_TEXTS",
    "ENDOFTEXT",
    "HF",
    "HFFamily",
    "HFTokenizer",
    "SENTENCEPIECE",
    "SentencePieceFamily",
    "SentencePieceTokenizer",
    "TIKTOKEN",
    "TiktokenFamily",
    "TiktokenTokenizer",
]

# Ordered: the first family whose matches() accepts a name loads it. TIKTOKEN comes
# last: it takes any other existing file as a rank file.
FAMILIES: tuple[TokenizerFamily, ...] = (HF, SENTENCEPIECE, TIKTOKEN)


def family_for(name: str) -> TokenizerFamily:
    """The first registered family that serves ``name``; a ``ConfigError`` lists what they accept."""
    for family in FAMILIES:
        if family.matches(name):
            return family
    raise unknown_tokenizer_error(name, FAMILIES)


_LOAD_LOCK = threading.Lock()


def load_tokenizer(name: str, *, backend: str = "auto") -> Tokenizer:
    """The tokenizer ``name`` (a name or a file path any registered family serves) on ``backend``.

    Cached and locked: build steps in several threads call it per work unit,
    and a family's probe check must run once, on one thread.
    """
    # The backend is checked first, so a bad one is reported whatever the name.
    if backend not in BACKENDS:
        raise ConfigError(f"unknown tokenizer backend {backend!r}; use one of {', '.join(BACKENDS)}")
    family = family_for(name)
    with _LOAD_LOCK:
        return _load_tokenizer(name, backend, family, family.stamp(name))


@functools.lru_cache(maxsize=8)
def _load_tokenizer(name: str, backend: str, family: TokenizerFamily, stamp: tuple) -> Tokenizer:
    # ``stamp`` is only part of the key: an edited tokenizer file is another entry.
    reference = family.reference_backend
    if reference is not None and backend not in ("auto", "gigatoken", reference):
        raise ConfigError(f"--backend {backend} does not apply to {family.serves}; use auto, gigatoken or {reference}")
    try:
        return family.load(name, backend)
    except BaseException as exc:  # a library's panic (not an Exception): the file, named in one line
        if not is_library_panic(exc):
            raise
        raise library_panic_error(name, "loading it", exc) from None


def load_reference_tokenizer(name: str) -> Tokenizer:
    """The tokenizer ``name`` on its family's reference backend (how readers decode a version's copy)."""
    family = family_for(name)
    return load_tokenizer(name, backend=family.reference_backend or "auto")
