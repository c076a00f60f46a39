"""The build pipeline: determinism, idempotent rebuilds, counts, splits, boundaries, refusals."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from core_support import SAMPLE, TINY_TEXTS, write_parquet
from shardflow.build import build, make_layout, plan_build, tokenize_unit, write_shard
from shardflow.build.tokenize import with_boundaries as _with_boundaries
from shardflow.config import BuildConfig
from shardflow.errors import ConfigError, InputError, ValidationError
from shardflow.formats import get_format
from shardflow.manifest import read_manifest
from shardflow.reader import open_version
from shardflow.validation import validate_dir


def files_of(directory: Path) -> dict[str, bytes]:
    """Every shard and index file of a version directory, by name (the manifest has a timestamp)."""
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir()) if p.name != "metadata.yaml"}


def stable_manifest(directory: Path) -> dict:
    """The manifest without what legitimately differs between two builds of the same thing."""
    m = read_manifest(directory).to_dict()
    for key in ("created_at", "dataset_path", "inputs", "tools"):
        m.pop(key)
    m["config"].pop("backend")
    m["config"].pop("unit_bytes")
    m["config"].pop("batch_rows")
    m["config"].pop("batch_bytes")
    m["tokenized_info"].pop("backend")
    return m


OPTIONS = dict(name="det", shard_tokens=30_011, val_fraction=0.2, seed=7)


def test_identical_output_for_1_and_2_workers_and_both_backends(built, tmp_path):
    # unit_bytes=1: one work unit per row group (4), so 2 workers really run units in parallel.
    a = built(SAMPLE, workers=1, backend="tiktoken", root=tmp_path / "a", **OPTIONS)
    b = built(SAMPLE, workers=2, backend="gigatoken", unit_bytes=1, batch_rows=5, root=tmp_path / "b", **OPTIONS)
    c = built(SAMPLE, workers=2, backend="tiktoken", unit_bytes=1, root=tmp_path / "c", **OPTIONS)
    assert read_manifest(a.directory).tokenized_info["backend"] == "tiktoken"
    assert read_manifest(b.directory).tokenized_info["backend"] == "gigatoken"
    ref = files_of(a.directory)
    assert len(ref) > 6
    assert files_of(b.directory) == ref
    assert files_of(c.directory) == ref
    assert stable_manifest(b.directory) == stable_manifest(a.directory) == stable_manifest(c.directory)
    assert a.ref == b.ref == c.ref == "det@v1"


def test_identical_rebuild_publishes_nothing_new(built, tmp_path):
    first = built(SAMPLE, name="same", shard_tokens=50_000)
    assert first.result.created and first.ref == "same@v1"
    catalog_file = first.catalog / "same.yaml"
    before_catalog = catalog_file.read_bytes()
    before_files = sorted(str(p.relative_to(tmp_path)) for p in first.data_root.rglob("*") if ".fingerprints" not in p.name)
    before_manifest = (first.directory / "metadata.yaml").read_bytes()
    # Workers, backend and batch size change nothing in the output: same version.
    again = built(SAMPLE, name="same", shard_tokens=50_000, workers=2, backend="tiktoken", batch_rows=3)
    assert not again.result.created
    assert again.ref == "same@v1"
    assert again.result.manifest_path == first.result.manifest_path
    assert catalog_file.read_bytes() == before_catalog
    assert (first.directory / "metadata.yaml").read_bytes() == before_manifest
    after_files = sorted(str(p.relative_to(tmp_path)) for p in first.data_root.rglob("*") if ".fingerprints" not in p.name)
    assert after_files == before_files
    # Nothing is left in the staging area: no directory, no lock file.
    assert not list((first.data_root / "same" / ".staging").glob("*"))


def test_changed_input_publishes_a_new_version_with_its_parent(built, tmp_path):
    src = write_parquet(tmp_path / "in" / "c.parquet", ["one", "two"])
    v1 = built(src, name="grow")
    write_parquet(src, ["one", "two", "three"])
    v2 = built(src, name="grow")
    assert (v1.ref, v2.ref) == ("grow@v1", "grow@v2")
    m2 = read_manifest(v2.directory)
    assert m2.parent == "grow@v1" and m2.version == "v2"
    assert m2.totals["documents"] == 3
    cat = yaml.safe_load((v2.catalog / "grow.yaml").read_text())
    assert cat["latest"] == "v2" and [v["version"] for v in cat["versions"]] == ["v1", "v2"]
    # A different option is a different build, too.
    v3 = built(src, name="grow", format="npy")
    assert v3.ref == "grow@v3"


def test_null_and_empty_texts_are_counted(built, tmp_path):
    texts = [None, "first", "", "second", None, "", "", "third", None]
    src = write_parquet(tmp_path / "n.parquet", texts, row_group_size=4)
    b = built(src, name="nulls", unit_bytes=1, batch_rows=2)
    m = read_manifest(b.directory)
    t = m.totals
    assert (t["input_rows"], t["null_texts"], t["empty_texts"], t["documents"]) == (9, 3, 3, 3)
    assert m.inputs[0]["rows"] == 9
    train = b.open().split("train")
    assert [train.text(i) for i in range(train.num_documents)] == ["first", "second", "third"]


def test_all_null_or_empty_corpus_is_refused(built, tmp_path):
    src = write_parquet(tmp_path / "n.parquet", [None, "", None])
    with pytest.raises(InputError, match=r"no text to tokenize: every one of its 3 rows in column 'text' is null \(2\) or empty \(1\); check --text-column"):
        built(src, name="empty")
    zero = write_parquet(tmp_path / "z.parquet", [])
    with pytest.raises(InputError, match=r"the corpus is empty: .*z\.parquet hold no rows"):
        built(zero, name="empty")


def test_id_overflow_is_refused(tmp_path, small_vocab):
    # A uint16 plan whose tokenizer then emits ids >= 65536 (here: the rank file the
    # plan names was swapped for cl100k after planning) must fail, never wrap.
    config = BuildConfig(name="ovf", sources=(str(write_parquet(tmp_path / "o.parquet", ["hello world"])),), tokenizer=str(small_vocab))
    plan = plan_build(config, data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    assert plan.dtype == "uint16"
    plan_file = Path(plan.staging) / "plan.json"
    raw = json.loads(plan_file.read_text())
    raw["config"]["tokenizer"] = "cl100k_base"
    before = plan_file.stat().st_mtime_ns
    plan_file.write_text(json.dumps(raw))
    os.utime(plan_file, ns=(before + 10**9, before + 10**9))  # plans are cached by mtime: make the edit visible
    # "hello world" is [15339, 1917] in cl100k; the boundary 100257 does not fit either.
    write_parquet(tmp_path / "o.parquet", ["hello world, \u4e2d\u6587\u5b57 \U0001f642 " * 20])
    with pytest.raises(InputError, match=r"o\.parquet row 0: token id \d+ does not fit uint16; refusing to truncate it"):
        tokenize_unit(plan.staging, 0)
    assert not list((Path(plan.staging) / "parts").glob("*.json"))


def test_shard_size_beyond_int32_index_is_refused():
    with pytest.raises(ConfigError, match=r"shard_tokens=2147483648 is out of range; a shard holds 1 to 2147483647 tokens"):
        BuildConfig(name="x", sources=("a",), shard_tokens=2**31)
    with pytest.raises(ConfigError, match=r"shard_tokens=0 is out of range"):
        BuildConfig(name="x", sources=("a",), shard_tokens=0)


def test_dtype_follows_the_vocabulary(built, tiny_parquet, small_vocab, tmp_path):
    big = read_manifest(built(tiny_parquet, name="big").directory)
    small = read_manifest(built(tiny_parquet, name="small", tokenizer=str(small_vocab)).directory)
    assert (big.dtype, big.tokenized_info["vocab_size"], big.boundary["token_id"]) == ("uint32", 100277, 100257)
    assert (small.dtype, small.tokenized_info["vocab_size"], small.boundary["token_id"]) == ("uint16", 5001, 5000)
    assert small.tokenized_info["tokenizer"] == "small5000"
    assert small.totals["max_token_id"] == 5000 and big.totals["max_token_id"] == 100257


def test_bos_default_and_eos_option_recorded(built, sample_texts):
    bos = read_manifest(built(SAMPLE, name="bos", shard_tokens=40_000).directory)
    eos_b = built(SAMPLE, name="eos", shard_tokens=40_000, boundary="eos")
    eos = read_manifest(eos_b.directory)
    assert bos.boundary["placement"] == "bos" and bos.config["boundary"] == "bos"
    assert eos.boundary["placement"] == "eos" and eos.config["boundary"] == "eos"
    assert bos.boundary["token"] == eos.boundary["token"] == "<|endoftext|>"
    train = eos_b.open().split("train")
    assert [train.text(i) for i in range(train.num_documents)] == sample_texts
    # EOS: every document ends with the boundary; the index points right after each EOS.
    all_tokens = train.tokens(0, train.num_tokens)
    ends = np.flatnonzero(all_tokens == eos.boundary["token_id"])
    assert len(ends) == len(sample_texts) and ends[-1] == train.num_tokens - 1
    assert train.doc_starts.tolist() == [0, *(ends[:-1] + 1).tolist()]


def test_shard_names_sort_in_manifest_order(built):
    b = built(SAMPLE, name="many", shard_tokens=11_000, val_count=5)
    m = read_manifest(b.directory)
    for split, entry in m.splits.items():
        names = [s.file for s in entry.shards]
        assert len(names) >= (12 if split == "train" else 1)
        assert names == sorted(names)
        assert names == sorted(p.name for p in b.directory.glob(f"many_{split}_*.bin"))
        assert [s.index.file for s in entry.shards] == sorted(p.name for p in b.directory.glob(f"many_{split}_*.bos.idx"))
        assert names[0] == f"many_{split}_000000.bin"


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


def _split_texts(b) -> dict[str, list[str]]:
    v = b.open()
    return {s: [v.split(s).text(i) for i in range(v.split(s).num_documents)] for s in v.splits}


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


def test_interrupted_build_resumes_to_the_same_bytes(built, tmp_path, monkeypatch):
    import shardflow.build.tokenize as tokenize_mod

    fresh = built(SAMPLE, name="res", shard_tokens=40_000, unit_bytes=1, root=tmp_path / "fresh")
    config = BuildConfig(name="res", sources=(str(SAMPLE),), shard_tokens=40_000, unit_bytes=1)
    root = tmp_path / "resumed"
    plan = plan_build(config, data_root=root / "data", catalog=root / "catalog")
    assert len(plan.units) == 4
    # Killed after two of the four units: the layout refuses to run on an incomplete tokenization.
    tokenize_unit(plan, 0)
    tokenize_unit(plan.staging, 2)
    with pytest.raises(ConfigError, match=r"work unit 1 \(sample.parquet\) is not tokenized; the layout needs every unit"):
        make_layout(plan)
    # A stale temporary file from a killed writer is ignored and replaced.
    (Path(plan.staging) / "parts" / ".unit-000001.tok.tmp-999999").write_bytes(b"junk")
    read: list[int] = []
    real = tokenize_mod.iter_text_batches

    def counting(inp, unit, **kw):
        read.append(unit.index)
        return real(inp, unit, **kw)

    monkeypatch.setattr(tokenize_mod, "iter_text_batches", counting)
    result = build(config, data_root=root / "data", catalog=root / "catalog")
    assert sorted(read) == [1, 3]  # build() tokenized only the missing units
    assert result.ref == "res@v1" and result.created
    assert files_of(Path(result.manifest_path).parent) == files_of(fresh.directory)
    assert not Path(plan.staging).exists()


def test_build_resumes_after_the_layout_and_some_shards(built, tmp_path, monkeypatch):
    import shardflow.build.write as write_mod

    fresh = built(SAMPLE, name="res", shard_tokens=40_000, unit_bytes=1, root=tmp_path / "fresh")
    config = BuildConfig(name="res", sources=(str(SAMPLE),), shard_tokens=40_000, unit_bytes=1)
    root = tmp_path / "resumed"
    plan = plan_build(config, data_root=root / "data", catalog=root / "catalog")
    for u in range(len(plan.units)):
        tokenize_unit(plan, u)
    layout = make_layout(plan)
    assert layout.shard_jobs() == [("train", k) for k in range(layout.splits["train"].shards)]
    write_shard(plan, "train", 1)
    (Path(plan.staging) / "out" / ".res_train_000000.bin.tmp-999999").write_bytes(b"junk")
    written: list[tuple[str, int]] = []
    real = write_mod.ShardWriter

    class Counting(real):  # type: ignore[misc, valid-type]
        def __init__(self, fmt, path, dtype, ntokens):
            written.append(Path(path).name)
            super().__init__(fmt, path, dtype, ntokens)

    monkeypatch.setattr(write_mod, "ShardWriter", Counting)
    result = build(config, data_root=root / "data", catalog=root / "catalog")
    assert "res_train_000001.bin" not in written and "res_train_000000.bin" in written
    assert files_of(Path(result.manifest_path).parent) == files_of(fresh.directory)


def test_resume_with_other_work_units_does_not_reuse_stale_parts(tmp_path, sample_texts):
    # unit_bytes is not part of the build key: a rerun with another cut of the same
    # build must not take the old plan's unit 0 (one row group) for the new unit 0 (all).
    root = tmp_path / "r"
    four = BuildConfig(name="cut", sources=(str(SAMPLE),), unit_bytes=1)
    plan = plan_build(four, data_root=root / "data", catalog=root / "catalog")
    assert len(plan.units) == 4
    tokenize_unit(plan.staging, 0)
    one = BuildConfig(name="cut", sources=(str(SAMPLE),))
    result = build(one, data_root=root / "data", catalog=root / "catalog")
    split = open_version(result.ref, catalog=root / "catalog").split("train")
    assert split.num_documents == len(sample_texts)
    assert [split.text(i) for i in range(split.num_documents)] == sample_texts


def test_workers_must_be_positive(tiny_parquet, tmp_path):
    with pytest.raises(ConfigError, match=r"workers must be at least 1, not 0"):
        build(BuildConfig(name="w", sources=(str(tiny_parquet),)), data_root=tmp_path, catalog=tmp_path, workers=0)


def test_inputs_and_fingerprints_in_the_manifest(built, tmp_path, sample_texts):
    import hashlib

    d = tmp_path / "in"
    table = pq.read_table(SAMPLE)
    pq.write_table(table.slice(0, 30), write_parquet(d / "a.parquet", []))
    pq.write_table(table.slice(30), d / "b.parquet")
    m = read_manifest(built(d, name="two").directory)
    assert [(i["relname"], i["rows"]) for i in m.inputs] == [("a.parquet", 30), ("b.parquet", 31)]
    assert m.inputs[0]["sha256"] == hashlib.sha256((d / "a.parquet").read_bytes()).hexdigest()
    assert m.totals["input_rows"] == 61 and m.totals["documents"] == len(sample_texts)


def test_same_texts_from_every_source_kind_give_the_same_shards(built, tmp_path):
    import datasets
    import pyarrow as pa
    import pyarrow.feather as feather

    table = pa.table({"text": TINY_TEXTS * 3})
    pq.write_table(table, tmp_path / "p.parquet", row_group_size=4)
    with pa.ipc.new_file(tmp_path / "f.arrow", table.schema) as w:
        w.write_table(table, max_chunksize=2)
    with pa.ipc.new_stream(tmp_path / "s.arrow", table.schema) as w:
        w.write_table(table, max_chunksize=5)
    feather.write_feather(table, tmp_path / "t.feather")
    datasets.Dataset(table).save_to_disk(str(tmp_path / "hf"))
    outputs = []
    for k, src in enumerate(["p.parquet", "f.arrow", "s.arrow", "t.feather", "hf"]):
        b = built(tmp_path / src, name="kinds", root=tmp_path / f"r{k}")
        outputs.append(files_of(b.directory))
    assert all(o == outputs[0] for o in outputs[1:])


@settings(max_examples=200, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=6), max_size=30),
    bos=st.booleans(),
    dtype=st.sampled_from([np.uint16, np.uint32]),
)
def test_boundaries_are_inserted_like_np_insert(lengths: list[int], bos: bool, dtype: type) -> None:
    """The fast boundary insertion is ``np.insert`` at each document's start (BOS) or end (EOS)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = (np.arange(offsets[-1], dtype=np.uint32) * 7919) % 50000
    expected = np.insert(tokens.astype(dtype), offsets[:-1] if bos else offsets[1:], dtype(50256))
    got = _with_boundaries(tokens, offsets, np.dtype(dtype), 50256, bos=bos)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, expected)


def test_a_val_fraction_that_selects_nothing_warns(built, caplog):
    with caplog.at_level("WARNING", logger="shardflow.build"):
        b = built(SAMPLE, name="tinyval", val_fraction=1e-12)
    assert open_version(b.ref, catalog=b.catalog).manifest.splits["val"].documents == 0
    assert "the val split is empty: val_fraction=1e-12 selects none of the corpus's" in caplog.text


def test_a_local_rank_file_travels_with_the_version(built, tiny_parquet, small_vocab, tmp_path):
    # The version carries a copy of the rank file: it decodes after the original is gone.
    ranks = tmp_path / "elsewhere" / small_vocab.name
    ranks.parent.mkdir()
    ranks.write_bytes(small_vocab.read_bytes())
    b = built(tiny_parquet, name="ranks", tokenizer=str(ranks))
    info = read_manifest(b.directory).tokenized_info
    assert info["rank_file"] == small_vocab.name
    copy = b.directory / small_vocab.name
    assert copy.read_bytes() == small_vocab.read_bytes()
    assert os.stat(copy).st_ino != os.stat(ranks).st_ino  # a copy: editing the original changes no version
    ranks.unlink()
    version = open_version(b.ref, catalog=b.catalog)
    assert version.split("train").text(0) == pq.read_table(tiny_parquet).column("text")[0].as_py()
    validate_dir(b.directory, published=True, catalog=b.catalog)
    copy.write_bytes(copy.read_bytes() + b"\n")
    with pytest.raises(ValidationError, match=r"small5000\.tiktoken: the rank file does not match its SHA-256 in the manifest"):
        validate_dir(b.directory, checksums=True)
    copy.unlink()
    with pytest.raises(ValidationError, match=r"small5000\.tiktoken: missing; the manifest names it as the tokenizer's rank file"):
        validate_dir(b.directory, checksums=False)


def test_two_sources_with_the_same_file_names_build_together(built, tmp_path):
    a = write_parquet(tmp_path / "a" / "part-00000.parquet", TINY_TEXTS[:2])
    b = write_parquet(tmp_path / "b" / "part-00000.parquet", TINY_TEXTS[2:])
    result = built((a.parent, b.parent), name="twodirs")
    manifest = read_manifest(result.directory)
    assert [i["relname"] for i in manifest.inputs] == ["a/part-00000.parquet", "b/part-00000.parquet"]
    assert manifest.totals["input_rows"] == len(TINY_TEXTS)
