"""Planning: the build key (identical rebuilds publish nothing, changed inputs a new version), inputs and their fingerprints, refusals before any work."""

from __future__ import annotations

import hashlib

import pyarrow.parquet as pq
import pytest
import yaml
from support.corpus import TINY_TEXTS, write_parquet
from support.paths import SAMPLE

from shardflow.pipeline import build, plan_build, tokenize_unit
from shardflow.config import BuildConfig
from shardflow.errors import ConfigError, InputError
from shardflow.manifest import read_manifest
from shardflow.reader import open_version


def _split_texts(b) -> dict[str, list[str]]:
    v = b.open()
    return {s: [v.split(s).text(i) for i in range(v.split(s).num_documents)] for s in v.splits}


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


@pytest.mark.slow
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


def test_shard_size_beyond_the_format_limit_is_refused():
    # The default format's header stores the count as int32; headerless bin holds more (int64 .bos.idx entries).
    with pytest.raises(ConfigError, match=r"shard_tokens=2147483648 is out of range; a shard holds 1 to 2147483647 tokens in format nanogpt \(2\*\*31 - 1; --format bin holds more\)"):
        BuildConfig(name="x", sources=("a",), shard_tokens=2**31)
    assert BuildConfig(name="x", sources=("a",), format="bin", shard_tokens=2**31).shard_tokens == 2**31
    with pytest.raises(ConfigError, match=r"shard_tokens=9223372036854775808 is out of range; a shard holds 1 to 9223372036854775807 tokens in format bin"):
        BuildConfig(name="x", sources=("a",), format="bin", shard_tokens=2**63)
    with pytest.raises(ConfigError, match=r"shard_tokens=0 is out of range"):
        BuildConfig(name="x", sources=("a",), shard_tokens=0)


@pytest.mark.slow
def test_dtype_follows_the_vocabulary(built, tiny_parquet, small_vocab, tmp_path):
    big = read_manifest(built(tiny_parquet, name="big").directory)
    small = read_manifest(built(tiny_parquet, name="small", tokenizer=str(small_vocab)).directory)
    assert (big.dtype, big.tokenized_info["vocab_size"], big.boundary["token_id"]) == ("uint32", 100277, 100257)
    assert (small.dtype, small.tokenized_info["vocab_size"], small.boundary["token_id"]) == ("uint16", 5001, 5000)
    assert small.tokenized_info["tokenizer"] == "small5000"
    assert small.totals["max_token_id"] == 5000 and big.totals["max_token_id"] == 100257


@pytest.mark.slow
def test_resume_with_other_work_units_does_not_reuse_stale_parts(tmp_path, sample_texts):
    # A rerun with another cut of the same inputs must not take the old plan's unit 0 (one row group)
    # for the new unit 0 (all): unit_bytes is part of the build key, so it is another staging directory.
    root = tmp_path / "r"
    four = BuildConfig(name="cut", sources=(str(SAMPLE),), unit_bytes=1)
    plan = plan_build(four, data_root=root / "data", catalog=root / "catalog")
    assert len(plan.units) == 4
    tokenize_unit(plan.staging, 0)
    one = BuildConfig(name="cut", sources=(str(SAMPLE),))
    assert plan_build(one, data_root=root / "data", catalog=root / "catalog").staging != plan.staging
    result = build(one, data_root=root / "data", catalog=root / "catalog")
    split = open_version(result.ref, catalog=root / "catalog").split("train")
    assert split.num_documents == len(sample_texts)
    assert [split.text(i) for i in range(split.num_documents)] == sample_texts


def test_workers_must_be_positive(tiny_parquet, tmp_path):
    with pytest.raises(ConfigError, match=r"workers must be at least 1, not 0"):
        build(BuildConfig(name="w", sources=(str(tiny_parquet),)), data_root=tmp_path, catalog=tmp_path, workers=0)


@pytest.mark.slow
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


def test_two_sources_with_the_same_file_names_build_together(built, tmp_path):
    a = write_parquet(tmp_path / "a" / "part-00000.parquet", TINY_TEXTS[:2])
    b = write_parquet(tmp_path / "b" / "part-00000.parquet", TINY_TEXTS[2:])
    result = built((a.parent, b.parent), name="twodirs")
    manifest = read_manifest(result.directory)
    assert [i["relname"] for i in manifest.inputs] == ["a/part-00000.parquet", "b/part-00000.parquet"]
    assert manifest.totals["input_rows"] == len(TINY_TEXTS)


def test_an_input_changed_during_the_build_is_refused_and_nothing_is_published(tmp_path):
    """Planning hashes a local file; a rewrite before (or while) a worker reads it would put other tokens under the
    planned SHA-256, and a later build of the planned bytes would find that version 'identical'."""
    src = tmp_path / "corpus"
    src.mkdir()
    table = pq.read_table(SAMPLE)
    pq.write_table(table.slice(0, 30), src / "a.parquet")
    changed = table.slice(30, 30)

    def rewrite(plan):  # another program rewrites the file once the build has planned (hashed) it
        pq.write_table(changed, src / "a.parquet")

    config = BuildConfig(name="moving", sources=(str(src),), val_fraction=0.1)
    where = {"data_root": tmp_path / "data", "catalog": tmp_path / "cat"}
    with pytest.raises(InputError, match=rf"^{src}/a\.parquet: the file changed during the build \(\d+ bytes, mtime "
                                         r"\d+ ns when it was hashed, now \d+ bytes, mtime \d+ ns\); build again"):
        build(config, on_plan=rewrite, **where)
    assert not (tmp_path / "cat" / "moving.yaml").exists()
    again = build(config, **where)  # the new bytes, hashed and tokenized
    manifest = read_manifest(open_version(again.ref, catalog=tmp_path / "cat").directory)
    assert manifest.inputs[0]["sha256"] == hashlib.sha256((src / "a.parquet").read_bytes()).hexdigest()
    assert manifest.totals["documents"] == changed.num_rows and "stat" not in manifest.inputs[0]


def test_a_file_rewritten_while_it_is_hashed_is_hashed_again_never_cached_under_its_new_stat(tmp_path, monkeypatch):
    import shardflow.sources.fingerprint as fingerprint
    from shardflow.sources import discover_inputs, fingerprint_inputs

    path = tmp_path / "a.parquet"
    pq.write_table(pq.read_table(SAMPLE).slice(0, 30), path)
    real, writes = fingerprint.sha256_file, []

    def hash_then_rewrite(p):  # the bytes are read, then another program rewrites the file
        digest = real(p)
        if not writes:
            pq.write_table(pq.read_table(SAMPLE).slice(30, 31), path)
            writes.append(p)
        return digest

    monkeypatch.setattr(fingerprint, "sha256_file", hash_then_rewrite)
    [inp] = fingerprint_inputs(discover_inputs((str(path),)), cache_dir=tmp_path / "cache")
    assert writes and inp.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    monkeypatch.setattr(fingerprint, "sha256_file", real)
    [again] = fingerprint_inputs(discover_inputs((str(path),)), cache_dir=tmp_path / "cache")
    assert again.sha256 == inp.sha256 and again.stat == inp.stat == fingerprint.local_stat(str(path))
