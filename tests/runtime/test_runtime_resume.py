"""Exact resume: save after N samples, load into a fresh dataset, continue the uninterrupted sequence."""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest

from shardflow.runtime import MixtureDataset, StreamingTokenDataset


def take(stream, n: int) -> list[bytes]:
    """The next ``n`` samples, running as many passes (epochs) as needed."""
    out: list[bytes] = []
    while len(out) < n:
        before = len(out)
        for sample in stream:
            out.append(sample["input_ids"].tobytes() + sample["labels"].tobytes())
            if len(out) == n:
                break
        assert len(out) > before, "a pass yielded nothing"
    return out


def via_json(state: dict) -> dict:
    return json.loads(json.dumps(state))  # states are plain data: they go into checkpoints


def make_stream(cat, **kw):
    opts = dict(seq_len=700, catalog=cat.path, seed=11, world_size=2, rank=1)
    opts.update(kw)
    return StreamingTokenDataset("wiki@v1", **opts)


def make_mixture(cat, **kw):
    opts = dict(seq_len=700, catalog=cat.path, seed=11, world_size=2, rank=0)
    opts.update(kw)
    return MixtureDataset({"wiki@v1": 0.6, "eos@v1": 0.4}, **opts)


# Phase 0 is one short epoch (its default epoch is about 300 samples); phase 1 has full epochs, then a short one.
PHASES = [
    (0, {"wiki@v1": 0.6, "eos@v1": 0.4}),
    (150, {"wiki@v1": 0.1, "eos@v1": 0.9}),
    (900, {"wiki@v1": 0.5, "eos@v1": 0.5}),
]


def make_phased(cat, **kw):
    opts = dict(seq_len=700, catalog=cat.path, seed=11, world_size=2, rank=0)
    opts.update(kw)
    return MixtureDataset(phases=PHASES, **opts)


def merge_round_robin(slices: list[list], block: int) -> list:
    """What a DataLoader does with the workers' slices: a block from worker 0, then worker 1, ..."""
    batches = [[s[i : i + block] for i in range(0, len(s), block)] for s in slices]
    merged = []
    for round_ in itertools.zip_longest(*batches):
        for b in round_:
            if b:
                merged.extend(b)
    return merged


@pytest.fixture(params=["stream", "mixture", "mixture-phases", "stream-infinite", "stream-packed-aligned"])
def factory(request, cat):
    return {
        "stream": lambda: make_stream(cat),
        "mixture": lambda: make_mixture(cat),
        "mixture-phases": lambda: make_phased(cat),
        "stream-infinite": lambda: make_stream(cat, infinite=True),
        "stream-packed-aligned": lambda: make_stream(cat, pack_sequences=True, align_to_bos=True, seq_len=300),
    }[request.param]


def test_resume_mid_epoch(factory):
    n = factory().samples_per_epoch
    total = 2 * n + 3
    reference = take(factory(), total)
    first = factory()
    head = take(first, n // 3)
    resumed = factory()
    resumed.load_state_dict(via_json(first.state_dict()))
    assert resumed.position == n // 3 and resumed.epoch == 0
    assert head + take(resumed, total - len(head)) == reference


def test_resume_across_an_epoch_boundary(factory):
    n = factory().samples_per_epoch
    reference = take(factory(), 3 * n)
    first = factory()
    head = take(first, n + 5)
    state = via_json(first.state_dict())
    assert (state["epoch"], state["offset"]) == (1, 5)
    resumed = factory()
    resumed.load_state_dict(state)
    assert head + take(resumed, 3 * n - len(head)) == reference


def test_resume_at_the_end_of_an_epoch(factory):
    n = factory().samples_per_epoch
    reference = take(factory(), 2 * n)
    first = factory()
    head = take(first, n)
    resumed = factory()
    resumed.load_state_dict(via_json(first.state_dict()))
    assert head + take(resumed, n) == reference


def test_two_resumes_within_one_epoch(factory):
    n = factory().samples_per_epoch
    reference = take(factory(), n + 4)
    a = factory()
    part1 = take(a, 3)
    b = factory()
    b.load_state_dict(via_json(a.state_dict()))
    part2 = take(b, n // 2)
    c = factory()
    c.load_state_dict(via_json(b.state_dict()))
    assert c.position == 3 + n // 2
    part3 = take(c, n + 4 - len(part1) - len(part2))
    assert part1 + part2 + part3 == reference


def test_worker_slices_merged_round_robin_are_the_rank_stream(cat):
    """What a DataLoader does with W workers and batch size B: B samples from worker 0, then worker 1, ..."""
    block = 3
    whole = list(make_stream(cat).indices())
    for workers in (1, 2, 5):
        slices = [list(make_stream(cat, worker_id=w, num_workers=workers, block_size=block).indices()) for w in range(workers)]
        assert merge_round_robin(slices, block) == whole


def test_resume_with_another_number_of_workers(cat):
    """The state is a rank-stream position: slices of any worker count continue it."""
    whole = list(make_stream(cat).indices())
    stream = make_stream(cat)
    stream.advance(7)
    state = via_json(stream.state_dict())
    resumed = [make_stream(cat, worker_id=w, num_workers=3, block_size=2) for w in range(3)]
    for r in resumed:
        r.load_state_dict(state)
    assert whole[:7] + merge_round_robin([list(r.indices()) for r in resumed], 2) == whole


@pytest.mark.parametrize("rank", [0, 1])
def test_resume_around_phase_boundaries(cat, rank):
    """States just before, at and just after each boundary, and in between, continue the uninterrupted sequence."""
    first = make_phased(cat, rank=rank, infinite=True)
    b1, b2 = first.phase_start(1), first.phase_start(2)
    total = b2 + 40
    reference = take(first, total)
    for n in (b1 - 1, b1, b1 + 1, (b1 + b2) // 2, b2 - 1, b2, b2 + 1):
        head_stream = make_phased(cat, rank=rank, infinite=True)
        head = take(head_stream, n)
        resumed = make_phased(cat, rank=rank, infinite=True)
        resumed.load_state_dict(via_json(head_stream.state_dict()))
        assert resumed.phase == (n >= b1) + (n >= b2)
        assert head + take(resumed, total - n) == reference, n


def test_resume_across_a_phase_boundary_with_other_workers(cat):
    """Resumed one sample before the last phase by 3 workers, merged as a DataLoader does: the same rank stream."""
    whole = make_phased(cat, rank=1, infinite=True)
    stop = whole.phase_start(2) + 30
    keys = list(whole.indices(0, stop))
    state = make_phased(cat, rank=1, infinite=True)
    state.advance(whole.phase_start(2) - 1)
    resumed = [make_phased(cat, rank=1, infinite=True, worker_id=w, num_workers=3, block_size=2) for w in range(3)]
    for r in resumed:
        r.load_state_dict(via_json(state.state_dict()))
    slices = [list(r.indices(r.position, stop)) for r in resumed]
    assert keys[: state.position] + merge_round_robin(slices, 2) == keys


def test_a_state_of_another_stream_is_refused(cat):
    state = make_stream(cat).state_dict()
    for other, field in [
        (make_stream(cat, seed=12), "seed"),
        (make_stream(cat, seq_len=701), "dataset.seq_len"),
        (make_stream(cat, shuffle=False), "shuffle"),
        (StreamingTokenDataset("wiki@v2", seq_len=700, catalog=cat.path, seed=11, world_size=2, rank=1), "dataset.shards"),
    ]:
        with pytest.raises(ValueError, match=f"different stream.*{field}: saved"):
            other.load_state_dict(state)
    with pytest.raises(ValueError, match="not a MixtureDataset state"):
        make_mixture(cat).load_state_dict(state)
    with pytest.raises(ValueError, match="not a StreamingTokenDataset state"):
        make_stream(cat).load_state_dict({"position": 3})
    bad = dict(state, position=-1)
    with pytest.raises(ValueError, match="position must be at least 0"):
        make_stream(cat).load_state_dict(bad)
    # The worker layout is not part of the state, and another rank or world size resumes elastically
    # (test_runtime_elastic.py).
    make_stream(cat, num_workers=4, worker_id=1, block_size=8).load_state_dict(state)
    make_stream(cat, world_size=3).load_state_dict(state)
    make_stream(cat, rank=0).load_state_dict(state)


def test_state_reports_epoch_and_offset(cat):
    s = make_stream(cat)
    n = s.samples_per_epoch
    s.advance(n * 2 + 9)
    st = s.state_dict()
    assert (st["position"], st["epoch"], st["offset"]) == (2 * n + 9, 2, 9)
    assert st["check"]["samples_per_epoch"] == n
    s.set_epoch(4)
    assert s.state_dict()["position"] == 4 * n
    np.testing.assert_equal(s.state_dict()["check"], make_stream(cat).state_dict()["check"])
