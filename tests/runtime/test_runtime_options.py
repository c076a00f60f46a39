"""``ReadOptions``: the readers' options as one object, the same as the keyword arguments."""

from __future__ import annotations

import numpy as np
import pytest

from support.shards import BOS, document_shards, write_shards
from shardflow.errors import ConfigError
from shardflow.runtime import MixtureDataset, ReadOptions, StreamingTokenDataset, TokenDataset, open_shards


@pytest.fixture
def docs(tmp_path):
    """A plain directory of document shards without ``.bos.idx``: the starts come from ``boundary_token``."""
    rng = np.random.default_rng(0)
    shards, _ = document_shards(rng.integers(5, 60, size=400).tolist(), 2000)
    write_shards(tmp_path / "docs", shards, format="npy")
    return tmp_path / "docs"


def same_samples(a, b) -> None:
    got, want = list(a), list(b)
    assert len(got) == len(want) > 0
    for x, y in zip(got, want):
        assert x.keys() == y.keys()
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])


def test_the_keywords_and_the_options_object_give_the_same_samples(docs):
    plain = {"pattern": "*", "boundary_token": BOS, "format": "npy"}
    samples = {"seq_len": 32, "pack_sequences": True, "align_to_bos": True, "overflow": "continue"}
    stream = {"seed": 3, "rank": 1, "world_size": 2, "shuffle_group": 2}

    shards = open_shards(docs, options=ReadOptions(**plain))
    assert shards.fingerprint == open_shards(docs, **plain).fingerprint and shards.boundary_token == BOS

    by_kw = TokenDataset(docs, **plain, **samples)
    by_opts = TokenDataset(docs, options=ReadOptions(**plain, **samples))
    assert by_kw.fingerprint == by_opts.fingerprint and repr(by_kw) == repr(by_opts)
    same_samples(by_kw, by_opts)

    s_kw = StreamingTokenDataset(docs, **plain, **samples, **stream)
    s_opts = StreamingTokenDataset(docs, options=ReadOptions(**plain, **samples, **stream))
    assert s_kw.state_dict() == s_opts.state_dict()
    same_samples(s_kw, s_opts)
    assert s_kw.state_dict() == s_opts.state_dict()  # both advanced to the epoch's end

    m_kw = MixtureDataset({by_kw: 0.6, by_opts: 0.4}, samples_per_epoch=50, **stream)
    m_opts = MixtureDataset({by_kw: 0.6, by_opts: 0.4}, options=ReadOptions(samples_per_epoch=50, **stream))
    assert list(m_kw.indices()) == list(m_opts.indices()) and m_kw.state_dict() == m_opts.state_dict()


def test_keywords_set_what_the_options_object_leaves_at_its_default(docs):
    base = ReadOptions(pattern="*", boundary_token=BOS, seq_len=32)
    one = StreamingTokenDataset(docs, options=base, seed=5, rank=1, world_size=3)
    other = StreamingTokenDataset(docs, pattern="*", boundary_token=BOS, seq_len=32, seed=5, rank=1, world_size=3)
    assert list(one.indices()) == list(other.indices()) and one.state_dict() == other.state_dict()


def test_an_option_given_twice_or_unknown_or_not_taken_is_refused(docs):
    opts = ReadOptions(pattern="*", seq_len=32)
    with pytest.raises(TypeError, match=r"TokenDataset\.__init__\(\) got seq_len both in options and as a keyword argument"):
        TokenDataset(docs, options=opts, seq_len=32)
    with pytest.raises(TypeError, match=r"open_shards\(\) got pattern both in options and as a keyword argument"):
        open_shards(docs, options=ReadOptions(pattern="*"), pattern="*")
    with pytest.raises(TypeError, match=r"TokenDataset\.__init__\(\) got an unexpected keyword argument 'sed'"):
        TokenDataset(docs, seq_len=32, pattern="*", sed=1)
    with pytest.raises(TypeError, match=r"TokenDataset\.__init__\(\) got an unexpected keyword argument 'rank'"):
        TokenDataset(docs, seq_len=32, pattern="*", rank=1)  # a stream's option, refused as before
    with pytest.raises(TypeError, match="unexpected keyword argument 'sed'"):
        ReadOptions(sed=1)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match=r"TokenDataset\.__init__\(\) does not take rank, world_size, which the given options set"):
        TokenDataset(docs, options=ReadOptions(pattern="*", seq_len=32, rank=1, world_size=2))
    with pytest.raises(TypeError, match=r"MixtureDataset\.__init__\(\) does not take dtype, which the given options set"):
        MixtureDataset({"a": 1.0}, options=ReadOptions(seq_len=32, dtype="uint16"))
    with pytest.raises(TypeError, match=r"StreamingTokenDataset\.__init__\(options=...\) takes a ReadOptions, not dict"):
        StreamingTokenDataset(docs, options={"seq_len": 32})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"TokenDataset\.__init__\(\) missing 1 required keyword-only argument: 'seq_len'"):
        TokenDataset(docs, options=ReadOptions(pattern="*"))


def test_the_values_are_checked_when_the_options_are_made():
    with pytest.raises(ValueError, match="seq_len must be at least 1"):
        ReadOptions(seq_len=0)
    with pytest.raises(ValueError, match="rank=2 must be below world_size=2"):
        ReadOptions(rank=2, world_size=2)
    with pytest.raises(ValueError, match="overflow='continue' only applies with align_to_bos=True"):
        ReadOptions(overflow="continue")
    with pytest.raises(ConfigError, match="dtype must be uint16 or uint32"):
        ReadOptions(dtype="int8")
    with pytest.raises(ConfigError, match="unknown shard format 'zip'"):
        ReadOptions(format="zip")
    opts = ReadOptions(seed=np.int64(4), dtype="uint16", boundary_token=np.int32(7), shuffle=0)
    assert (type(opts.seed), opts.dtype, type(opts.boundary_token), opts.shuffle) == (int, np.dtype("<u2"), int, False)
    assert opts.set_fields() == {"seed", "dtype", "boundary_token", "shuffle"}
