"""The ``megatron`` format: Megatron-LM's indexed dataset (``P.bin`` + ``P.idx``), one shard per prefix.

The expected bytes are written by hand from the published layout
(NVIDIA/Megatron-LM, megatron/core/datasets/indexed_dataset.py: ``_IndexWriter``
and ``_IndexReader``), and the builds are read back by a reader written here
from that layout alone -- never by shardflow's own code.
"""

from __future__ import annotations

import hashlib
import re
import shutil
import struct
from pathlib import Path

import numpy as np
import pytest
import yaml

from support.builds import STATS_AND_CARD, Built, make_builder
from support.corpus import TINY_IDS
from support.paths import SAMPLE
from support.recut import cut_across_documents
from shardflow.errors import ConfigError, ValidationError
from shardflow.formats import FORMATS, MEGATRON
from shardflow.formats.megatron import encode_idx, parse_idx
from shardflow.manifest import FileEntry, ShardEntry, read_manifest
from shardflow.reader import open_version
from shardflow.runtime import open_shards
from shardflow.validation import validate_dir

CL100K_EOT = 100257
SMALL_EOT = 5000
MAGIC = b"MMIDIDX\x00\x00"
# Megatron's DType codes (indexed_dataset.DType): 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64,
# 7 float32, 8 uint16. The ones a token file of shardflow's can have:
CODE_UINT16, CODE_INT32 = 8, 4
SPEC_DTYPES = {CODE_UINT16: np.dtype("<u2"), CODE_INT32: np.dtype("<i4")}


# -- the layout, by hand ---------------------------------------------------------------------------------


def idx_bytes(code: int, lengths: list[int], itemsize: int) -> bytes:
    """A .idx with one sequence per document: header, lengths, byte pointers, document indices 0..S."""
    pointers = [sum(lengths[:i]) * itemsize for i in range(len(lengths))]
    documents = list(range(len(lengths) + 1))
    return (
        MAGIC
        + struct.pack("<Q", 1)  # version
        + struct.pack("<B", code)  # dtype code
        + struct.pack("<Q", len(lengths))  # sequence count
        + struct.pack("<Q", len(documents))  # document count: documents + 1
        + struct.pack(f"<{len(lengths)}i", *lengths)
        + struct.pack(f"<{len(pointers)}q", *pointers)
        + struct.pack(f"<{len(documents)}q", *documents)
    )


def stream(eot: int, placement: str = "bos") -> list[int]:
    out: list[int] = []
    for ids in TINY_IDS:
        out += [eot, *ids] if placement == "bos" else [*ids, eot]
    return out


def pack(tokens: list[int], code: str) -> bytes:
    return struct.pack(f"<{len(tokens)}{code}", *tokens)


def bos_idx(*starts: int) -> bytes:
    return struct.pack(f"<{len(starts)}i", *starts)


# -- a reader written from the published layout --------------------------------------------------------


def read_idx(path: Path) -> dict:
    data = path.read_bytes()
    magic, version, code, nseq, ndoc = struct.unpack_from("<9sQBQQ", data, 0)
    assert (magic, version) == (MAGIC, 1)
    off = 9 + 8 + 1 + 8 + 8
    lengths = np.frombuffer(data, dtype="<i4", count=nseq, offset=off)
    off += lengths.nbytes
    pointers = np.frombuffer(data, dtype="<i8", count=nseq, offset=off)
    off += pointers.nbytes
    documents = np.frombuffer(data, dtype="<i8", count=ndoc, offset=off)
    off += documents.nbytes
    assert off == len(data), "no sequence modes: not multimodal"
    return {"code": code, "lengths": lengths, "pointers": pointers, "documents": documents}


def read_prefix(prefix: Path) -> tuple[dict, list[np.ndarray]]:
    """Megatron's IndexedDataset(prefix) by hand: every sequence, read from P.bin at its pointer and length."""
    idx = read_idx(Path(f"{prefix}.idx"))
    raw = Path(f"{prefix}.bin").read_bytes()
    dt = SPEC_DTYPES[idx["code"]]
    seqs = [
        np.frombuffer(raw, dtype=dt, count=int(n), offset=int(p)) for n, p in zip(idx["lengths"], idx["pointers"])
    ]
    return idx, seqs


def prefixes(directory: Path, name: str, split: str = "train") -> list[Path]:
    return [p.with_suffix("") for p in sorted(directory.glob(f"{split}/{name}_{split}_*.bin"))]


# -- golden bytes ----------------------------------------------------------------------------------------


def test_hand_made_layout_is_what_it_claims():
    b = idx_bytes(CODE_INT32, [3, 2, 4], 4)
    assert len(b) == 34 + 3 * 4 + 3 * 8 + 4 * 8
    assert b[:34].hex() == (
        "4d4d494449445800" "00"  # MMIDIDX\0\0
        "0100000000000000"  # version 1
        "04"  # int32
        "0300000000000000"  # 3 sequences
        "0400000000000000"  # 4 document indices
    )
    assert struct.unpack("<3q", b[34 + 12 : 34 + 36]) == (0, 12, 20)


@pytest.mark.parametrize(
    "which,eot,code,width,packcode",
    [("cl100k", CL100K_EOT, CODE_INT32, 4, "I"), ("small", SMALL_EOT, CODE_UINT16, 2, "H")],
)
def test_golden_bytes_three_documents(built, tiny_parquet, small_vocab, which, eot, code, width, packcode):
    tok = "cl100k_base" if which == "cl100k" else str(small_vocab)
    b = built(tiny_parquet, name="tiny", format="megatron", tokenizer=tok)
    files = {p.relative_to(b.directory).as_posix() for p in b.directory.rglob("*")
             if p.is_file() and p.relative_to(b.directory).parts[0] not in STATS_AND_CARD} - {small_vocab.name}
    assert files == {"metadata.yaml", "train/tiny_train_000000.bin", "train/tiny_train_000000.bos.idx", "train/tiny_train_000000.idx"}
    # [E a b][E ok][E The end .]: three documents, three sequences of 3, 2 and 4 tokens.
    assert (b.directory / "train/tiny_train_000000.bin").read_bytes() == pack(stream(eot), packcode)
    assert (b.directory / "train/tiny_train_000000.idx").read_bytes() == idx_bytes(code, [3, 2, 4], width)
    assert (b.directory / "train/tiny_train_000000.bos.idx").read_bytes() == bos_idx(0, 3, 5)
    assert encode_idx(9, np.dtype(f"<u{width}"), np.array([0, 3, 5])) == idx_bytes(code, [3, 2, 4], width)
    m = read_manifest(b.directory)
    assert m.format_name == "megatron" and m.format["header_bytes"] == 0
    (shard,) = m.splits["train"].shards
    idx = (b.directory / "train/tiny_train_000000.idx").read_bytes()
    assert shard.sidecars == (FileEntry(file="train/tiny_train_000000.idx", bytes=len(idx), sha256=hashlib.sha256(idx).hexdigest()),)
    assert m.totals["bytes"] == 9 * width + 12 + len(idx)


@pytest.mark.parametrize("placement", ["bos", "eos"])
def test_golden_bytes_across_shards(built, tiny_parquet, placement):
    # At most 5 tokens per shard, whole documents (schema 3): one sequence per document, none split.
    # bos: [E a b | E ok]  [E The end .]        eos: [a b E | ok E]  [The end . E]
    b = built(tiny_parquet, name="tiny", format="megatron", shard_tokens=5, boundary=placement)
    s = stream(CL100K_EOT, placement)
    expected = [(s[0:5], [3, 2], bos_idx(0, 3)), (s[5:9], [4], bos_idx(0))]
    for k, (tokens, lengths, index) in enumerate(expected):
        stem = b.directory / f"train/tiny_train_{k:06d}"
        assert Path(f"{stem}.bin").read_bytes() == pack(tokens, "I")
        assert Path(f"{stem}.idx").read_bytes() == idx_bytes(CODE_INT32, lengths, 4)
        assert Path(f"{stem}.bos.idx").read_bytes() == index
    assert not (b.directory / "train/tiny_train_000002.bin").exists()
    validate_dir(b.directory)
    v = b.open()
    assert [v.split("train").text(i) for i in range(3)] == ["a b", "ok", "The end."]


@pytest.mark.parametrize("placement", ["bos", "eos"])
def test_golden_bytes_of_a_schema_2_shard_beginning_mid_document(built, tiny_parquet, tmp_path, placement):
    # Schema 2 cut across documents (4 tokens per shard; cut here by hand, no build writes it now).
    # A shard that begins inside a document gets a sequence for that tail:
    # bos: [E a b | E]  [ok | E The end]  [.]        eos: [a b E | ok]  [E | The end .]  [E]
    b = built(tiny_parquet, name="tiny", format="megatron", boundary=placement)
    old = tmp_path / "schema2"
    shutil.copytree(b.directory, old)
    cut_across_documents(old, "train", 4)
    s = stream(CL100K_EOT, placement)
    expected = [(s[0:4], [3, 1], bos_idx(0, 3)), (s[4:8], [1, 3], bos_idx(1)), (s[8:9], [1], b"")]
    for k, (tokens, lengths, index) in enumerate(expected):
        stem = old / f"train/tiny_train_{k:06d}"
        assert Path(f"{stem}.bin").read_bytes() == pack(tokens, "I")
        assert Path(f"{stem}.idx").read_bytes() == idx_bytes(CODE_INT32, lengths, 4)
        assert Path(f"{stem}.bos.idx").read_bytes() == index
    validate_dir(old)
    v = open_version(old, catalog=tmp_path / "no-catalog")
    assert v.manifest.schema_version == 2
    assert [v.split("train").text(i) for i in range(3)] == ["a b", "ok", "The end."]


# -- real builds, read with the spec reader ----------------------------------------------------------------


@pytest.fixture(scope="module")
def sample_megatron(tmp_path_factory) -> Built:
    """The sample corpus, cl100k, --format megatron, in shards of whole documents, at most 20,011 tokens each."""
    return make_builder(tmp_path_factory.mktemp("megatron"))(SAMPLE, name="meg", format="megatron", shard_tokens=20_011)


@pytest.fixture(scope="module")
def sample_megatron_schema2(sample_megatron, tmp_path_factory) -> Path:
    """The same version cut by hand as schema 2 cut it: shards of exactly 20,011 tokens, documents crossing them."""
    dest = tmp_path_factory.mktemp("megatron-schema2") / "v1"
    shutil.copytree(sample_megatron.directory, dest)
    cut_across_documents(dest, "train", 20_011)
    return dest


@pytest.fixture(params=["whole", "schema2"])
def meg_dir(request, sample_megatron, sample_megatron_schema2) -> Path:
    """A megatron version directory, read-only: shards of whole documents (schema 3), or cut across them (schema 2)."""
    return sample_megatron.directory if request.param == "whole" else sample_megatron_schema2


def test_one_shard_build_reads_token_for_token(built, sample_texts):
    b = built(SAMPLE, name="one", format="megatron")
    (prefix,) = prefixes(b.directory, "one")
    idx, seqs = read_prefix(prefix)
    v = b.open()
    train = v.split("train")
    assert idx["code"] == CODE_INT32  # cl100k needs uint32: Megatron's int32, the same bytes
    # One sequence per document, starting exactly at the manifest's document starts.
    assert len(seqs) == train.num_documents == len(sample_texts) == v.manifest.splits["train"].documents
    assert idx["documents"].tolist() == list(range(len(seqs) + 1))
    assert (idx["pointers"] // 4).tolist() == train.doc_starts.tolist()
    assert int(idx["lengths"].sum()) == train.num_tokens
    for i, seq in enumerate(seqs):
        assert seq.tolist() == train.document(i, with_boundary=True).tolist()
        assert seq[0] == CL100K_EOT
        assert v.tokenizer.decode(seq[1:].astype(np.int64).tolist()) == sample_texts[i] == train.text(i)


@pytest.mark.slow
def test_documents_across_shards_give_consistent_sequences(meg_dir, sample_texts, tmp_path):
    v = open_version(meg_dir, catalog=tmp_path / "no-catalog")
    train = v.split("train")
    assert train.num_shards > 3
    docs: list[list[int]] = []
    tails = 0
    for k, prefix in enumerate(prefixes(meg_dir, "meg")):
        idx, seqs = read_prefix(prefix)
        shard = train.shard(k)
        starts = train.shard_starts(k).tolist()
        # Each shard's sequences tile it, and start at its document starts (plus 0 for a continued tail).
        assert int(idx["lengths"].sum()) == len(shard)
        assert np.concatenate(seqs).tolist() == shard.tolist()
        assert (idx["pointers"] // 4).tolist() == sorted({0, *starts})
        assert idx["documents"].tolist() == list(range(len(seqs) + 1))
        for j, seq in enumerate(seqs):
            if j == 0 and seq[0] != CL100K_EOT:  # the tail of the previous shard's last document
                assert 0 not in starts and k > 0
                docs[-1] += seq.tolist()
                tails += 1
            else:
                docs.append(seq.tolist())
    if v.manifest.schema_version >= 3:
        assert tails == 0  # whole documents: every shard's first sequence starts one
    else:
        assert tails >= 3  # documents do cross shard boundaries here
    assert len(docs) == train.num_documents == len(sample_texts)
    for i, doc in enumerate(docs):
        assert doc == train.document(i, with_boundary=True).tolist()
    # Round trip: the reader's text equals the original.
    assert [train.text(i) for i in range(train.num_documents)] == sample_texts
    validate_dir(meg_dir)


def test_uint16_vocabulary_writes_code_8(built, small_vocab, sample_texts):
    b = built(SAMPLE, name="small", format="megatron", tokenizer=str(small_vocab), shard_tokens=30_011)
    v = b.open()
    assert v.manifest.dtype == "uint16"
    for k, prefix in enumerate(prefixes(b.directory, "small")):
        idx, seqs = read_prefix(prefix)
        assert idx["code"] == CODE_UINT16
        assert np.concatenate(seqs).tolist() == v.split("train").shard(k).tolist()
    train = v.split("train")
    assert [train.text(i) for i in range(train.num_documents)] == sample_texts


# -- validation -----------------------------------------------------------------------------------------------


@pytest.fixture
def meg_copy(meg_dir, tmp_path) -> Path:
    """A private copy of ``meg_dir``, to corrupt."""
    dest = tmp_path / "v1"
    shutil.copytree(meg_dir, dest)
    return dest


IDX1 = "train/meg_train_000001.idx"  # in the schema-2 cut it begins with a continued document: sequence 0 is a tail


def _edit(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


@pytest.mark.parametrize("checksums", [True, False])
def test_validation_catches_a_corrupted_idx(meg_copy, checksums):
    _edit(meg_copy / IDX1, 0, b"MMIDIDY")
    with pytest.raises(ValidationError, match=r"meg_train_000001\.idx: \.idx magic b'MMIDIDY\\x00\\x00' is not Megatron's"):
        validate_dir(meg_copy, checksums=checksums)


def test_validation_reports_sha256_and_what_the_bytes_say(meg_copy):
    path = meg_copy / IDX1
    starts = np.fromfile(meg_copy / "train/meg_train_000001.bos.idx", "<i4").tolist()
    pointers = (read_idx(path)["pointers"] // 4).tolist()
    if read_manifest(meg_copy).schema_version >= 3:
        assert starts[0] == 0 and pointers == starts  # one sequence per document, the first at token 0
    else:
        assert 0 not in starts and pointers == [0, *starts]  # sequence 0 is the tail of a continued document
    nseq = struct.unpack_from("<Q", path.read_bytes(), 18)[0]
    # Swap the first two lengths: they still add up, but the pointers no longer follow them.
    a, b2 = struct.unpack_from("<2i", path.read_bytes(), 34)
    assert a != b2
    _edit(path, 34, struct.pack("<2i", b2, a))
    with pytest.raises(ValidationError) as info:
        validate_dir(meg_copy)
    msg = str(info.value)
    assert f"{IDX1}: SHA-256 does not match the manifest" in msg
    assert re.search(r"sequence 1 points at byte \d+, not \d+; pointers must be consecutive byte offsets", msg)
    assert nseq > 2


def test_validation_checks_lengths_version_dtype_and_starts(meg_copy):
    path = meg_copy / IDX1
    original = path.read_bytes()
    n = read_manifest(meg_copy).splits["train"].shards[1].tokens
    _edit(path, 34, struct.pack("<i", struct.unpack_from("<i", original, 34)[0] + 1))
    with pytest.raises(ValidationError, match=rf"sequence lengths add up to {n + 1} tokens, the shard holds {n}\b"):
        validate_dir(meg_copy, checksums=False)
    path.write_bytes(original)
    _edit(path, 9, struct.pack("<Q", 2))
    with pytest.raises(ValidationError, match=r"unsupported Megatron \.idx version 2 \(expected 1\)"):
        validate_dir(meg_copy, checksums=False)
    path.write_bytes(original)
    _edit(path, 17, bytes([CODE_UINT16]))
    with pytest.raises(ValidationError, match=r"dtype code 8 \(uint16\), but the manifest's uint32 tokens are code 4 \(int32\)"):
        validate_dir(meg_copy, checksums=False)
    # A self-consistent index for other document starts: the sequences must start at the .bos.idx's.
    path.write_bytes(encode_idx(n, np.dtype("<u4"), np.array([0, 5, 100])))
    with pytest.raises(ValidationError, match=r"3 sequences, \d+ document starts in meg_train_000001\.bin .*first differ at sequence 1"):
        validate_dir(meg_copy, checksums=False)
    path.write_bytes(original[:-8])
    with pytest.raises(ValidationError, match=r"bytes, but its header says \d+ sequences and \d+ document indices"):
        validate_dir(meg_copy, checksums=False)
    path.unlink()
    with pytest.raises(ValidationError, match=r"meg_train_000001\.idx: missing; the manifest lists it beside train/meg_train_000001\.bin"):
        validate_dir(meg_copy, checksums=False)


def test_validation_needs_the_manifest_to_list_the_idx(meg_copy):
    data = yaml.safe_load((meg_copy / "metadata.yaml").read_text())
    del data["splits"]["train"]["shards"][2]["sidecars"]
    (meg_copy / "metadata.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(ValidationError, match=r"meg_train_000002\.idx: format 'megatron' keeps it beside train/meg_train_000002\.bin, but the manifest does not list it"):
        validate_dir(meg_copy)


# -- manifest, readers, registry ----------------------------------------------------------------------------


def test_manifest_entry_without_sidecars_is_unchanged():
    index = FileEntry(file="x.bos.idx", bytes=4, sha256="0" * 64)
    plain = ShardEntry(file="x.bin", bytes=8, sha256="1" * 64, tokens=2, documents=1, index=index)
    assert list(plain.to_dict()) == ["file", "bytes", "sha256", "tokens", "documents", "index"]
    assert ShardEntry.from_dict(plain.to_dict(), "t") == plain
    side = FileEntry(file="x.idx", bytes=62, sha256="2" * 64)
    meg = ShardEntry(file="x.bin", bytes=8, sha256="1" * 64, tokens=2, documents=1, index=index, sidecars=(side,))
    assert meg.to_dict()["sidecars"] == [{"file": "x.idx", "bytes": 62, "sha256": "2" * 64}]
    assert ShardEntry.from_dict(meg.to_dict(), "t") == meg
    assert meg.files == (index, side)


def test_plain_directory_takes_the_dtype_from_the_idx(sample_megatron, tmp_path):
    # Without the manifest: a .bin with a sibling MMIDIDX .idx is megatron, its dtype the .idx's code.
    plain = tmp_path / "plain"
    plain.mkdir()
    for p in sample_megatron.directory.glob("train/meg_train_*"):
        if not p.name.endswith(".bos.idx"):
            shutil.copy(p, plain / p.name)
    s = open_shards(plain)
    assert s.format is MEGATRON and s.dtype == np.dtype("<u4")
    v = sample_megatron.open().split("train")
    assert s.num_tokens == v.num_tokens and s.read(0, 1000).tolist() == v.tokens(0, 1000).tolist()
    # A code shardflow cannot read as token ids is refused by name, not guessed from the size.
    _edit(plain / "meg_train_000000.idx", 17, bytes([5]))
    with pytest.raises(ValidationError, match=r"Megatron dtype code 5 \(int64\); shardflow reads token ids stored as uint16 \(8\) or int32 \(4\)"):
        open_shards(plain)
    (plain / "meg_train_000000.idx").unlink()
    with pytest.raises(ConfigError, match=r"does not record its dtype"):
        open_shards(plain)  # now a headerless bin without a dtype
    with pytest.raises(ConfigError, match=r"meg_train_000000\.idx, which cannot be read; pass dtype="):
        open_shards(plain, format="megatron")


def test_registry_and_parse_errors(tmp_path):
    assert FORMATS["megatron"] is MEGATRON and MEGATRON.extension == "bin"
    assert MEGATRON.header(5, np.dtype("<u2")) == b""
    with pytest.raises(ConfigError, match=r"stores uint16 or uint32 tokens, not int64"):
        MEGATRON.header(1, np.dtype("int64"))
    with pytest.raises(ValidationError, match=r"shorter than the 34-byte Megatron \.idx header"):
        parse_idx(b"MMIDIDX", "x.idx")
    with pytest.raises(ValidationError, match=r"Megatron dtype code 9 is not one of"):
        parse_idx(MAGIC + struct.pack("<QBQQ", 1, 9, 0, 1) + struct.pack("<q", 0), "x.idx")
    # An empty shard (never written by a build, but well defined): no sequences, document indices [0].
    assert encode_idx(0, np.dtype("<u2"), np.array([], dtype=np.int64)) == idx_bytes(CODE_UINT16, [], 2)


@pytest.mark.slow
def test_incremental_build_equals_a_full_one(tmp_path, sample_texts):
    # Shards linked from the parent version keep their .idx too: the bytes are a full build's.
    from support.builds import files_of
    from support.corpus import write_parquet

    src = tmp_path / "src"
    write_parquet(src / "a.parquet", sample_texts[:40])
    first = make_builder(tmp_path / "inc")(src, name="inc", format="megatron", shard_tokens=20_011)
    write_parquet(src / "b.parquet", sample_texts[40:])
    second = make_builder(tmp_path / "inc")(src, name="inc", format="megatron", shard_tokens=20_011)
    full = make_builder(tmp_path / "full")(src, name="inc", format="megatron", shard_tokens=20_011)
    assert second.directory != first.directory
    assert read_manifest(second.directory).extra["reuse"]["linked_shards"] >= 1
    assert files_of(second.directory) == files_of(full.directory)
    assert read_manifest(second.directory).splits == read_manifest(full.directory).splits
    validate_dir(second.directory)
