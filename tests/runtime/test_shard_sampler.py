"""``ShardSampler``: a ``DistributedSampler`` for ``TokenDataset`` whose ranks each read about their share of the shards.

What these show, on 96 synthetic shards of uneven sizes: every rank yields the same
number of indices (``ceil(n / world_size)``, or ``n // world_size`` with ``drop_last``),
together they cover every sample (the padding repeats samples only past the epoch's
end), the order depends on ``(seed, epoch)`` alone; and the shards a rank touches
weigh at most 1.5 times its share of the split plus one shuffle group, where
PyTorch's round-robin dealing touches nearly all of them. On a bucket, the sampler
has the next shards of its order fetched ahead, on its own thread.
"""

from __future__ import annotations

import numpy as np
import pytest

from shardflow.runtime import ShardSampler, TokenDataset
from support.shards import counting_shards, write_shards

SEQ = 63  # windows of 64 tokens
GROUP = 4


@pytest.fixture(scope="module")
def dataset(tmp_path_factory: pytest.TempPathFactory) -> TokenDataset:
    sizes = [64 * int(n) for n in np.random.default_rng(1).integers(20, 60, size=96)]
    directory = tmp_path_factory.mktemp("sampler")
    write_shards(directory, counting_shards(sizes))
    return TokenDataset(directory, seq_len=SEQ)


def touched_bytes(ds: TokenDataset, ids: list[int]) -> int:
    shards = np.unique(np.searchsorted(ds.sample_offsets, ids, side="right") - 1)
    return int(ds.shards.tokens[shards].sum()) * 4


@pytest.mark.parametrize("world", [1, 3, 4, 7])
def test_ranks_cover_the_epoch_with_equal_lengths(dataset, world):
    n = len(dataset)
    got = [list(ShardSampler(dataset, rank=r, world_size=world, seed=3)) for r in range(world)]
    assert {len(g) for g in got} == {-(-n // world)} == {len(ShardSampler(dataset, rank=0, world_size=world))}
    flat = [i for g in got for i in g]
    assert sorted(set(flat)) == list(range(n))  # every sample, and only repeats past the epoch's end
    assert len(flat) - n == -(-n // world) * world - n
    dropped = [list(ShardSampler(dataset, rank=r, world_size=world, seed=3, drop_last=True)) for r in range(world)]
    assert {len(d) for d in dropped} == {n // world}
    assert len({i for d in dropped for i in d}) == n // world * world  # no sample twice


def test_the_order_is_a_function_of_seed_and_epoch(dataset):
    a = ShardSampler(dataset, rank=1, world_size=4, seed=5)
    b = ShardSampler(dataset, rank=1, world_size=4, seed=5)
    first = list(a)
    assert first == list(b)
    a.set_epoch(1)
    second = list(a)
    assert second != first and sorted(second) != sorted(first)  # another order, and other shards for rank 1
    assert list(ShardSampler(dataset, rank=1, world_size=4, seed=5, shuffle=False)) == list(range(len(first), 2 * len(first)))
    with pytest.raises(ValueError, match=r"rank=4, world_size=4: need 0 <= rank < world_size"):
        ShardSampler(dataset, rank=4, world_size=4)


@pytest.mark.parametrize("world", [4, 8])
def test_a_rank_touches_its_share_of_the_shards_round_robin_touches_them_all(dataset, world):
    total = int(dataset.shards.tokens.sum()) * 4
    group = int(np.sort(dataset.shards.tokens)[-GROUP:].sum()) * 4  # the largest shuffle group
    perm = np.random.default_rng(0).permutation(len(dataset))
    for epoch in range(3):
        for r in range(world):
            sampler = ShardSampler(dataset, rank=r, world_size=world, seed=9, shuffle_group=GROUP)
            sampler.set_epoch(epoch)
            assert touched_bytes(dataset, list(sampler)) <= 1.5 * total / world + group
    # DistributedSampler's dealing (a permutation, indices[rank::world]) touches nearly every shard on each rank.
    assert touched_bytes(dataset, perm[0::world].tolist()) > 0.9 * total


def test_a_torch_dataloader_reads_the_samplers_indices(dataset):
    torch = pytest.importorskip("torch")
    from shardflow.runtime import TorchTokenDataset

    sampler = ShardSampler(dataset, rank=2, world_size=4, seed=1)
    loader = torch.utils.data.DataLoader(TorchTokenDataset(dataset), batch_size=5, sampler=sampler)
    got = torch.cat([b["input_ids"][:, 0] for b in loader]).tolist()
    # counting shards: a window's first token is its split-wide position
    assert got == [dataset.locate(i)[1] + int(dataset.shards.offsets[dataset.locate(i)[0]]) for i in sampler]
