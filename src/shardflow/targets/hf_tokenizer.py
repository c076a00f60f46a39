"""The version's tokenizer as a directory ``transformers.AutoTokenizer.from_pretrained`` loads: ``hf_tokenizer/``.

Why the trainers need it, and what it holds (``tokenizer.json``, for the tiktoken family the same
byte-level BPE rebuilt with the ``tokenizers`` library; ``tokenizer_config.json`` naming the
manifest's BOS and EOS): docs/TARGETS.md. A build whose target sets ``Target.hf_tokenizer`` writes
it into the staged version (``pipeline/target_files.py``, before the manifest is validated and the
version published); where none can be made, ``hf_dir`` is None. This module is pure (it imports no
tokenizer code): the build passes the vocabulary in.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from .._bytelevel import bytes_to_unicode
from ..manifest import BoundaryTokens

__all__ = ["HF_DIR", "hf_dir", "write_hf_dir", "tiktoken_to_tokenizer_json"]

HF_DIR = "hf_tokenizer"


def _merge_of(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes]:
    """The pair tiktoken merges last to make ``token``: BPE over its bytes with the ranks below its own."""
    limit = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best, at = limit, -1
        for i in range(len(parts) - 1):
            rank = ranks.get(parts[i] + parts[i + 1], limit)
            if rank < best:
                best, at = rank, i
        if at < 0:
            break
        parts[at : at + 2] = [parts[at] + parts[at + 1]]
    if len(parts) != 2:
        raise ValueError(f"token {token!r} (rank {limit}) is not the merge of two lower-ranked tokens")
    return parts[0], parts[1]


def _oniguruma(pattern: str) -> str:
    """tiktoken's pattern for the tokenizers library's regex engine (Oniguruma, Ruby syntax), where ``{1,3}+``
    is "one or more runs of 1 to 3", not tiktoken's possessive "1 to 3": ``1904`` would split 19|04, not 190|4.
    A bounded run that ends its alternative matches the same greedy, so the ``+`` goes."""
    return re.sub(r"(\{\d+(?:,\d*)?\})\+", r"\1", pattern)


def tiktoken_to_tokenizer_json(ranks: dict[bytes, int], pattern: str, specials: dict[str, int]) -> str:
    """A ``tokenizer.json`` encoding exactly as tiktoken does with these ranks, split pattern and special tokens."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers

    chars = bytes_to_unicode()

    def spell(b: bytes) -> str:
        return "".join(chars[x] for x in b)

    vocab = {spell(t): r for t, r in ranks.items()}
    vocab.update(specials)  # in the vocabulary, so they keep their ids (a gap before them would shift added ones)
    merges = [
        (spell(a), spell(b))
        for t, _ in sorted(ranks.items(), key=lambda kv: kv[1])
        if len(t) > 1
        for a, b in [_merge_of(t, ranks)]
    ]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, ignore_merges=True, fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_oniguruma(pattern)), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    # Marked special (their ids come from the vocabulary above): AutoTokenizer names them as bos/eos tokens.
    for text, _ in sorted(specials.items(), key=lambda kv: kv[1]):
        tok.add_special_tokens([AddedToken(text, special=True, normalized=False)])
    return tok.to_str()


def hf_dir(directory: Path) -> Path | None:
    """The version's ``hf_tokenizer/`` if it carries one (built with a target that needs it), else None."""
    out = directory / HF_DIR
    return out if (out / "tokenizer_config.json").is_file() else None


def write_hf_dir(out: Path, tokenizer_json: str, boundary: BoundaryTokens) -> Path:
    """Write ``out/hf_tokenizer/`` (atomically: a reader sees all of it or nothing) naming ``boundary``'s tokens."""
    config: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 1 << 30}
    if boundary.bos:
        config["bos_token"] = boundary.bos[0]
    # A BOS-only version: its boundary token is the one an EOS-reading stack must cut at.
    config["eos_token"] = (boundary.eos or boundary.bos)[0]  # type: ignore[index]
    target = out / HF_DIR
    staging = Path(tempfile.mkdtemp(prefix=f".{HF_DIR}.", dir=out))
    try:
        (staging / "tokenizer.json").write_text(tokenizer_json, encoding="utf-8")
        (staging / "tokenizer_config.json").write_text(json.dumps(config, indent=1) + "\n", encoding="utf-8")
        shutil.rmtree(target, ignore_errors=True)  # a rebuilt staging directory's earlier copy
        os.rename(staging, target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
