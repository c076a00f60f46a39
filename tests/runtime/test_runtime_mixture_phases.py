"""Mixture phases (annealing): weights that change at global sample positions, exact, split and refused when wrong."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from shardflow.runtime import MixtureDataset
from shardflow.runtime.mixture import mixture_counts

# The example: 70/30, then 20/80 for the annealing phase (20,000 samples each here).
ANNEAL = [(0, {"wiki@v1": 0.7, "eos@v1": 0.3}), (20_000, {"wiki@v1": 0.2, "eos@v1": 0.8})]


def phased(cat, phases=ANNEAL, **kw) -> MixtureDataset:
    opts = dict(seq_len=64, catalog=cat.path, seed=3, infinite=True)
    opts.update(kw)
    return MixtureDataset(phases=phases, **opts)


def components(mix: MixtureDataset, start: int, stop: int) -> np.ndarray:
    return np.array([c for c, _ in mix.indices(start, stop)])


def test_realized_proportions_within_one_percent_in_each_phase(cat):
    mix = phased(cat)
    comps = components(mix, 0, 40_000)
    for (lo, hi), share in [((0, 20_000), 0.7), ((20_000, 40_000), 0.2)]:
        wiki = comps[lo:hi] == 0
        assert abs(wiki.mean() - share) < 0.01
        # Not only on average: the switch is sharp and every run of 1,000 samples in a phase is mixed evenly.
        c = np.concatenate(([0], np.cumsum(wiki)))
        assert np.abs((c[1000:] - c[:-1000]) / 1000 - share).max() < 0.01
    assert mix.phase == 0 and mix.phase_start(1) == 20_000
    mix.advance(20_000)
    assert mix.phase == 1
    np.testing.assert_allclose(mix.weights, [0.2, 0.8])


def test_every_epoch_has_exact_counts_and_phases_end_on_an_epoch(cat):
    mix = phased(cat, infinite=False)
    full = [p.epoch_samples for p in mix.phases]
    assert 20_000 % full[0]  # so phase 0 ends with a short epoch
    starts, sizes = [], []
    for e in range(12):
        mix.set_epoch(e)
        starts.append(mix.position)  # one rank: rank positions are global positions
        sizes.append(mix.epoch_samples)
        phase = mix.phases[mix.phase]
        comps = np.array([c for c, _ in mix.indices()])
        assert len(comps) == mix.epoch_samples == mix.samples_per_epoch
        np.testing.assert_array_equal(np.bincount(comps, minlength=2), mixture_counts(np.array(phase.weights), len(comps)))
        np.testing.assert_array_equal(mix.counts, np.bincount(comps, minlength=2))
    k = 20_000 // full[0]
    assert sizes[:k] == [full[0]] * k and sizes[k] == 20_000 % full[0] and starts[k + 1] == 20_000
    assert sizes[k + 1 :] == [full[1]] * (11 - k)
    np.testing.assert_array_equal(mix.phases[1].counts, mixture_counts(np.array([0.2, 0.8]), full[1]))


def test_components_continue_their_streams_across_phases(cat):
    """No sample is repeated or skipped because of a switch: at each epoch end a component has read a prefix of its stream."""
    phases = [
        (0, {"wiki@v1": 1.0, "eos@v1": 0.0}),  # eos joins later,
        (3_000, {"wiki@v1": 0.5, "eos@v1": 0.5}),
        (9_000, {"wiki@v1": 0.0, "eos@v1": 1.0}),  # wiki is dropped for the last phase
    ]
    for shuffle in (False, True):
        mix = phased(cat, phases=phases, shuffle=shuffle)
        sizes = [len(ds) for ds in mix.components]
        ends = [3_000, 9_000, 9_000 + 2 * mix.phases[2].epoch_samples]
        keys = list(mix.indices(0, ends[-1]))
        assert {c for c, _ in keys[:3_000]} == {0} and {c for c, _ in keys[9_000:]} == {1}
        for end in ends:
            for d, n in enumerate(sizes):
                read = Counter(i for c, i in keys[:end] if c == d)
                total = sum(read.values())
                if not shuffle:  # the stream of an unshuffled component is its samples in order, epoch after epoch
                    assert read == Counter(p % n for p in range(total)), (end, d)
                else:  # whole epochs of the component, then part of the next: read k or k + 1 times, nothing else
                    k, extra = divmod(total, n)
                    times = Counter(read[i] for i in range(n))
                    assert times == Counter({k: n - extra, k + 1: extra}) - Counter(), (end, d)


def test_ranks_and_workers_split_every_phase_exactly(cat):
    phases = [(0, {"wiki@v1": 0.6, "eos@v1": 0.4}), (5_003, {"wiki@v1": 0.1, "eos@v1": 0.9})]
    single = phased(cat, phases=phases, seed=9, infinite=False)
    single.set_epoch(5)  # well after the boundary
    stop = single.position
    assert single.phase == 1
    full = Counter(single.indices(0, stop))
    for world_size, workers, block in [(2, 3, 4), (3, 1, 1), (4, 5, 2)]:
        seen: Counter = Counter()
        for r in range(world_size):
            for w in range(workers):
                m = phased(cat, phases=phases, seed=9, infinite=False, rank=r, world_size=world_size, worker_id=w, num_workers=workers, block_size=block)
                m.set_epoch(5)
                seen.update(m.indices(0, m.position))
        assert seen == full


def test_all_ranks_reach_a_phase_together(cat):
    """Boundaries are global positions, and phases end on epochs that every rank reads its share of."""
    phases = [(0, {"wiki@v1": 0.7, "eos@v1": 0.3}), (6_000, {"wiki@v1": 0.2, "eos@v1": 0.8})]
    for r in range(4):  # epochs and the boundary divide by world_size: exactly start / world_size each
        mix = phased(cat, phases=phases, rank=r, world_size=4, samples_per_epoch=1_000)
        assert mix.phase_start(1) == 1_500
        mix.advance(1_499)
        assert mix.phase == 0
        mix.advance(1)
        assert mix.phase == 1
    # Otherwise the ranks' shares of an epoch differ by one sample: the ranks reach the boundary within one
    # sample per epoch before it. drop_last gives every rank the same share, so the same start.
    m = phased(cat, phases=phases, world_size=7)
    n_epochs = 6_000 // m.phases[0].epoch_samples + 1  # full epochs and the short one
    spread = [phased(cat, phases=phases, rank=r, world_size=7).phase_start(1) for r in range(7)]
    assert all(abs(s - 6_000 / 7) <= n_epochs for s in spread) and len(set(spread)) > 1
    dropped = {phased(cat, phases=phases, rank=r, world_size=7, drop_last=True).phase_start(1) for r in range(7)}
    assert len(dropped) == 1


def test_a_plain_mixture_is_one_phase_from_step_zero(cat):
    weights = {"wiki@v1": 0.7, "eos@v1": 0.3}
    plain = MixtureDataset(weights, seq_len=64, catalog=cat.path, seed=2, rank=1, world_size=3)
    one = MixtureDataset(phases=[(0, weights)], seq_len=64, catalog=cat.path, seed=2, rank=1, world_size=3)
    n = plain.samples_per_epoch
    assert list(plain.indices(0, 3 * n)) == list(one.indices(0, 3 * n))
    assert plain.state_dict() == one.state_dict() and len(plain.phases) == 1
    one.advance(5)
    plain.load_state_dict(one.state_dict())  # the same stream: the state carries over
    assert plain.position == 5


def test_a_state_of_another_schedule_is_refused(cat):
    state = phased(cat).state_dict()
    later = [ANNEAL[0], (25_000, ANNEAL[1][1])]
    other_weights = [ANNEAL[0], (20_000, {"wiki@v1": 0.3, "eos@v1": 0.7})]
    for phases in (later, other_weights):
        with pytest.raises(ValueError, match="different stream.*phases: saved"):
            phased(cat, phases=phases).load_state_dict(state)
    with pytest.raises(ValueError, match="different stream.*phases: saved .*, now None"):
        MixtureDataset(ANNEAL[0][1], seq_len=64, catalog=cat.path, seed=3, infinite=True).load_state_dict(state)


def test_resuming_far_into_training_is_immediate(cat):
    """The layout is a few sums per phase: a state at sample 10**12 loads and reads at once."""
    big = [(0, ANNEAL[0][1]), (10**12, ANNEAL[1][1]), (2 * 10**12 + 17, {"wiki@v1": 0.5, "eos@v1": 0.5})]
    mix = phased(cat, phases=big, rank=5, world_size=8)
    start = mix.phase_start(1)
    assert abs(start - 10**12 // 8) <= 10**12 // mix.phases[0].epoch_samples + 1
    mix.advance(start - 3)
    ahead = list(mix.indices(mix.position, mix.position + 50))
    resumed = phased(cat, phases=big, rank=5, world_size=8)
    resumed.load_state_dict(mix.state_dict())
    assert resumed.phase == 0 and list(resumed.indices(resumed.position, resumed.position + 50)) == ahead
    resumed.advance(3)
    assert resumed.phase == 1 and resumed.state_dict()["offset"] == 0
    comp, idx = ahead[3]
    np.testing.assert_array_equal(next(iter(resumed))["input_ids"], mix.components[comp][idx]["input_ids"])


@pytest.mark.parametrize(
    ("phases", "message"),
    [
        ([(5, {"wiki@v1": 1.0})], "first phase starts at step 5, but the schedule must start at step 0"),
        ([(0, {"wiki@v1": 1.0}), (100, {"wiki@v1": 1.0}), (50, {"wiki@v1": 1.0})], "out of order: step 50 comes after step 100"),
        ([(0, {"wiki@v1": 1.0}), (100, {"wiki@v1": 1.0}), (100, {"wiki@v1": 1.0})], "two phases start at step 100"),
        ([(0, {"wiki@v1": 0.5, "eos@v1": 0.5}), (100, {"wiki@v1": 1.0})], "phase at step 100 gives no weight to 'eos@v1'"),
        ([(0, {"wiki@v1": 1.0}), (100, {"wiki@v1": 0.5, "eos@v1": 0.5})], "phase at step 100 names 'eos@v1', which the first phase does not"),
        ([(0, {"wiki@v1": 1.0, "eos@v1": 1.0}), (100, {"wiki@v1": 0, "eos@v1": 0.0})], "all weights of the phase at step 100 are 0"),
        ([(0, {"wiki@v1": 0.0, "eos@v1": 0.0})], "all weights of the phase at step 0 are 0"),
        ([(0, {"wiki@v1": 1.0, "eos@v1": 0.0}), (100, {"wiki@v1": 2.0, "eos@v1": 0.0})], "'eos@v1' has weight 0 in every phase"),
        ([(0, {"wiki@v1": 1.0}), (100, {"wiki@v1": -0.5})], "weight of 'wiki@v1' in the phase at step 100 is -0.5; weights must be positive, or 0"),
        ([(0, {"wiki@v1": 1.0}), (100, {"wiki@v1": math.nan})], "weight of 'wiki@v1' in the phase at step 100 is nan"),
        ([(0, {"wiki@v1": 1.0}), (100, {"wiki@v1": math.inf})], "weight of 'wiki@v1' in the phase at step 100 is inf"),
        ([(0, [("wiki@v1", 0.5), ("wiki@v1", 0.5)])], "phase at step 0 names 'wiki@v1' twice"),
        ([(0, {})], "at least one dataset in the phase at step 0"),
        ([(0, "wiki@v1")], "weights in the phase at step 0 are"),
        ([], "non-empty list of \\(step, \\{dataset: weight\\}\\) pairs"),
        ({0: {"wiki@v1": 1.0}}, "non-empty list"),
        ([(0, {"wiki@v1": 1.0}, 7)], "phases are \\(step, \\{dataset: weight\\}\\) pairs"),
        ([(0.0, {"wiki@v1": 1.0})], "step is a global sample position \\(an integer >= 0\\), not 0.0"),
        ([(-1, {"wiki@v1": 1.0})], "not -1"),
        ([(True, {"wiki@v1": 1.0})], "not True"),
    ],
)
def test_bad_schedules_are_refused(cat, phases, message):
    with pytest.raises(ValueError, match=message):
        MixtureDataset(phases=phases, seq_len=64, catalog=cat.path)


def test_bad_combinations_are_refused(cat):
    weights = {"wiki@v1": 1.0}
    with pytest.raises(ValueError, match="either weights .* not both"):
        MixtureDataset(weights, phases=[(0, weights)], seq_len=64, catalog=cat.path)
    with pytest.raises(ValueError, match="either weights .* none was given"):
        MixtureDataset(seq_len=64, catalog=cat.path)
    tiny = [(0, {"wiki@v1": 1.0, "eos@v1": 1.0}), (1_000, {"wiki@v1": 1.0, "eos@v1": 1e-9})]
    with pytest.raises(ValueError, match="weight of 'eos@v1' in the phase at step 1000 .* gives it no sample in an epoch of 100"):
        MixtureDataset(phases=tiny, seq_len=64, catalog=cat.path, samples_per_epoch=100)
    with pytest.raises(ValueError, match="100 samples per epoch cannot be split over world_size=101"):
        MixtureDataset(phases=tiny[:1] + [(1_000, tiny[0][1])], seq_len=64, catalog=cat.path, samples_per_epoch=100, world_size=101)
    with pytest.raises(ValueError, match="phase=2 is past the last phase; the schedule has 2"):
        phased(cat).phase_start(2)
