"""The streaming dataset: exact splitting over (rank, worker), deterministic shuffles."""

from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.runtime import StreamingTokenDataset, TokenDataset
from shardflow.runtime.order import EpochOrder, rank_bounds

COMBOS = [  # (world_size, num_workers, block_size)
    (1, 1, 1),
    (2, 1, 1),
    (1, 3, 1),
    (2, 3, 4),
    (3, 5, 2),
    (4, 8, 1),
    (2, 64, 3),  # far more workers than shards and than blocks
    (7, 2, 5),
]


def read_all(ds: TokenDataset, world_size: int, num_workers: int, block_size: int, **kw) -> Counter:
    seen: Counter = Counter()
    for rank in range(world_size):
        for worker in range(num_workers):
            s = StreamingTokenDataset(
                ds, rank=rank, world_size=world_size, worker_id=worker, num_workers=num_workers, block_size=block_size, **kw
            )
            ids = list(s.indices())
            assert len(ids) == len(s)  # __len__ is this worker's share of the pass
            seen.update(ids)
    return seen


@pytest.mark.parametrize("ref,seq_len", [("wiki@v1", 256), ("one@v1", 512), ("one@v1", 30_000), ("wiki@v1", 19_000)])
@pytest.mark.parametrize("world_size,num_workers,block_size", COMBOS)
def test_every_sample_exactly_once(cat, ref, seq_len, world_size, num_workers, block_size):
    ds = TokenDataset(ref, seq_len=seq_len, catalog=cat.path)
    if len(ds) < world_size:
        with pytest.raises(ValueError, match="cannot be split over world_size"):
            StreamingTokenDataset(ds, world_size=world_size)
        return
    seen = read_all(ds, world_size, num_workers, block_size, seed=3)
    assert sorted(seen) == list(range(len(ds)))
    assert set(seen.values()) == {1}


@settings(max_examples=60, deadline=None)
@given(
    counts=st.lists(st.integers(min_value=0, max_value=40), min_size=1, max_size=12),
    world_size=st.integers(min_value=1, max_value=6),
    num_workers=st.integers(min_value=1, max_value=6),
    block_size=st.integers(min_value=1, max_value=7),
    group=st.integers(min_value=1, max_value=5),
    epoch=st.integers(min_value=0, max_value=3),
)
def test_split_is_a_partition_for_any_layout(counts, world_size, num_workers, block_size, group, epoch):
    """The splitting arithmetic alone, over arbitrary per-shard sample counts (empty shards included)."""
    offsets = np.concatenate(([0], np.cumsum(counts)))
    total = int(offsets[-1])
    order = EpochOrder(offsets, seed=1, epoch=epoch, shuffle=True, group=group)
    assert sorted(order(np.arange(total)).tolist()) == list(range(total))
    covered = []
    for r in range(world_size):
        lo, hi = rank_bounds(total, r, world_size, drop_last=False)
        n = hi - lo
        for w in range(num_workers):
            mine = [p for p in range(n) if (p // block_size) % num_workers == w]
            covered.extend(order(np.asarray(lo + np.array(mine, dtype=np.int64))).tolist())
    assert sorted(covered) == list(range(total))


def test_samples_are_the_datasets(cat):
    ds = TokenDataset("wiki@v1", seq_len=300, pack_sequences=True, catalog=cat.path)
    s = StreamingTokenDataset(ds, seed=5, world_size=2, rank=1)
    ids = list(s.indices())
    for sample, i in zip(s, ids):
        for key, value in ds[i].items():
            np.testing.assert_array_equal(sample[key], value)


def test_shuffle_is_deterministic_from_seed_and_epoch(cat):
    def order(**kw):
        s = StreamingTokenDataset("wiki@v1", seq_len=256, catalog=cat.path, **kw)
        return list(s.indices())

    first = order(seed=0)
    assert first == order(seed=0)  # a fresh object, same order
    assert first != order(seed=1)
    assert sorted(first) == list(range(len(first)))
    assert first != sorted(first)
    s = StreamingTokenDataset("wiki@v1", seq_len=256, catalog=cat.path, seed=0)
    s.set_epoch(1)
    second = list(s.indices())
    assert second != first and sorted(second) == sorted(first)
    assert order(seed=0, shuffle=False) == list(range(len(first)))


def test_shuffle_is_over_shards_and_over_samples(cat):
    ds = TokenDataset("wiki@v1", seq_len=256, catalog=cat.path)
    shard_of = np.searchsorted(ds.sample_offsets, np.arange(len(ds)), side="right") - 1
    firsts = set()
    for epoch in range(6):
        s = StreamingTokenDataset(ds, seed=0, shuffle_group=1)
        s.set_epoch(epoch)
        ids = np.array(list(s.indices()))
        shards = shard_of[ids]
        # With groups of one shard, each shard's samples come together, in a shuffled order...
        runs = shards[np.r_[True, shards[1:] != shards[:-1]]]
        assert sorted(runs.tolist()) == list(range(ds.num_shards))
        for k in range(ds.num_shards):
            within = ids[shards == k]
            assert sorted(within.tolist()) == list(range(ds.sample_offsets[k], ds.sample_offsets[k + 1]))
            if len(within) > 3:
                assert within.tolist() != sorted(within.tolist())
        firsts.add(int(runs[0]))
    assert len(firsts) > 1  # ...and the shard order changes with the epoch


def test_drop_last_gives_every_rank_the_same_count(cat):
    ds = TokenDataset("wiki@v1", seq_len=256, catalog=cat.path)
    n = len(ds)
    assert n % 3  # the test needs a remainder
    lengths = []
    seen: Counter = Counter()
    for r in range(3):
        s = StreamingTokenDataset(ds, rank=r, world_size=3, drop_last=True)
        ids = list(s.indices())
        lengths.append(len(ids))
        seen.update(ids)
    assert lengths == [n // 3] * 3
    assert set(seen.values()) == {1} and len(seen) == n - n % 3


def test_passes_run_epoch_after_epoch(cat):
    s = StreamingTokenDataset("one@v1", seq_len=4096, catalog=cat.path, seed=2)
    n = s.samples_per_epoch
    epoch0 = [x["input_ids"][:4].tolist() for x in s]
    assert len(epoch0) == n and s.epoch == 1 and s.position == n
    epoch1 = [x["input_ids"][:4].tolist() for x in s]
    assert len(epoch1) == n and s.epoch == 2
    assert sorted(epoch0) == sorted(epoch1) and epoch0 != epoch1
    inf = StreamingTokenDataset("one@v1", seq_len=4096, catalog=cat.path, seed=2, infinite=True)
    got = []
    for x in inf:
        got.append(x["input_ids"][:4].tolist())
        if len(got) == 2 * n:
            break
    assert got == epoch0 + epoch1
    with pytest.raises(TypeError, match="infinite"):
        len(inf)


def test_constructor_limits_are_explained(cat):
    ref = "wiki@v1"
    with pytest.raises(ValueError, match="rank=2 must be below world_size=2"):
        StreamingTokenDataset(ref, seq_len=64, rank=2, world_size=2, catalog=cat.path)
    with pytest.raises(ValueError, match="world_size must be at least 1"):
        StreamingTokenDataset(ref, seq_len=64, world_size=0, catalog=cat.path)
    with pytest.raises(ValueError, match="worker_id=3 must be below num_workers=3"):
        StreamingTokenDataset(ref, seq_len=64, worker_id=3, num_workers=3, catalog=cat.path)
    with pytest.raises(ValueError, match="seed must be at least 0"):
        StreamingTokenDataset(ref, seq_len=64, seed=-1, catalog=cat.path)
    with pytest.raises(ValueError, match="seq_len is required"):
        StreamingTokenDataset(ref, catalog=cat.path)
    ds = TokenDataset(ref, seq_len=64, catalog=cat.path)
    with pytest.raises(ValueError, match="differs from the given dataset"):
        StreamingTokenDataset(ds, seq_len=65)


def test_pickled_copies_are_small_and_read_the_same(cat):
    """What a spawn/forkserver DataLoader worker gets: no memory maps, no cached permutations."""
    import pickle

    s = StreamingTokenDataset("wiki@v1", seq_len=128, catalog=cat.path, seed=4, pack_sequences=True)
    before = [x["input_ids"].tobytes() for x in itertools.islice(s, 50)]
    assert any(v is not None for v in s.dataset.shards._views) and s._orders
    blob = pickle.dumps(s)
    assert len(blob) < 50_000
    copy = pickle.loads(blob)
    assert all(v is None for v in copy.dataset.shards._views) and not copy._orders
    assert copy.position == s.position == 50
    copy.load_state_dict(StreamingTokenDataset("wiki@v1", seq_len=128, catalog=cat.path, seed=4, pack_sequences=True).state_dict())
    assert [x["input_ids"].tobytes() for x in itertools.islice(copy, 50)] == before
