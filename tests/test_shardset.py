"""The one reader of a split's layout (``shardflow.shardset.ShardSet``), checked on real built versions.

Every invariant is checked against an independent reading of the same files:
the concatenation of all shards (``np.concatenate``), the positions of the
boundary token in it, and document starts derived from the tokens alone (a
copy of the shards without their ``.bos.idx``).
"""

from __future__ import annotations

import hashlib
import pickle
import shutil
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from support.builds import Built, make_builder
from support.paths import ASSETS, SAMPLE
from support.recut import whole_document_cuts
from shardflow.pipeline import BuildResult
from shardflow.formats import NANOGPT
from shardflow.manifest import read_manifest
from shardflow.runtime import open_shards
from shardflow.runtime.shards import ShardInfo as RuntimeShardInfo
from shardflow.runtime.shards import ShardSet as RuntimeShardSet
from shardflow.shardset import ShardInfo, ShardSet


@pytest.fixture(scope="module")
def eos_built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The sample corpus with EOS placement, in shards of whole documents, at most 40,000 tokens each."""
    return make_builder(tmp_path_factory.mktemp("eos-built"))(SAMPLE, name="eos", shard_tokens=40_000, boundary="eos")


SCHEMA2 = ASSETS / "schema2"
# two@v1 as the code of manifest schema 2 published it (read in place, never written): BOS placement,
# 2,000-token shards cut across documents, so the tests below also read documents that span shards.
schema2_built = Built(
    result=BuildResult(ref="two@v1", manifest_path=str(SCHEMA2 / "data/two/v1/metadata.yaml"), created=False),
    data_root=SCHEMA2 / "data",
    catalog=SCHEMA2 / "catalog",
)


@pytest.fixture(params=["bos", "eos", "schema2"])
def version(request: pytest.FixtureRequest, sample_built: Built, eos_built: Built) -> Built:
    return {"bos": sample_built, "eos": eos_built, "schema2": schema2_built}[request.param]


def _set(b: Built) -> ShardSet:
    return ShardSet.from_manifest(b.directory, read_manifest(b.directory), "train")


def _everything(s: ShardSet) -> np.ndarray:
    """The split's token stream, read shard by shard (not through the set's split-wide methods)."""
    return np.concatenate([np.asarray(s.shard(k)) for k in range(s.num_shards)])


def test_runtime_module_reexports_the_core_types():
    assert RuntimeShardSet is ShardSet and RuntimeShardInfo is ShardInfo


def test_offsets_add_up_to_the_manifest(version):
    m = read_manifest(version.directory)
    s = _set(version)
    entries = m.splits["train"].shards
    assert s.num_shards == len(entries) > 2
    assert s.offsets.dtype == np.int64 and len(s.offsets) == s.num_shards + 1 and s.offsets[0] == 0
    assert np.diff(s.offsets).tolist() == [e.tokens for e in entries] == [len(s.shard(k)) for k in range(s.num_shards)]
    assert s.num_tokens == int(s.offsets[-1]) == m.splits["train"].tokens
    assert sum(entry.tokens for entry in m.splits.values()) == m.totals["tokens"]
    assert sum(len(s.doc_starts(k)) for k in range(s.num_shards)) == len(s.all_doc_starts()) == m.splits["train"].documents


def test_each_shard_keeps_its_manifest_entry(version):
    """Callers that verify files (incremental builds) get the sizes and checksums of the files the set reads."""
    s = _set(version)
    for info, entry in zip(s.shards, read_manifest(version.directory).splits["train"].shards, strict=True):
        assert info.entry == entry
        assert info.path.name == Path(entry.file).name and info.index is not None and info.index.name == Path(entry.index.file).name
        assert hashlib.sha256(info.path.read_bytes()).hexdigest() == entry.sha256
        assert hashlib.sha256(info.index.read_bytes()).hexdigest() == entry.index.sha256


def test_document_starts_sit_at_the_boundary_token(version):
    s = _set(version)
    everything = _everything(s)
    starts = s.all_doc_starts()
    boundary = s.boundary_token
    assert starts.dtype == np.int64 and np.all(np.diff(starts) > 0)
    at = np.flatnonzero(everything == boundary)
    if s.placement == "bos":
        assert np.all(everything[starts] == boundary)
        expected = at  # and every BOS starts one
    else:
        assert starts[0] == 0 and np.all(everything[starts[1:] - 1] == boundary)
        expected = np.concatenate(([0], at[at + 1 < len(everything)] + 1))
    np.testing.assert_array_equal(starts, expected)
    # Split-wide starts are the per-shard ones shifted by the shard's offset.
    for k in range(s.num_shards):
        inside = starts[(starts >= s.offsets[k]) & (starts < s.offsets[k + 1])] - s.offsets[k]
        np.testing.assert_array_equal(inside, s.doc_starts(k))


def test_documents_cross_shard_boundaries_only_before_schema_3(version):
    """Schema 3: every shard begins with a document, and is cut where the next one would pass ``shard_tokens``.

    Not vacuous for the tests above: in the schema-2 version some shard starts
    inside a document, so its first document start is not token 0.
    """
    s = _set(version)
    m = read_manifest(version.directory)
    begins_a_document = [len(s.doc_starts(k)) > 0 and s.doc_starts(k)[0] == 0 for k in range(s.num_shards)]
    if m.schema_version >= 3:
        assert all(begins_a_document)
        lengths = np.diff(np.append(s.all_doc_starts(), s.num_tokens))
        assert np.diff(s.offsets).tolist() == whole_document_cuts(lengths, m.config["shard_tokens"])
    else:
        assert not all(begins_a_document[1:])


def test_read_across_shard_boundaries(version):
    s = _set(version)
    everything = _everything(s)
    for k in range(1, s.num_shards):
        o = int(s.offsets[k])
        np.testing.assert_array_equal(s.read(o - 7, o + 5), np.concatenate((s.shard(k - 1)[-7:], s.shard(k)[:5])))
    # Spanning three shards, and the whole split.
    a, b = int(s.offsets[1]) - 3, int(s.offsets[2]) + 3
    np.testing.assert_array_equal(s.read(a, b), everything[a:b])
    np.testing.assert_array_equal(s.read(0, s.num_tokens), everything)
    assert s.read(-5, 0).size == 0 and s.read(s.num_tokens, s.num_tokens + 9).size == 0 and s.read(9, 3).size == 0
    assert s.read(10, 10).dtype == s.dtype == everything.dtype


def test_locate(version):
    s = _set(version)
    everything = _everything(s)
    for t in [0, 1, s.num_tokens - 1, *s.offsets[1:-1].tolist(), *(s.offsets[1:-1] - 1).tolist()]:
        k, i = s.locate(t)
        assert s.offsets[k] <= t < s.offsets[k + 1] and i == t - s.offsets[k]
        assert s.shard(k)[i] == everything[t]
    for bad in (-1, s.num_tokens):
        with pytest.raises(IndexError, match="out of range"):
            s.locate(bad)


def test_reader_and_runtime_agree_with_a_reading_from_tokens_alone(version, tmp_path):
    """reader.Split, open_shards (version and plain glob of the same files) and starts derived without any .bos.idx."""
    v = version.open()
    split = v.split("train")
    runtime = open_shards(version.ref, catalog=version.catalog)
    boundary = runtime.boundary_token
    plain = open_shards(str(version.directory / "train" / "*_train_*.bin"), boundary_token=boundary, boundary=runtime.placement)
    bare = tmp_path / "bare"
    bare.mkdir()
    for info in runtime.shards:
        shutil.copy(info.path, bare / info.path.name)  # shards only: starts must be derived from the tokens
    derived = open_shards(bare, boundary_token=boundary, boundary=runtime.placement)
    assert all(info.index is None for info in derived.shards)
    assert runtime.num_shards == plain.num_shards == derived.num_shards == split.num_shards
    np.testing.assert_array_equal(split.shard_offsets, runtime.offsets)
    np.testing.assert_array_equal(split.shard_offsets, derived.offsets)
    for other in (runtime, plain, derived):
        np.testing.assert_array_equal(split.doc_starts, other.all_doc_starts())
        for k in range(split.num_shards):
            np.testing.assert_array_equal(split.shard_starts(k), other.doc_starts(k))
    assert len(split.doc_starts) == split.num_documents


def test_shards_cut_anywhere_derive_the_same_starts(version, tmp_path):
    """The same stream re-cut at document starts and inside documents: derived starts do not depend on the cuts.

    With EOS placement, a shard cut right after an EOS starts a document at its
    token 0 only because the previous shard ends with EOS.
    """
    s = _set(version)
    everything, starts = _everything(s), s.all_doc_starts()
    cuts = [0, int(starts[5]), int(starts[20]) + 3, int(starts[21]), len(everything)]
    for k, (lo, hi) in enumerate(zip(cuts, cuts[1:])):
        toks = everything[lo:hi]
        (tmp_path / f"recut_train_{k:06d}.bin").write_bytes(NANOGPT.header(len(toks), s.dtype) + toks.tobytes())
    recut = open_shards(tmp_path, boundary_token=s.boundary_token, boundary=s.placement)
    assert recut.num_shards == 4 and all(info.index is None for info in recut.shards)
    np.testing.assert_array_equal(recut.all_doc_starts(), starts)
    # Shards 1 and 3 begin at a document start; shard 2 lies inside document 20.
    assert recut.doc_starts(1)[0] == 0 and len(recut.doc_starts(2)) == 0 and recut.doc_starts(3)[0] == 0


def test_reader_split_delegates_to_its_shard_set(sample_built):
    split = sample_built.open().split("train")
    s = split.shards
    assert split.shard_offsets is s.offsets and split.doc_starts is s.all_doc_starts()
    assert isinstance(split.shard(0), np.memmap) and np.shares_memory(split.shard(0), s.shard(0))
    assert s._views[0] is not None  # one cache of maps: the reader's shard(0) opened the set's
    # open_shards on a version returns the version's own split set.
    assert s.version is not None and s.version.split("train").shards is s


def test_cached_arrays_are_read_only(sample_built):
    s = _set(sample_built)
    for a in (s.offsets, s.doc_starts(0), s.all_doc_starts(), s.shard(0)):
        with pytest.raises(ValueError, match="read-only"):
            a[0] = 1


def test_pickles_without_maps_or_indexes(sample_built):
    s = _set(sample_built)
    lo, hi = int(s.offsets[1]) - 10, int(s.offsets[2]) + 10  # shards 0, 1 and 2
    expected = s.read(lo, hi).copy()
    starts = s.all_doc_starts().copy()
    assert all(s._views[k] is not None for k in range(3))
    blob = pickle.dumps(s)
    assert len(blob) < 16_000  # the description only: the shards hold 600 KB
    copy = pickle.loads(blob)
    assert all(v is None for v in copy._views) and all(x is None for x in copy._starts) and copy._all_starts is None
    assert copy.shards == s.shards and copy.fingerprint == s.fingerprint
    np.testing.assert_array_equal(copy.read(lo, hi), expected)
    np.testing.assert_array_equal(copy.all_doc_starts(), starts)


def test_last_token_keeps_no_map_it_opened(eos_built):
    s = _set(eos_built)
    everything = _everything(_set(eos_built))
    for k in range(s.num_shards):
        assert s.last_token(k) == everything[s.offsets[k + 1] - 1]
    assert all(v is None for v in s._views)


def test_unknown_split_names_the_splits(sample_built):
    with pytest.raises(KeyError, match=r"sample@v1 has no split 'val'; its splits are train"):
        ShardSet.from_manifest(sample_built.directory, read_manifest(sample_built.directory), "val")


@pytest.fixture(scope="module")
def sample_stream(sample_built: Built) -> tuple[ShardSet, np.ndarray]:
    s = _set(sample_built)
    return s, _everything(s)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_read_matches_the_concatenated_shards(sample_stream, data):
    s, everything = sample_stream
    n = s.num_tokens
    near_boundary = st.builds(lambda o, d: o + d, st.sampled_from(s.offsets.tolist()), st.integers(-3, 3))
    point = st.one_of(st.integers(-20, n + 20), near_boundary)
    start, stop = data.draw(point, label="start"), data.draw(point, label="stop")
    lo, hi = min(max(start, 0), n), min(max(stop, 0), n)
    got = s.read(start, stop)
    np.testing.assert_array_equal(got, everything[lo : max(lo, hi)])
    assert got.dtype == everything.dtype
    if 0 <= start < n:
        k, i = s.locate(start)
        assert s.shard(k)[i] == everything[start]


def test_plain_directories_with_one_token_as_bos_and_eos_find_the_document_starts(tmp_path):
    """``BOS + ids + EOS`` with BOS == EOS (tiktoken's <|endoftext|>): starts come from the tokens alone."""
    from shardflow.formats import NPY
    from shardflow.runtime.shards import open_shards

    T = 9
    docs = [[1, 2], [3], [4, 5, 6], [7], [8, 1]]
    stream = [t for d in docs for t in (T, *d, T)]
    # Cut so that a shard ends on a BOS, and another on an EOS.
    cuts = [0, 4, 7, 12, len(stream)]
    for i, (a, b) in enumerate(zip(cuts, cuts[1:])):
        arr = np.asarray(stream[a:b], dtype=np.uint16)
        with open(tmp_path / f"d_train_{i:06d}.npy", "wb") as f:
            f.write(NPY.header(len(arr), arr.dtype))
            f.write(arr.tobytes())
    shards = open_shards(tmp_path, boundary_token=T, boundary="both")
    expected, pos = [], 0
    for d in docs:
        expected.append(pos)
        pos += len(d) + 2
    assert shards.all_doc_starts().tolist() == expected
