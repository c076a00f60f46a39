"""modded-nanogpt (and llm.c): ``nanogpt-legacy`` shards (magic 20240520, version 1), uint16, BOS 50256.

Its ``_load_data_shard`` asserts the magic and version of the 256-int32 header
and reads uint16 tokens; its BOS-aligned batching looks for the id 50256,
hard-coded. So: format ``nanogpt-legacy``, BOS placement, uint16 only, and a
boundary id of 50256 (GPT-2's ``<|endoftext|>``). Its evaluation reads
``val_tokens`` (10,485,760 by default) from the val files, and stops when they
run out: a smaller val split is flagged. Its BOS-aligned train loader loads the
second train file before its first batch, so the train split is cut into two
files at least.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..manifest import Manifest
from .base import Target
from .settings_support import boundary_ids, split_dir, split_tokens

VAL_TOKENS = 10_485_760
"""``val_tokens`` of modded-nanogpt's hyperparameters: tokens read per evaluation."""


def _settings(manifest: Manifest, directory: Path) -> Iterator[str]:
    yield f'train_files = "{split_dir(manifest, directory, "train")}/*.bin"'
    if len(manifest.splits["train"].shards) < 2:
        yield (
            "# WARNING: train_files matches one file, and train_gpt.py's BOS-aligned loader loads the next one "
            "before its first batch ('generator raised StopIteration'): build from two documents or more "
            "(shardflow then cuts the train split into two files at least)"
        )
    val = split_tokens(manifest, "val")
    if val:
        yield f'val_files = "{split_dir(manifest, directory, "val")}/*.bin"'
        # Its val loader moves to the next file unless a batch and one more token fit in this one:
        # one evaluation of val_tokens from a single file needs val_tokens + 2 tokens.
        if val - 2 < VAL_TOKENS:
            yield (
                f"# WARNING: the val split holds {val:,} tokens; one evaluation of the default val_tokens "
                f"{VAL_TOKENS:,} reads {VAL_TOKENS + 2:,}: set val_tokens to a multiple of your validation batch "
                f"(world size x val_seq_len) of at most {val - 2:,}, or build with a larger --val-count/--val-fraction"
            )
        else:
            yield f"val_tokens = {VAL_TOKENS}  # the val split holds {val:,}"
    else:
        yield "# WARNING: no val split; build with --val-count or --val-fraction, modded-nanogpt evaluates on val_files"
    bos, _ = boundary_ids(manifest)
    yield f"# BOS {bos} is the document separator its BOS-aligned batches look for (hard-coded 50256)"
    yield f"# vocab_size: {manifest.tokenized_info['vocab_size']} ids; the model's embedding is padded to 50304"


TARGET = Target(
    name="modded-nanogpt", stack="modded-nanogpt (and llm.c)", formats=("nanogpt-legacy",), boundaries=("bos",),
    dtypes=("uint16",), boundary_id=50256,
    # Its loader drops each shard's tail after the last full global batch (8 x 64 x 1024 tokens at its
    # defaults): small inputs' own shards would lose too much (measured in bench/bench_shard_loss.py).
    gathers=True, train_files_at_least=2,
    settings_title="modded-nanogpt (train_gpt.py Hyperparameters)", settings_lines=_settings,
)
