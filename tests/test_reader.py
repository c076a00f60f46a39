"""Reading a version back: every document's text is the original text."""

from __future__ import annotations

import numpy as np
import pyarrow.parquet as pq
import pytest

from support.builds import make_builder
from support.paths import ASSETS, SAMPLE
from support.recut import whole_document_cuts
from shardflow import open_version as top_level_open_version
from shardflow.reader import open_version


def test_sample_documents_round_trip(sample_built, sample_texts):
    v = sample_built.open()
    train = v.split("train")
    # Whole documents, at most 50,000 tokens a shard (manifest schema 3): 4 shards.
    assert (train.num_documents, train.num_shards) == (len(sample_texts), 4)
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
    bos = np.flatnonzero(everything == eot)
    assert np.array_equal(train.doc_starts, bos)
    # Schema 3: shards of whole documents, cut where the next document would pass 50,000 tokens.
    lengths = np.diff(np.append(bos, len(everything)))
    assert train.shard_offsets.tolist() == np.cumsum([0, *whole_document_cuts(lengths, 50_000)]).tolist()
    assert np.isin(train.shard_offsets[:-1], bos).all()  # no document continues into the next shard
    # A range across two shard boundaries.
    lo, hi = int(train.shard_offsets[1]) - 10, int(train.shard_offsets[2]) + 10
    assert np.array_equal(train.tokens(lo, hi), everything[lo:hi])
    assert np.array_equal(train.tokens(-5, 3), everything[:3])
    assert len(train.tokens(10, 10)) == 0 and len(train.tokens(train.num_tokens, train.num_tokens + 9)) == 0
    last_of_shard = np.searchsorted(bos, train.shard_offsets[1:-1]) - 1
    for i in {0, *last_of_shard.tolist(), *(last_of_shard + 1).tolist(), train.num_documents - 1}:
        with_bos = train.document(i, with_boundary=True)
        assert with_bos[0] == eot and eot not in with_bos[1:]
        assert np.array_equal(with_bos, everything[bos[i] : bos[i] + lengths[i]])
        assert np.array_equal(train.document(i), with_bos[1:])


def test_documents_spanning_shards_of_an_older_schema():
    """A schema-2 version as published (tests/assets/schema2): its documents cross shard boundaries."""
    v = open_version("two@v1", catalog=ASSETS / "schema2" / "catalog")
    assert v.manifest.schema_version == 2
    train = v.split("train")
    eot = v.manifest.boundary["token_id"]
    everything = np.concatenate([np.asarray(train.shard(k)) for k in range(train.num_shards)])
    bos = np.flatnonzero(everything == eot)
    assert np.array_equal(train.doc_starts, bos)
    ends = np.append(bos[1:], len(everything))
    crossing = [i for i in range(train.num_documents) if np.searchsorted(train.shard_offsets, bos[i], "right") != np.searchsorted(train.shard_offsets, ends[i] - 1, "right")]
    assert len(crossing) == train.num_shards - 1, "every shard boundary of the fixture falls inside a document"
    for i in crossing:
        with_bos = train.document(i, with_boundary=True)
        assert np.array_equal(with_bos, everything[bos[i] : ends[i]]) and eot not in with_bos[1:]
    texts = pq.read_table(ASSETS / "schema2" / "two.parquet", columns=["text"]).column("text").to_pylist()
    val = v.split("val")
    read = [train.text(i) for i in range(train.num_documents)] + [val.text(i) for i in range(val.num_documents)]
    assert sorted(read) == sorted(texts)


def test_shards_are_read_only_memory_maps(sample_built):
    v = sample_built.open()
    shard = v.split("train").shard(0)
    assert isinstance(shard, np.memmap) and not shard.flags.writeable
    assert shard.dtype == np.dtype("<u4") and len(shard) == v.manifest.splits["train"].shards[0].tokens == 47_107


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
