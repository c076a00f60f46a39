"""Elastic resume: one rank's state, saved at world size N, continued by every rank of world size M.

An epoch's order is one permutation of its samples whatever the world size, and ranks read
contiguous shares of it (``rank_bounds``). Ranks advance together, so a state at offset ``k`` of
an epoch says that every rank of its world has read the first ``min(k, its share)`` positions of
its share. Those positions are *read*; the others, in epoch order, are the epoch's *rest*. A stream
resumed at another world size reads the rest of that epoch split by the same rule (rank ``r`` of
``M`` reads share ``r`` of the rest, ``rank_bounds(len(rest), r, M)``; with ``drop_last`` the last
``len(rest) % M`` positions of the rest are not read), then the following epochs as usual. A run
resumed again within that epoch adds a step to the record (``Resumed``). The full rule, and why
the state of rank 0 is the one to keep: docs/RUNTIME.md ("Resume rules").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .options import check_int, shown
from .order import EpochRuns, rank_bounds

__all__ = [
    "Resumed", "EpochRest", "ResumedRuns", "MAX_RESUME_WORLD", "MAX_RESUME_STEPS",
    "continued", "epoch_rest", "rank_layout", "refuse_differences", "same",
]

MAX_RESUME_WORLD = 2**20
"""The most ranks that the world sizes an epoch was resumed from add up to: each rank of them can cut the
rest once more, and this bounds what a state can make a load compute and hold."""

MAX_RESUME_STEPS = 256
"""The most resumes at another world size that one epoch records."""


@dataclass(frozen=True)
class Resumed:
    """Epoch ``epoch`` was read partly at other world sizes: ``steps`` are the ``(world_size, offset)`` of
    each state it was resumed from, in order; the stream reads that epoch's rest."""

    epoch: int
    steps: tuple[tuple[int, int], ...]

    def to_state(self) -> dict[str, Any]:
        """The plain, JSON-safe form kept in ``state_dict()["resumed"]``."""
        return {"epoch": self.epoch, "steps": [[w, k] for w, k in self.steps]}

    @classmethod
    def from_state(cls, value: Any, *, max_epoch: int) -> "Resumed | None":
        """The record of a state's ``resumed`` field (None when absent), checked; a bad one is a ``ValueError``."""
        if value is None:
            return None
        if not isinstance(value, dict) or set(value) != {"epoch", "steps"}:
            raise ValueError(f"resumed must be a dict of 'epoch' and 'steps', not {shown(value)}")
        epoch = check_int("resumed.epoch", value["epoch"], minimum=0, maximum=max_epoch)
        steps = value["steps"]
        if not isinstance(steps, list) or not 1 <= len(steps) <= MAX_RESUME_STEPS:
            raise ValueError(
                f"resumed.steps must be a list of 1 to {MAX_RESUME_STEPS} [world_size, offset] pairs, not {shown(steps)}"
            )
        checked = []
        for i, step in enumerate(steps):
            if not isinstance(step, (list, tuple)) or len(step) != 2:
                raise ValueError(f"resumed.steps[{i}] must be a [world_size, offset] pair, not {shown(step)}")
            world = check_int(f"resumed.steps[{i}] world_size", step[0], minimum=1, maximum=MAX_RESUME_WORLD)
            checked.append((world, check_int(f"resumed.steps[{i}] offset", step[1], minimum=1)))
        if sum(w for w, _ in checked) > MAX_RESUME_WORLD:
            raise ValueError(f"resumed.steps: their world sizes add up to more than {MAX_RESUME_WORLD:,} ranks")
        return cls(epoch, tuple(checked))


def continued(resumed: "Resumed | None", epoch: int, world_size: int, offset: int) -> "Resumed | None":
    """``resumed`` (or no record) followed by a move from ``world_size`` at ``offset`` of ``epoch``; None if nothing
    of ``epoch`` was read (it is then read whole, as usual)."""
    # A record of an earlier epoch no longer matters: that epoch is behind every rank.
    steps = resumed.steps if resumed is not None and resumed.epoch == epoch else ()
    if offset:
        steps += ((world_size, offset),)
        if sum(w for w, _ in steps) > MAX_RESUME_WORLD:
            raise ValueError(
                f"check.world_size: {world_size:,} ranks, and the epoch's earlier resumes, add up to more than "
                f"{MAX_RESUME_WORLD:,}: too many to resume at another world size"
            )
    if len(steps) > MAX_RESUME_STEPS:
        raise ValueError(f"resumed: epoch {epoch} was already resumed at another world size {MAX_RESUME_STEPS} times")
    return Resumed(epoch, steps) if steps else None


def _shares(n: int, world_size: int, drop_last: bool) -> tuple[np.ndarray, np.ndarray]:
    """``rank_bounds(n, r, world_size)`` of every rank ``r``, vectorized (int64-exact for any n below 2**62)."""
    r = np.arange(world_size, dtype=np.int64)
    per, rem = divmod(n, world_size)
    if drop_last:
        lo = r * per
        return lo, lo + per
    # r * n // W split so that no product passes 2**62 (r * rem < W**2 <= 2**40).
    lo = r * per + (r * rem) // world_size
    return lo, np.append(lo[1:], n)


class EpochRest:
    """The positions of one epoch still to read, in epoch order, as sorted disjoint intervals ``[starts, ends)``."""

    def __init__(self, starts: np.ndarray, ends: np.ndarray) -> None:
        starts, ends = np.asarray(starts, dtype=np.int64), np.asarray(ends, dtype=np.int64)
        keep = ends > starts
        self.starts, self.ends = starts[keep], ends[keep]
        self.cum = np.concatenate(([0], np.cumsum(self.ends - self.starts))).astype(np.int64)
        """Ordinal (number within the rest) of each interval's first position, and the rest's length last."""

    def __len__(self) -> int:
        return int(self.cum[-1])

    def at(self, ordinals: np.ndarray) -> np.ndarray:
        """The epoch positions of the rest's ``ordinals`` (each in ``[0, len(self))``)."""
        ordinals = np.asarray(ordinals, dtype=np.int64)
        i = np.searchsorted(self.cum, ordinals, side="right") - 1
        return self.starts[i] + (ordinals - self.cum[i])

    def keeping(self, lo: np.ndarray, hi: np.ndarray) -> "EpochRest":
        """The rest restricted to the ordinals ``[lo[j], hi[j])`` (sorted, disjoint)."""
        # Cut at every interval edge and every kept range's edge: each piece then lies in one
        # interval and is wholly kept or not.
        points = np.union1d(np.concatenate((lo, hi)), self.cum)
        a, b = points[:-1], points[1:]
        j = np.searchsorted(lo, a, side="right") - 1
        kept = (j >= 0) & (a < hi[np.maximum(j, 0)]) if len(lo) else np.zeros(len(a), dtype=bool)
        a, b = a[kept], b[kept]
        starts = self.at(a)
        ends = starts + (b - a)
        # Pieces that touch in the epoch are one interval again, so the count stays small.
        new = np.concatenate(([True], starts[1:] != ends[:-1])) if len(a) else np.zeros(0, dtype=bool)
        last = np.append(new[1:], True) if len(a) else new
        return EpochRest(starts[new], ends[last])

    def after(self, world_size: int, offset: int, *, drop_last: bool) -> "EpochRest":
        """What is left once every rank of ``world_size`` has read ``min(offset, its share)`` of its share."""
        lo, hi = _shares(len(self), world_size, drop_last)
        widest = int((hi - lo).max())
        if offset >= widest:
            raise ValueError(
                f"resumed: offset {offset:,} is past every share of the {len(self):,} samples left in that epoch "
                f"over {world_size} ranks (at most {widest - 1:,})"
            )
        read_end = lo + np.minimum(offset, hi - lo)
        # Unread: each share after its read part, and with drop_last the rest's unread tail.
        return self.keeping(read_end, np.append(lo[1:], len(self)))


def epoch_rest(size: int, steps: tuple[tuple[int, int], ...], *, drop_last: bool) -> EpochRest:
    """The rest of an epoch of ``size`` samples after the reads that ``steps`` record."""
    rest = EpochRest(np.array([0]), np.array([size]))
    for world_size, offset in steps:
        rest = rest.after(world_size, offset, drop_last=drop_last)
    return rest


class ResumedRuns:
    """One rank's ``EpochRuns`` with the resumed epoch replaced by the rank's share of its rest.

    Positions before that epoch are ``EpochRuns``'s; the epoch's share of the rest follows, and every
    later position is shifted by the difference in size. Same interface as ``EpochRuns``.
    """

    def __init__(
        self, runs: list[tuple[int, int | None]], *, rank: int, world_size: int, drop_last: bool, resumed: Resumed
    ) -> None:
        base = self.base = EpochRuns(runs, rank=rank, world_size=world_size, drop_last=drop_last)
        self.size, self.lo, self.share, self.first_epoch = base.size, base.lo, base.share, base.first_epoch
        self.resumed = resumed
        self.epoch = e = resumed.epoch
        u = self.run = base.run_of_epoch(e)
        self.rest = epoch_rest(int(base.size[u]), resumed.steps, drop_last=drop_last)
        self.first, last = rank_bounds(len(self.rest), rank, world_size, drop_last=drop_last)
        self.rest_start = base.epoch_span(e)[0]
        """Rank-stream positions ``[rest_start, rest_stop)`` are this rank's share of the rest."""
        self.rest_stop = self.rest_start + (last - self.first)
        self.shift = (last - self.first) - int(base.share[u])
        self.start = base.start + np.where(np.arange(len(base.start)) > u, self.shift, 0)

    def run_at(self, position: int) -> int:
        if position < self.rest_start:
            return self.base.run_at(position)
        return self.run if position < self.rest_stop else self.base.run_at(position - self.shift)

    def run_of_epoch(self, epoch: int) -> int:
        return self.base.run_of_epoch(epoch)

    def epoch_at(self, position: int) -> int:
        if position < self.rest_start:
            return self.base.epoch_at(position)
        return self.epoch if position < self.rest_stop else self.base.epoch_at(position - self.shift)

    def epoch_span(self, epoch: int) -> tuple[int, int]:
        if epoch == self.epoch:
            return self.rest_start, self.rest_stop
        start, stop = self.base.epoch_span(epoch)
        return (start, stop) if epoch < self.epoch else (start + self.shift, stop + self.shift)

    def locate(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        positions = np.asarray(positions, dtype=np.int64)
        epochs, offsets = np.empty_like(positions), np.empty_like(positions)
        before, after = positions < self.rest_start, positions >= self.rest_stop
        inside = ~(before | after)
        if before.any():
            epochs[before], offsets[before] = self.base.locate(positions[before])
        if after.any():
            epochs[after], offsets[after] = self.base.locate(positions[after] - self.shift)
        if inside.any():
            epochs[inside] = self.epoch
            offsets[inside] = self.rest.at(positions[inside] - self.rest_start + self.first)
        return epochs, offsets


def rank_layout(
    runs: list[tuple[int, int | None]], *, rank: int, world_size: int, drop_last: bool, resumed: Resumed | None
) -> "EpochRuns | ResumedRuns":
    """Where each epoch lies in one rank's stream: ``EpochRuns``, or ``ResumedRuns`` after an elastic resume."""
    if resumed is None:
        return EpochRuns(runs, rank=rank, world_size=world_size, drop_last=drop_last)
    return ResumedRuns(runs, rank=rank, world_size=world_size, drop_last=drop_last, resumed=resumed)


def refuse_differences(saved: dict[Any, Any], mine: dict[str, Any]) -> None:
    """One ``ValueError`` naming every field where a state's ``saved`` check fields differ from ``mine`` (a dict's
    differing keys by name: ``dataset.seq_len``), if any."""
    details = []
    for key in sorted(set(saved) | set(mine), key=str):
        a, b = saved.get(key), mine.get(key)
        if same(a, b):
            continue
        inner = []
        if isinstance(a, dict) and isinstance(b, dict):
            inner = [
                f"{key}.{k}: saved {shown(a.get(k))}, now {shown(b.get(k))}"
                for k in sorted(set(a) | set(b), key=str)
                if not same(a.get(k), b.get(k))
            ]
        details += inner or [f"{key}: saved {shown(a)}, now {shown(b)}"]
    if details:
        raise ValueError(
            f"this state was saved by a different stream and would not continue it exactly ({'; '.join(details)}). "
            "Resume with the same dataset version, options and seed"
        )


def same(a: Any, b: Any) -> bool:
    """``a == b`` as one bool, False where the comparison fails or is not a bool (arrays in a state, say)."""
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - any value a checkpoint holds compares, or differs
        return False
