"""Mixtures: exact proportions per epoch, even interleaving, deterministic, refused bad weights."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from shardflow.runtime import MixtureDataset, TokenDataset
from shardflow.runtime.mixture import mixture_counts


def epoch_components(mix: MixtureDataset) -> np.ndarray:
    return np.array([c for c, _ in mix.indices()])


def test_realized_proportions_within_one_percent(cat):
    mix = MixtureDataset({"wiki@v1": 0.7, "eos@v1": 0.3}, seq_len=128, catalog=cat.path, seed=0)
    comps = epoch_components(mix)
    assert len(comps) == mix.epoch_samples == mix.samples_per_epoch
    share = np.bincount(comps, minlength=2) / len(comps)
    assert abs(share[0] - 0.7) < 0.01 and abs(share[1] - 0.3) < 0.01
    # By default no component repeats a sample within an epoch, and the scarcer one is read whole.
    per = {d: [i for c, i in mix.indices() if c == d] for d in (0, 1)}
    assert all(len(v) == len(set(v)) for v in per.values())
    limiting = min((len(ds) / w, d) for d, (ds, w) in enumerate(zip(mix.components, mix.weights)))[1]
    assert len(per[limiting]) in (len(mix.components[limiting]), len(mix.components[limiting]) - 1)


def test_every_run_of_an_epoch_is_mixed_evenly(cat):
    weights = {"wiki@v1": 0.5, "eos@v1": 0.3, "one@v1": 0.2}
    mix = MixtureDataset(weights, seq_len=64, catalog=cat.path, samples_per_epoch=20_000)
    comps = epoch_components(mix)
    np.testing.assert_array_equal(np.bincount(comps), mixture_counts(mix.weights, 20_000))
    run = 1000
    for d, w in enumerate(mix.weights):
        c = np.concatenate(([0], np.cumsum(comps == d)))
        shares = (c[run:] - c[:-run]) / run
        assert np.abs(shares - w).max() < 0.01, d


def test_two_versions_of_one_dataset_and_normalized_weights(cat):
    a = MixtureDataset({"wiki@v1": 7, "wiki@v2": 3}, seq_len=256, catalog=cat.path, seed=4)
    b = MixtureDataset({"wiki@v1": 0.7, "wiki@v2": 0.3}, seq_len=256, catalog=cat.path, seed=4)
    assert list(a.indices()) == list(b.indices())  # deterministic, and weights are normalized
    np.testing.assert_allclose(a.weights, [0.7, 0.3])
    c = MixtureDataset({"wiki@v1": 0.7, "wiki@v2": 0.3}, seq_len=256, catalog=cat.path, seed=5)
    assert list(a.indices()) != list(c.indices())
    keys = list(a.indices())  # before iterating: a pass moves the position to the next epoch
    samples = list(a)
    assert len(samples) == len(keys) and a.epoch == 1
    for (comp, idx), s in zip(keys, samples):
        np.testing.assert_array_equal(s["input_ids"], a.components[comp][idx]["input_ids"])


def test_split_over_ranks_and_workers_is_exact(cat):
    mix_args = ({"wiki@v1": 0.6, "eos@v1": 0.4},)
    kw = dict(seq_len=200, catalog=cat.path, seed=9)
    full = Counter(MixtureDataset(*mix_args, **kw).indices())
    for world_size, workers, block in [(2, 3, 4), (3, 1, 1), (4, 5, 2)]:
        seen: Counter = Counter()
        for r in range(world_size):
            rank_keys = []
            for w in range(workers):
                m = MixtureDataset(*mix_args, **kw, rank=r, world_size=world_size, worker_id=w, num_workers=workers, block_size=block)
                rank_keys.extend(m.indices())
            seen.update(rank_keys)
            # Each rank's contiguous share of the epoch is mixed like the whole.
            assert abs(np.mean([c == 0 for c, _ in rank_keys]) - 0.6) < 0.03
        assert seen == full


def test_upsampling_wraps_into_the_next_component_epoch(cat):
    small = TokenDataset("one@v1", seq_len=4096, catalog=cat.path)  # a few dozen samples
    big = TokenDataset("wiki@v1", seq_len=4096, catalog=cat.path)
    mix = MixtureDataset({small: 0.5, big: 0.5}, samples_per_epoch=4 * len(small))
    got = [i for c, i in mix.indices() if c == 0]
    assert len(got) == 2 * len(small)
    counts = Counter(got)
    assert set(counts.values()) == {2}  # each small sample exactly twice: two of its epochs


def test_bad_weights_are_refused(cat):
    kw = dict(seq_len=64, catalog=cat.path)
    cases = [
        ({"wiki@v1": 0.0, "eos@v1": 0.0}, "all mixture weights are 0"),
        ({"wiki@v1": 0.7, "eos@v1": 0.0}, "weight of 'eos@v1' is 0; remove that dataset"),
        ({"wiki@v1": 0.7, "eos@v1": -0.3}, "weight of 'eos@v1' is -0.3; weights must be positive"),
        ({"wiki@v1": math.nan}, "weight of 'wiki@v1' is nan"),
        ({"wiki@v1": math.inf}, "weight of 'wiki@v1' is inf"),
        ({"wiki@v1": "0.5"}, "weight of 'wiki@v1' is '0.5'"),
        ({"wiki@v1": True}, "weight of 'wiki@v1' is True"),
        ({}, "at least one dataset"),
    ]
    for weights, message in cases:
        with pytest.raises(ValueError, match=message):
            MixtureDataset(weights, **kw)
    with pytest.raises(ValueError, match="gives it no sample"):
        MixtureDataset({"wiki@v1": 1.0, "eos@v1": 1e-9}, seq_len=64, catalog=cat.path, samples_per_epoch=100)


def test_components_must_agree(cat):
    with pytest.raises(ValueError, match="different tokenizers"):
        MixtureDataset({"wiki@v1": 0.5, "small@v1": 0.5}, seq_len=64, catalog=cat.path)
    a = TokenDataset("wiki@v1", seq_len=64, catalog=cat.path)
    b = TokenDataset("eos@v1", seq_len=65, catalog=cat.path)
    with pytest.raises(ValueError, match="disagree on seq_len"):
        MixtureDataset({a: 0.5, b: 0.5})
    c = TokenDataset("eos@v1", seq_len=64, pack_sequences=True, catalog=cat.path)
    with pytest.raises(ValueError, match="disagree on pack_sequences"):
        MixtureDataset({a: 0.5, c: 0.5})
    with pytest.raises(ValueError, match="seq_len is required"):
        MixtureDataset({"wiki@v1": 1.0}, catalog=cat.path)


def test_mixture_counts_add_up():
    for total in (1, 7, 100, 12345):
        for probs in ([1.0], [0.7, 0.3], [1 / 3] * 3, [0.5, 0.25, 0.125, 0.125]):
            c = mixture_counts(np.array(probs), total)
            assert c.sum() == total and (np.abs(c - np.array(probs) * total) < 1).all()
