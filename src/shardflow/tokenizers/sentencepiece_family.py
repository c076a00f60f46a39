"""The SentencePiece family: a ``.model`` file, with gigatoken as the fast backend where it agrees.

``load_tokenizer("path/to/spm.model")`` returns a ``SentencePieceTokenizer``
whose ``encode_batch`` is, token for token, the reference:

* The reference is the ``sentencepiece`` library (backend ``sentencepiece``):
  ``SentencePieceProcessor(model_proto=...).encode(text)``, no BOS or EOS
  added. It never maps text to a control piece: ``<s>`` in a document is the
  ordinary pieces of ``<``, ``s`` and ``>``. (User-defined pieces are split
  out of the text, as the library does.)
* The fast backend is gigatoken (``gigatoken.Tokenizer.from_sentencepiece``),
  which reads BPE models with byte fallback. Unlike the library it matches
  control pieces in text, as special tokens, and has no switch for that, so
  the documents holding a control piece's text are encoded by the reference
  (``routing.Substrings``; ``<s>`` in a document is rare). It must agree with
  the reference on the probe strings (``PROBE_STRINGS``,
  ``COMMON_SPECIAL_TEXTS`` and every control and user-defined piece, alone
  and inside words; those holding a control piece are routed) before it is
  used; ``--backend auto`` falls back to the reference otherwise (a unigram
  model, or normalizer options gigatoken treats differently), and
  ``--backend gigatoken`` is then refused. The characters gigatoken encodes
  differently are found as for tokenizer.json files (``routing``; none for
  the models tested) and their documents are encoded by the reference too.

``default_bos`` / ``default_eos`` are the model's ``bos_id()`` / ``eos_id()``
(-1: none). The ids are the piece ids (``get_piece_size()`` of them), so a
32,000-piece model writes uint16 shards. A version carries a byte copy of the
``.model`` file.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import ConfigError
from .base import Tokenizer, TokenizerFamily, TokenizerSpec, checked_fast, dist_version, file_stamp, name_of_file
from .panics import one_line

__all__ = ["SENTENCEPIECE", "SentencePieceFamily", "SentencePieceTokenizer"]

_SPACE = "\u2581"  # "▁": how SentencePiece spells a space inside pieces
_BYTE_PIECE = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
# A first line like "IQ== 0": Llama 3 ships its tiktoken ranks as tokenizer.model.
_RANK_LINE = re.compile(rb"^[A-Za-z0-9+/=]+ \d+\r?$")

Token = tuple[str, int]


@dataclass(frozen=True)
class _Model:
    """One ``.model`` file as loaded once."""

    path: Path
    data: bytes
    sp: Any  # sentencepiece.SentencePieceProcessor, the reference
    spec: TokenizerSpec


class SentencePieceTokenizer(Tokenizer):
    """One SentencePiece model with one backend; ``encode_batch`` is ``encode_ordinary`` exactly."""

    reference_backend = "sentencepiece"
    libraries = ("sentencepiece",)
    _source: _Model

    # -- boundary tokens ------------------------------------------------------------
    def _piece(self, token_id: int) -> Token | None:
        return (self._source.sp.id_to_piece(token_id), token_id) if token_id >= 0 else None

    @property
    def default_bos(self) -> Token | None:
        return self._piece(int(self._source.sp.bos_id()))

    @property
    def default_eos(self) -> Token | None:
        return self._piece(int(self._source.sp.eos_id()))

    def _boundary_where(self) -> str:
        return f"{self._source.path} has bos_id and eos_id -1"

    def token_id(self, text: str) -> int | None:
        """A piece's id by its spelling (``<s>``, ``▁the``), spaces written as spaces or as ``▁``."""
        for piece in (text, text.replace(" ", _SPACE)):
            token_id = int(self._source.sp.piece_to_id(piece))
            # piece_to_id answers the unknown piece's id for any piece it does not know.
            if token_id != self._source.sp.unk_id() or piece == self._source.sp.id_to_piece(token_id):
                return token_id
        return None

    def token_text(self, token_id: int) -> str | None:
        """A piece's text: control pieces as spelled (``</s>``), byte pieces as their byte, ``▁`` as a space."""
        token_id = int(token_id)
        if not 0 <= token_id <= self.max_token_value:
            return None
        sp = self._source.sp
        piece = sp.id_to_piece(token_id)
        if sp.is_byte(token_id):
            return bytes([int(_BYTE_PIECE.match(piece).group(1), 16)]).decode("utf-8", errors="replace")  # type: ignore[union-attr]
        if sp.is_control(token_id) or sp.is_unknown(token_id):
            return piece
        return piece.replace(_SPACE, " ")

    def key_facts(self) -> list[Any]:
        return [*super().key_facts(), self.spec.family, self.default_bos, self.default_eos]

    @property
    def max_token_value(self) -> int:
        """The largest piece id (a 32,000-piece model: 31999, so uint16)."""
        return int(self._source.sp.get_piece_size()) - 1

    # -- encoding -------------------------------------------------------------------
    def encode_ordinary(self, text: str) -> list[int]:
        """The reference: sentencepiece's ``encode(text)`` (no BOS/EOS; control-piece text stays ordinary)."""
        return list(self._source.sp.encode(text))

    def reference_batch(self, texts: list[str]) -> list[list[int]]:
        return _reference_lists(self._source.sp, texts)

    def decode(self, tokens: Sequence[int] | np.ndarray) -> str:
        """sentencepiece's ``decode``, control pieces shown as spelled (``</s>``); invalid UTF-8 is replaced.

        The library decodes a control piece to nothing; a boundary token is
        then invisible, unlike in the other families. So each run of other
        pieces is decoded by the library, and a control piece is its text.
        """
        ids = np.asarray(tokens, dtype=np.int64).tolist()
        sp = self._source.sp
        parts: list[str] = []
        run: list[int] = []
        for token_id in ids:
            if sp.is_control(token_id):
                parts += [sp.decode(run), sp.id_to_piece(token_id)]
                run = []
            else:
                run.append(token_id)
        parts.append(sp.decode(run))
        return "".join(parts)

    def decode_bytes(self, tokens: Sequence[int] | np.ndarray) -> bytes:
        """The bytes ``decode`` stands for, byte pieces one by one (``decode`` would replace a partial character)."""
        ids = np.asarray(tokens, dtype=np.int64).tolist()
        sp = self._source.sp
        out = bytearray()
        first = True
        for token_id in ids:
            if sp.is_control(token_id):
                out += sp.id_to_piece(token_id).encode("utf-8")
                first = True  # as in decode, the pieces after it are a new run
                continue
            if sp.is_byte(token_id):
                out.append(int(_BYTE_PIECE.match(sp.id_to_piece(token_id)).group(1), 16))  # type: ignore[union-attr]
            elif first or sp.is_unknown(token_id):
                # The library drops the dummy-prefix space of the text's first piece; let it decide.
                out += sp.decode([token_id]).encode("utf-8")
            else:
                out += sp.id_to_piece(token_id).replace(_SPACE, " ").encode("utf-8")
            first = False
        return bytes(out)


class SentencePieceFamily(TokenizerFamily):
    """Paths to a SentencePiece ``.model`` file."""

    name = reference_backend = "sentencepiece"
    serves = "SentencePiece .model files"
    path_hint = "a path to a SentencePiece .model file"

    def matches(self, name_or_path: str) -> bool:
        return name_or_path.endswith(".model")

    def stamp(self, name_or_path: str) -> tuple[Any, ...]:
        return file_stamp([Path(name_or_path).expanduser()])

    def load(self, name_or_path: str, backend: str) -> Tokenizer:
        stamp = self.stamp(name_or_path)
        model = _load_model(name_or_path, stamp)
        make = functools.partial(SentencePieceTokenizer, spec=model.spec, source=model)
        return self.pick_backend(name_or_path, backend, make, lambda: _fast_backend(name_or_path, stamp), "sentencepiece")


SENTENCEPIECE = SentencePieceFamily()


@functools.lru_cache(maxsize=4)
def _fast_backend(name: str, stamp: tuple[Any, ...]) -> tuple[Any | None, str, Any | None]:
    """gigatoken for a ``.model``, checked: ``(fast, "", routed pattern)``, or ``(None, why not, None)``."""
    model = _load_model(name, stamp)
    try:
        import gigatoken

        fast = gigatoken.Tokenizer.from_sentencepiece(model.data)
    except ImportError:
        return None, "gigatoken is not installed (pip install gigatoken), or cannot read .model files", None
    except Exception as exc:  # unigram models, options gigatoken does not implement
        return None, f"gigatoken cannot load it ({one_line(exc)})", None
    sp = model.sp
    # gigatoken splits control pieces out of the text, as special tokens; sentencepiece
    # never matches them in text. gigatoken has no public switch for it, so the
    # documents holding a control piece's text are encoded by sentencepiece (routed).
    controls = [sp.id_to_piece(i) for i in range(sp.get_piece_size()) if sp.is_control(i)]
    # What gigatoken splits out of text: the control and the user-defined pieces.
    pieces = sorted(set(fast.as_hf().get_added_vocab()) | set(controls))
    key = f"sentencepiece {model.spec.rank_file_sha256} sentencepiece {dist_version('sentencepiece')}"
    # The probe texts that hold a control piece are routed, so gigatoken never encodes them.
    return checked_fast(name, fast, lambda t: list(sp.encode(t)), functools.partial(_reference_lists, sp),
                        own=pieces, key=key, library="sentencepiece", routed=controls)


def _reference_lists(sp: Any, texts: list[str]) -> list[list[int]]:
    return sp.encode(texts, num_threads=max(1, os.cpu_count() or 1))


@functools.lru_cache(maxsize=4)
def _load_model(name: str, stamp: tuple[Any, ...]) -> _Model:
    """Read and check a ``.model`` file once per ``stamp``."""
    try:
        import sentencepiece
    except ImportError:
        raise ConfigError("a .model file needs the sentencepiece library: pip install 'sentencepiece>=0.2'") from None
    path = Path(name).expanduser()
    if not path.is_file():
        raise ConfigError(f"tokenizer file {str(path)!r} does not exist; pass an existing SentencePiece .model file")
    data = path.read_bytes()
    problem = None
    try:
        # From the bytes read, so the SHA-256 recorded is of the model loaded.
        sp = sentencepiece.SentencePieceProcessor(model_proto=data)
    except Exception as exc:
        message = one_line(exc)
        # The library names its own source line and a protobuf call; say what it means.
        problem = "sentencepiece cannot parse it" if "Parse" in message else message
    else:
        if sp.get_piece_size() == 0:
            problem = "it has no pieces"
    if problem is not None:
        if _RANK_LINE.match(data.split(b"\n", 1)[0]):
            fix = "it looks like a tiktoken rank file: rename it to NAME.tiktoken to use it as one"
        else:
            fix = "pass a .model file written by sentencepiece's trainer"
        raise ConfigError(f"tokenizer file {str(path)!r} is not a SentencePiece model ({problem}); {fix}")
    spec = TokenizerSpec(
        name=name_of_file(path),
        rank_file=str(path.resolve()),
        rank_file_sha256=hashlib.sha256(data).hexdigest(),
        pretokenizer=None,
        local_file=True,
        family="sentencepiece",
    )
    return _Model(path=path, data=data, sp=sp, spec=spec)
