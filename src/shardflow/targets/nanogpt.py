"""nanoGPT ``train.py``: ``train.bin`` and ``val.bin`` in one data directory, headerless uint16, EOS after each document.

Its ``get_batch`` memory-maps ``os.path.join(data_dir, 'train.bin')`` with
``dtype=np.uint16``; its ``prepare.py`` appends the EOT token after each
document. So: format ``bin``, EOS placement, uint16 only, and one file per
split named ``train.bin`` / ``val.bin`` at the top of the version directory
(the data directory), however many tokens a split holds (OpenWebText's
train.bin has about 9 B): ``bin`` has no token count to overflow, and the
``.bos.idx`` beside each (ours; nanoGPT ignores it) has int64 entries past
2**31 - 1 tokens.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..manifest import Manifest
from .base import Target
from .settings_support import split_tokens


BLOCK_SIZE = 1024
"""``block_size`` of train.py's defaults: the context length of each sampled sequence."""


def _file_name(name: str, split: str, index: int, extension: str) -> str:
    # One shard per split: shard_tokens is "unlimited" for bin (a train.bin of more than 2**31 - 1
    # tokens gets an int64 .bos.idx), so there is never a shard 1.
    assert index == 0, f"--target nanogpt writes one {split}.{extension}; shard {index} cannot exist"
    return f"{split}.{extension}"


def _settings(manifest: Manifest, directory: Path) -> Iterator[str]:
    yield "# data_dir = os.path.join('data', dataset): link the version directory there, e.g."
    yield f"#   ln -s {directory} data/{manifest.name}"
    yield f"dataset = '{manifest.name}'"
    yield f"# reads {directory / 'train.bin'} and {directory / 'val.bin'} as np.uint16"
    if not split_tokens(manifest, "val"):
        yield "# WARNING: no val split; train.py's estimate_loss reads val.bin: build with --val-count or --val-fraction"
    for split in ("train", "val"):
        # get_batch draws torch.randint(len(data) - block_size, ...): a split needs more than block_size tokens.
        if 0 < (n := split_tokens(manifest, split)) <= BLOCK_SIZE:
            yield (
                f"# WARNING: {split}.bin holds {n:,} tokens, and get_batch reads block_size + 1 of them "
                f"(block_size {BLOCK_SIZE} by default): set block_size below {n:,}, or build a larger {split} split"
            )
    yield (
        f"# no meta.pkl: train.py uses vocab_size 50304 (GPT-2's 50257 padded); the version has "
        f"{manifest.tokenized_info['vocab_size']} ids"
    )


TARGET = Target(
    name="nanogpt", stack="nanoGPT (train.py)", formats=("bin",), boundaries=("eos",), dtypes=("uint16",),
    one_file_per_split=True, file_name=_file_name,
    settings_title="nanoGPT (train.py)", settings_lines=_settings,
)
