"""Reading a version back: every document's text is the original text."""

from __future__ import annotations

import numpy as np
import pytest

from core_support import SAMPLE, make_builder
from shardflow import open_version as top_level_open_version
from shardflow.reader import open_version


def test_sample_documents_round_trip(sample_built, sample_texts):
    v = sample_built.open()
    train = v.split("train")
    assert (train.num_documents, train.num_shards) == (len(sample_texts), 3)
    assert [train.text(i) for i in range(train.num_documents)] == sample_texts
    assert top_level_open_version is open_version


@pytest.fixture(scope="module")
def real_built(tmp_path_factory, real_corpus):
    return make_builder(tmp_path_factory.mktemp("real"))(real_corpus, name="real", shard_tokens=150_000, workers=2)


def test_real_corpus_documents_round_trip(real_built, real_texts):
    assert len(real_texts) == 302
    train = real_built.open().split("train")
    assert train.num_documents == 302 and train.num_shards > 3
    for i, text in enumerate(real_texts):
        assert train.text(i) == text, f"document {i} differs"


def test_documents_and_token_ranges(sample_built):
    v = sample_built.open()
    train = v.split("train")
    eot = v.manifest.boundary["token_id"]
    everything = np.concatenate([np.asarray(train.shard(k)) for k in range(train.num_shards)])
    assert len(everything) == train.num_tokens == v.manifest.totals["tokens"]
    assert train.shard_offsets.tolist() == [0, 50_000, 100_000, train.num_tokens]
    assert np.array_equal(train.doc_starts, np.flatnonzero(everything == eot))
    # A range across a shard boundary.
    assert np.array_equal(train.tokens(49_990, 100_010), everything[49_990:100_010])
    assert np.array_equal(train.tokens(-5, 3), everything[:3])
    assert len(train.tokens(10, 10)) == 0 and len(train.tokens(train.num_tokens, train.num_tokens + 9)) == 0
    for i in (0, 14, 15, 60):  # includes documents that continue into the next shard
        with_bos = train.document(i, with_boundary=True)
        assert with_bos[0] == eot and eot not in with_bos[1:]
        assert np.array_equal(train.document(i), with_bos[1:])
    crossing = [i for i in range(train.num_documents - 1) if np.searchsorted(train.shard_offsets, train.doc_starts[i], "right") != np.searchsorted(train.shard_offsets, train.doc_starts[i + 1] - 1, "right")]
    assert crossing, "the sample build should have documents spanning shards"


def test_shards_are_read_only_memory_maps(sample_built):
    shard = sample_built.open().split("train").shard(0)
    assert isinstance(shard, np.memmap) and not shard.flags.writeable
    assert shard.dtype == np.dtype("<u4") and len(shard) == 50_000


def test_out_of_range_and_unknown_split(sample_built):
    v = sample_built.open()
    with pytest.raises(IndexError, match=r"document 61 out of range: split 'train' has 61 documents"):
        v.split("train").document(61)
    with pytest.raises(KeyError, match=r"sample@v1 has no split 'val'; its splits are train"):
        v.split("val")
    assert v.splits == ["train"] and v.ref == "sample@v1"
    assert repr(v) == f"Version('sample@v1', {str(sample_built.directory)!r})"


def test_open_by_path_and_by_reference(sample_built):
    by_ref = open_version("sample@latest", catalog=sample_built.catalog)
    by_path = open_version(sample_built.directory / "metadata.yaml")
    assert by_ref.directory == by_path.directory == sample_built.directory
    assert by_ref.split().text(3) == by_path.split().text(3)


def test_val_split_reads_back(built, sample_texts):
    v = built(SAMPLE, name="val", val_count=7, shard_tokens=9_001).open()
    assert v.splits == ["train", "val"]
    val, train = v.split("val"), v.split("train")
    val_texts = [val.text(i) for i in range(val.num_documents)]
    train_texts = [train.text(i) for i in range(train.num_documents)]
    assert len(val_texts) == 7
    assert sorted(val_texts + train_texts) == sorted(sample_texts)
