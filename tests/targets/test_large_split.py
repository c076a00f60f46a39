"""A shard of more than 2**31 - 1 tokens (nanoGPT's one ``train.bin``): int64 ``.bos.idx`` entries, read by every reader.

Building 2**31 tokens is out of a test's reach, so the limit is lowered
(``bosidx.MAX_INT32_TOKENS``, read at call time by the writer and every
reader): a real build of the shared corpus then writes int64 indexes, and the
shard set, the runtime's BOS-aligned ``TokenDataset``, validation and the
spec readers (tests/targets/spec_readers.py, written from FORMAT.md and the
stacks' rules) must all read them, documents where the tokens say.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
import spec_readers as spec

from shardflow.pipeline import build
from shardflow.config import BuildConfig
from shardflow.errors import ValidationError
from shardflow.formats import bosidx
from shardflow.formats.writer import encode_index
from shardflow.reader import open_version
from shardflow.runtime import TokenDataset, open_shards
from shardflow.validation import validate_dir


def test_int64_index_golden_bytes(monkeypatch):
    # The real limit: a shard of 2**31 - 1 tokens keeps int32 entries, one more token makes them int64.
    assert bosidx.encode([0, 5, 9], 2**31 - 1) == struct.pack("<3i", 0, 5, 9)
    assert bosidx.encode([0, 5, 2**31], 2**31 + 1) == struct.pack("<3q", 0, 5, 2**31)
    assert bosidx.encode([0, 5, 9]) == bytes.fromhex("00000000" "05000000" "09000000")  # unchanged default
    monkeypatch.setattr(bosidx, "MAX_INT32_TOKENS", 9)
    data, sha = encode_index(np.array([0, 5, 9]), 10)
    assert data == bytes.fromhex("0000000000000000" "0500000000000000" "0900000000000000")
    assert encode_index(np.array([0, 5]), 9)[0] == struct.pack("<2i", 0, 5)  # at the limit: int32
    with pytest.raises(ValueError, match=r"document start 2147483648 does not fit int32"):
        bosidx.encode([2**31])


def test_int64_index_read_and_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(bosidx, "MAX_INT32_TOKENS", 9)
    path = tmp_path / "a.bos.idx"
    path.write_bytes(struct.pack("<3q", 0, 5, 9))
    starts = bosidx.read(path, 10)
    assert starts.dtype == np.dtype("<i8") and starts.tolist() == [0, 5, 9]
    path.write_bytes(struct.pack("<3i", 0, 5, 9))  # an int32 index where the token count asks for int64
    with pytest.raises(ValidationError, match=r"a.bos.idx: 12 bytes is not a whole number of int64 entries \(the index of a shard of 10 tokens\)"):
        bosidx.read(path, 10)
    path.write_bytes(struct.pack("<2q", 0, 10))
    with pytest.raises(ValidationError, match=r"entries point outside the shard's 10 tokens"):
        bosidx.read(path, 10)


def _shardflow_sample_starts(doc_starts: list[int], ntokens: int, seq_len: int) -> list[int]:
    """The runtime's BOS alignment (RUNTIME.md): a sample at a document start s with s + seq_len + 1 tokens
    in the shard, the next at the first document start at or after s + seq_len."""
    out: list[int] = []
    for s in doc_starts:
        if s + seq_len + 1 > ntokens:
            break
        if not out or s >= out[-1] + seq_len:
            out.append(s)
    return out


@pytest.mark.slow
def test_nanogpt_split_past_the_int32_limit(tmp_path, real_corpus, real_texts, gpt2_sized, monkeypatch):
    limit = 50_000  # the val split (20 documents) stays under it, the train split (about 1.2 M tokens) does not
    monkeypatch.setattr(bosidx, "MAX_INT32_TOKENS", limit)
    config = BuildConfig(name="shared", sources=(str(real_corpus),), tokenizer=str(gpt2_sized), target="nanogpt", val_count=20)
    assert config.format == "bin" and config.shard_tokens == 2**63 - 1
    result = build(config, data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    v = open_version(result.ref, catalog=tmp_path / "catalog", verify=True)
    m = v.manifest
    eos = m.boundary_tokens.eos[1]
    widths = {}
    docs = []
    for split in ("train", "val"):
        (entry,) = m.splits[split].shards
        assert entry.file == f"{split}.bin"
        tokens = np.asarray(spec.nanogpt_tokens(v.directory, split))
        assert len(tokens) == entry.tokens
        split_docs = spec.split_after_eos(tokens, eos)
        docs += split_docs
        # Where the tokens say documents start: 0 and after every EOS but the last.
        expected = np.concatenate(([0], np.cumsum([len(d) for d in split_docs])[:-1])).tolist()
        on_disk = spec.shardflow_bos_idx(v.directory / f"{split}.bos.idx", entry.tokens, int32_max=limit)
        widths[split] = on_disk.dtype.itemsize
        assert entry.index.bytes == widths[split] * len(expected)
        assert on_disk.tolist() == expected
        shards = v.split(split).shards
        assert shards.doc_starts(0).dtype.itemsize == widths[split] and shards.doc_starts(0).tolist() == expected
        assert shards.all_doc_starts().tolist() == expected
        for seq_len in (64, 1024):
            for rule, reference in (("shardflow", _shardflow_sample_starts), ("nemo", spec.nemo_sample_starts)):
                want = reference(np.asarray(expected) if rule == "nemo" else expected, entry.tokens, seq_len)
                if not want:
                    continue
                ds = TokenDataset(v.ref, split=split, catalog=tmp_path / "catalog", seq_len=seq_len, align_to_bos=True, align_rule=rule)
                assert [ds.locate(i)[1] for i in range(len(ds))] == want
                # Shard-local sample starts as wide as the shard's index: int32 would wrap past 2**31 - 1.
                assert ds._starts is not None and ds._starts.dtype.itemsize == widths[split]
                assert ds[len(ds) - 1]["input_ids"].tolist() == tokens[want[-1] : want[-1] + seq_len].tolist()
    assert widths == {"train": 8, "val": 4}
    assert sorted(map(tuple, docs)) == sorted(tuple(v.tokenizer.encode_ordinary(t) + [eos]) for t in real_texts if t)
    validate_dir(v.directory, checksums=True)
    # An index of the wrong width is caught: the same entries written as int32.
    idx = v.directory / "train.bos.idx"
    idx.write_bytes(np.fromfile(idx, dtype="<i8").astype("<i4").tobytes())
    with pytest.raises(ValidationError, match=r"train\.bos\.idx: \d+ bytes, but the manifest says \d+"):
        validate_dir(v.directory, checksums=True)


@pytest.mark.slow
def test_bin_shards_of_both_widths(tmp_path, real_corpus, monkeypatch):
    # Shards of whole documents vary in size under the 30,000-token bound: those of more than 25,000
    # tokens get int64 entries, the others (the unit's short last one among them) int32: one split, both widths.
    limit = 25_000
    monkeypatch.setattr(bosidx, "MAX_INT32_TOKENS", limit)
    config = BuildConfig(name="mixed", sources=(str(real_corpus),), format="bin", shard_tokens=30_000)
    result = build(config, data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    shards = open_shards(result.ref, catalog=tmp_path / "catalog", verify=True)
    m = open_version(result.ref, catalog=tmp_path / "catalog").manifest
    sizes = [s.tokens for s in m.splits["train"].shards]
    assert max(sizes) <= 30_000 and len(sizes) > 2
    widths = [8 if n > limit else 4 for n in sizes]
    assert widths[-1] == 4 and widths.count(8) >= 2 and widths.count(4) >= 2, sizes
    bos = m.boundary_tokens.bos[1]
    tokens = np.asarray(shards.read(0, shards.num_tokens))
    assert [shards.doc_starts(k).dtype.itemsize for k in range(len(sizes))] == widths
    for k, entry in enumerate(m.splits["train"].shards):
        on_disk = spec.shardflow_bos_idx(shards.shards[k].index, entry.tokens, int32_max=limit)
        assert on_disk.tolist() == shards.doc_starts(k).tolist()
        assert on_disk[0] == 0  # every shard begins with a document (schema 3: none spans two shards)
    assert shards.all_doc_starts().tolist() == np.flatnonzero(tokens == bos).tolist()
    seq_len = 512
    ds = TokenDataset(result.ref, catalog=tmp_path / "catalog", seq_len=seq_len, align_to_bos=True)
    want = [
        (k, s)
        for k in range(len(sizes))
        for s in _shardflow_sample_starts(shards.doc_starts(k).tolist(), sizes[k], seq_len)
    ]
    assert len(ds) == len(want) and [ds.locate(i) for i in range(len(ds))] == want
    assert all(ds[i]["input_ids"][0] == bos for i in range(0, len(ds), 7))
    validate_dir(open_version(result.ref, catalog=tmp_path / "catalog").directory, checksums=True)


@pytest.mark.slow
def test_an_incremental_build_reads_its_int64_indexed_parent(tmp_path, real_corpus, gpt2_sized, monkeypatch):
    # The parent's train.bos.idx (int64) gives the document starts of the reused input's tokens.
    import pyarrow.parquet as pq

    monkeypatch.setattr(bosidx, "MAX_INT32_TOKENS", 50_000)
    table = pq.read_table(sorted(real_corpus.glob("*.parquet"))[0])
    src = tmp_path / "src"
    src.mkdir()
    half = table.num_rows // 2
    pq.write_table(table.slice(0, half), src / "a.parquet")
    config = BuildConfig(name="inc", sources=(str(src),), tokenizer=str(gpt2_sized), target="nanogpt", val_fraction=0.1)
    build(config, data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    pq.write_table(table.slice(half), src / "b.parquet")
    v2 = build(config, data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    full = build(config, data_root=tmp_path / "full" / "data", catalog=tmp_path / "full" / "catalog")
    inc = open_version(v2.ref, catalog=tmp_path / "catalog", verify=True)
    ref = open_version(full.ref, catalog=tmp_path / "full" / "catalog", verify=True)
    assert inc.manifest.to_dict().get("reuse"), "the second build did not reuse its parent"
    assert inc.manifest.splits["train"].shards[0].index.bytes == 8 * inc.manifest.splits["train"].documents
    for name in ("train.bin", "train.bos.idx", "val.bin", "val.bos.idx"):
        assert (inc.directory / name).read_bytes() == (ref.directory / name).read_bytes(), name
