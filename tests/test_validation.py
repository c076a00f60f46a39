"""Validation: every kind of damage is detected, with a message that says what and where."""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import yaml

from support.recut import cut_across_documents
from shardflow.errors import ValidationError
from shardflow.manifest import MANIFEST_NAME, read_manifest
from shardflow.reader import open_version
from shardflow.validation import validate_dir

HEADER = 1024  # nanogpt
SHARD = "train/sample_train_000001.bin"
INDEX = "train/sample_train_000001.bos.idx"
EOT = 100257


def tokens_of(directory: Path, name: str = SHARD) -> np.ndarray:
    return np.fromfile(directory / name, dtype="<u4", offset=HEADER)


def put_token(directory: Path, pos: int, value: int, name: str = SHARD) -> None:
    with open(directory / name, "r+b") as f:
        f.seek(HEADER + 4 * pos)
        f.write(struct.pack("<I", value))


def ordinary_position(directory: Path) -> int:
    """A token position in shard 1 that is not a document start."""
    toks = tokens_of(directory)
    pos = 100
    while toks[pos] == EOT or toks[pos + 1] == EOT:
        pos += 1
    return pos


def problems(directory: Path, *, checksums: bool = True) -> str:
    with pytest.raises(ValidationError) as info:
        validate_dir(directory, checksums=checksums)
    message = str(info.value)
    assert message.startswith(f"validation of {directory} failed (")
    return message


def test_an_intact_version_validates(version_copy):
    report = validate_dir(version_copy)
    # Whole documents, at most 50,000 tokens a shard (schema 3): 47107 + 49874 + 48391 + 3006 tokens.
    assert report.ok and (report.shards, report.tokens, report.documents) == (4, 148378, 61)
    assert open_version(version_copy, verify=True).manifest.ref == "sample@v1"


def test_truncated_shard(version_copy):
    path = version_copy / SHARD
    data = path.read_bytes()
    path.write_bytes(data[:-6])
    msg = problems(version_copy, checksums=False)
    assert f"{path}: {len(data) - 6} bytes, but the manifest says {len(data)}; the shard is truncated or was changed" in msg
    n = (len(data) - HEADER) // 4  # what the intact header says
    assert re.search(rf"file is {len(data) - 6} bytes but its header says {n} tokens of 4 bytes after a 1024-byte header \({len(data)} bytes\)", msg)
    split = open_version(version_copy).split("train")  # opening checks no shard (issue 43): its first use does
    with pytest.raises(ValidationError, match=rf"{re.escape(str(path))}: {len(data) - 6} bytes, but the manifest says {len(data)}"):
        split.shard(1)


def test_changed_token_out_of_vocabulary(version_copy):
    pos = ordinary_position(version_copy)
    put_token(version_copy, pos, 100_300)
    msg = problems(version_copy, checksums=False)
    assert f"{version_copy / SHARD}: token {pos} is id 100300, not below the vocabulary size 100277" in msg


def test_changed_token_within_vocabulary_fails_the_checksum(version_copy):
    pos = ordinary_position(version_copy)
    old = int(tokens_of(version_copy)[pos])
    put_token(version_copy, pos, 1 if old != 1 else 2)
    assert "1 problem)" in (msg := problems(version_copy))
    assert re.search(rf"{re.escape(str(version_copy / SHARD))}: SHA-256 [0-9a-f]{{16}}\.\.\. does not match the manifest's [0-9a-f]{{16}}\.\.\.; the shard's bytes were changed", msg)


def test_changed_boundary_token_breaks_the_index(version_copy):
    starts = np.fromfile(version_copy / INDEX, dtype="<i4")
    put_token(version_copy, int(starts[2]), 13)  # a BOS becomes '.'
    msg = problems(version_copy, checksums=False)
    assert f"{version_copy / INDEX}: entry 2 points at token {int(starts[2])}, which is not a document start (BOS token {EOT} expected)" in msg


def test_stray_boundary_token_is_an_unindexed_document(version_copy):
    pos = ordinary_position(version_copy)
    put_token(version_copy, pos, EOT)
    msg = problems(version_copy, checksums=False)
    assert f"{version_copy / SHARD}: the document starting at token {pos} has no entry in {Path(INDEX).name} (1 unindexed)" in msg


@pytest.mark.parametrize(
    "field,value,expected",
    [
        (0, 12345, r"header magic 12345 is not nanogpt's 278895051; wrong format or a damaged header"),
        (1, 7, r"unsupported nanogpt header version 7 \(expected 1\)"),
        # shard 1 holds 49874 tokens (200520 bytes)
        (2, 49_873, r"file is 200520 bytes but its header says 49873 tokens of 4 bytes after a 1024-byte header \(200516 bytes\)"),
        (3, 2, r"header says uint16 tokens but the manifest says uint32"),
        (3, 8, r"header says 8 bytes per token; only 2 and 4 are defined"),
    ],
)
def test_wrong_header(version_copy, field, value, expected):
    with open(version_copy / SHARD, "r+b") as f:
        f.seek(4 * field)
        f.write(struct.pack("<i", value))
    msg = problems(version_copy, checksums=False)
    assert re.search(re.escape(str(version_copy / SHARD)) + ": " + expected, msg), msg


def test_wrong_npy_header(built, tiny_parquet):
    b = built(tiny_parquet, name="tiny", format="npy")
    path = b.directory / "train/tiny_train_000000.npy"
    data = bytearray(path.read_bytes())
    data[data.index(b"<u4") : data.index(b"<u4") + 3] = b"<i4"
    path.write_bytes(bytes(data))
    msg = problems(b.directory, checksums=False)
    assert f"{path}: npy dtype int32 is not uint16 or uint32 (little-endian)" in msg


def test_missing_index_entry(version_copy):
    path = version_copy / INDEX
    starts = np.fromfile(path, dtype="<i4")
    path.write_bytes(np.delete(starts, 3).astype("<i4").tobytes())
    msg = problems(version_copy)
    n = len(starts)
    assert f"{path}: {4 * (n - 1)} bytes, but the manifest says {4 * n}" in msg
    assert f"{path}: {n - 1} entries, but the manifest says {n} documents start in {SHARD}" in msg
    assert f"{version_copy / SHARD}: the document starting at token {int(starts[3])} has no entry in {Path(INDEX).name} (1 unindexed)" in msg


def test_missing_index_entry_with_a_consistent_manifest(version_copy):
    # Even when sizes, checksums and counts were all rewritten to match, the
    # unindexed BOS is found by scanning the tokens.
    import hashlib

    path = version_copy / INDEX
    starts = np.fromfile(path, dtype="<i4")
    data = np.delete(starts, 1).astype("<i4").tobytes()  # not the first: a shard must begin with a document
    path.write_bytes(data)
    manifest_path = version_copy / "metadata.yaml"
    raw = yaml.safe_load(manifest_path.read_text())
    shard = raw["splits"]["train"]["shards"][1]
    shard["documents"] -= 1
    shard["index"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    raw["splits"]["train"]["documents"] -= 1
    raw["totals"]["documents"] -= 1
    # stats.json would still count the document (a second problem): this is about the token scan alone.
    del raw["stats"]
    manifest_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    msg = problems(version_copy)
    assert "(1 problem):" in msg
    assert f"the document starting at token {int(starts[1])} has no entry in {Path(INDEX).name} (1 unindexed)" in msg


def test_missing_index_file_and_missing_shard(version_copy):
    (version_copy / INDEX).unlink()
    (version_copy / "train/sample_train_000002.bin").unlink()
    msg = problems(version_copy)
    assert "(2 problems):" in msg
    assert f"{version_copy / INDEX}: the .bos.idx index of {SHARD} is missing" in msg
    assert f"{version_copy / 'train/sample_train_000002.bin'}: shard 2 of split 'train' is missing" in msg
    split = open_version(version_copy).split("train")  # opening checks no shard (issue 43): its first use does
    with pytest.raises(ValidationError, match=r"sample_train_000001\.bos\.idx: missing; sample@v1 is damaged"):
        split.shard_starts(1)
    with pytest.raises(ValidationError, match=r"sample_train_000002\.bin: missing; sample@v1 is damaged"):
        split.shard(2)


def test_checksum_mismatch_of_shard_and_index(version_copy):
    toks = tokens_of(version_copy)
    pos = ordinary_position(version_copy)
    a, b = int(toks[pos]), int(toks[pos + 1])
    if a == b:
        pytest.skip("equal neighbours")
    put_token(version_copy, pos, b)
    put_token(version_copy, pos + 1, a)  # same tokens, same sizes, different order
    msg = problems(version_copy)
    assert "(1 problem):" in msg
    assert f"{version_copy / SHARD}: SHA-256" in msg and "the shard's bytes were changed" in msg
    assert validate_dir(version_copy, checksums=False).ok  # only the checksum can see a reordering


def test_index_checksum_mismatch(version_copy):
    import hashlib

    manifest_path = version_copy / "metadata.yaml"
    raw = yaml.safe_load(manifest_path.read_text())
    raw["splits"]["train"]["shards"][0]["index"]["sha256"] = hashlib.sha256(b"other").hexdigest()
    manifest_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    msg = problems(version_copy)
    assert f"{version_copy / 'train/sample_train_000000.bos.idx'}: SHA-256 does not match the manifest; the index was changed" in msg


def test_totals_that_do_not_add_up(version_copy):
    manifest_path = version_copy / "metadata.yaml"
    raw = yaml.safe_load(manifest_path.read_text())
    raw["totals"]["tokens"] += 1
    raw["splits"]["train"]["documents"] += 1
    manifest_path.write_text(yaml.safe_dump(raw, sort_keys=False))
    msg = problems(version_copy)
    assert "split 'train' indexes list 61 documents, the manifest says 62" in msg
    assert "totals say 148379 tokens / 61 documents, the splits add up to 148378 / 61" in msg


def test_every_problem_is_listed(version_copy):
    (version_copy / "train/sample_train_000000.bos.idx").unlink()
    put_token(version_copy, ordinary_position(version_copy), 100_300)
    data = (version_copy / "train/sample_train_000002.bin").read_bytes()
    (version_copy / "train/sample_train_000002.bin").write_bytes(data[:-4])
    msg = problems(version_copy)
    assert "sample_train_000000.bos.idx: the .bos.idx index" in msg
    assert "sample_train_000001.bin: token" in msg
    assert "sample_train_000002.bin: " in msg and "truncated" in msg


def test_eos_placement_is_validated_too(built, tiny_parquet):
    b = built(tiny_parquet, name="tiny", boundary="eos")
    assert validate_dir(b.directory).ok
    idx = b.directory / "train/tiny_train_000000.bos.idx"
    idx.write_bytes(struct.pack("<3i", 0, 2, 5))  # 2 is not right after an EOS (3 is)
    msg = problems(b.directory, checksums=False)
    assert "entry 1 points at token 2, which is not a document start (EOS token 100257 expected)" in msg
    assert "the document starting at token 3 has no entry" in msg


def _rewrite_index(directory: Path, shard: int, entries: list[int]) -> Path:
    """Replace shard ``shard``'s index and make the manifest agree with it (sizes, checksums, counts)."""
    import hashlib

    raw = yaml.safe_load((directory / "metadata.yaml").read_text())
    entry = raw["splits"]["train"]["shards"][shard]
    data = struct.pack(f"<{len(entries)}i", *entries)
    (directory / entry["index"]["file"]).write_bytes(data)
    delta = len(entries) - entry["documents"]
    entry["documents"] = len(entries)
    entry["index"].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    raw["splits"]["train"]["documents"] += delta
    raw["totals"]["documents"] += delta
    (directory / "metadata.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    return directory / entry["index"]["file"]


def test_eos_document_starting_a_shard_must_be_indexed(built, tiny_parquet):
    # Whole documents of at most 3 tokens, EOS placement: [a b E] [ok E] [The end . E] ("The end." is longer
    # than the bound: alone). Shard 1 starts a document (shard 0 ends with EOS) -- even with a manifest
    # rewritten to agree with an index that leaves it out.
    b = built(tiny_parquet, name="tiny", boundary="eos", shard_tokens=3)
    assert [e.tokens for e in read_manifest(b.directory).splits["train"].shards] == [3, 2, 4]
    assert [(b.directory / f"train/tiny_train_00000{k}.bos.idx").read_bytes() for k in range(3)] == [struct.pack("<i", 0)] * 3
    _rewrite_index(b.directory, 1, [])
    msg = problems(b.directory)
    assert "tiny_train_000001.bin: the document starting at token 0 has no entry in tiny_train_000001.bos.idx" in msg


def test_eos_continued_document_must_not_be_indexed(built, tiny_parquet, tmp_path):
    # Schema 2 cut across documents (by hand: no build does now): [a b E] [ok E The] [end . E];
    # shard 2 continues "The end.", so its token 0 starts no document.
    b = built(tiny_parquet, name="tiny", boundary="eos")
    old = tmp_path / "schema2"
    shutil.copytree(b.directory, old)
    cut_across_documents(old, "train", 3)
    assert [(old / f"train/tiny_train_00000{k}.bos.idx").read_bytes() for k in range(3)] == [
        struct.pack("<i", 0), struct.pack("<2i", 0, 2), b""]
    assert validate_dir(old).ok
    _rewrite_index(old, 2, [0])
    msg = problems(old)
    assert "tiny_train_000002.bos.idx: entry 0 points at token 0, which is not a document start (EOS token 100257 expected)" in msg


def test_a_schema_3_shard_that_begins_mid_document_is_refused(version_copy):
    cut_across_documents(version_copy, "train", 20_011)
    validate_dir(version_copy)  # as schema 2 wrote it: shards cut across documents are fine there
    manifest = yaml.safe_load((version_copy / MANIFEST_NAME).read_text())
    manifest["schema_version"] = 3  # claimed whole documents: the second shard begins inside one
    (version_copy / MANIFEST_NAME).write_text(yaml.safe_dump(manifest, sort_keys=False))
    assert re.search(r"train_000001\.bos\.idx: .*does not begin with a document .* schema 3 hold whole documents", problems(version_copy))
