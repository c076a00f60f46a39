"""``UnitShardWriter``: documents in, bounded shards out, no document across two shards.

Checked on the files it leaves, read back through the formats' own readers:
the shards' tokens are the documents' in order, each ``.bos.idx`` lists the
shard's document starts, every shard is within the bound unless it holds one
document longer than it, and a shard is cut only before a document that does
not fit.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shardflow.formats import FORMATS, MEGATRON, NANOGPT, bosidx
from shardflow.formats.megatron import idx_path, parse_idx
from shardflow.formats.unit_writer import UnitShard, UnitShardWriter

DTYPE = np.dtype("<u4")
FORMAT_DTYPES = [
    (fmt, np.dtype(dt)) for fmt in FORMATS.values() for dt in ("<u2", "<u4") if fmt.name != "nanogpt-legacy" or dt == "<u2"
]


def write_documents(directory: Path, fmt, dtype, docs: list[np.ndarray], bound: int, batches: list[int]) -> list[UnitShard]:
    """Write ``docs`` in batches of the given sizes (the rest in one last batch); returns the shards."""
    with UnitShardWriter(fmt, lambda i: directory / "out" / f"u_{i:06d}.{fmt.extension}", dtype, bound) as w:
        done = 0
        for n in [*batches, len(docs)]:
            batch = docs[done : done + n]
            if batch:
                w.write(np.concatenate(batch), [len(d) for d in batch])
            done += len(batch)
        return w.close()


def check_shards(fmt, dtype, docs: list[np.ndarray], bound: int, shards: list[UnitShard]) -> None:
    """The properties every cut must have, on the files."""
    lengths = [len(d) for d in docs]
    all_tokens: list[np.ndarray] = []
    doc_starts: list[np.ndarray] = []
    offset = 0
    for s in shards:
        raw = s.path.read_bytes()
        tokens = np.asarray(fmt.open(s.path, dtype))
        assert (s.bytes, s.sha256) == (len(raw), hashlib.sha256(raw).hexdigest())
        assert raw == fmt.header(len(tokens), dtype) + tokens.tobytes()  # what a counted writer writes
        index = bosidx.index_path(s.path)
        starts = bosidx.read(index, s.tokens)
        assert (s.index_bytes, s.index_sha256) == (index.stat().st_size, hashlib.sha256(index.read_bytes()).hexdigest())
        assert s.tokens == len(tokens) > 0 and s.documents == len(starts)
        assert starts[0] == 0  # a shard begins with a document: none continues from the shard before
        assert fmt.check_sidecars(s.path, s.tokens, dtype, starts) == []
        assert [name for name, _, _ in s.sidecars] == [p.name for p in fmt.sidecars(s.path, s.tokens, dtype, starts)]
        all_tokens.append(tokens)
        doc_starts.append(starts.astype(np.int64) + offset)
        offset += s.tokens
    # The shards, end to end, are the documents, end to end, and their indexes are the document starts.
    joined = np.concatenate(all_tokens) if all_tokens else np.empty(0, dtype)
    assert joined.tolist() == (np.concatenate(docs).tolist() if docs else [])
    assert (np.concatenate(doc_starts).tolist() if doc_starts else []) == np.cumsum([0, *lengths])[:-1].tolist()
    # Within the bound unless one oversized document; cut only before a document that does not fit.
    first = np.cumsum([0] + [s.documents for s in shards])
    for k, s in enumerate(shards):
        assert s.tokens <= bound or (s.documents == 1 and lengths[first[k]] > bound)
        if k + 1 < len(shards):
            assert s.tokens + lengths[first[k + 1]] > bound


@settings(max_examples=40, deadline=None)
@given(
    which=st.integers(0, len(FORMAT_DTYPES) - 1),
    lengths=st.lists(st.integers(1, 40), max_size=30),
    bound=st.integers(1, 60),
    batches=st.lists(st.integers(0, 8), max_size=5),
)
def test_documents_are_cut_into_bounded_shards_that_hold_them_whole(
    which: int, lengths: list[int], bound: int, batches: list[int]
) -> None:
    fmt, dtype = FORMAT_DTYPES[which]
    rng = np.random.default_rng(len(lengths) * 61 + bound)
    docs = [rng.integers(0, 60_000, n).astype(dtype) for n in lengths]
    with tempfile.TemporaryDirectory() as d:
        shards = write_documents(Path(d), fmt, dtype, docs, bound, batches)
        check_shards(fmt, dtype, docs, bound, shards)
        files = sorted(p.name for p in (Path(d) / "out").iterdir()) if shards else []
        expected = sorted(n for s in shards for n in (s.path.name, bosidx.index_path(s.path).name, *(x[0] for x in s.sidecars)))
        assert files == expected  # and no temporary file


def test_an_oversized_document_gets_a_shard_of_its_own(tmp_path: Path) -> None:
    lengths = [3, 4, 12, 2, 2, 5, 1]
    docs = [np.full(n, i, dtype=DTYPE) for i, n in enumerate(lengths)]
    shards = write_documents(tmp_path, NANOGPT, DTYPE, docs, 8, [2, 3])
    assert [(s.tokens, s.documents) for s in shards] == [(7, 2), (12, 1), (4, 2), (6, 2)]
    assert [bosidx.read(bosidx.index_path(s.path), s.tokens).tolist() for s in shards] == [[0, 3], [0], [0, 2], [0, 5]]
    assert [s.path.name for s in shards] == [f"u_{i:06d}.bin" for i in range(4)]
    check_shards(NANOGPT, DTYPE, docs, 8, shards)


def test_a_megatron_shard_gets_its_idx_with_one_sequence_per_document(tmp_path: Path) -> None:
    docs = [np.arange(n, dtype=DTYPE) for n in (5, 3, 9, 2)]
    shards = write_documents(tmp_path, MEGATRON, DTYPE, docs, 10, [])
    assert [s.tokens for s in shards] == [8, 9, 2]
    index = parse_idx(idx_path(shards[0].path).read_bytes(), idx_path(shards[0].path))
    assert index.sequence_lengths.tolist() == [5, 3]
    assert shards[0].sidecars[0][0] == idx_path(shards[0].path).name


def test_no_documents_write_no_shard(tmp_path: Path) -> None:
    with UnitShardWriter(NANOGPT, lambda i: tmp_path / f"u{i}.bin", DTYPE, 10) as w:
        w.write(np.empty(0, DTYPE), [])
        assert w.close() == []
    assert list(tmp_path.iterdir()) == []


def test_a_failure_keeps_the_shards_committed_before_it_and_no_temporary_file(tmp_path: Path) -> None:
    def path_for(i: int) -> Path:
        if i == 2:
            raise OSError("no room for a third shard")
        return tmp_path / f"u{i}.bin"

    with pytest.raises(OSError, match="no room for a third shard"):
        with UnitShardWriter(NANOGPT, path_for, DTYPE, 4) as w:
            for n in (3, 3, 3):
                w.add(np.arange(n, dtype=DTYPE))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u0.bin", "u0.bos.idx", "u1.bin", "u1.bos.idx"]
    assert [s.tokens for s in w.shards] == [3, 3]


def test_a_failure_inside_a_shard_leaves_no_temporary_file(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="tokenizer failed"):
        with UnitShardWriter(NANOGPT, lambda i: tmp_path / f"u{i}.bin", DTYPE, 100) as w:
            w.add(np.arange(5, dtype=DTYPE))
            raise RuntimeError("tokenizer failed")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("bound", "tokens", "lengths", "message"),
    [
        (0, [1], [1], "bound must be a positive number of tokens, not 0"),
        (2**31, [1], [1], r"bound 2147483648 is more tokens than a nanogpt shard holds \(2147483647\)"),
        (10, [1, 2], [2, 0], r"every document has at least one token \(its boundary\)"),
        (10, [1, 2, 3], [2], "the lengths add up to 2 tokens, not the 3 given"),
        (10, np.zeros((2, 2)), [4], "tokens must be a flat array of uint32, not 2-D float64"),
    ],
)
def test_a_wrong_call_is_refused_before_anything_is_written(tmp_path: Path, bound, tokens, lengths, message) -> None:
    with pytest.raises(ValueError, match=message):
        with UnitShardWriter(NANOGPT, lambda i: tmp_path / f"u{i}.bin", DTYPE, bound) as w:
            w.write(np.asarray(tokens, dtype=DTYPE) if not isinstance(tokens, np.ndarray) else tokens, lengths)
    assert list(tmp_path.iterdir()) == []
