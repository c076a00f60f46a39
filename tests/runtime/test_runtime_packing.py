"""Packing: document ids, cross-document label masking, restarting positions and cu_seqlens."""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.shards import BOS, document_shards, write_shards
from shardflow.reader import open_version
from shardflow.runtime import TokenDataset, collate

EOT = 100257  # cl100k's <|endoftext|>, the boundary token of the built versions


def check_packed_item(item: dict, docidx: np.ndarray) -> None:
    """``docidx``: the split-wide document number of each of the window's seq_len + 1 tokens."""
    seq_len = len(item["input_ids"])
    changes = docidx[1:] != docidx[:-1]
    np.testing.assert_array_equal(item["labels"] == -100, changes)
    np.testing.assert_array_equal(item["doc_ids"], docidx[:-1] - docidx[0])
    inputs = docidx[:-1]
    first = {d: int(np.argmax(inputs == d)) for d in np.unique(inputs).tolist()}
    np.testing.assert_array_equal(item["position_ids"], np.arange(seq_len) - np.array([first[d] for d in inputs.tolist()]))
    assert item["cu_seqlens"].dtype == np.int32
    np.testing.assert_array_equal(item["cu_seqlens"], sorted(first.values()) + [seq_len])
    np.testing.assert_array_equal(item["position_ids"] == 0, np.isin(np.arange(seq_len), item["cu_seqlens"][:-1]))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    doc_lengths=st.lists(st.integers(min_value=1, max_value=60), min_size=1, max_size=40),
    shard_tokens=st.integers(min_value=5, max_value=200),
    seq_len=st.integers(min_value=1, max_value=50),
    placement=st.sampled_from(["bos", "eos"]),
    align=st.booleans(),
)
def test_packing_matches_the_document_structure(doc_lengths, shard_tokens, seq_len, placement, align):
    shards, starts = document_shards(doc_lengths, shard_tokens, placement=placement)
    doc_starts = np.concatenate(([0], np.cumsum(doc_lengths)[:-1]))
    with tempfile.TemporaryDirectory() as tmp:
        write_shards(Path(tmp), shards, starts=starts)
        try:
            ds = TokenDataset(tmp, seq_len=seq_len, pack_sequences=True, align_to_bos=align)
        except ValueError as exc:
            assert "yields no sample" in str(exc)
            return
        for i in range(len(ds)):
            k, start = ds.locate(i)
            g = k * shard_tokens + start
            docidx = np.searchsorted(doc_starts, np.arange(g, g + seq_len + 1), side="right") - 1
            item = ds[i]
            check_packed_item(item, docidx)
            # The last token of a document never predicts the next document's first token.
            last_of_doc = np.isin(np.arange(g, g + seq_len) + 1, doc_starts)
            assert (item["labels"][last_of_doc] == -100).all()


@pytest.mark.parametrize("name", ["wiki@v1", "eos@v1"])
def test_real_versions(cat, name):
    ds = TokenDataset(name, seq_len=512, pack_sequences=True, catalog=cat.path)
    plain = TokenDataset(name, seq_len=512, catalog=cat.path)
    split = open_version(name, catalog=cat.path).split("train")
    placement = split.version.manifest.boundary["placement"]
    starts = split.doc_starts
    masked = 0
    for i in range(0, len(ds), 3):
        item = ds[i]
        k, start = ds.locate(i)
        g = int(split.shard_offsets[k]) + start
        docidx = np.searchsorted(starts, np.arange(g, g + 513), side="right") - 1
        check_packed_item(item, docidx)
        np.testing.assert_array_equal(item["input_ids"], plain[i]["input_ids"])
        keep = item["labels"] != -100
        np.testing.assert_array_equal(item["labels"][keep], plain[i]["labels"][keep])
        if placement == "bos":
            # BOS opens every document: no kept label is a BOS.
            assert not (item["labels"][keep] == EOT).any()
        else:
            # EOS closes every document: what follows an EOS is never a target...
            assert (item["labels"][item["input_ids"] == EOT] == -100).all()
            # ...but predicting the EOS itself is (the model learns to stop).
            assert (item["labels"] == EOT).sum() == ((plain[i]["labels"] == EOT)).sum()
        masked += int((~keep).sum())
    assert masked > 0


def test_collate_flattens_cu_seqlens(cat):
    ds = TokenDataset("wiki@v1", seq_len=2048, pack_sequences=True, catalog=cat.path)
    samples = [ds[i] for i in range(4)]
    batch = collate(samples)
    assert batch["input_ids"].shape == (4, 2048) and batch["position_ids"].shape == (4, 2048)
    cu = batch["cu_seqlens"]
    assert cu.dtype == np.int32 and cu[0] == 0 and cu[-1] == 4 * 2048
    assert (np.diff(cu) > 0).all()
    # Every sample boundary is a segment boundary, and every segment starts where position_ids is 0.
    assert set(range(0, 4 * 2048, 2048)) <= set(cu.tolist())
    np.testing.assert_array_equal(np.flatnonzero(batch["position_ids"].reshape(-1) == 0), cu[:-1])
    assert int(batch["max_seqlen"]) == int(np.diff(cu).max())
    plain = collate([TokenDataset("wiki@v1", seq_len=64, catalog=cat.path)[i] for i in range(3)])
    assert set(plain) == {"input_ids", "labels"} and plain["labels"].shape == (3, 64)
    with pytest.raises(ValueError, match="at least one sample"):
        collate([])


def test_packing_needs_an_index_on_plain_directories(tmp_path):
    shards, _ = document_shards([30, 40, 50], 60)
    write_shards(tmp_path, shards)  # no .bos.idx
    ds = TokenDataset(tmp_path, seq_len=10, pack_sequences=True)
    with pytest.raises(Exception, match="no .bos.idx sidecar.*boundary_token"):
        ds[0]
    derived = TokenDataset(tmp_path, seq_len=10, pack_sequences=True, boundary_token=BOS)
    assert derived.shards.doc_starts(0).tolist() == [0, 30]
    assert derived.shards.doc_starts(1).tolist() == [10]
    eos_shards, _ = document_shards([30, 40, 50], 60, placement="eos")
    write_shards(tmp_path / "eos", eos_shards)
    eos = TokenDataset(tmp_path / "eos", seq_len=10, pack_sequences=True, boundary_token=BOS, boundary="eos")
    assert eos.shards.doc_starts(0).tolist() == [0, 30]
    assert eos.shards.doc_starts(1).tolist() == [10]
