"""Megatron-LM (and NeMo 2 ``GPTDataset``, GPT-NeoX, Nanotron): the indexed dataset, ``P.bin`` + ``P.idx`` per shard.

``IndexedDataset(P)`` reads ``P.idx`` (magic, version, dtype code, one
sequence per document) and memory-maps ``P.bin`` with that dtype; its
document-aware sampling sees our documents. ``preprocess_data.py
--append-eod`` puts the EOD token after each document (its loss mask and
``GPTDataset`` expect it there), so EOS placement; ``--bos --eos`` (both) may
refine it.
"""

from __future__ import annotations

from pathlib import Path

from ..manifest import Manifest
from .base import Target
from .settings_support import boundary_ids, header


def _prefixes(manifest: Manifest, directory: Path, split: str) -> list[str]:
    entry = manifest.splits.get(split)
    return [str(directory / s.file[: -len(".bin")]) for s in entry.shards] if entry is not None else []


def _settings(manifest: Manifest, directory: Path) -> str:
    bos, eos = boundary_ids(manifest)
    lines = header("Megatron-LM (IndexedDataset / GPTDataset)", manifest)
    lines.append("--train-data-path " + " ".join(_prefixes(manifest, directory, "train")))
    val = _prefixes(manifest, directory, "val")
    if val:
        lines.append("--valid-data-path " + " ".join(val))
    lines.append(f"--vocab-size {manifest.tokenized_info['vocab_size']}  # with --tokenizer-type NullTokenizer")
    lines.append(f"# EOD id {eos if eos is not None else bos} (the tokenizer's eod must be it; add --eod-mask-loss to mask it)")
    lines.append("--seq-length 4096  # your sequence length")
    return "\n".join(lines)


TARGET = Target(
    name="megatron",
    stack="Megatron-LM (IndexedDataset)",
    formats=("megatron",),
    boundaries=("eos", "both"),
    globs_split_dir=False,
    settings_text=_settings,
)
