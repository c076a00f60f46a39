"""KempnerForge ``MemoryMappedDataset``: the ``*.npy`` files of a split directory, EOS after each document.

It globs ``*.npy`` in the dataset directory (sorted) and ``np.load``s each
with ``mmap_mode="r"``, so the dtype comes from the ``.npy`` header, never
from the file size (which it guesses for ``.bin``). Its packing cuts
documents at the EOS id. So: format ``npy``, EOS placement (or both), and the
split's directory holding nothing but that split's shards (schema 2: the
embeddings live in ``embeddings/``, the val shards in ``val/``).

Its ``train.py`` reads the EOS id for packing from
``AutoTokenizer.from_pretrained(data.tokenizer_path).eos_token_id`` and raises
``data.tokenizer_path is required when pack_sequences=True`` without one, so
the settings point ``tokenizer_path`` at the version's ``hf_tokenizer/``
(``targets.hf_tokenizer``: what AutoTokenizer loads, EOS = the manifest's).
Where the version has none (a SentencePiece ``.model``; a version built
before it), they print ``pack_sequences = false``, which needs no tokenizer. Every key is a
field of its ``DataConfig`` / ``ModelConfig`` (its loader rejects unknown keys).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..manifest import Manifest
from .base import Target
from .hf_tokenizer import HF_DIR, hf_dir
from .settings_support import boundary_ids, split_dir, split_tokens


def _settings(manifest: Manifest, directory: Path) -> Iterator[str]:
    _, eos = boundary_ids(manifest)
    info = manifest.tokenized_info
    tokenizer_dir = hf_dir(directory)
    yield from [
        "[data]",
        f'dataset_path = "{split_dir(manifest, directory, "train")}"',
        'file_pattern = "*.npy"',
    ]
    if tokenizer_dir is not None:
        yield from [
            f"pack_sequences = true  # document-aware packing: documents end at the EOS id {eos}",
            f'tokenizer_path = "{tokenizer_dir}"  # AutoTokenizer loads it; its eos_token_id is {eos}',
        ]
    else:
        yield (
            f"pack_sequences = false  # no {HF_DIR}/ in this version ({info['tokenizer']}): packing (documents end "
            f"at the EOS id {eos}) needs a tokenizer_path whose AutoTokenizer eos_token_id is {eos}"
        )
    yield from ["[model]", f"vocab_size = {info['vocab_size']}  # at least this many ids"]
    if split_tokens(manifest, "val"):
        yield f'# evaluation data: dataset_path = "{split_dir(manifest, directory, "val")}", file_pattern = "*.npy"'


TARGET = Target(
    name="kempnerforge", stack="KempnerForge (MemoryMappedDataset)", formats=("npy",), boundaries=("eos", "both"),
    hf_tokenizer=True, settings_title="KempnerForge (MemoryMappedDataset; DataConfig)", settings_lines=_settings,
)
