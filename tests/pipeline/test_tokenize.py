"""Tokenizing work units: boundary insertion, counts of null and empty texts, ids that do not fit, every source kind alike."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from support.builds import files_of
from support.corpus import TINY_TEXTS, write_parquet
from support.paths import SAMPLE
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.sources.fingerprint import local_stat
from shardflow.pipeline import plan_build, tokenize_unit
from shardflow.pipeline.tokenize import with_boundaries as _with_boundaries
from shardflow.config import BuildConfig
from shardflow.errors import InputError, ValidationError
from shardflow.manifest import read_manifest
from shardflow.reader import open_version
from shardflow.validation import validate_dir


def _split_texts(b) -> dict[str, list[str]]:
    v = b.open()
    return {s: [v.split(s).text(i) for i in range(v.split(s).num_documents)] for s in v.splits}


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


def test_id_overflow_is_refused(tmp_path, small_vocab):
    # A uint16 plan whose tokenizer then emits ids >= 65536 (here: the rank file the
    # plan names was swapped for cl100k after planning) must fail, never wrap.
    config = BuildConfig(name="ovf", sources=(str(write_parquet(tmp_path / "o.parquet", ["hello world"])),), tokenizer=str(small_vocab))
    plan = plan_build(config, data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    assert plan.dtype == "uint16"
    # "hello world" is [15339, 1917] in cl100k; the boundary 100257 does not fit either.
    write_parquet(tmp_path / "o.parquet", ["hello world, \u4e2d\u6587\u5b57 \U0001f642 " * 20])
    plan_file = Path(plan.staging) / "plan.json"
    raw = json.loads(plan_file.read_text())
    raw["config"]["tokenizer"] = "cl100k_base"
    raw["inputs"][0]["stat"] = local_stat(str(tmp_path / "o.parquet"))  # (the file the plan names, as rewritten)
    before = plan_file.stat().st_mtime_ns
    plan_file.write_text(json.dumps(raw))
    os.utime(plan_file, ns=(before + 10**9, before + 10**9))  # plans are cached by mtime: make the edit visible
    with pytest.raises(InputError, match=r"o\.parquet row 0: token id \d+ does not fit uint16; refusing to truncate it"):
        tokenize_unit(plan.staging, 0)
    assert not list((Path(plan.staging) / "parts").glob("*.json"))


def test_ids_the_reference_disagrees_with_stop_the_unit_naming_the_file_and_row(tmp_path, monkeypatch):
    """Each batch's live check: the longest document within CHECK_BYTES, as written; a disagreement names its row."""
    from shardflow.tokenizers import TiktokenTokenizer

    path = write_parquet(tmp_path / "d.parquet", ["a", "the one checked: the longest short document", "b"])
    config = BuildConfig(name="dis", sources=(str(path),), backend="gigatoken")
    plan = plan_build(config, data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    monkeypatch.setattr(TiktokenTokenizer, "encode_ordinary", lambda self, text: [0])
    with pytest.raises(InputError, match=r"d\.parquet row 1: the gigatoken backend and tiktoken disagree on this document; "
                       r"rerun with --backend tiktoken and report the document$"):
        tokenize_unit(plan.staging, 0)
    assert not list((Path(plan.staging) / "parts").iterdir())  # nothing of the unit is left


@pytest.mark.slow
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


@pytest.mark.slow
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


@settings(max_examples=300, deadline=None)
@given(
    lengths=st.lists(st.integers(min_value=0, max_value=6), max_size=30),
    placement=st.sampled_from(["bos", "eos", "both"]),
    dtype=st.sampled_from([np.uint16, np.uint32]),
    same=st.booleans(),
)
@pytest.mark.slow
def test_boundaries_are_inserted_like_np_insert(lengths: list[int], placement: str, dtype: type, same: bool) -> None:
    """The fast boundary insertion is ``np.insert`` at each document's start (BOS) and/or end (EOS)."""
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    tokens = (np.arange(offsets[-1], dtype=np.uint32) * 7919) % 50000
    bos = 50256 if placement in ("bos", "both") else None
    eos = (50256 if same else 50300) if placement in ("eos", "both") else None
    # Per document, in order: its BOS at its start, then its EOS at its end (np.insert keeps
    # the order of equal indices, so an empty document still gets BOS before EOS).
    where, values = [], []
    for i in range(len(lengths)):
        if bos is not None:
            where.append(offsets[i])
            values.append(bos)
        if eos is not None:
            where.append(offsets[i + 1])
            values.append(eos)
    expected = np.insert(tokens.astype(dtype), np.array(where, dtype=np.int64), np.array(values, dtype=dtype))
    got = _with_boundaries(tokens, offsets, np.dtype(dtype), bos=bos, eos=eos)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, expected)


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


@pytest.mark.slow
def test_the_pieces_are_handed_to_the_writeback_in_order_as_they_grow(built, monkeypatch, tmp_path):
    # A tokenize job writes its unit's pieces (shard files) through ShardWriter, which asks the kernel to
    # start writing each batch's tokens as they come (start_writeback), so that a piece's fsync waits only
    # for its tail: per piece, its tokens after the header end to end, every byte once; piece after piece;
    # and the bytes are those of a build without the spy. (tests/formats covers ShardWriter alone, with
    # its count known; here the pieces are opened without it and cut by UnitShardWriter.)
    import shardflow.formats.writer as writer
    from shardflow.formats import get_format

    calls: list[tuple[str, int, int]] = []

    def spy(fd: int, offset: int, nbytes: int) -> bool:
        calls.append((os.path.basename(os.readlink(f"/proc/self/fd/{fd}")), offset, nbytes))
        return True

    monkeypatch.setattr(writer, "start_writeback", spy)
    monkeypatch.setattr(writer, "WRITEBACK_MIN_BYTES", 1)  # every batch of the small sample
    options = dict(name="wb", batch_rows=8, shard_tokens=40_000)
    b = built(SAMPLE, **options)
    m = read_manifest(b.directory)
    shards = m.splits["train"].shards
    assert len(shards) >= 3  # one unit, cut into several pieces
    files = list(dict.fromkeys(name for name, _, _ in calls))  # each piece's temporary file, in first-call order
    assert [re.match(r"\.train-(\d{6})", f).group(1) for f in files] == [f"{k:06d}" for k in range(len(shards))]
    assert [name for name, _, _ in calls] == sorted((name for name, _, _ in calls), key=files.index)  # no going back
    header = len(get_format(m.format_name).header(0, np.dtype(m.dtype)))  # the pieces' header, written at commit
    width = np.dtype(m.dtype).itemsize
    for f, shard in zip(files, shards):
        ranges = [(offset, nbytes) for name, offset, nbytes in calls if name == f]
        assert len(ranges) >= 2  # handed over batch by batch as the piece grew, not once at its end
        assert [offset for offset, _ in ranges] == [header + sum(n for _, n in ranges[:i]) for i in range(len(ranges))]
        assert sum(n for _, n in ranges) == shard.tokens * width  # every token byte, once
    monkeypatch.undo()
    plain = built(SAMPLE, root=tmp_path / "plain", **options)
    for shard in shards:
        assert (plain.directory / shard.file).read_bytes() == (b.directory / shard.file).read_bytes()




def test_a_job_encodes_its_next_batch_on_its_own_thread_while_it_writes_one(tmp_path, monkeypatch):
    """Batch k+1 is encoded while batch k is checked and written (``overlap.ahead``): here the write of the first
    batch waits until the second batch's encoding has begun, which would never happen (a 30 s wait) were the
    encoding on the job's own thread. The tokens are those of a build without the wait."""
    import threading

    from shardflow.formats.unit_writer import UnitShardWriter
    from shardflow.tokenizers.base import Tokenizer

    path = write_parquet(tmp_path / "b.parquet", [f"document {i}: " + "words of text " * 40 for i in range(8)])
    config = BuildConfig(name="ahead", sources=(str(path),), batch_rows=2)
    plan = plan_build(config, data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    second_encoded = threading.Event()
    encoders: set[str] = set()
    batches = []
    encode, write = Tokenizer.encode_batch, UnitShardWriter.write

    def encode_batch(self, texts):
        first = texts[0].as_py() if hasattr(texts[0], "as_py") else texts[0]
        if first.startswith("document"):  # a batch of the unit (not the set-up's word)
            encoders.add(threading.current_thread().name)
            batches.append(first)
            if len(batches) == 2:
                second_encoded.set()
        return encode(self, texts)

    def write_waiting(self, tokens, lengths):
        assert second_encoded.wait(30), "the next batch was not encoded while this one was written"
        return write(self, tokens, lengths)

    monkeypatch.setattr(Tokenizer, "encode_batch", encode_batch)
    monkeypatch.setattr(UnitShardWriter, "write", write_waiting)
    result = tokenize_unit(plan.staging, 0)
    assert len(batches) == 4 and encoders == {"shardflow-ahead"} and threading.current_thread().name not in encoders
    monkeypatch.undo()
    plain = plan_build(config, data_root=tmp_path / "plain", catalog=tmp_path / "plain-catalog")
    again = tokenize_unit(plain.staging, 0)
    assert [p.sha256 for p in result.pieces["train"]] == [p.sha256 for p in again.pieces["train"]]


def test_a_job_that_fails_leaves_no_thread_running_and_no_input_open(tmp_path, monkeypatch):
    """A unit stopped by a bad batch (here the live check's disagreement on its second batch) has stopped its reading
    and encoding threads, and closed its input, by the time the error reaches the caller."""
    import threading

    from shardflow.tokenizers import TiktokenTokenizer

    path = write_parquet(tmp_path / "f.parquet", [f"document {i}: " + "words of text " * 30 for i in range(12)])
    config = BuildConfig(name="fail", sources=(str(path),), batch_rows=2, backend="gigatoken")
    plan = plan_build(config, data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    checked = []
    real = TiktokenTokenizer.encode_ordinary

    def disagree_second(self, text):
        checked.append(text)
        return real(self, text) if len(checked) < 2 else [0]

    monkeypatch.setattr(TiktokenTokenizer, "encode_ordinary", disagree_second)
    try:
        tokenize_unit(plan.staging, 0)
    except InputError as exc:
        error = exc  # held with its traceback (the job's frames), as a caller that reports it holds it
    assert re.match(r".*f\.parquet row [23]: the gigatoken backend and tiktoken disagree", str(error))
    assert [t.name for t in threading.enumerate() if t.name == "shardflow-ahead"] == []
    open_files = {os.path.realpath(f"/proc/self/fd/{fd}") for fd in os.listdir("/proc/self/fd")}
    assert str(path.resolve()) not in open_files
