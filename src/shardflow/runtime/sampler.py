"""A distributed sampler for ``TokenDataset`` that keeps each rank's reads on its share of the shards.

    ds = TokenDataset("wiki@latest", catalog="s3://bucket/catalog", seq_len=1024)
    sampler = ShardSampler(ds, rank=rank, world_size=world_size, seed=0)
    loader = DataLoader(TorchTokenDataset(ds), batch_size=8, sampler=sampler)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        ...

PyTorch's ``DistributedSampler`` permutes all samples and deals them out
round-robin (``indices[rank::world_size]``), so every rank touches nearly every
shard: from a bucket, every node downloads the whole split (docs/SCALE.md,
"What each node downloads"). ``ShardSampler`` uses the streaming reader's epoch
order instead (``shardflow.runtime.order.EpochOrder``: shards permuted, samples
shuffled within groups of ``shuffle_group`` shards) and gives each rank a
contiguous range of it, so a rank reads about ``1/world_size`` of the shards
plus the groups at its range's two ends. It has ``DistributedSampler``'s
interface and length rule: every rank yields the same number of indices,
``ceil(n / world_size)`` (the last ones taken again from the epoch's start), or
``n // world_size`` with ``drop_last``. The order is a function of ``(seed,
epoch)`` alone. On a bucket it also has the next ``READAHEAD_SHARDS`` shards of
its order fetched into the cache ahead of the one being read (in the process
that iterates it: the DataLoader's main process, whose workers then find them
cached).
"""

from __future__ import annotations

from typing import Any, Iterator

import numpy as np

from .dataset import TokenDataset
from .order import EpochOrder
from .prefetch import READAHEAD_SHARDS, Readahead
from .remote import RemoteShardSet

__all__ = ["ShardSampler"]

_CHUNK = 1 << 16
"""Positions resolved per numpy call while iterating (bounded memory whatever the epoch's size)."""


class ShardSampler:
    """Sample indices of ``dataset`` (a ``TokenDataset``, or the ``TorchTokenDataset`` over one) for ``rank`` of
    ``world_size``, shard-local (see the module docstring)."""

    def __init__(self, dataset: Any, *, rank: int = 0, world_size: int = 1, seed: int = 0, shuffle: bool = True,
                 shuffle_group: int = 8, drop_last: bool = False, readahead: int = READAHEAD_SHARDS) -> None:
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank={rank}, world_size={world_size}: need 0 <= rank < world_size")
        if shuffle_group < 1:
            raise ValueError(f"shuffle_group={shuffle_group}: at least 1")
        dataset = dataset if isinstance(dataset, TokenDataset) else getattr(dataset, "dataset", dataset)
        if not isinstance(dataset, TokenDataset):
            raise TypeError(f"ShardSampler reads a TokenDataset (or a TorchTokenDataset), not {type(dataset).__name__}")
        self.dataset: TokenDataset = dataset
        self.rank, self.world_size, self.seed = rank, world_size, seed
        self.shuffle, self.shuffle_group, self.drop_last = shuffle, shuffle_group, drop_last
        self.readahead = readahead
        self.epoch = 0
        n = len(dataset)
        self.num_samples = n // world_size if drop_last else -(-n // world_size)
        """Indices each rank yields per epoch (the same for every rank, as ``DistributedSampler``)."""

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples

    def positions(self) -> np.ndarray:
        """This rank's positions in the epoch's order (int64; past the epoch's end they wrap to its start)."""
        n = len(self.dataset)
        lo = self.rank * self.num_samples
        return np.arange(lo, lo + self.num_samples, dtype=np.int64) % max(n, 1)

    def __iter__(self) -> Iterator[int]:
        ds = self.dataset
        order = EpochOrder(ds.sample_offsets, seed=self.seed, epoch=self.epoch, shuffle=self.shuffle, group=self.shuffle_group)
        positions = self.positions()
        ahead = None
        if isinstance(ds.shards, RemoteShardSet) and self.readahead > 0:
            ahead = Readahead(ds.shards, self._shard_order(order, positions), depth=self.readahead)
        try:
            for a in range(0, len(positions), _CHUNK):
                ids = order(positions[a : a + _CHUNK])
                if ahead is None:
                    yield from ids.tolist()
                    continue
                shards = (np.searchsorted(ds.sample_offsets, ids, side="right") - 1).tolist()
                for i, k in zip(ids.tolist(), shards):
                    ahead.reached(k)
                    yield i
        finally:
            if ahead is not None:
                ahead.close()

    def _shard_order(self, order: EpochOrder, positions: np.ndarray) -> list[int]:
        """The shards of this rank's samples, in order of first use."""
        seen: dict[int, None] = {}
        for a in range(0, len(positions), _CHUNK):
            ks = np.searchsorted(self.dataset.sample_offsets, order(positions[a : a + _CHUNK]), side="right") - 1
            uniq, first = np.unique(ks, return_index=True)
            for k in uniq[np.argsort(first)].tolist():
                seen.setdefault(k, None)
        return list(seen)
