"""Files a trainer target's settings name that a build puts into the staged version: ``hf_tokenizer/``.

``Target.hf_tokenizer`` (KempnerForge, Megatron-LM) asks for the version's
tokenizer in the form ``transformers.AutoTokenizer`` loads, naming the
manifest's boundary tokens (``targets/hf_tokenizer.py`` says why and how).
``finalize`` calls ``write_target_files`` after the tokenizer file is copied
and before the manifest is validated, so the version is published with it.
A tokenizer with no such form here (a SentencePiece ``.model``, a tiktoken
pattern shardflow does not know) gets none, with a log line: the target's
settings then name a setting that needs no tokenizer.
"""

from __future__ import annotations

import logging
from pathlib import Path

from ..manifest import Manifest
from ..targets import get_target
from ..targets.hf_tokenizer import tiktoken_to_tokenizer_json, write_hf_dir
from ..tokenizers.base import Tokenizer

__all__ = ["write_target_files", "tokenizer_file_name"]

log = logging.getLogger(__name__)


def write_target_files(target: str | None, manifest: Manifest, out: Path, tokenizer: Tokenizer) -> None:
    """Write into the staged version ``out`` what ``target``'s settings name (nothing without a target)."""
    if target is None or not get_target(target).hf_tokenizer:
        return
    text = _tokenizer_json(tokenizer)
    if text is None:
        log.info("%s: no AutoTokenizer form of %s here; the --target %s settings need none", out, tokenizer.spec.name, target)
        return
    write_hf_dir(out, text, manifest.boundary_tokens)


def _tokenizer_json(tokenizer: Tokenizer) -> str | None:
    spec = tokenizer.spec
    if spec.family == "hf" and spec.rank_file and spec.rank_file.endswith(".json"):
        return Path(spec.rank_file).read_text(encoding="utf-8")
    if spec.family == "tiktoken":
        key = spec.rank_file_sha256 or spec.name
        if key not in _CONVERTED:  # by the ranks' SHA-256 (or the name): cl100k's 100k merges take seconds
            _CONVERTED[key] = _tiktoken_json(tokenizer)
        return _CONVERTED[key]
    return None


_CONVERTED: dict[str, str | None] = {}


def _tiktoken_json(tokenizer: Tokenizer) -> str | None:
    from ..tokenizers.tiktoken_family import TiktokenTokenizer, split_pattern

    pattern = split_pattern(tokenizer.spec.pretokenizer)
    if pattern is None or not isinstance(tokenizer, TiktokenTokenizer):
        return None
    encoding = tokenizer.encoding
    specials = {text: int(encoding.encode_single_token(text)) for text in encoding.special_tokens_set}
    special_ids = set(specials.values())
    ranks: dict[bytes, int] = {}
    for i in range(encoding.n_vocab):
        if i in special_ids:
            continue
        try:
            ranks[encoding.decode_single_token_bytes(i)] = i
        except KeyError:  # an unused id (cl100k's 100256, between its ranks and its specials)
            continue
    try:
        return tiktoken_to_tokenizer_json(ranks, pattern, specials)
    except ValueError as exc:  # a rank file whose tokens are not all merges of lower ranks: no BPE form
        log.warning("%s: no tokenizer.json form (%s)", tokenizer.spec.name, exc)
        return None


def tokenizer_file_name(tokenizer: Tokenizer) -> str | None:
    """The name under which a version carries its tokenizer's file, or None for a named encoding.

    The file is a local ``.tiktoken`` rank file, a ``tokenizer.json`` or a
    SentencePiece ``.model`` (``spec.rank_file`` for every family). The stem
    selects the split pattern of a known encoding (cl100k_base.tiktoken), and
    the suffix the family (.json, .model), so the name is kept.
    """
    spec = tokenizer.spec
    if not spec.local_file or spec.rank_file is None:
        return None
    return Path(spec.rank_file).name
