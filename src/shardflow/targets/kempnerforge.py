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
    lines = header("KempnerForge (MemoryMappedDataset)", manifest)
    lines += [
        "[data]",
        f'dataset_path = "{split_dir(manifest, directory, "train")}"',
        'file_pattern = "*.npy"',
        f"vocab_size = {manifest.tokenized_info['vocab_size']}",
        f"eos_token_id = {eos}",
    ]
    if split_tokens(manifest, "val"):
        lines.append(f'# validation: dataset_path = "{split_dir(manifest, directory, "val")}", file_pattern = "*.npy"')
    return "\n".join(lines)


TARGET = Target(
    name="kempnerforge",
    stack="KempnerForge (MemoryMappedDataset)",
    formats=("npy",),
    boundaries=("eos", "both"),
    settings_text=_settings,
)
