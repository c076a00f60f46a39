"""The layout: validation splits chosen from the seed, document starts, shard names and order, refusals."""

from __future__ import annotations

import numpy as np
import pytest
from support.corpus import write_parquet
from support.paths import SAMPLE

from shardflow.errors import InputError
from shardflow.formats import get_format
from shardflow.manifest import read_manifest
from shardflow.reader import open_version


def _split_texts(b) -> dict[str, list[str]]:
    v = b.open()
    return {s: [v.split(s).text(i) for i in range(v.split(s).num_documents)] for s in v.splits}


def test_all_null_or_empty_corpus_is_refused(built, tmp_path):
    src = write_parquet(tmp_path / "n.parquet", [None, "", None])
    with pytest.raises(InputError, match=r"no text to tokenize: every one of its 3 rows in column 'text' is null \(2\) or empty \(1\); check --text-column"):
        built(src, name="empty")
    zero = write_parquet(tmp_path / "z.parquet", [])
    with pytest.raises(InputError, match=r"the corpus is empty: .*z\.parquet hold no rows"):
        built(zero, name="empty")


def test_shard_names_sort_in_manifest_order(built):
    b = built(SAMPLE, name="many", shard_tokens=11_000, val_count=5)
    m = read_manifest(b.directory)
    for split, entry in m.splits.items():
        names = [s.file for s in entry.shards]
        assert len(names) >= (12 if split == "train" else 1)
        assert names == sorted(names)
        # One directory per split (manifest schema 2): a glob over it sees the split's shards, in manifest order.
        assert names == [f"{split}/{p.name}" for p in sorted((b.directory / split).glob("*.bin"))]
        assert [s.index.file for s in entry.shards] == [f"{split}/{p.name}" for p in sorted((b.directory / split).glob("*.bos.idx"))]
        assert names[0] == f"{split}/many_{split}_000000.bin"


def test_bos_idx_points_at_every_bos_and_only_at_bos(sample_built):
    m = read_manifest(sample_built.directory)
    fmt = get_format(m.format_name)
    eot = m.boundary["token_id"]
    total = 0
    for entry in m.splits["train"].shards:
        tokens = np.asarray(fmt.open(sample_built.directory / entry.file, np.dtype(m.dtype)))
        starts = np.fromfile(sample_built.directory / entry.index.file, dtype="<i4")
        assert np.array_equal(starts, np.flatnonzero(tokens == eot))
        assert len(starts) == entry.documents
        total += len(starts)
    assert total == m.totals["documents"] == 61


@pytest.mark.slow
def test_val_split_by_count_is_deterministic_from_the_seed(built, tmp_path, sample_texts):
    a = _split_texts(built(SAMPLE, name="vc", val_count=10, seed=1, root=tmp_path / "a"))
    b = _split_texts(built(SAMPLE, name="vc", val_count=10, seed=1, unit_bytes=1, workers=2, root=tmp_path / "b"))
    c = _split_texts(built(SAMPLE, name="vc", val_count=10, seed=2, root=tmp_path / "c"))
    assert a == b
    assert len(a["val"]) == 10 and len(a["train"]) == 51
    assert a["val"] != c["val"] and len(c["val"]) == 10
    for split in (a, c):  # a partition of the corpus, each split in corpus order
        assert sorted(split["train"] + split["val"]) == sorted(sample_texts)
        assert split["val"] == [t for t in sample_texts if t in set(split["val"])]


@pytest.mark.slow
def test_val_split_by_fraction_is_deterministic_from_the_seed(built, tmp_path, sample_texts):
    a = _split_texts(built(SAMPLE, name="vf", val_fraction=0.3, seed=3, root=tmp_path / "a"))
    b = _split_texts(built(SAMPLE, name="vf", val_fraction=0.3, seed=3, unit_bytes=1, root=tmp_path / "b"))
    c = _split_texts(built(SAMPLE, name="vf", val_fraction=0.3, seed=4, root=tmp_path / "c"))
    assert a == b
    assert 8 <= len(a["val"]) <= 30
    assert a["val"] != c["val"]
    assert sorted(a["train"] + a["val"]) == sorted(sample_texts)
    assert a["train"] == [t for t in sample_texts if t not in set(a["val"])]


def test_val_count_larger_than_the_corpus_is_refused(built, tiny_parquet):
    with pytest.raises(InputError, match=r"val_count=3 leaves no training documents: the corpus has 3 non-empty documents"):
        built(tiny_parquet, name="tiny", val_count=3)


def test_a_val_fraction_that_selects_nothing_warns(built, caplog):
    with caplog.at_level("WARNING", logger="shardflow.pipeline"):
        b = built(SAMPLE, name="tinyval", val_fraction=1e-12)
    assert open_version(b.ref, catalog=b.catalog).manifest.splits["val"].documents == 0
    assert "the val split is empty: val_fraction=1e-12 selects none of the corpus's" in caplog.text
