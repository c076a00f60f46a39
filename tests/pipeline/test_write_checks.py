"""Every shard is checked where its bytes pass, and no build reads one back (``pipeline/check.py``).

A tokenize job checks each piece's arrays before committing it, a gathered shard is checked as its tokens
are copied, a placed shard is its piece while the piece's files are the ones its job recorded (size, inode,
mtime), and a shard linked from the parent is the parent's own file. The write-shard job records which
(``layout/SPLIT-K.valid.json``); finalize compares the records with the files and reads nothing. A file
that is not known to be the one checked is read back in full. On the sample corpus in 4 inputs (9 placed
train shards, 3 gathered val shards) with the small vocabulary.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import shardflow.pipeline.check as check_mod
import shardflow.pipeline.tokenize as tokenize_mod
import shardflow.pipeline.write as write_mod
import shardflow.validation as validation
from support.builds import fault_options, versions
from support.corpus import split_sample
from shardflow.config import BuildConfig
from shardflow.errors import ValidationError
from shardflow.pipeline import build, build_lock, make_layout, plan_build, tokenize_unit, write_shard
from shardflow.pipeline.staging import Staging
from shardflow.pipeline.write import shard_done


def test_a_build_and_an_incremental_one_read_no_shard_back(tmp_path, small_vocab, monkeypatch):
    reads: list[str] = []
    real = validation.validate_shard_entry

    def counting(directory, ctx, split, k, entry, **kw):
        reads.append(entry.file)
        return real(directory, ctx, split, k, entry, **kw)

    monkeypatch.setattr(check_mod, "validate_shard_entry", counting)
    monkeypatch.setattr(validation, "validate_shard_entry", counting)
    checked: list[str] = []
    record = write_mod.record_check
    monkeypatch.setattr(write_mod, "record_check", lambda *a: checked.append(a[-1]) or record(*a))
    src = split_sample(tmp_path / "src")
    last = src / "part3.parquet"
    os.replace(last, tmp_path / last.name)  # the first build has 3 inputs, the second all 4
    config = BuildConfig(name="wc", sources=(str(src),), **fault_options(small_vocab), stats=False)
    where = dict(data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    build(config, **where, workers=2)
    first, checked[:] = Counter(checked), []
    os.replace(tmp_path / last.name, last)
    build(config, **where, workers=2)
    assert versions(tmp_path, "wc") == ["v1", "v2"]
    assert reads == []  # neither the write jobs nor finalize read a shard back
    assert set(first) == {"written"} and first["written"] >= 9  # placed and gathered, checked as written
    checked = Counter(checked)
    assert set(checked) == {"written", "parent"} and checked["parent"] >= 5  # the unchanged inputs' shards: linked
    validation.validate_dir(tmp_path / "data" / "wc" / "v2", checksums=True)  # the full re-read agrees
    assert len(reads) == sum(checked.values())  # (and is what the counting sees)


@pytest.mark.parametrize("fmt", ["bin", "megatron", "nanogpt", "npy"])
def test_every_format_checks_its_shards_as_written(tmp_path, small_vocab, tiny_parquet, monkeypatch, fmt):
    """A header (nanogpt, npy) written and checked, a sidecar (megatron's .idx) written and checked: each shard's
    record says so, its files' identities as the unit recorded them, and none is read back."""
    checked: list[str] = []
    record = write_mod.record_check
    monkeypatch.setattr(write_mod, "record_check", lambda *a: checked.append(a[-1]) or record(*a))
    monkeypatch.setattr(check_mod, "validate_shard_entry", lambda *a, **kw: pytest.fail("a shard was read back"))
    config = BuildConfig(name="f", sources=(str(tiny_parquet),), tokenizer=str(small_vocab), format=fmt, shard_tokens=3,
                         stats=False)
    result = build(config, data_root=tmp_path / "data", catalog=tmp_path / "catalog", workers=1)
    assert checked == ["written"] * 3  # one document a shard
    validation.validate_dir(Path(result.manifest_path).parent, checksums=True)


@pytest.mark.parametrize("change", ["replaced", "touched"])
def test_a_piece_changed_since_its_job_wrote_it_is_read_back_when_it_is_placed(tmp_path, small_vocab, change):
    """Replaced by a copy with one byte changed: its SHA-256 (taken as it was written) fails, and the shard is not
    committed. Only touched: the same bytes, read back and recorded so (without the check it would be trusted)."""
    config = BuildConfig(name="pc", sources=(str(split_sample(tmp_path / "src")),), **fault_options(small_vocab))
    plan = plan_build(config, data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    staging = Staging(plan.staging)
    with build_lock(plan) as plan:
        for u in range(len(plan.units)):
            tokenize_unit(plan, u)
        unit, p = make_layout(plan).splits["train"].sources[0]
        piece = staging.piece(unit, "train", p, "bin")
        st = piece.stat()
        if change == "replaced":
            data = bytearray(piece.read_bytes())
            data[-3] ^= 0x01
            (piece.parent / "copy").write_bytes(bytes(data))
            os.replace(piece.parent / "copy", piece)
            with pytest.raises(ValidationError, match=r"validation of shard 0 of split 'train' failed:\n  \S+pc_train_000000\.bin: SHA-256"):
                write_shard(plan, "train", 0)
            assert shard_done(plan, "train", 0) is None and not staging.shard_check("train", 0).exists()
        else:
            os.utime(piece, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
            write_shard(plan, "train", 0)
            assert json.loads(staging.shard_check("train", 0).read_text())["checked"] == "read"
        write_shard(plan, "train", 1)
        assert json.loads(staging.shard_check("train", 1).read_text())["checked"] == "written"


@pytest.mark.parametrize("damage", ["id past the vocabulary", "an EOS left out"])
def test_a_tokenize_job_refuses_to_commit_a_piece_that_fails_its_checks(tmp_path, small_vocab, tiny_parquet, monkeypatch,
                                                                       damage):
    """What the tokenizer and the boundaries hand the writer is checked before a piece is committed: a build whose
    tokens are damaged there stops in one message naming the piece, and publishes nothing."""
    real = tokenize_mod.with_boundaries

    def damaged(tokens, offsets, dtype, *, bos=None, eos=None):
        out = real(tokens, offsets, dtype, bos=bos, eos=eos)
        if damage == "an EOS left out":
            out[int(np.flatnonzero(out == eos)[0])] = 7
        else:
            out[1] = 5001  # the small vocabulary's size: ids 0..5000
        return out

    monkeypatch.setattr(tokenize_mod, "with_boundaries", damaged)
    config = BuildConfig(name="tk", sources=(str(tiny_parquet),), tokenizer=str(small_vocab), boundary="eos",
                         stats=False)
    message = (r"unit-000000/train-000000\.bin: token 1 is id 5001, not below the vocabulary size 5001"
               if damage == "id past the vocabulary" else
               r"unit-000000/train-000000\.bos\.idx: entry 1 points at token 3, which is not a document start \(EOS")
    with pytest.raises(ValidationError, match=message):
        build(config, data_root=tmp_path / "data", catalog=tmp_path / "catalog", workers=1)
    assert versions(tmp_path, "tk") == []
    assert not list(Path(tmp_path / "data").rglob("train-000000.bin"))
