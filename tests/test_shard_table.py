"""The shard table (manifest schema 4): the shards listed in ``shards.tsv`` beside the manifest, named and hashed in it.

A version written with a table reads back the same entries as its YAML twin,
publishes (the manifest rewritten at publish keeps its table), validates, and
opens from a bucket; a table changed after publish is refused by ``shardflow
validate`` and by readers, and one forged together with the manifest's entry by
the catalog's SHA-256 of the manifest (the trust chain: catalog, manifest,
table). Every malformed table is refused naming the file and the line.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import numpy as np
import pytest
import yaml

from support.cli import run_main
from support.wide_version import WideVersion, wide_version
from shardflow.errors import ManifestError
from shardflow.manifest import SCHEMA_VERSION, TABLE_SCHEMA_VERSION, read_manifest, write_manifest
from shardflow.reader import open_version
from shardflow.runtime import TokenDataset, open_shards
from shardflow.shard_table import TABLE_MAGIC, decode_table, encode_table

SHARDS = 12


@pytest.fixture(scope="module")
def tabled(tmp_path_factory: pytest.TempPathFactory) -> WideVersion:
    return wide_version(tmp_path_factory.mktemp("tabled"), SHARDS, table=True)


@pytest.fixture
def copy(tabled: WideVersion, tmp_path: Path) -> WideVersion:
    """A private copy of the data root and catalog (catalog paths are relative), to damage."""
    root = tmp_path / "root"
    shutil.copytree(tabled.data_root.parent, root)
    return WideVersion(tabled.ref, root / "manifests", root / "data", root / "data" / tabled.ref.replace("@", "/"),
                       SHARDS)


def validate(w: WideVersion) -> tuple[int, str]:
    rc, out, err = run_main("validate", w.ref, "--catalog", str(w.catalog))
    return rc, out + err


def test_a_tabled_version_reads_back_what_its_yaml_twin_says(tabled, tmp_path):
    manifest = read_manifest(tabled.directory)
    assert manifest.schema_version == TABLE_SCHEMA_VERSION and manifest.shard_table is not None
    text = (tabled.directory / "metadata.yaml").read_text()
    assert "sha256" not in text.split("\nsplits:")[1] and (tabled.directory / "shards.tsv").read_bytes().startswith(TABLE_MAGIC)
    inline = write_manifest(tmp_path, manifest, shard_table=False)  # the same version, its shards in its YAML
    twin = read_manifest(inline)
    assert twin.schema_version == SCHEMA_VERSION and twin.shard_table is None and not (tmp_path / "shards.tsv").exists()
    assert twin.splits == manifest.splits and len(twin.splits["train"].shards) == SHARDS
    assert twin.replace(schema_version=TABLE_SCHEMA_VERSION, shard_table=manifest.shard_table) == manifest


def test_publishing_keeps_the_table_and_it_validates_and_reads(tabled):
    rc, text = validate(tabled)
    assert rc == 0 and text.startswith(f"OK {tabled.ref}: {SHARDS} shards"), text
    ds = TokenDataset(tabled.ref, catalog=tabled.catalog, seq_len=16)
    assert ds.num_shards == SHARDS and int(ds[int(ds.sample_offsets[5])]["input_ids"][1]) == 105


def test_a_changed_table_is_refused_by_validate_and_readers(copy):
    table = copy.directory / "shards.tsv"
    table.chmod(0o644)
    data = table.read_bytes()
    table.write_bytes(data.replace(b"\t64\t2\t", b"\t65\t2\t", 1))  # one shard's token count, same size
    rc, text = validate(copy)
    assert rc == 2 and f"{table}: not the shard table" in text and "SHA-256 differs" in text, text
    with pytest.raises(ManifestError, match=r"shards\.tsv: not the shard table .*metadata\.yaml names"):
        open_version(copy.ref, catalog=copy.catalog)
    table.unlink()
    with pytest.raises(ManifestError, match=r"shards\.tsv: missing; .*metadata\.yaml names it as its shard table"):
        open_shards(copy.ref, catalog=copy.catalog)


def test_a_table_forged_with_the_manifest_is_caught_by_the_catalog(copy):
    import hashlib

    table, manifest = copy.directory / "shards.tsv", copy.directory / "metadata.yaml"
    for p in (table, manifest):
        p.chmod(0o644)
    data = table.read_bytes().replace(b"\t64\t2\t", b"\t65\t2\t", 1)
    table.write_bytes(data)
    d = yaml.safe_load(manifest.read_text())
    d["shard_table"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest.write_text(yaml.safe_dump(d, sort_keys=False))
    rc, text = validate(copy)
    assert rc == 2 and "the manifest was changed after" in text, text
    with pytest.raises(Exception, match="the manifest was changed after"):
        open_version(copy.ref, catalog=copy.catalog)


def test_a_schema_4_manifest_needs_its_table_and_a_schema_3_one_has_none(copy):
    manifest = copy.directory / "metadata.yaml"
    manifest.chmod(0o644)
    d = yaml.safe_load(manifest.read_text())
    manifest.write_text(yaml.safe_dump({k: v for k, v in d.items() if k != "shard_table"}, sort_keys=False))
    with pytest.raises(ManifestError, match=r"a 'shard_table' is read with schema 4"):
        read_manifest(copy.directory)
    manifest.write_text(yaml.safe_dump({**d, "schema_version": 3}, sort_keys=False))
    with pytest.raises(ManifestError, match=r"a 'shard_table' is read with schema 4 by read_manifest \(schema 3\)"):
        read_manifest(copy.directory)
    d["splits"]["train"]["shards"] = SHARDS + 1
    manifest.write_text(yaml.safe_dump(d, sort_keys=False))
    with pytest.raises(ManifestError, match=rf"split 'train': field 'shards' must be {SHARDS}, as the shard table"):
        read_manifest(copy.directory)
    d["shard_table"]["file"] = "../shards.tsv"
    manifest.write_text(yaml.safe_dump(d, sort_keys=False))
    with pytest.raises(ManifestError, match=r"shard_table: file '\.\./shards\.tsv' escapes the version directory"):
        read_manifest(copy.directory)


LINE = "train\ttrain/a.bin\t1088\t" + "a" * 64 + "\t16\t1\ttrain/a.bos.idx\t4\t" + "b" * 64


@pytest.mark.parametrize("data, message", [
    (b"shardflow shard table 2\n", r"not a shard table"),
    (TABLE_MAGIC + LINE.encode(), r"does not end with a newline"),
    (TABLE_MAGIC + LINE.replace("1088", "01088").encode() + b"\n", r"line 2: not a line of a shard table"),
    (TABLE_MAGIC + LINE.replace("a" * 64, "A" * 64).encode() + b"\n", r"line 2: not a line of a shard table"),
    (TABLE_MAGIC + (LINE + "\n" + LINE.replace("train\t", "val\t", 1) + "\n" + LINE + "\n").encode(),
     r"line 4: split 'train' is listed in two runs"),
    (TABLE_MAGIC + b"\xff\n", r"not UTF-8"),
])
def test_a_malformed_table_is_refused_naming_the_line(data, message):
    with pytest.raises(ManifestError, match=message):
        decode_table(data, "shards.tsv")


@pytest.mark.parametrize("name", ["../a.bin", "/etc/passwd", "train/../../a.bin", "a\\b.bin", "train/x/a.bin"])
def test_a_table_naming_a_file_outside_the_version_is_refused(copy, name):
    """Names in a table are checked as the YAML's are (``ShardEntry.from_dict``), even when its SHA-256 matches."""
    import hashlib

    table, manifest = copy.directory / "shards.tsv", copy.directory / "metadata.yaml"
    for p in (table, manifest):
        p.chmod(0o644)
    data = table.read_bytes().replace(f"train/{copy.ref.split('@')[0]}_train_000003.bin".encode(), name.encode(), 1)
    table.write_bytes(data)
    d = yaml.safe_load(manifest.read_text())
    d["shard_table"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    manifest.write_text(yaml.safe_dump(d, sort_keys=False))
    with pytest.raises(ManifestError, match=r"split 'train', shard 3: file .* escapes the version directory"):
        read_manifest(copy.directory)


def test_sidecars_round_trip(tabled):
    manifest = read_manifest(tabled.directory).to_dict()
    shard = manifest["splits"]["train"]["shards"][0]
    side = {**shard, "sidecars": [{"file": "train/a.idx", "bytes": 7, "sha256": "c" * 64}]}
    assert decode_table(encode_table({"train": {"shards": [side, shard]}}), "t") == {"train": [side, shard]}
    with pytest.raises(ManifestError, match=r"not writable in a shard table"):
        encode_table({"train": {"shards": [{**shard, "sha256": "not hex"}]}})


def test_a_tabled_version_opens_from_a_bucket(tabled, tmp_path):
    pytest.importorskip("s3fs", reason="object storage needs the optional extra: pip install 'shardflow[s3]'")
    pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")
    from support.s3 import S3Server, environment

    s3 = S3Server()
    try:
        with environment(s3.env):
            fs, bucket = s3.fs(), f"tab-{uuid.uuid4().hex[:10]}"
            fs.mkdir(bucket)
            root = tabled.data_root.parent
            for p in sorted(root.rglob("*")):
                if p.is_file():
                    fs.put_file(str(p), f"{bucket}/{p.relative_to(root).as_posix()}")
            name, version = tabled.ref.split("@")
            shards = open_shards(f"s3://{bucket}/data/{name}/{version}", cache_dir=tmp_path / "a")
            assert shards.num_shards == SHARDS and any((tmp_path / "a").rglob("shards.tsv"))
            local = open_shards(tabled.ref, catalog=tabled.catalog)
            np.testing.assert_array_equal(shards.shard(7), local.shard(7))
            by_catalog = TokenDataset(tabled.ref, catalog=f"s3://{bucket}/manifests", seq_len=16, cache_dir=tmp_path / "b")
            assert by_catalog.num_shards == SHARDS and int(by_catalog[int(by_catalog.sample_offsets[3])]["input_ids"][1]) == 103
    finally:
        s3.stop()
