"""Shard formats: golden bytes of a tiny fixed corpus, round trips, and header checks.

The expected bytes are written out from the byte layouts in the format
modules' specifications (struct-packed header ints, literal npy headers) --
never by running the writer.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

from support.builds import STATS_AND_CARD
from support.corpus import TINY_IDS
from support.paths import SAMPLE
from shardflow.errors import ConfigError, ValidationError
from shardflow.formats import FORMATS, NANOGPT, NANOGPT_LEGACY, NPY, RAWBIN, get_format

CL100K_EOT = 100257
SMALL_EOT = 5000
NANOGPT_MAGIC = 278895051
LEGACY_MAGIC = 20240520


def nanogpt_header(ntokens: int, width: int) -> bytes:
    return struct.pack("<256i", NANOGPT_MAGIC, 1, ntokens, width, *([0] * 252))


def legacy_header(ntokens: int) -> bytes:
    return struct.pack("<256i", LEGACY_MAGIC, 1, ntokens, *([0] * 253))


def npy_header(ntokens: int, descr: str) -> bytes:
    # NPY 1.0: magic, version 1.0, little-endian uint16 header length, then the
    # dict literal padded with spaces and a newline to 128 bytes in all.
    text = "{'descr': '%s', 'fortran_order': False, 'shape': (%d,), }" % (descr, ntokens)
    body = text.encode("latin1") + b" " * (128 - 10 - len(text) - 1) + b"\n"
    return b"\x93NUMPY\x01\x00" + struct.pack("<H", len(body)) + body


def stream(eot: int, placement: str = "bos") -> list[int]:
    """The tiny corpus's token stream: <|endoftext|> before (BOS) or after (EOS) each document."""
    out: list[int] = []
    for ids in TINY_IDS:
        out += [eot, *ids] if placement == "bos" else [*ids, eot]
    return out


def pack(tokens: list[int], code: str) -> bytes:
    return struct.pack(f"<{len(tokens)}{code}", *tokens)


def idx(*starts: int) -> bytes:
    return struct.pack(f"<{len(starts)}i", *starts)


def test_expected_bytes_are_what_they_claim():
    # A sanity check of the hand-written layouts themselves.
    assert len(nanogpt_header(9, 4)) == len(legacy_header(9)) == 1024
    assert nanogpt_header(9, 4)[:16].hex() == "cb999f10" "01000000" "09000000" "04000000"
    assert legacy_header(9)[:12].hex() == "88d83401" "01000000" "09000000"
    assert len(npy_header(9, "<u4")) == 128 and npy_header(9, "<u4")[8:10] == b"\x76\x00"
    assert stream(CL100K_EOT) == [100257, 64, 293, 100257, 564, 100257, 791, 842, 13]


# (format, tokenizer, shard bytes, bos.idx bytes): the whole tiny corpus in one shard.
GOLDEN = {
    ("nanogpt", "cl100k"): nanogpt_header(9, 4) + pack(stream(CL100K_EOT), "I"),
    ("nanogpt", "small"): nanogpt_header(9, 2) + pack(stream(SMALL_EOT), "H"),
    ("nanogpt-legacy", "small"): legacy_header(9) + pack(stream(SMALL_EOT), "H"),
    ("npy", "cl100k"): npy_header(9, "<u4") + pack(stream(CL100K_EOT), "I"),
    ("npy", "small"): npy_header(9, "<u2") + pack(stream(SMALL_EOT), "H"),
    ("bin", "cl100k"): pack(stream(CL100K_EOT), "I"),
    ("bin", "small"): pack(stream(SMALL_EOT), "H"),
}


def _tokenizer(which: str, small_vocab: Path) -> str:
    return "cl100k_base" if which == "cl100k" else str(small_vocab)


@pytest.mark.slow
@pytest.mark.parametrize("fmt,which", list(GOLDEN))
def test_golden_bytes(built, tiny_parquet, small_vocab, fmt, which):
    b = built(tiny_parquet, name="tiny", format=fmt, tokenizer=_tokenizer(which, small_vocab))
    ext = FORMATS[fmt].extension
    files = {p.relative_to(b.directory).as_posix() for p in b.directory.rglob("*")
             if p.is_file() and p.relative_to(b.directory).parts[0] not in STATS_AND_CARD}
    # A local rank file (the small vocabulary) is copied into the version, byte for byte.
    ranks = {small_vocab.name} if which == "small" else set()
    assert files == {"metadata.yaml", "train/tiny_train_000000.bos.idx", f"train/tiny_train_000000.{ext}"} | ranks
    if ranks:
        assert (b.directory / small_vocab.name).read_bytes() == small_vocab.read_bytes()
    assert (b.directory / f"train/tiny_train_000000.{ext}").read_bytes() == GOLDEN[(fmt, which)]
    assert (b.directory / "train/tiny_train_000000.bos.idx").read_bytes() == idx(0, 3, 5)


def test_golden_bytes_eos(built, tiny_parquet):
    b = built(tiny_parquet, name="tiny", boundary="eos")
    assert b.open().manifest.boundary == {"token": "<|endoftext|>", "token_id": CL100K_EOT, "placement": "eos"}
    eos = stream(CL100K_EOT, "eos")
    assert eos == [64, 293, 100257, 564, 100257, 791, 842, 13, 100257]
    assert (b.directory / "train/tiny_train_000000.bin").read_bytes() == nanogpt_header(9, 4) + pack(eos, "I")
    assert (b.directory / "train/tiny_train_000000.bos.idx").read_bytes() == idx(0, 3, 5)


# Shards of whole documents (schema 3), documents [E a b] [E ok] [E The end .] of 3, 2 and 4 tokens:
# at most 5 tokens, a shard takes documents while it stays within the bound: [E a b E ok] [E The end .];
# at most 3, "The end." (4 tokens) is longer than the bound and alone: [E a b] [E ok] [E The end .].
ACROSS_SHARDS = {
    5: [(slice(0, 5), (0, 3)), (slice(5, 9), (0,))],
    3: [(slice(0, 3), (0,)), (slice(3, 5), (0,)), (slice(5, 9), (0,))],
}


@pytest.mark.parametrize("shard_tokens", list(ACROSS_SHARDS))
def test_golden_bytes_across_shards(built, tiny_parquet, shard_tokens):
    b = built(tiny_parquet, name="tiny", shard_tokens=shard_tokens)
    s = stream(CL100K_EOT)
    expected = ACROSS_SHARDS[shard_tokens]
    for k, (cut, starts) in enumerate(expected):
        tokens = s[cut]
        assert (b.directory / f"train/tiny_train_{k:06d}.bin").read_bytes() == nanogpt_header(len(tokens), 4) + pack(tokens, "I")
        assert (b.directory / f"train/tiny_train_{k:06d}.bos.idx").read_bytes() == idx(*starts)
    assert [e.tokens for e in b.open().manifest.splits["train"].shards] == [c.stop - c.start for c, _ in expected]
    # metadata.yaml and train/ (one directory per split), besides the statistics and the card
    assert len({p.name for p in b.directory.iterdir()} - STATS_AND_CARD) == 2
    assert len(list((b.directory / "train").iterdir())) == 2 * len(expected)


@pytest.mark.parametrize(
    "fmt,which", [("nanogpt", "cl100k"), ("nanogpt-legacy", "small"), ("npy", "cl100k"), ("bin", "small")]
)
@pytest.mark.slow
def test_round_trip_every_format(built, small_vocab, sample_texts, fmt, which):
    # Small shards, so that the documents are read from many of them.
    b = built(SAMPLE, name="rt", format=fmt, tokenizer=_tokenizer(which, small_vocab), shard_tokens=20_011)
    v = b.open()
    train = v.split("train")
    assert train.num_shards > 3
    assert train.num_documents == len(sample_texts)
    assert [train.text(i) for i in range(train.num_documents)] == sample_texts
    assert v.manifest.dtype == ("uint32" if which == "cl100k" else "uint16")


def test_npy_shards_load_with_numpy(built, tiny_parquet):
    b = built(tiny_parquet, name="tiny", format="npy")
    arr = np.load(b.directory / "train/tiny_train_000000.npy")
    assert arr.dtype == np.dtype("<u4") and arr.tolist() == stream(CL100K_EOT)


def test_legacy_refuses_uint32_with_a_clear_message(built, tiny_parquet, tmp_path):
    with pytest.raises(ConfigError, match=r"format 'nanogpt-legacy' stores uint16 tokens only, but this tokenizer needs uint32 .*use --format nanogpt"):
        built(tiny_parquet, name="tiny", format="nanogpt-legacy")
    assert not (tmp_path / "catalog" / "tiny.yaml").exists()


def test_headers_and_registry():
    assert list(FORMATS) == ["nanogpt", "nanogpt-legacy", "npy", "bin", "megatron"]
    assert NANOGPT.header(7, np.dtype("<u2")) == nanogpt_header(7, 2)
    assert NANOGPT_LEGACY.header(7, np.dtype("<u2")) == legacy_header(7)
    assert NPY.header(7, np.dtype("<u2")) == npy_header(7, "<u2")
    assert NPY.header(2**31 - 1, np.dtype("<u4")) == npy_header(2**31 - 1, "<u4")  # still 128 bytes
    assert RAWBIN.header(7, np.dtype("<u4")) == b""
    with pytest.raises(ConfigError, match=r"unknown shard format 'arrow'; use one of nanogpt, nanogpt-legacy, npy, bin, megatron"):
        get_format("arrow")
    with pytest.raises(ConfigError, match=r"stores uint16 or uint32 tokens, not int64"):
        NANOGPT.header(1, np.dtype("int64"))


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def test_nanogpt_read_header_errors(tmp_path):
    ok = nanogpt_header(3, 2) + pack([1, 2, 3], "H")
    assert NANOGPT.open(_write(tmp_path / "ok.bin", ok)).tolist() == [1, 2, 3]
    with pytest.raises(ValidationError, match=r"header magic 20240520 is not nanogpt's 278895051; wrong format or a damaged header"):
        NANOGPT.read_header(_write(tmp_path / "m.bin", legacy_header(3) + pack([1, 2, 3], "H")), None)
    bad_version = struct.pack("<256i", NANOGPT_MAGIC, 2, 3, 2, *([0] * 252))
    with pytest.raises(ValidationError, match=r"unsupported nanogpt header version 2 \(expected 1\)"):
        NANOGPT.read_header(_write(tmp_path / "v.bin", bad_version), None)
    bad_width = struct.pack("<256i", NANOGPT_MAGIC, 1, 3, 3, *([0] * 252))
    with pytest.raises(ValidationError, match=r"header says 3 bytes per token; only 2 and 4 are defined"):
        NANOGPT.read_header(_write(tmp_path / "w.bin", bad_width), None)
    negative = struct.pack("<256i", NANOGPT_MAGIC, 1, -5, 2, *([0] * 252))
    with pytest.raises(ValidationError, match=r"header token count -5 is negative"):
        NANOGPT.read_header(_write(tmp_path / "n.bin", negative), None)
    with pytest.raises(ValidationError, match=r"100 bytes, shorter than the 1024-byte nanogpt header"):
        NANOGPT.read_header(_write(tmp_path / "s.bin", b"\0" * 100), None)
    with pytest.raises(ValidationError, match=r"header says uint16 tokens but the manifest says uint32"):
        NANOGPT.read_header(tmp_path / "ok.bin", np.dtype("<u4"))
    with pytest.raises(ValidationError, match=r"file is 1028 bytes but its header says 3 tokens of 2 bytes after a 1024-byte header \(1030 bytes\); the shard is truncated"):
        NANOGPT.open(_write(tmp_path / "t.bin", ok[:-2]))


def test_npy_and_bin_read_header_errors(tmp_path):
    np.save(tmp_path / "two_d.npy", np.zeros((2, 2), dtype="<u2"))
    with pytest.raises(ValidationError, match=r"an npy shard is a flat 1-D array, not shape \(2, 2\)"):
        NPY.open(tmp_path / "two_d.npy")
    np.save(tmp_path / "f.npy", np.zeros(3, dtype="<f4"))
    with pytest.raises(ValidationError, match=r"npy dtype float32 is not uint16 or uint32"):
        NPY.open(tmp_path / "f.npy")
    with pytest.raises(ValidationError, match=r"not a valid \.npy shard"):
        NPY.open(_write(tmp_path / "junk.npy", b"junk" * 40))
    with pytest.raises(ConfigError, match=r"a headerless \.bin shard does not record its dtype; pass dtype='uint16' or 'uint32'"):
        RAWBIN.open(_write(tmp_path / "r.bin", pack([1, 2, 3], "H")))
    assert RAWBIN.open(tmp_path / "r.bin", np.dtype("<u2")).tolist() == [1, 2, 3]
    with pytest.raises(ValidationError, match=r"6 bytes is not a whole number of uint32 tokens"):
        RAWBIN.open(tmp_path / "r.bin", np.dtype("<u4"))


def test_bosidx_read_checks(tmp_path):
    from shardflow.formats import bosidx

    assert bosidx.index_path(tmp_path / "x_train_000001.bin") == tmp_path / "x_train_000001.bos.idx"
    assert bosidx.read(_write(tmp_path / "a.bos.idx", idx(0, 5, 9)), 10).tolist() == [0, 5, 9]
    with pytest.raises(ValidationError, match=r"entries are not strictly ascending"):
        bosidx.read(_write(tmp_path / "b.bos.idx", idx(0, 5, 5)), 10)
    with pytest.raises(ValidationError, match=r"entries point outside the shard's 9 tokens"):
        bosidx.read(tmp_path / "a.bos.idx", 9)
    with pytest.raises(ValidationError, match=r"7 bytes is not a whole number of int32 entries"):
        bosidx.read(_write(tmp_path / "c.bos.idx", b"\0" * 7))
    with pytest.raises(ValidationError, match=r"the \.bos\.idx index is missing"):
        bosidx.read(tmp_path / "none.bos.idx")
