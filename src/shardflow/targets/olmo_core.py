"""OLMo-core numpy datasets: headerless token files read with a given dtype; documents found by the EOS id.

``NumpyFSLDataset`` (``NumpyFSLDatasetConfig``; and the document-aware variants) memory-map each path
with the configured dtype (``NumpyDatasetDType``) and find document
boundaries by searching for ``eos_token_id``. A ``.npy`` file's 128-byte
header would be read as tokens, so: format ``bin``, EOS placement (or both),
and the settings name every shard path and the dtype.
"""

from __future__ import annotations

from pathlib import Path

from ..manifest import Manifest
from .base import Target
from .settings_support import boundary_ids, header


def _settings(manifest: Manifest, directory: Path) -> str:
    bos, eos = boundary_ids(manifest)
    lines = header("OLMo-core (NumpyFSLDatasetConfig; NumpyDatasetConfig in older releases)", manifest)
    lines.append("NumpyFSLDatasetConfig(")
    lines.append("    paths=[")
    lines += [f'        "{directory / s.file}",' for s in manifest.splits["train"].shards]
    lines.append("    ],")
    lines.append(f"    dtype=NumpyDatasetDType.{manifest.dtype},")
    lines.append("    sequence_length=2048,  # your sequence length")
    lines.append(
        f"    tokenizer=TokenizerConfig(vocab_size={manifest.tokenized_info['vocab_size']}, "
        f"eos_token_id={eos}, pad_token_id={eos}, bos_token_id={bos}),"
    )
    lines.append(")")
    if "val" in manifest.splits and manifest.splits["val"].shards:
        lines.append("# val shards (an evaluator's paths):")
        lines += [f"#   {directory / s.file}" for s in manifest.splits["val"].shards]
    return "\n".join(lines)


TARGET = Target(
    name="olmo-core",
    stack="OLMo-core (numpy datasets)",
    formats=("bin",),
    boundaries=("eos", "both"),
    globs_split_dir=False,
    settings_text=_settings,
)
