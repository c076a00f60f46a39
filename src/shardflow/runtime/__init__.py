"""Training-side runtime: pre-tokenized shards fed to a training loop, exactly and fast.

    from shardflow.runtime import TokenDataset, StreamingTokenDataset, MixtureDataset

    ds = TokenDataset("wikitext@latest", split="train", seq_len=1024)           # map-style
    it = StreamingTokenDataset("wikitext@latest", split="train", seq_len=1024,  # epochs, ranks, workers
                               rank=0, world_size=1, seed=0, shuffle=True)
    mix = MixtureDataset({"a@latest": 0.7, "b@latest": 0.3}, split="train", seq_len=1024, seed=0)
    it = StreamingTokenDataset("s3://bucket/data/wikitext/v3", seq_len=1024,   # object storage, through a
                               cache_limit_bytes=50 << 30)                      # verified local cache

A version on object storage (a version URL, or ``catalog="s3://..."``) is
read through a local cache (``shardflow.runtime.remote``; the streaming
reader's prefetching and eviction: ``shardflow.runtime.prefetch``).

The core needs numpy, the standard library and PyYAML only. The PyTorch
adapters (``TorchTokenDataset``, ``TorchStreamingDataset``, ``StreamingLoader``,
``torch_collate``) live in ``shardflow.runtime.torch_adapters`` and are loaded
on first access from here, so ``import shardflow.runtime`` never imports torch.
See ``docs/RUNTIME.md``.
"""

from __future__ import annotations

from typing import Any

from .dataset import TokenDataset, aligned_starts
from .inspect import inspect_version
from .mixture import MixtureDataset
from .options import ReadOptions
from .packing import IGNORE_INDEX, collate, pack_fields
from .sampler import ShardSampler
from .shards import ShardInfo, ShardSet, open_shards
from .streaming import SampleStream, StreamingTokenDataset

__all__ = [
    "TokenDataset",
    "StreamingTokenDataset",
    "MixtureDataset",
    "ShardSampler",
    "ReadOptions",
    "EmbeddingStore",
    "SampleStream",
    "ShardSet",
    "ShardInfo",
    "open_shards",
    "aligned_starts",
    "pack_fields",
    "collate",
    "IGNORE_INDEX",
    "inspect_version",
]
# Not in __all__, so that ``from shardflow.runtime import *`` does not import torch.

_TORCH_NAMES = {"TorchTokenDataset", "TorchStreamingDataset", "StreamingLoader", "torch_collate"}


def __getattr__(name: str) -> Any:
    # The PyTorch adapters import torch; load them only when asked for.
    if name == "EmbeddingStore":  # needs ml_dtypes (fp8 codecs); the token readers do not
        from .embedding_store import EmbeddingStore

        return EmbeddingStore
    if name in _TORCH_NAMES:
        from . import torch_adapters

        return getattr(torch_adapters, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
