"""Plain directories of shards (no manifest): the dtype comes from headers, never from file sizes."""

from __future__ import annotations

import numpy as np
import pytest

from support.shards import BOS, document_shards, write_shards
from shardflow.errors import ConfigError, ValidationError
from shardflow.runtime import StreamingTokenDataset, TokenDataset, open_shards


def tokens(n: int, dtype: str = "uint16") -> np.ndarray:
    # Values above 255 in both bytes, so reading with the wrong width scrambles them visibly.
    return (np.arange(n, dtype=np.int64) * 7 + 300).astype(dtype)


@pytest.mark.parametrize("fmt", ["nanogpt", "nanogpt-legacy", "npy"])
def test_uint16_shards_are_read_as_uint16(tmp_path, fmt):
    """KempnerForge reads a uint16 shard whose size is a multiple of 4 as uint32; the header says uint16."""
    shards = [tokens(1000), tokens(2000)]  # 2000 and 4000 bytes of tokens: multiples of 4
    write_shards(tmp_path, shards, format=fmt, dtype="uint16")
    ds = TokenDataset(tmp_path, seq_len=99)
    assert ds.shards.dtype == np.dtype("<u2") and ds.shards.format.name == fmt
    np.testing.assert_array_equal(ds[0]["input_ids"], shards[0][:99].astype(np.int64))
    assert len(ds) == 1000 // 100 + 2000 // 100


@pytest.mark.parametrize("fmt", ["nanogpt", "npy"])
def test_uint32_shards(tmp_path, fmt):
    shards = [tokens(500, "uint32") + 70_000]
    write_shards(tmp_path, shards, format=fmt, dtype="uint32")
    ds = TokenDataset(tmp_path, seq_len=49)
    assert ds.shards.dtype == np.dtype("<u4")
    np.testing.assert_array_equal(ds[3]["labels"], shards[0][151:200].astype(np.int64))


def test_headerless_bin_needs_a_dtype(tmp_path):
    raw = tokens(4000)
    (tmp_path / "train.bin").write_bytes(raw.tobytes())  # nanoGPT's train.bin: no header at all
    (tmp_path / "val.bin").write_bytes(tokens(1000).tobytes())
    with pytest.raises(ConfigError, match="train.bin: a headerless .bin shard.*dtype='uint16'.*never guesses"):
        TokenDataset(tmp_path, seq_len=64)
    ds = TokenDataset(tmp_path, seq_len=63, dtype="uint16")
    assert len(ds) == 4000 // 64
    np.testing.assert_array_equal(ds[1]["input_ids"], raw[64:127].astype(np.int64))
    val = TokenDataset(tmp_path, split="val", seq_len=63, dtype="uint16")
    assert val.shards.num_tokens == 1000 and [s.path.name for s in val.shards.shards] == ["val.bin"]
    as32 = TokenDataset(tmp_path, seq_len=63, dtype="uint32")  # what the user asked for, explicitly
    assert as32.shards.num_tokens == 2000


def test_a_header_that_disagrees_with_the_given_dtype_is_refused(tmp_path):
    write_shards(tmp_path, [tokens(100)], format="nanogpt", dtype="uint16")
    with pytest.raises(ValidationError, match="header says uint16"):
        TokenDataset(tmp_path, seq_len=9, dtype="uint32")
    with pytest.raises(ConfigError, match="dtype must be uint16 or uint32"):
        TokenDataset(tmp_path, seq_len=9, dtype="int8")


def test_mixed_formats_or_dtypes_are_refused(tmp_path):
    write_shards(tmp_path / "a", [tokens(100)], format="nanogpt", dtype="uint16")
    write_shards(tmp_path / "a", [tokens(100, "uint32")], format="npy", dtype="uint32")
    with pytest.raises(ConfigError, match="one directory, one format"):
        TokenDataset(tmp_path / "a", seq_len=9)
    write_shards(tmp_path / "b", [tokens(100)], format="npy", dtype="uint16", stem="x_train")
    write_shards(tmp_path / "b", [tokens(100, "uint32")], format="npy", dtype="uint32", stem="y_train")
    with pytest.raises(ConfigError, match="one directory, one dtype"):
        TokenDataset(tmp_path / "b", seq_len=9)


def test_patterns_and_globs(tmp_path):
    write_shards(tmp_path, [tokens(300)] * 3, format="npy", stem="shard")  # KempnerForge names: no split in them
    with pytest.raises(ConfigError, match=r"match .*'\*train\*'.*pattern='\*'"):
        TokenDataset(tmp_path, seq_len=9)
    by_pattern = TokenDataset(tmp_path, seq_len=9, pattern="*.npy")
    by_glob = TokenDataset(str(tmp_path / "shard_*.npy"), seq_len=9)
    assert by_pattern.num_shards == by_glob.num_shards == 3
    assert by_pattern.shards.fingerprint == by_glob.shards.fingerprint
    with pytest.raises(ConfigError, match="no shard files"):
        TokenDataset(str(tmp_path / "nothing_*.bin"), seq_len=9)


def test_foreign_index_files_are_detected(tmp_path):
    """NeMo's .bos.idx holds byte offsets; with the boundary token known, a wrong index is refused."""
    shards, starts = document_shards([40, 30, 50, 200], 400)
    write_shards(tmp_path, shards, starts=[s * 2 + 1 for s in starts])  # in range, but not token indices
    ds = TokenDataset(tmp_path, seq_len=10, pack_sequences=True, boundary_token=BOS)
    with pytest.raises(ValidationError, match="do not point at document starts"):
        ds[0]
    far = tmp_path / "far"
    write_shards(far, shards, starts=[s * 4 for s in starts])
    with pytest.raises(ValidationError, match="bos.idx: entries point outside the shard's 320 tokens"):
        TokenDataset(far, seq_len=10, align_to_bos=True)
    good = tmp_path / "good"
    write_shards(good, shards, starts=starts)
    ok = TokenDataset(good, seq_len=10, align_to_bos=True, boundary_token=BOS)
    assert all(ok[i]["input_ids"][0] == BOS for i in range(len(ok)))


def test_options_that_need_a_manifest(tmp_path):
    write_shards(tmp_path, [tokens(100)])
    with pytest.raises(ConfigError, match="verify=True checks checksums against a manifest"):
        TokenDataset(tmp_path, seq_len=9, verify=True)
    with pytest.raises(ConfigError, match="boundary must be 'bos' or 'eos'"):
        open_shards(tmp_path, boundary="mid")  # type: ignore[arg-type]


def test_streaming_over_a_plain_directory(tmp_path):
    write_shards(tmp_path, [tokens(1000)] * 5, format="npy")
    seen = []
    for w in range(3):
        s = StreamingTokenDataset(tmp_path, seq_len=99, worker_id=w, num_workers=3, seed=1)
        seen += list(s.indices())
    assert sorted(seen) == list(range(50))
    state = StreamingTokenDataset(tmp_path, seq_len=99).state_dict()
    (tmp_path / "data_train_000000.npy").write_bytes(b"")  # another directory content: another stream
    write_shards(tmp_path, [tokens(1000)] * 4 + [tokens(1100)], format="npy")
    with pytest.raises(ValueError, match="different stream"):
        StreamingTokenDataset(tmp_path, seq_len=99).load_state_dict(state)


def test_embedding_files_beside_npy_shards_are_not_shards(tmp_path):
    # A version directory opened without its manifest: <name>_train.emb.npy is an embedding file.
    shards = [tokens(400), tokens(300)]
    write_shards(tmp_path, shards, format="npy", dtype="uint16")
    np.save(tmp_path / "x_train.emb.npy", np.zeros((5, 4), dtype=np.float32))
    np.save(tmp_path / "x_train.emb.scales.npy", np.ones(5, dtype=np.float32))
    ds = TokenDataset(tmp_path, seq_len=99)
    assert ds.num_shards == 2
