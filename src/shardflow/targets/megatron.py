"""Megatron-LM (and NeMo 2 ``GPTDataset``, GPT-NeoX, Nanotron): the indexed dataset, ``P.bin`` + ``P.idx`` per shard.

``IndexedDataset(P)`` reads ``P.idx`` (magic, version, dtype code, one
sequence per document) and memory-maps ``P.bin`` with that dtype; its
document-aware sampling sees our documents. ``preprocess_data.py
--append-eod`` puts the EOD token after each document (its loss mask and
``GPTDataset`` expect it there), so EOS placement; ``--bos --eos`` (both) may
refine it.

The settings are flags of Megatron-LM's ``pretrain_gpt.py``. Checked against:
megatron-core 0.16.1 (the newest on Python 3.11; its ``get_blend_from_list``
and ``MegatronTokenizer`` run in tests/targets/test_trainer_configs.py), and
Megatron-LM's ``arguments.py`` / ``get_blend_and_blend_per_split`` sources and
its NullTokenizer rule at commit d98e8a64 (modelled in tests/targets/config_readers.py):

* ``--per-split-data-args-path``: a JSON file ``{"train": [prefixes], "valid":
  [...] or null, "test": null}`` that its ``get_blend_and_blend_per_split``
  reads, written beside the version's files (``megatron_data_args.json``) when
  the settings are printed (its prefixes are absolute paths, known only once
  the version is published; a read-only data root gets the prefixes inline), so
  a version of tens of thousands of shards is one argument, not a command line
  past the kernel's limit.
* ``--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR/hf_tokenizer``:
  Megatron's EOD is then that tokenizer's ``eos_token`` id, the manifest's EOS,
  in both. With ``NullTokenizer`` the EOD depends on the release
  (``vocab_size`` in megatron-core 0.16.1 and older Megatron-LM,
  ``vocab_size - 1`` at d98e8a64 unless ``--null-tokenizer-eod-id`` is given),
  never our EOS. A version without ``hf_tokenizer/`` (a SentencePiece
  ``.model``; one built before it) gets ``NullTokenizer`` with
  ``--null-tokenizer-eod-id``, which releases without that flag refuse loudly.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..manifest import Manifest
from .._io import atomic_write_text
from .base import Target
from .hf_tokenizer import hf_dir
from .settings_support import boundary_ids, header


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


def _settings(manifest: Manifest, directory: Path) -> str:
    bos, eos = boundary_ids(manifest)
    eod = eos if eos is not None else bos
    train = _prefixes(manifest, directory, "train") or []
    val = _prefixes(manifest, directory, "val") or []
    lines = header("Megatron-LM (pretrain_gpt.py arguments; IndexedDataset / GPTDataset)", manifest)
    args_file = data_args_file(manifest, directory)
    if args_file is not None:
        lines.append(f"--per-split-data-args-path {args_file}  # train: {len(train)} prefixes, valid: {len(val)}")
    else:  # a read-only data root: every prefix on the command line (fine for a few hundred shards)
        lines.append(f"# {directory / DATA_ARGS_FILE} could not be written: the prefixes follow")
        lines.append("--train-data-path " + " ".join(train))
        if val:
            lines.append("--valid-data-path " + " ".join(val))
    tokenizer_dir = hf_dir(directory)
    if tokenizer_dir is not None:
        lines.append("--tokenizer-type HuggingFaceTokenizer")
        lines.append(f"--tokenizer-model {tokenizer_dir}  # its eos_token is Megatron's EOD: id {eod}")
    else:
        lines.append("--tokenizer-type NullTokenizer")
        lines.append(f"--vocab-size {manifest.tokenized_info['vocab_size']}")
        lines.append(f"--null-tokenizer-eod-id {eod}  # Megatron-LM releases with this flag; older ones refuse it")
    lines.append("--seq-length 4096  # your sequence length")
    lines.append(f"# add --eod-mask-loss to mask the EOD id {eod} in the loss")
    return "\n".join(lines)


TARGET = Target(
    name="megatron",
    stack="Megatron-LM (IndexedDataset)",
    formats=("megatron",),
    boundaries=("eos", "both"),
    globs_split_dir=False,
    hf_tokenizer=True,
    settings_text=_settings,
)
