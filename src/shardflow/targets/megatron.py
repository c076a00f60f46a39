"""Megatron-LM (and NeMo 2 ``GPTDataset``, GPT-NeoX, Nanotron): the indexed dataset, ``P.bin`` + ``P.idx`` per shard.

``IndexedDataset(P)`` memory-maps ``P.bin`` with the dtype of ``P.idx``; its document-aware
sampling sees our documents. EOS placement, because ``preprocess_data.py --append-eod`` puts the
EOD token after each document (its loss mask and ``GPTDataset`` expect it there); ``--bos --eos``
may refine it. The settings are flags of ``pretrain_gpt.py``, checked against the releases in
docs/TARGETS.md ("Megatron versions"): ``--per-split-data-args-path`` names a JSON file of the
shard prefixes written beside the version (``megatron_data_args.json``; absolute paths, known only
once the version is published; a read-only data root gets the prefixes inline), so tens of
thousands of shards are one argument, not a command line past the kernel's limit.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from ..manifest import Manifest
from .._io import atomic_write_text
from .base import Target
from .hf_tokenizer import hf_dir
from .settings_support import boundary_ids


DATA_ARGS_FILE = "megatron_data_args.json"


def _prefixes(manifest: Manifest, directory: Path, split: str) -> list[str] | None:
    entry = manifest.splits.get(split)
    if entry is None or not entry.shards:
        return None
    return [str(directory / s.file[: -len(".bin")]) for s in entry.shards]


def data_args_file(manifest: Manifest, directory: Path) -> Path | None:
    """``directory/megatron_data_args.json`` (``--per-split-data-args-path``), written if missing; None where the
    version directory cannot be written to."""
    path = directory / DATA_ARGS_FILE
    text = json.dumps(
        {"train": _prefixes(manifest, directory, "train"), "valid": _prefixes(manifest, directory, "val"), "test": None},
        indent=1,
    ) + "\n"
    try:
        if not path.is_file() or path.read_text(encoding="utf-8") != text:  # the version moved: its paths did too
            atomic_write_text(path, text)
    except OSError:
        return None
    return path


def _settings(manifest: Manifest, directory: Path) -> Iterator[str]:
    bos, eos = boundary_ids(manifest)
    eod = eos if eos is not None else bos
    train = _prefixes(manifest, directory, "train") or []
    val = _prefixes(manifest, directory, "val") or []
    args_file = data_args_file(manifest, directory)
    if args_file is not None:
        yield f"--per-split-data-args-path {args_file}  # train: {len(train)} prefixes, valid: {len(val)}"
    else:  # a read-only data root: every prefix on the command line (fine for a few hundred shards)
        yield f"# {directory / DATA_ARGS_FILE} could not be written: the prefixes follow"
        yield "--train-data-path " + " ".join(train)
        if val:
            yield "--valid-data-path " + " ".join(val)
    tokenizer_dir = hf_dir(directory)
    if tokenizer_dir is not None:
        yield "--tokenizer-type HuggingFaceTokenizer"
        yield f"--tokenizer-model {tokenizer_dir}  # its eos_token is Megatron's EOD: id {eod}"
    else:
        yield "--tokenizer-type NullTokenizer"
        yield f"--vocab-size {manifest.tokenized_info['vocab_size']}"
        yield f"--null-tokenizer-eod-id {eod}  # Megatron-LM releases with this flag; older ones refuse it"
    yield "--seq-length 4096  # your sequence length"
    yield f"# add --eod-mask-loss to mask the EOD id {eod} in the loss"


TARGET = Target(
    name="megatron", stack="Megatron-LM (IndexedDataset)", formats=("megatron",), boundaries=("eos", "both"),
    globs_split_dir=False,
    hf_tokenizer=True,
    settings_title="Megatron-LM (pretrain_gpt.py arguments; IndexedDataset / GPTDataset)", settings_lines=_settings,
)
