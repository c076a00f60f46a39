"""OLMo-core numpy datasets: headerless token files read with a given dtype; documents found by the EOS id.

``NumpyFSLDataset`` (``NumpyFSLDatasetConfig``; and the document-aware variants) memory-map each path
with the configured dtype (``NumpyDatasetDType``) and find document
boundaries by searching for ``eos_token_id``. A ``.npy`` file's 128-byte
header would be read as tokens, so: format ``bin``, EOS placement (or both),
and the settings name the dtype and the split's shards by one glob:
``expand_glob=True`` makes ``NumpyDatasetConfig`` expand each path with
``deterministic_glob_directory`` (sorted, so in manifest order: the shard
names are zero-padded), and a version of tens of thousands of shards stays a
one-line setting. (Checked against ai2-olmo-core 3.0.0's
``olmo_core/data/numpy_dataset.py``; ``NumpyDatasetConfig`` had the same
``expand_glob`` field in 1.x.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..manifest import Manifest
from .base import Target
from .settings_support import boundary_ids, split_dir, split_tokens


def _settings(manifest: Manifest, directory: Path) -> Iterator[str]:
    bos, eos = boundary_ids(manifest)
    yield "NumpyFSLDatasetConfig("
    yield f'    paths=["{split_dir(manifest, directory, "train")}/*.bin"],'
    yield f"    expand_glob=True,  # {len(manifest.splits['train'].shards)} shards, sorted: manifest order"
    yield f"    dtype=NumpyDatasetDType.{manifest.dtype},"
    yield "    sequence_length=2048,  # your sequence length"
    yield (
        f"    tokenizer=TokenizerConfig(vocab_size={manifest.tokenized_info['vocab_size']}, "
        f"eos_token_id={eos}, pad_token_id={eos}, bos_token_id={bos}),"
    )
    yield ")"
    if split_tokens(manifest, "val"):
        yield f'# val shards (an evaluator\'s paths, expand_glob=True): "{split_dir(manifest, directory, "val")}/*.bin"'


TARGET = Target(
    name="olmo-core", stack="OLMo-core (numpy datasets)", formats=("bin",), boundaries=("eos", "both"),
    globs_split_dir=False,
    settings_title="OLMo-core (NumpyFSLDatasetConfig; NumpyDatasetConfig in older releases)", settings_lines=_settings,
)
