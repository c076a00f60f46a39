"""One streaming reader's pass over a remote split: fetch ahead in reading order, evict behind, under a byte limit.

The reader (``StreamingTokenDataset`` over a ``RemoteShardSet``) knows the
exact order of its samples, so before each epoch of its pass it scans the
shards it will read there (a vectorized pass over its positions, O(samples)
numbers, no data) and notes each shard's first and last use. A background
thread then fetches the shards in order of first use (each pinned, so no other
process evicts it) while the bytes it holds stay within ``limit``; right after a
shard's last use the reader drops its memory map, unpins it and evicts it
(unless another process pins it). Without a limit it only fetches ahead.

The shards in use at one moment (shuffling mixes ``shuffle_group`` shards) must
fit in the limit: when the next shard cannot be fetched because every held one
is still in use, the reader raises ``ConfigError`` saying so rather than thrash.
A sample whose shard the plan did not foresee is fetched on the spot, so the
data read is right whatever happens to the plan.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator

import numpy as np

from ..errors import ConfigError
from .remote import RemoteShardSet

log = logging.getLogger(__name__)

__all__ = ["ShardFeeder", "Readahead", "epoch_segments", "READAHEAD_SHARDS"]

READAHEAD_SHARDS = 2
"""Shards a map-style reader over a known order (``TokenDataset`` iterated, ``ShardSampler``) has fetched ahead
of the one it reads."""

Segment = Callable[[], Iterator[np.ndarray]]
"""One epoch of a pass: a callable giving, in reading order, the shard of each sample (in chunks)."""


def epoch_segments(
    stream: Any, start: int, stop: int | None, *, worker_id: int, num_workers: int, block_size: int
) -> Iterator[Segment]:
    """Per epoch of a ``StreamingTokenDataset``'s pass ``[start, stop)``, the shards of one worker's samples."""
    offsets = stream.dataset.sample_offsets
    a = start
    while stop is None or a < stop:
        b = stream._layout.epoch_span(stream._layout.epoch_at(a))[1]
        b = b if stop is None else min(b, stop)
        # The worker's blocks from the one holding position a: block i of the pass is block i - skip
        # from start + skip * block_size, and worker_id's blocks are those of worker worker_id - skip there.
        skip = (a - start) // block_size

        def segment(a: int = a, b: int = b, skip: int = skip) -> Iterator[np.ndarray]:
            first = start + skip * block_size
            for pos, _, ids in stream._keys(first, b, (worker_id - skip) % num_workers, num_workers, block_size):
                yield np.searchsorted(offsets, ids[pos >= a], side="right") - 1

        yield segment
        a = b


class ShardFeeder:
    """Prefetching and eviction for one pass; ``before(k)`` / ``after(k)`` around every sample of shard ``k``."""

    def __init__(self, shards: RemoteShardSet, segments: Iterator[Segment], *, limit: int | None) -> None:
        self.shards = shards
        self.limit = limit
        self._segments = segments
        self._cond = threading.Condition()
        self._queue: deque[int] = deque()  # to fetch, in order of first use
        self._ready: set[int] = set()  # fetched and pinned
        self._fetching: set[int] = set()  # being fetched by the thread
        self._held = 0  # bytes of the shards fetched, or being fetched, and pinned
        self._error: BaseException | None = None
        self._stop = False
        self._last: dict[int, int] = {}
        self._step = 0
        self._steps = 0
        shards.cache.prepare()
        self._thread = threading.Thread(target=self._run, name="shardflow-prefetch", daemon=True)
        self._thread.start()

    # -- the reader's side -------------------------------------------------------

    def _next_segment(self) -> None:
        """Plan the next epoch this reader reads samples of: first and last use of each shard."""
        for segment in self._segments:
            first: dict[int, int] = {}
            last: dict[int, int] = {}
            n = 0
            for ks in segment():
                ks = np.asarray(ks, dtype=np.int64)
                uniq, at = np.unique(ks, return_index=True)
                for k, i in zip(uniq.tolist(), at.tolist()):
                    first.setdefault(k, n + i)
                uniq, at = np.unique(ks[::-1], return_index=True)
                for k, i in zip(uniq.tolist(), at.tolist()):
                    last[k] = n + len(ks) - 1 - i
                n += len(ks)
            if n:
                with self._cond:
                    self._last, self._step, self._steps = last, 0, n
                    self._queue = deque(k for k in sorted(first, key=first.__getitem__) if k not in self._ready)
                    self._cond.notify_all()
                return
        # More samples than the plan foresaw (the stream was changed mid-pass): fetch on demand from here.
        self._last, self._step, self._steps = {}, 0, -1

    def before(self, k: int) -> None:
        """Wait until shard ``k`` is in the cache (fetching it here if the plan did not foresee it)."""
        if self._step == self._steps:
            self._next_segment()
        with self._cond:
            while k not in self._ready:
                if self._error is not None:
                    raise self._error
                if k in self._fetching:
                    self._cond.wait(0.5)
                    continue
                if k not in self._queue or self._queue[0] != k:
                    break  # not foreseen (or queued behind a shard the plan put first): fetch it here
                if self.limit is not None and self._held > 0 and self._held + self.shards.data_bytes(k) > self.limit:
                    # k is the thread's next shard and only this reader frees room: it never will in time.
                    raise self._too_small(k)
                self._cond.wait(0.5)
            else:
                return
            if k in self._queue:
                self._queue.remove(k)
            self._held += self.shards.data_bytes(k)
        self._acquire(k)
        with self._cond:
            self._ready.add(k)

    def after(self, k: int) -> None:
        """Count the sample read; after the last sample of shard ``k`` in this epoch, evict it."""
        step = self._step
        self._step += 1
        if self._last.get(k) == step:
            self._evict(k)

    def _too_small(self, k: int) -> ConfigError:
        return ConfigError(
            f"cache_limit_bytes={self.limit:,} is too small for {self.shards.name}: {len(self._ready)} shards "
            f"({self._held:,} bytes) are still being read and shard {k} needs {self.shards.data_bytes(k):,} more. "
            "Shuffling reads shuffle_group shards at a time: raise cache_limit_bytes to hold that many shards, "
            "or lower shuffle_group"
        )

    def _evict(self, k: int) -> None:
        """Unpin shard ``k``; under a limit, also drop its map and delete it (unless another process pins it)."""
        if self.limit is not None:
            self.shards.release(k)
        for name, _, _ in self.shards.data_files(k):
            self.shards.cache.unpin(name)
            if self.limit is not None:
                self.shards.cache.try_evict(name)
        with self._cond:
            self._ready.discard(k)
            self._held -= self.shards.data_bytes(k)
            self._cond.notify_all()

    def close(self) -> None:
        """Stop prefetching; evict what this pass still holds under a limit (the next pass fetches what it needs)."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join()
        for k in list(self._ready):
            self._evict(k)

    # -- the prefetch thread --------------------------------------------------------

    def _acquire(self, k: int) -> None:
        for name, _, _ in self.shards.data_files(k):
            self.shards.cache.pin(name)
        try:
            self.shards.fetch(k)
        except BaseException:
            for name, _, _ in self.shards.data_files(k):
                self.shards.cache.unpin(name)
            with self._cond:
                self._held -= self.shards.data_bytes(k)
            raise

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._stop and (
                    not self._queue
                    or self.limit is not None
                    and self._held > 0
                    and self._held + self.shards.data_bytes(self._queue[0]) > self.limit
                ):
                    self._cond.wait()
                if self._stop:
                    return
                k = self._queue.popleft()
                self._held += self.shards.data_bytes(k)
                self._fetching.add(k)
            try:
                self._acquire(k)
            except BaseException as exc:  # handed to the reader, which raises it when it needs a shard
                with self._cond:
                    self._error = exc
                    self._fetching.discard(k)
                    self._cond.notify_all()
                return
            with self._cond:
                self._ready.add(k)
                self._fetching.discard(k)
                self._cond.notify_all()


class Readahead:
    """Map-style reading in a known order: fetch the next ``depth`` shards of ``order`` (shards in order of first
    use) into the cache while the reader is on one, on one background thread.

    Only fetches (each file pinned while it downloads, so no process evicts it half-written): the reader opens
    each shard itself, which finds it cached, and evicts under its own ``cache_limit_bytes``, so this adds at
    most ``depth`` shards to what a process holds. A failed fetch is left to the reader, which fetches the shard
    again when it opens it and raises there, naming the object.
    """

    def __init__(self, shards: RemoteShardSet, order: list[int], *, depth: int = READAHEAD_SHARDS) -> None:
        self.shards = shards
        self.order = order
        self.depth = depth
        self._where = {k: i for i, k in reversed(list(enumerate(order)))}  # each shard's first place
        self._next = 0  # the first place of order not yet handed to the thread
        self._pool: ThreadPoolExecutor | None = None

    def reached(self, k: int) -> None:
        """The reader is on shard ``k``: have the shards after it in the order, up to ``depth``, fetched."""
        i = self._where.get(k)
        if i is None or self.depth < 1:
            return
        stop = min(len(self.order), i + 1 + self.depth)
        if self._next >= stop:
            return
        if self._pool is None:
            self.shards.cache.prepare()
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardflow-readahead")
        for j in range(max(self._next, i + 1), stop):
            self._pool.submit(self._fetch, self.order[j])
        self._next = stop

    def _fetch(self, k: int) -> None:
        names = [name for name, _, _ in self.shards.data_files(k)]
        try:
            with self.shards.cache.pinned(names):
                self.shards.fetch(k)
        except Exception as exc:  # the reader fetches it again when it opens it, and raises there
            log.info("fetching shard %d of %s ahead failed (%s); it is fetched when read", k, self.shards.name, exc)

    def close(self) -> None:
        """Stop: wait for the fetch in progress, drop the ones not started."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
