"""Readers trust only what was published, and keep it while they read (issue 40, cases 3, 5 and 7).

Case 3: a shard rewritten in place at the same size, its manifest untouched, is refused by
``TokenDataset`` and ``StreamingTokenDataset`` when it is first mapped (its mtime is not the one
recorded at publish), and a writer who restores the mtime is caught by the token-id check of the
window served. Case 5: a version an open reader holds is pinned: ``rm`` refuses it naming the
reader's pid (and ``gc`` a pinned leftover), a forked worker and an unpickled copy keep the pin,
``--force`` removes it anyway and the reader then fails in one message saying so. Case 7:
a resume state whose position (or epoch, offset) is out of range is one ``ValueError``.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from support.cli import run_main
from support.shards import counting_shards, write_shards
from shardflow.catalog import Catalog
from shardflow.errors import CatalogError, ValidationError
from shardflow.manifest import read_manifest
from shardflow.runtime import MixtureDataset, StreamingTokenDataset, TokenDataset

NAME = "readertrust"
REF = f"{NAME}@v1"


def vdir(root: Path) -> Path:
    return root / "data" / NAME / "v1"


def first_sample_of_shard(ds: TokenDataset, k: int) -> int:
    return int(ds.sample_offsets[k])


# --- case 3: a shard changed in place after publish -----------------------------------------------------

def test_a_shard_changed_in_place_is_refused_when_first_mapped_and_a_restored_mtime_by_the_id_check(root):
    cat = root / "catalog"
    shard = read_manifest(vdir(root)).splits["train"].shards[1]
    path = vdir(root) / shard.file
    ds = TokenDataset(REF, catalog=cat, seq_len=64)  # opened before the change: its first map comes after
    stream = StreamingTokenDataset(REF, catalog=cat, seq_len=64, shuffle=False)
    ds[first_sample_of_shard(ds, 0)]  # shard 0 is untouched and mapped: served

    st = path.stat()
    path.chmod(0o644)
    data = bytearray(path.read_bytes())
    at = st.st_size - 2 * shard.tokens + 2 * 10  # tokens 10 to 41, in the shard's first window (uint16 ids)
    data[at : at + 64] = np.full(32, 65535, dtype="<u2").tobytes()  # ids past the 5,001-id vocabulary, same size
    path.write_bytes(bytes(data))
    assert path.stat().st_size == st.st_size and path.stat().st_mtime_ns != st.st_mtime_ns

    changed = rf"^{path}: changed after {REF} was published .*shardflow validate {REF}.* rebuild"
    with pytest.raises(ValidationError, match=changed):
        ds[first_sample_of_shard(ds, 1)]
    with pytest.raises(ValidationError, match=changed):
        for _ in stream:  # in order: shard 0's samples, then the first of shard 1
            pass
    with pytest.raises(ValidationError, match=changed):  # opened after the change: opening is fine, mapping is not
        TokenDataset(REF, catalog=cat, seq_len=64)[first_sample_of_shard(ds, 1)]

    # A writer who restores the mtime passes the stat check; the window's ids do not pass the vocabulary.
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    fresh = TokenDataset(REF, catalog=cat, seq_len=64)
    with pytest.raises(ValidationError, match=rf"^{path}: token id 65535 at token 10 is not below the vocabulary "
                                              rf"size 5,001 of {REF}.*shardflow validate {REF}"):
        fresh[first_sample_of_shard(fresh, 1)]
    with pytest.raises(ValidationError, match="token id 65535"):
        for _ in StreamingTokenDataset(REF, catalog=cat, seq_len=64, shuffle=False):
            pass
    rc, out, err = run_main("validate", REF, "--catalog", cat)
    assert rc != 0 and shard.file in out + err

    # A new mtime over the published bytes (a copy that did not keep mtimes, a touch) is hashed once, and served.
    untouched = vdir(root) / read_manifest(vdir(root)).splits["train"].shards[2].file
    os.utime(untouched, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    assert fresh[first_sample_of_shard(fresh, 2)]["input_ids"].shape == (64,)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(seq_len=st.sampled_from([16, 100, 700]), align=st.booleans(), quantile=st.floats(0.9, 0.99999),
       picks=st.lists(st.integers(0, 10**9), min_size=1, max_size=40))
def test_the_id_check_refuses_exactly_the_groups_that_hold_an_id_past_the_vocabulary(
    published, seq_len, align, quantile, picks
):
    """Property: with a vocabulary lowered below ids the shards hold, a sample is served iff no window of its
    group (``ID_GROUP_BITS``: 64 samples of one shard) holds an id at or above it, and what is served is below it."""
    from shardflow.runtime.dataset import ID_GROUP_BITS

    ds = TokenDataset(REF, catalog=published / "catalog", seq_len=seq_len, align_to_bos=align)
    ids = np.concatenate([ds.shards.shard(k) for k in range(ds.shards.num_shards)])
    ds.shards.vocab_size = max(1, int(np.quantile(ids, quantile)))  # some windows now hold ids "past" it
    ds = pickle.loads(pickle.dumps(ds))  # the copy makes its id checks for the vocabulary it now has
    vocab = ds.shards.vocab_size
    for pick in picks:
        i = pick % len(ds)
        k = int(np.searchsorted(ds.sample_offsets, i, side="right")) - 1
        first = int(ds.sample_offsets[k]) + (((i - int(ds.sample_offsets[k])) >> ID_GROUP_BITS) << ID_GROUP_BITS)
        group = range(first, min(first + (1 << ID_GROUP_BITS), int(ds.sample_offsets[k + 1])))
        bad = any(int(np.asarray(_window(ds, j)).max()) >= vocab for j in group)
        if bad:
            with pytest.raises(ValidationError, match=rf"token id \d+ at token \d+ is not below the vocabulary size"):
                ds[i]
        else:
            assert int(ds[i]["labels"].max()) < vocab and int(ds[i]["input_ids"].max()) < vocab


def _window(ds: TokenDataset, j: int) -> np.ndarray:
    """Sample ``j``'s tokens, read around the checks (what the property compares against)."""
    k, start = ds.locate(j)
    return ds.shards.shard(k)[start : start + ds.seq_len + 1]


# --- case 5: a version being read is pinned --------------------------------------------------------------

def _hold_until_told(conn) -> None:  # noqa: ANN001 - a forked child: holds the inherited pin until told
    conn.send("ready")
    conn.recv()


def test_rm_and_gc_refuse_a_version_an_open_reader_pins_and_a_forced_rm_fails_the_reader_in_one_message(root):
    cat = root / "catalog"
    ds = TokenDataset(REF, catalog=cat, seq_len=64)
    rc, out, err = run_main("rm", REF, "--catalog", cat)
    assert rc == 2 and out == "", err
    assert err.strip().splitlines() == [
        f"shardflow: error: {REF} is being read: pinned by pid {os.getpid()}. Wait for that job to end (or stop it), "
        "or pass --force to remove it anyway: its readers then fail at the next shard they open"
    ]
    assert [v.version for v in Catalog(cat).versions(NAME)] == ["v1"] and vdir(root).is_dir()

    # A DataLoader worker: forked, it shares the pin; spawned, it unpickles the dataset and pins again.
    copy = pickle.loads(pickle.dumps(ds))
    parent, child = multiprocessing.get_context("fork").Pipe()
    worker = multiprocessing.get_context("fork").Process(target=_hold_until_told, args=(child,))
    worker.start()
    try:
        assert parent.recv() == "ready"
        del ds
        gc.collect()
        assert run_main("rm", REF, "--catalog", cat).status == 2  # the forked worker and the copy still hold it
        copy_sample = copy[0]
    finally:
        parent.send("done")
        worker.join(10)
    assert run_main("rm", REF, "--catalog", cat).status == 2  # the unpickled copy alone
    assert copy_sample["input_ids"].shape == (64,)

    # gc keeps a removed version's leftover that a reader pins (an rm interrupted after the catalog's commit point).
    with Catalog(cat).lock(NAME):
        Catalog(cat).remove(NAME, "v1", removed_at="2025-01-01T00:00:00Z")
    rc, out, err = run_main("gc", "--catalog", cat, "--data-root", root / "data")
    assert rc == 2 and vdir(root).is_dir()
    assert f"kept {vdir(root)}: {vdir(root)} is being read: pinned by pid {os.getpid()}" in err

    # Past the pin: removed anyway, the reader fails at its next unmapped shard, saying so.
    rc, out, err = run_main("rm", REF, "--catalog", cat, "--force")
    assert rc == 0 and out.startswith(f"finished removing {REF}"), err
    assert not vdir(root).exists()
    assert copy[0]["input_ids"].shape == (64,)  # its mapped shard outlives the files
    with pytest.raises(CatalogError, match=rf"{REF} was removed \(shardflow rm\) while it was being read: its "
                                           rf"directory {vdir(root)} is gone"):
        copy[len(copy) - 1]
    del copy
    gc.collect()
    assert not (root / "data" / NAME / ".pins").exists()


# --- case 7: a resume state out of range -------------------------------------------------------------------

def test_every_field_of_a_resume_state_is_range_checked_one_value_error(tmp_path):
    write_shards(tmp_path, counting_shards([3000, 3000]))
    stream = StreamingTokenDataset(str(tmp_path), seq_len=16, seed=0)
    mix = MixtureDataset({str(tmp_path): 0.5, TokenDataset(str(tmp_path), seq_len=16): 0.5}, seq_len=16)
    for reader in (stream, mix):
        state = reader.state_dict()
        for field, value in (("position", 2**63), ("position", 10**400), ("epoch", 2**64), ("offset", -1),
                             ("position", np.uint64(2**63)), ("check", [1])):
            with pytest.raises(ValueError, match=field):
                reader.load_state_dict({**state, field: value})
            assert reader.position == 0
        with pytest.raises(ValueError, match=r"^epoch must be at most"):
            reader.set_epoch(2**63)
        with pytest.raises(ValueError, match=r"^n must be at most"):
            reader.advance(2**63)
        reader.load_state_dict({**state, "position": 2**40})  # far, but in range: continues
        assert reader.state_dict()["position"] == 2**40 and next(iter(reader))["input_ids"].shape == (16,)
