"""The streaming dataset: every sample of an epoch read exactly once, split over ranks and workers.

    it = StreamingTokenDataset("wikitext@latest", split="train", seq_len=1024, rank=0, world_size=1, seed=0)
    for sample in it: ...            # one pass: the rest of the current epoch
    state = it.state_dict()          # exact position; load_state_dict(state) continues from it

Epochs, ranks, workers and exact resume: docs/RUNTIME.md ("Streaming"). A rank's *rank stream* is
its positions, epoch after epoch; a position in it is ``epoch * samples_per_epoch + offset``, and
the state is the position of the next sample. Worker ``w`` of ``n`` reads blocks ``w, w + n, ...`` of
``block_size`` samples, the order in which a PyTorch DataLoader collects batches, so with
``block_size == batch_size`` the loader delivers the rank stream in order. Iterating this object
advances the position when it reads the whole rank stream (``num_workers == 1``); a consumer that
merges worker slices itself calls ``advance(n)`` (the PyTorch loader does). A state of another rank
or world size resumes elastically (``shardflow.runtime.resume``; docs/RUNTIME.md, "Resume rules").
"""

from __future__ import annotations

import os
from typing import Any, Iterable, Iterator

import numpy as np

from ..errors import ConfigError
from .dataset import TokenDataset
from .options import DATASET_OPTIONS, REMOTE_OPTIONS, STREAM_OPTIONS, ReadOptions, check_int, shown
from .order import EpochOrder, EpochRuns, rank_bounds
from .prefetch import ShardFeeder, epoch_segments
from .remote import RemoteShardSet, is_remote_ref, open_remote_split
from .resume import Resumed, ResumedRuns, continued, rank_layout, refuse_differences, same
from .shards import ShardSet

__all__ = ["StreamingTokenDataset", "SampleStream", "STATE_FORMAT", "MAX_SAMPLES", "check_split"]

STATE_FORMAT = 1
"""Version of the ``state_dict`` layout."""

MAX_SAMPLES = 2**53
"""A rank's positions times ``world_size`` stay below this (positions, epochs, ``advance``, ``set_epoch``,
resume states): far past any run (9e15 samples), JSON-exact, and it keeps the int64 arithmetic of epochs
and mixture components exact. A state beyond it is refused with a ``ValueError``."""

_CHUNK = 4096  # positions resolved at once (one vectorized epoch-order lookup)


def check_split(epoch_samples: int, world_size: int) -> None:
    """Refuse epochs of fewer samples than ranks: every rank reads at least one sample per epoch."""
    if epoch_samples < world_size:
        raise ValueError(
            f"{epoch_samples} samples per epoch cannot be split over world_size={world_size} ranks: "
            "every rank needs at least one; use a smaller seq_len or fewer ranks"
        )


class SampleStream:
    """What streaming and mixture datasets share: epochs, rank/worker splitting, exact state.

    Subclasses call ``_init_stream`` with their options, having set
    ``self.epoch_samples`` (samples per epoch, all ranks), or pass it ``runs``
    when epochs differ in size (see ``EpochRuns``), and implement
    ``_resolve(epoch, positions)`` -> (component ids, sample ids), positions
    numbered within the epoch over all ranks, ``_get(component, sample)`` and
    ``_sample_ids(component ids, sample ids)`` (what ``indices()`` yields).
    """

    kind = "SampleStream"
    epoch_samples: int

    def _init_stream(self, opts: ReadOptions, runs: list[tuple[int, int | None]] | None = None) -> None:
        self.rank, self.world_size = opts.rank, opts.world_size
        self.worker_id, self.num_workers, self.block_size = opts.worker_id, opts.num_workers, opts.block_size
        self.seed, self.shuffle, self.shuffle_group = opts.seed, opts.shuffle, opts.shuffle_group
        self.drop_last, self.infinite = opts.drop_last, opts.infinite
        if runs is None:
            runs = [(self.epoch_samples, None)]
        check_split(runs[-1][0], self.world_size)
        self._epoch_runs = runs
        self._resumed: Resumed | None = None  # set by an elastic resume: an epoch partly read at another world size
        self._layout: EpochRuns | ResumedRuns = EpochRuns(
            runs, rank=self.rank, world_size=self.world_size, drop_last=self.drop_last
        )
        self._position = 0

    def __getstate__(self) -> dict[str, Any]:
        # Cached epoch permutations can be large; a copy sent to a DataLoader
        # worker (spawn / forkserver) recomputes the ones it needs.
        state = self.__dict__.copy()
        state["_orders"] = {}
        return state

    # -- positions -------------------------------------------------------------

    @property
    def samples_per_epoch(self) -> int:
        """Samples this rank reads per epoch (all its workers together); of the current epoch if they differ."""
        start, stop = self._layout.epoch_span(self.epoch)
        return stop - start

    @property
    def position(self) -> int:
        """Position of the next sample in this rank's stream (``epoch * samples_per_epoch + offset`` when the
        epochs are equal; a phased mixture's differ, and ``state_dict()`` gives the epoch and offset)."""
        return self._position

    @property
    def epoch(self) -> int:
        return self._layout.epoch_at(self._position)

    @property
    def max_position(self) -> int:
        """The largest position this rank's stream takes (``MAX_SAMPLES // world_size``)."""
        return MAX_SAMPLES // self.world_size

    def set_epoch(self, epoch: int) -> None:
        """Start the next pass at the beginning of ``epoch`` (like ``DistributedSampler.set_epoch``); of an epoch
        resumed at another world size, at the beginning of this rank's share of its rest."""
        start = self._layout.epoch_span(check_int("epoch", epoch, minimum=0, maximum=self.max_position))[0]
        if start > self.max_position:
            raise ValueError(f"epoch {epoch:,} starts at position {start:,}, past the last one, {self.max_position:,}")
        self._position = start

    def advance(self, n: int) -> None:
        """Mark ``n`` more samples of the rank stream consumed (for consumers that merge worker slices)."""
        self._position += check_int("n", n, minimum=0, maximum=self.max_position - self._position)

    def pass_bounds(self, start: int | None = None) -> tuple[int, int | None]:
        """``(start, stop)`` of the pass from ``start`` (default: the position): to the epoch's end, or None if infinite."""
        start = self._position if start is None else start
        if self.infinite:
            return start, None
        return start, self._layout.epoch_span(self._layout.epoch_at(start))[1]

    def pass_length(self, *, worker_id: int = 0, num_workers: int = 1, block_size: int = 1, start: int | None = None) -> int:
        """Samples a worker reads in the pass from ``start`` (default: the position)."""
        start, stop = self.pass_bounds(start)
        if stop is None:
            raise TypeError("an infinite stream has no length")
        total = stop - start
        full, rem = divmod(total, block_size)
        mine = max(0, -(-(full - worker_id) // num_workers)) * block_size
        if rem and full % num_workers == worker_id:
            mine += rem
        return mine

    def __len__(self) -> int:
        """Samples this (rank, worker) reads in the current pass."""
        return self.pass_length(worker_id=self.worker_id, num_workers=self.num_workers, block_size=self.block_size)

    def _worker_positions(
        self, start: int, stop: int | None, worker_id: int, num_workers: int, block_size: int
    ) -> Iterator[np.ndarray]:
        """Chunks of the rank-stream positions of one worker's blocks in ``[start, stop)``, in order."""
        per = max(1, _CHUNK // block_size)
        offsets = np.arange(block_size, dtype=np.int64)
        steps = num_workers * np.arange(per, dtype=np.int64)
        j = worker_id
        while True:
            pos = ((start + (j + steps) * block_size)[:, None] + offsets).ravel()
            if stop is not None:
                pos = pos[pos < stop]
                if not len(pos):
                    return
            yield pos
            j += num_workers * per

    def _keys(
        self, start: int, stop: int | None, worker_id: int, num_workers: int, block_size: int
    ) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """(rank positions, components, sample ids) of one worker's share of ``[start, stop)``, in chunks."""
        for pos in self._worker_positions(start, stop, worker_id, num_workers, block_size):
            epochs, epoch_pos = self._layout.locate(pos)
            comps = np.empty_like(pos)
            ids = np.empty_like(pos)
            for e in np.unique(epochs):
                mask = epochs == e
                comps[mask], ids[mask] = self._resolve(int(e), epoch_pos[mask])
            yield pos, comps, ids

    def _resolve(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def _get(self, component: int, sample: int) -> dict[str, np.ndarray]:
        raise NotImplementedError

    def _sample_ids(self, comps: np.ndarray, ids: np.ndarray) -> Iterable[Any]:
        raise NotImplementedError

    def indices(
        self,
        start: int | None = None,
        stop: int | None = None,
        *,
        worker_id: int | None = None,
        num_workers: int | None = None,
        block_size: int | None = None,
    ) -> Iterator[Any]:
        """The samples this worker reads in ``[start, stop)`` (default: the current pass), as ``_sample_ids``
        names them: ``TokenDataset`` indices, a mixture's ``(component, index)``.

        Reads no tokens; for checking how a pass is split.
        """
        first, end = self.pass_bounds(start)
        for _, comps, ids in self._keys(
            first,
            end if stop is None else stop,
            self.worker_id if worker_id is None else worker_id,
            self.num_workers if num_workers is None else num_workers,
            self.block_size if block_size is None else block_size,
        ):
            yield from self._sample_ids(comps, ids)

    def iter_range(
        self,
        start: int,
        stop: int | None,
        *,
        worker_id: int = 0,
        num_workers: int = 1,
        block_size: int = 1,
    ) -> Iterator[dict[str, np.ndarray]]:
        """The samples of one worker's share of rank-stream positions ``[start, stop)``; changes no state."""
        for _, comps, ids in self._keys(start, stop, worker_id, num_workers, block_size):
            for c, i in zip(comps.tolist(), ids.tolist()):
                yield self._get(c, i)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        """One pass: this (rank, worker)'s samples from the position to the end of the epoch (or forever)."""
        start, stop = self.pass_bounds()
        whole = self.num_workers == 1
        for pos, comps, ids in self._keys(start, stop, self.worker_id, self.num_workers, self.block_size):
            for p, c, i in zip(pos.tolist(), comps.tolist(), ids.tolist()):
                sample = self._get(c, i)
                if whole:
                    # Counted before it is handed over: a state taken after
                    # receiving this sample resumes with the next one.
                    self._position = p + 1
                yield sample

    # -- state -----------------------------------------------------------------

    def _check_fields(self) -> dict[str, Any]:
        return {
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shuffle_group": self.shuffle_group,
            "rank": self.rank,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
            # The endless run's: for a plain stream, the samples per epoch.
            "samples_per_epoch": int(self._layout.share[-1]),
        }

    def state_dict(self) -> dict[str, Any]:
        """The exact position in this rank's stream and what determines the stream (plain data, JSON-safe); after
        an elastic resume, ``resumed`` records how the resumed epoch was read (``shardflow.runtime.resume``)."""
        return {
            "kind": self.kind,
            "format": STATE_FORMAT,
            "position": self._position,
            "epoch": self.epoch,
            "offset": self._position - self._layout.epoch_span(self.epoch)[0],
            "check": self._check_fields(),
            **({"resumed": self._resumed.to_state()} if self._resumed is not None else {}),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state``: this rank's own, or any rank's state of this stream at any world size (an
        elastic resume: docs/RUNTIME.md, "Resume rules"); refuses a state of another dataset, seed or options.

        This rank's own state (same rank and world_size) continues exactly where it was. Another rank's, at the
        same world size, continues at the same offset of the same epoch (ranks advance together). A state of
        another world size ends what was read of its epoch: this rank reads its share of the rest of it.
        Every field is checked before anything changes: whatever a checkpoint holds, a state this stream
        cannot continue is one ``ValueError`` naming the field (positions past ``max_position`` included).
        """
        if not isinstance(state, dict) or not same(state.get("kind"), self.kind) or not same(state.get("format"), STATE_FORMAT):
            found = (shown(state.get("kind")), shown(state.get("format"))) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"not a {self.kind} state (format {STATE_FORMAT}): got {found}")
        saved, mine = state.get("check", {}), self._check_fields()
        if not isinstance(saved, dict):
            raise ValueError(f"not a {self.kind} state: its 'check' field is {shown(saved)}, not a dict")
        # The rank layout may differ (checked next); everything else must be this stream's.
        refuse_differences(saved, {**mine, **{k: saved.get(k) for k in ("rank", "world_size", "samples_per_epoch")}})
        world = check_int("check.world_size", saved.get("world_size"), minimum=1, maximum=MAX_SAMPLES)
        rank = check_int("check.rank", saved.get("rank"), minimum=0, maximum=world - 1)
        size = self._epoch_runs[-1][0]
        if size < world:
            raise ValueError(f"check.world_size: saved {world:,}, more ranks than the {size:,} samples of an epoch here")
        lo, hi = rank_bounds(size, rank, world, drop_last=self.drop_last)
        refuse_differences(saved, {**mine, "rank": rank, "world_size": world, "samples_per_epoch": hi - lo})
        resumed = Resumed.from_state(state.get("resumed"), max_epoch=MAX_SAMPLES)
        layout = rank_layout(self._epoch_runs, rank=rank, world_size=world, drop_last=self.drop_last, resumed=resumed)
        limit = MAX_SAMPLES // world
        position = check_int("position", state.get("position"), minimum=0, maximum=limit)
        for name in ("epoch", "offset"):  # derived from the position, for people; checked all the same
            if name in state:
                check_int(name, state[name], minimum=0, maximum=limit)
        if (rank, world) != (self.rank, self.world_size):
            epoch = layout.epoch_at(position)
            offset = position - layout.epoch_span(epoch)[0]
            if world != self.world_size:
                resumed, offset = continued(resumed, epoch, world, offset), 0
            layout = rank_layout(
                self._epoch_runs, rank=self.rank, world_size=self.world_size, drop_last=self.drop_last, resumed=resumed
            )
            start, stop = layout.epoch_span(epoch)
            position = start + min(offset, stop - start)
            if position > self.max_position:
                raise ValueError(f"position: epoch {epoch:,} starts past the last position here, {self.max_position:,}")
        self._resumed, self._layout, self._position = resumed, layout, position


class StreamingTokenDataset(SampleStream):
    """``TokenDataset``'s samples as an epoch stream, shuffled, split over ranks and workers, resumable.

    ``ref`` and the dataset options are those of ``TokenDataset`` (or pass a
    ``TokenDataset`` as ``ref``) but ``align_rule``, as keywords or
    ``options=ReadOptions(...)``. ``rank``/``world_size`` split epochs over
    distributed ranks; ``worker_id``/``num_workers``/``block_size`` split a
    rank's stream over loader workers (the PyTorch adapter fills them in).
    ``shuffle_group`` shards are shuffled together. ``infinite=True`` makes a
    pass run through epoch after epoch.

    A version on object storage (see ``TokenDataset``) is not fetched at open:
    a background thread fetches the shards this rank and worker will read, in
    reading order, into ``cache_dir``. ``cache_limit_bytes`` bounds the shards
    one reader (a process: a rank or a DataLoader worker) holds in the cache:
    each is evicted after its last sample of the epoch (see
    ``shardflow.runtime.prefetch``); it must hold the ``shuffle_group`` shards
    read at once.
    """

    kind = "StreamingTokenDataset"
    _feeder: ShardFeeder | None = None

    def __init__(
        self, ref: "str | os.PathLike[str] | ShardSet | TokenDataset", *, options: ReadOptions | None = None, **kwargs: Any
    ) -> None:
        opts = ReadOptions.collect("StreamingTokenDataset.__init__", STREAM_OPTIONS, options, kwargs)
        if is_remote_ref(ref, opts.catalog):
            # Opened here, not by TokenDataset: only the manifest now, the shards as they are read.
            ref = open_remote_split(ref, options=opts.only(REMOTE_OPTIONS))
        elif opts.cache_dir is not None:
            raise ConfigError(f"cache_dir is for versions on object storage (s3://...); {ref!r} is read in place")
        if isinstance(ref, TokenDataset):
            if opts.seq_len is not None and opts.seq_len != ref.seq_len:
                raise ValueError(f"seq_len={opts.seq_len} differs from the given dataset's seq_len={ref.seq_len}")
            self.dataset = ref
        else:
            if opts.seq_len is None:
                raise ValueError("seq_len is required (the number of input tokens per sample)")
            self.dataset = TokenDataset(ref, options=opts.only(DATASET_OPTIONS, cache_dir=None, cache_limit_bytes=None))
        self.seq_len = self.dataset.seq_len
        self.epoch_samples = len(self.dataset)
        self.cache_limit_bytes = opts.cache_limit_bytes
        shards = self.dataset.shards
        if self.cache_limit_bytes is not None:
            if not isinstance(shards, RemoteShardSet):
                raise ConfigError(f"cache_limit_bytes is for versions on object storage (s3://...); {shards.name} is read in place")
            largest = max((shards.data_bytes(k) for k in range(shards.num_shards)), default=0)
            if largest > self.cache_limit_bytes:
                raise ConfigError(
                    f"cache_limit_bytes={self.cache_limit_bytes:,} cannot hold the largest shard of {shards.name} "
                    f"({largest:,} bytes); raise it to hold at least shuffle_group={opts.shuffle_group} shards"
                )
        self._orders: dict[int, EpochOrder] = {}
        self._init_stream(opts)

    def __repr__(self) -> str:
        return (
            f"StreamingTokenDataset({self.dataset!r}, rank={self.rank}/{self.world_size}, "
            f"worker={self.worker_id}/{self.num_workers}, seed={self.seed}, shuffle={self.shuffle}, "
            f"epoch={self.epoch}, position={self.position})"
        )

    def epoch_order(self, epoch: int) -> EpochOrder:
        """The permutation of samples of ``epoch`` (all ranks); cached for the last two epochs."""
        order = self._orders.get(epoch)
        if order is None:
            order = EpochOrder(
                self.dataset.sample_offsets, seed=self.seed, epoch=epoch, shuffle=self.shuffle, group=self.shuffle_group
            )
            self._orders = {e: o for e, o in self._orders.items() if e >= epoch - 1}
            self._orders[epoch] = order
        return order

    def _resolve(self, epoch: int, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.zeros_like(positions), self.epoch_order(epoch)(positions)

    def _get(self, component: int, sample: int) -> dict[str, np.ndarray]:
        feeder = self._feeder
        if feeder is None:
            return self.dataset[sample]
        k = self.dataset.locate(sample)[0]
        feeder.before(k)
        item = self.dataset[sample]
        feeder.after(k)
        return item

    # -- a version on object storage: fetch ahead, evict behind -------------------

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state.pop("_feeder", None)
        return state

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        if not isinstance(self.dataset.shards, RemoteShardSet):
            return super().__iter__()
        return self._fed(None, None, self.worker_id, self.num_workers, self.block_size, super().__iter__)

    def iter_range(
        self, start: int, stop: int | None, *, worker_id: int = 0, num_workers: int = 1, block_size: int = 1
    ) -> Iterator[dict[str, np.ndarray]]:
        def samples() -> Iterator[dict[str, np.ndarray]]:
            return super(StreamingTokenDataset, self).iter_range(
                start, stop, worker_id=worker_id, num_workers=num_workers, block_size=block_size
            )

        if not isinstance(self.dataset.shards, RemoteShardSet):
            return samples()
        return self._fed(start, stop, worker_id, num_workers, block_size, samples)

    def _fed(
        self, start: int | None, stop: int | None, worker_id: int, num_workers: int, block_size: int, samples: Any
    ) -> Iterator[dict[str, np.ndarray]]:
        """``samples()``, with a ``ShardFeeder`` planned on the same positions (one pass at a time)."""
        if start is None:
            start, stop = self.pass_bounds()
        if self._feeder is not None:  # a second pass at once over this object: fetched on use, not evicted
            yield from self._unfed(samples())
            return
        segments = epoch_segments(self, start, stop, worker_id=worker_id, num_workers=num_workers, block_size=block_size)
        self._feeder = feeder = ShardFeeder(self.dataset.shards, segments, limit=self.cache_limit_bytes)
        try:
            yield from samples()
        finally:
            self._feeder = None
            feeder.close()

    def _unfed(self, samples: Iterator[dict[str, np.ndarray]]) -> Iterator[dict[str, np.ndarray]]:
        """``samples``, each made with no feeder: the running pass's plans and counts only its own samples (one
        thread interleaves the passes, so the feeder is put back before the other pass resumes)."""
        while True:
            feeder, self._feeder = self._feeder, None
            try:
                item = next(samples)
            except StopIteration:
                return
            finally:
                self._feeder = feeder
            yield item

    def _sample_ids(self, comps: np.ndarray, ids: np.ndarray) -> Iterable[int]:
        """The ``TokenDataset`` indices."""
        return ids.tolist()

    def _check_fields(self) -> dict[str, Any]:
        return {"dataset": self.dataset.fingerprint, **super()._check_fields()}
