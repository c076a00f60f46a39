"""NeMo Automodel ``NanogptDataset``: ``nanogpt`` shards (magic 278895051) with their ``.bos.idx``, BOS placement.

It reads the header magic 278895051 (and modded-nanogpt's 20240520), the
dtype from the header, and uses the ``.bos.idx`` beside a shard when
``align_to_bos`` is on. With EOS placement its index path and its linear
search path give different samples, so the target keeps BOS placement.

Its BOS alignment starts a sample at a BOS ``s`` only if ``s + seq_len + 1``
tokens fit before the shard's end (the input and the shifted label);
shardflow's runtime matches it with ``align_rule="nemo"`` (see RUNTIME.md).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..manifest import Manifest
from .base import Target
from .settings_support import boundary_ids, split_dir, split_tokens


def _settings(manifest: Manifest, directory: Path) -> Iterator[str]:
    bos, _ = boundary_ids(manifest)
    yield from [
        "dataset:",
        "  _target_: nemo_automodel.components.datasets.llm.nanogpt_dataset.NanogptDataset",
        f'  file_pattern: "{split_dir(manifest, directory, "train")}/*.bin"',
        "  seq_len: 1024  # your sequence length",
        f"  bos_token: {bos}",
        "  align_to_bos: true",
    ]
    if split_tokens(manifest, "val"):
        yield from [
            "validation_dataset:",
            "  _target_: nemo_automodel.components.datasets.llm.nanogpt_dataset.NanogptDataset",
            f'  file_pattern: "{split_dir(manifest, directory, "val")}/*.bin"',
            "  seq_len: 1024",
            f"  bos_token: {bos}",
            "  align_to_bos: true",
        ]
    yield f"# model vocab_size >= {manifest.tokenized_info['vocab_size']}"


TARGET = Target(
    name="nemo", stack="NeMo Automodel (NanogptDataset)", formats=("nanogpt", "nanogpt-legacy"), boundaries=("bos",),
    settings_title="NeMo Automodel (NanogptDataset)", settings_lines=_settings,
)
