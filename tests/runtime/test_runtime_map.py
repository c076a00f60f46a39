"""The map-style dataset: KempnerForge windows, per shard, located by binary search."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.shards import counting_shards, write_shards
from shardflow.reader import open_version
from shardflow.runtime import TokenDataset


def reference_windows(sizes: list[int], seq_len: int) -> list[tuple[int, int]]:
    """(shard, start) of every window, the slow obvious way."""
    out = []
    for k, n in enumerate(sizes):
        start = 0
        while start + seq_len + 1 <= n:
            out.append((k, start))
            start += seq_len + 1
    return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=300), min_size=1, max_size=7),
    seq_len=st.integers(min_value=1, max_value=120),
    fmt=st.sampled_from(["nanogpt", "npy", "bin"]),
)
def test_windows_match_the_reference(sizes, seq_len, fmt):
    expected = reference_windows(sizes, seq_len)
    with tempfile.TemporaryDirectory() as tmp:
        write_shards(Path(tmp), counting_shards(sizes), format=fmt, dtype="uint32")
        opts = {"dtype": "uint32"} if fmt == "bin" else {}
        if not expected:
            with pytest.raises(ValueError, match="yields no sample"):
                TokenDataset(tmp, seq_len=seq_len, **opts)
            return
        ds = TokenDataset(tmp, seq_len=seq_len, **opts)
        assert len(ds) == len(expected)
        offsets = np.concatenate(([0], np.cumsum(sizes)))
        used = np.zeros(int(offsets[-1]), dtype=bool)
        for i, (k, start) in enumerate(expected):
            item = ds[i]
            g = offsets[k] + start  # counting shards: the token is its split-wide position
            np.testing.assert_array_equal(item["input_ids"], np.arange(g, g + seq_len))
            np.testing.assert_array_equal(item["labels"], np.arange(g + 1, g + seq_len + 1))
            assert ds.locate(i) == (k, start)
            assert not used[g : g + seq_len + 1].any()  # windows never overlap
            used[g : g + seq_len + 1] = True
        # Windows never cross shards, and only each shard's tail (< one window) is unused.
        for k, n in enumerate(sizes):
            assert not used[offsets[k] : offsets[k + 1]][n - n % (seq_len + 1) :].any()
        for bad in (len(ds), -len(ds) - 1, 10**12):
            with pytest.raises(IndexError, match="out of range"):
                ds[bad]
        np.testing.assert_array_equal(ds[-1]["input_ids"], ds[len(ds) - 1]["input_ids"])


def test_real_version_windows(cat):
    ds = TokenDataset("wiki@v1", seq_len=1000, catalog=cat.path)
    split = open_version("wiki@v1", catalog=cat.path).split("train")
    sizes = [s.tokens for s in split.entry.shards]
    assert len(ds) == sum(n // 1001 for n in sizes)
    for i in (0, 1, len(ds) // 2, len(ds) - 1):
        k, start = ds.locate(i)
        g = int(split.shard_offsets[k]) + start
        expected = split.tokens(g, g + 1001).astype(np.int64)
        item = ds[i]
        np.testing.assert_array_equal(item["input_ids"], expected[:-1])
        np.testing.assert_array_equal(item["labels"], expected[1:])
        assert item["input_ids"].dtype == np.int64 and item["labels"].dtype == np.int64
        assert set(item) == {"input_ids", "labels"}


def test_items_are_independent_copies(cat):
    ds = TokenDataset("wiki@latest", seq_len=64, catalog=cat.path)
    item = ds[3]
    before = item["input_ids"].copy()
    item["labels"][:] = -100  # a training loop masking labels must not corrupt the inputs
    np.testing.assert_array_equal(item["input_ids"], before)
    np.testing.assert_array_equal(ds[3]["input_ids"], before)
    assert item["input_ids"].flags.writeable
    assert not ds.window(3).flags.writeable  # the raw view is read-only


def test_numpy_integer_indices_and_bad_types(cat):
    ds = TokenDataset("wiki@latest", seq_len=64, catalog=cat.path)
    np.testing.assert_array_equal(ds[np.int64(5)]["input_ids"], ds[5]["input_ids"])
    with pytest.raises(TypeError):
        ds[1.0]


def test_constructor_limits_are_explained(cat):
    with pytest.raises(ValueError, match="seq_len must be at least 1"):
        TokenDataset("wiki@latest", seq_len=0, catalog=cat.path)
    with pytest.raises(ValueError, match="seq_len must be an integer"):
        TokenDataset("wiki@latest", seq_len=True, catalog=cat.path)
    with pytest.raises(ValueError, match="overflow='continue' only applies with align_to_bos=True"):
        TokenDataset("wiki@latest", seq_len=64, overflow="continue", catalog=cat.path)
    # Shards hold whole documents, so the largest is under the 30,000-token bound: a window of it plus one
    # token fits nowhere, and the message names that shard's size; a window of exactly its size fits.
    largest = max(s.tokens for s in open_version("wiki@v2", catalog=cat.path).split("train").entry.shards)
    assert 20_000 < largest < 30_000
    with pytest.raises(ValueError, match=rf"seq_len={largest} needs windows of {largest + 1} tokens.*"
                                         rf"largest shard has {largest} tokens"):
        TokenDataset("wiki@v2", seq_len=largest, catalog=cat.path)
    assert len(TokenDataset("wiki@v2", seq_len=largest - 1, catalog=cat.path)) == 1
    with pytest.raises(TypeError):
        TokenDataset("wiki@latest", 64, catalog=cat.path)  # keyword-only


def test_uint16_and_npy_versions(cat):
    small = TokenDataset("small@latest", seq_len=256, catalog=cat.path)
    assert small.shards.dtype == np.dtype("<u2") and small.shards.format.name == "nanogpt-legacy"
    assert int(small[0]["input_ids"][0]) == 5000  # the small vocabulary's <|endoftext|> opens document 0
    npy = TokenDataset("npy@latest", seq_len=256, catalog=cat.path)
    wiki = open_version("one@latest", catalog=cat.path).split("train")
    np.testing.assert_array_equal(npy[0]["input_ids"], wiki.tokens(0, 256).astype(np.int64))
