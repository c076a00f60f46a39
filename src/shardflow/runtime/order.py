"""Epoch orders: which sample comes at which position of an epoch, deterministically.

An epoch is a permutation of a dataset's samples, a pure function of
``(seed, epoch)`` (and a ``salt`` that tells the components of a mixture
apart). With shuffling it is shuffled on two levels, which keeps reads local:

1. the shards are permuted;
2. consecutive permuted shards form groups of ``group`` shards, and the
   samples of each group are permuted together.

Nothing is materialized for the whole epoch: a position is found in its group
by binary search and each group's permutation is computed when first needed
(and cached), so an epoch over millions of samples costs memory for one group.

The random numbers are the raw 64-bit outputs of PCG64 seeded through
``SeedSequence`` and turned into permutations by a stable argsort; NumPy keeps
both bit-for-bit stable across releases (unlike ``Generator.permutation``), so a
resume state written by one NumPy reads the same samples with another.
"""

from __future__ import annotations

import math
from collections import OrderedDict

import numpy as np

__all__ = ["EpochOrder", "EpochRuns", "random_permutation", "rank_bounds", "coprime_stride"]


def random_permutation(n: int, key: tuple[int, ...]) -> np.ndarray:
    """A permutation of ``range(n)`` determined by ``key`` alone (int64)."""
    raw = np.random.PCG64(np.random.SeedSequence(list(key))).random_raw(n)
    return np.argsort(raw, kind="stable").astype(np.int64, copy=False)


class EpochOrder:
    """The sample at each position of one epoch over shards with ``sample_offsets``.

    ``sample_offsets`` has one entry per shard plus one: shard ``k`` holds the
    samples ``sample_offsets[k]:sample_offsets[k+1]``. Call with an array of
    positions (each in ``[0, total)``) to get the sample ids there.
    """

    _CACHE_GROUPS = 4

    def __init__(
        self, sample_offsets: np.ndarray, *, seed: int, epoch: int, shuffle: bool, group: int, salt: int = 0
    ) -> None:
        self.offsets = np.asarray(sample_offsets, dtype=np.int64)
        self.total = int(self.offsets[-1])
        self.shuffle = shuffle
        self._key = (int(seed), int(salt), int(epoch))
        self._cache: OrderedDict[int, np.ndarray] = OrderedDict()
        if not shuffle:
            return
        counts = np.diff(self.offsets)
        self.shard_order = random_permutation(len(counts), self._key + (0,))
        permuted = counts[self.shard_order]
        self.group = group
        n_groups = -(-len(counts) // group)
        sizes = np.add.reduceat(permuted, np.arange(0, len(counts), group)) if len(counts) else np.zeros(0, np.int64)
        self.group_offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64)
        assert len(self.group_offsets) == n_groups + 1

    def _group_perm(self, g: int) -> np.ndarray:
        perm = self._cache.get(g)
        if perm is not None:
            self._cache.move_to_end(g)
            return perm
        shards = self.shard_order[g * self.group : (g + 1) * self.group]
        pool = np.concatenate([np.arange(self.offsets[k], self.offsets[k + 1], dtype=np.int64) for k in shards])
        perm = pool[random_permutation(len(pool), self._key + (1, g))]
        self._cache[g] = perm
        if len(self._cache) > self._CACHE_GROUPS:
            self._cache.popitem(last=False)
        return perm

    def __call__(self, positions: np.ndarray) -> np.ndarray:
        positions = np.asarray(positions, dtype=np.int64)
        if not self.shuffle:
            return positions.copy()
        groups = np.searchsorted(self.group_offsets, positions, side="right") - 1
        out = np.empty_like(positions)
        # Positions come in runs (one worker's blocks), so this touches a group or two.
        for g in np.unique(groups):
            mask = groups == g
            out[mask] = self._group_perm(int(g))[positions[mask] - self.group_offsets[g]]
        return out


def rank_bounds(total: int, rank: int, world_size: int, *, drop_last: bool) -> tuple[int, int]:
    """The contiguous positions ``[lo, hi)`` of an epoch of ``total`` samples that ``rank`` reads.

    Balanced: the shares differ by at most one sample and cover the epoch
    exactly. With ``drop_last`` every rank gets ``total // world_size`` and the
    last ``total % world_size`` positions of the epoch are not read (which
    samples those are changes with the epoch when shuffling).
    """
    if drop_last:
        per = total // world_size
        return rank * per, (rank + 1) * per
    return rank * total // world_size, (rank + 1) * total // world_size


class EpochRuns:
    """Where each epoch lies in one rank's stream, for epochs that come in runs of equal size.

    ``runs`` is ``[(size, count), ...]``: ``count`` epochs of ``size`` samples
    (all ranks together), in order; the last run is endless (``count=None``).
    Every epoch is split over ranks by ``rank_bounds``, and a rank's stream is
    its share of epoch 0, then of epoch 1, ... A plain stream is one endless
    run; a phased mixture has a run (or two) per phase. Locating a position
    costs a binary search over the runs, never a walk over the epochs.
    """

    def __init__(self, runs: list[tuple[int, int | None]], *, rank: int, world_size: int, drop_last: bool) -> None:
        if not runs or runs[-1][1] is not None or any(count is None or count < 1 for _, count in runs[:-1]):
            raise ValueError(f"epoch runs are (size, count >= 1) pairs ending with an endless (size, None): {runs!r}")
        bounds = [rank_bounds(size, rank, world_size, drop_last=drop_last) for size, _ in runs]
        self.size = np.array([size for size, _ in runs], dtype=np.int64)
        """Samples per epoch of each run, all ranks."""
        self.lo = np.array([lo for lo, _ in bounds], dtype=np.int64)
        """Where this rank's share starts in each run's epochs."""
        self.share = np.array([hi - lo for lo, hi in bounds], dtype=np.int64)
        """Samples per epoch this rank reads in each run (0 for an epoch smaller than the ranks)."""
        counts = np.array([count for _, count in runs[:-1]], dtype=np.int64)
        self.first_epoch = np.concatenate(([0], np.cumsum(counts))).astype(np.int64)
        """Number of each run's first epoch."""
        self.start = np.concatenate(([0], np.cumsum(counts * self.share[:-1]))).astype(np.int64)
        """Rank-stream position of each run's first sample."""

    def run_at(self, position: int) -> int:
        """The run holding rank-stream ``position`` (a run this rank reads nothing of holds no position)."""
        return int(np.searchsorted(self.start, position, side="right")) - 1

    def run_of_epoch(self, epoch: int) -> int:
        return int(np.searchsorted(self.first_epoch, epoch, side="right")) - 1

    def epoch_at(self, position: int) -> int:
        """The epoch of rank-stream ``position``."""
        u = self.run_at(position)
        # Python ints: a product of int64 scalars would wrap around silently.
        return int(self.first_epoch[u]) + (position - int(self.start[u])) // int(self.share[u])

    def epoch_span(self, epoch: int) -> tuple[int, int]:
        """Rank-stream positions ``[start, stop)`` of ``epoch`` (empty where this rank reads none of it)."""
        u = self.run_of_epoch(epoch)
        start = int(self.start[u]) + (epoch - int(self.first_epoch[u])) * int(self.share[u])
        return start, start + int(self.share[u])

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Epochs of rank-stream ``positions`` and the positions within them (numbered over all ranks)."""
        if len(self.start) == 1:  # the common case, a plain stream: no search
            epochs, offsets = np.divmod(positions, self.share[0])
            return epochs, self.lo[0] + offsets
        runs = np.searchsorted(self.start, positions, side="right") - 1
        epochs, offsets = np.divmod(positions - self.start[runs], self.share[runs])
        return self.first_epoch[runs] + epochs, self.lo[runs] + offsets


def _partial_quotients(a: int, b: int) -> list[int]:
    out = []
    while b:
        out.append(a // b)
        a, b = b, a % b
    return out


def coprime_stride(n: int, *, span: int = 64) -> int:
    """A stride coprime with ``n`` near ``n`` times the golden ratio's fraction (0.618...).

    ``x -> x * stride % n`` is then a permutation of ``range(n)`` that spreads
    every run of consecutive positions evenly over ``range(n)`` (a Kronecker
    sequence), which is what a mixture's interleaving needs. How evenly depends
    on the continued fraction of ``n / stride``: small partial quotients, like
    the golden ratio's all-ones, mean low discrepancy. So among the coprimes
    within ``span`` of ``0.618 n`` this picks the one whose largest partial
    quotient is smallest (ties: the closest), deterministically.
    """
    if n <= 2:
        return 1
    center = round(n * (math.sqrt(5) - 1) / 2)
    best: tuple[tuple[int, int], int] | None = None
    for a in range(max(1, center - span), min(n - 1, center + span) + 1):
        if math.gcd(a, n) != 1:
            continue
        quotients = _partial_quotients(n, a)[1:]
        score = (max(quotients, default=0), abs(a - center))
        if best is None or score < best[0]:
            best = (score, a)
    return best[1] if best is not None else 1
