"""KempnerForge ``MemoryMappedDataset``: the ``*.npy`` files of a split directory, EOS after each document.

It globs ``*.npy`` in the dataset directory (sorted) and ``np.load``s each
with ``mmap_mode="r"``, so the dtype comes from the ``.npy`` header, never
from the file size (which it guesses for ``.bin``). Its packing cuts
documents at the EOS id. So: format ``npy``, EOS placement (or both), and the
split's directory holding nothing but that split's shards (schema 2: the
embeddings live in ``embeddings/``, the val shards in ``val/``).
"""

from __future__ import annotations

from pathlib import Path

from ..manifest import Manifest
from .base import Target
from .settings_support import boundary_ids, header, split_dir, split_tokens


def _settings(manifest: Manifest, directory: Path) -> str:
    _, eos = boundary_ids(manifest)
    info = manifest.tokenized_info
    tokenizer_file = info.get("tokenizer_file") or info.get("rank_file")
    lines = header("KempnerForge (MemoryMappedDataset; DataConfig)", manifest)
    lines += [
        "[data]",
        f'dataset_path = "{split_dir(manifest, directory, "train")}"',
        'file_pattern = "*.npy"',
        f"pack_sequences = true  # document-aware packing: documents end at the EOS id {eos}",
    ]
    if tokenizer_file:
        lines.append(f'tokenizer_path = "{directory / tokenizer_file}"')
    else:
        lines.append(f"# tokenizer_path: {info['tokenizer']} (a tiktoken encoding; give the matching tokenizer)")
    lines += ["[model]", f"vocab_size = {info['vocab_size']}  # at least this many ids"]
    if split_tokens(manifest, "val"):
        lines.append(f'# evaluation data: dataset_path = "{split_dir(manifest, directory, "val")}", file_pattern = "*.npy"')
    return "\n".join(lines)


TARGET = Target(
    name="kempnerforge",
    stack="KempnerForge (MemoryMappedDataset)",
    formats=("npy",),
    boundaries=("eos", "both"),
    settings_text=_settings,
)
