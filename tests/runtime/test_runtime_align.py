"""BOS alignment: samples start at document starts; long documents are cut, then skipped or continued."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.shards import BOS, document_shards, write_shards
from shardflow.reader import open_version
from shardflow.runtime import TokenDataset, aligned_starts

EOT = 100257


def reference_starts(doc_starts: list[int], n: int, seq_len: int, overflow: str) -> list[int]:
    """The obvious token-by-token walk (slow): the behaviour ``aligned_starts`` must have."""
    window = seq_len + 1
    is_start = np.zeros(n + 1, dtype=bool)
    is_start[doc_starts] = True
    doc_of = np.cumsum(is_start[:n]) - 1  # -1 before the first start
    lengths = {}
    for s, e in zip(doc_starts, doc_starts[1:] + [n]):
        lengths[s] = e - s
    out: list[int] = []
    p = doc_starts[0] if doc_starts else n
    while p + window <= n:
        out.append(p)
        q = p + seq_len
        if is_start[q]:
            p = q
            continue
        this_doc_start = doc_starts[doc_of[q]]
        if overflow == "continue" and lengths[this_doc_start] > window:
            p = q
            continue
        p = q
        while p < n and not is_start[p]:
            p += 1
        if p >= n:
            break
    return out


@settings(max_examples=150, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=80), min_size=0, max_size=30),
    head=st.integers(min_value=0, max_value=30),
    seq_len=st.integers(min_value=1, max_value=40),
    overflow=st.sampled_from(["skip", "continue"]),
)
def test_aligned_starts_match_the_reference(lengths, head, seq_len, overflow):
    # ``head`` tokens continue a document from the previous shard (no index entry).
    doc_starts = (head + np.concatenate(([0], np.cumsum(lengths)[:-1]))).tolist() if lengths else []
    n = head + sum(lengths)
    got = aligned_starts(np.asarray(doc_starts, dtype=np.int64), n, seq_len, overflow).tolist()
    assert got == reference_starts(doc_starts, n, seq_len, overflow)
    # Invariants: in the shard, ascending, no (input, label) pair used twice.
    assert all(s + seq_len + 1 <= n for s in got)
    assert all(b - a >= seq_len for a, b in zip(got, got[1:]))
    if overflow == "skip":
        assert set(got) <= set(doc_starts)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    lengths=st.lists(st.integers(min_value=1, max_value=90), min_size=1, max_size=30),
    shard_tokens=st.integers(min_value=20, max_value=300),
    seq_len=st.integers(min_value=1, max_value=40),
)
def test_aligned_samples_start_with_bos(lengths, shard_tokens, seq_len):
    shards, starts = document_shards(lengths, shard_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        write_shards(Path(tmp), shards, starts=starts)
        try:
            ds = TokenDataset(tmp, seq_len=seq_len, align_to_bos=True)
        except ValueError:
            return
        for i in range(len(ds)):
            assert ds[i]["input_ids"][0] == BOS


@pytest.mark.slow
@pytest.mark.parametrize("seq_len", [256, 1024, 4096])
def test_real_version_every_sample_starts_with_bos(cat, seq_len):
    ds = TokenDataset("wiki@v1", seq_len=seq_len, align_to_bos=True, catalog=cat.path)
    split = open_version("wiki@v1", catalog=cat.path).split("train")
    doc_starts = set(split.doc_starts.tolist())
    prev = None
    for i in range(len(ds)):
        item = ds[i]
        assert item["input_ids"][0] == EOT
        k, start = ds.locate(i)
        assert int(split.shard_offsets[k]) + start in doc_starts
        if prev is not None and prev[0] == k:
            assert start - prev[1] >= seq_len  # at most the boundary label is shared
        prev = (k, start)


@pytest.mark.slow
def test_real_version_eos_placement(cat):
    ds = TokenDataset("eos@v1", seq_len=512, align_to_bos=True, catalog=cat.path)
    for i in range(len(ds)):
        k, start = ds.locate(i)
        shard = ds.shards.shard(k)
        assert start == 0 and k == 0 or shard[start - 1] == EOT  # right after an EOS


def test_continue_keeps_long_documents(cat):
    seq_len = 1024
    skip = TokenDataset("one@v1", seq_len=seq_len, align_to_bos=True, catalog=cat.path)
    cont = TokenDataset("one@v1", seq_len=seq_len, align_to_bos=True, overflow="continue", catalog=cat.path)
    assert len(cont) > len(skip)
    starts = cont.shards.doc_starts(0)
    lengths = dict(zip(starts.tolist(), np.diff(np.append(starts, cont.shards.tokens[0])).tolist()))
    covered = 0
    for i in range(len(cont)):
        _, start = cont.locate(i)
        if start in lengths:
            assert cont[i]["input_ids"][0] == EOT
        else:
            # A continuation: it carries on from the previous sample inside a document longer than a window.
            _, prev = cont.locate(i - 1)
            assert start == prev + seq_len
            doc = int(starts[np.searchsorted(starts, start, side="right") - 1])
            assert lengths[doc] > seq_len + 1
            covered += 1
    assert covered > 0
    # With "skip" no sample starts inside a document.
    assert all(skip.locate(i)[1] in lengths for i in range(len(skip)))


def test_align_and_pack_together(cat):
    ds = TokenDataset("wiki@v1", seq_len=4096, align_to_bos=True, pack_sequences=True, catalog=cat.path)
    for i in range(len(ds)):
        item = ds[i]
        assert item["position_ids"][0] == 0 and item["doc_ids"][0] == 0
        assert item["input_ids"][0] == EOT
        # Every segment of the inputs begins with BOS.
        assert (item["input_ids"][item["cu_seqlens"][:-1]] == EOT).all()


def test_align_needs_a_window_after_a_document_start(tmp_path):
    # One shard of 10 tokens whose only document starts at 5 (the first 5 continue an earlier one).
    write_shards(tmp_path, [np.full(10, 100, dtype=np.uint32)], starts=[np.array([5])])
    assert len(TokenDataset(tmp_path, seq_len=8)) == 1
    with pytest.raises(ValueError, match="document start early enough"):
        TokenDataset(tmp_path, seq_len=8, align_to_bos=True)
