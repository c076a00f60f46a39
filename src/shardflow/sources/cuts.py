"""Where work units begin: from the input file and ``unit_bytes`` alone, the same for every kind.

A unit's boundaries depend on nothing but its own file and the unit size:
not on the other inputs, not on what an incremental build reuses, not on the
worker count. So an input planned alone, among others, or as the file added
to an incremental build is cut into the same units, and ``unit_bytes`` is part
of the build key (``config._NOT_IN_BUILD_KEY`` leaves it in).

Two rules, one per way of cutting a file:

- byte ranges (uncompressed JSON Lines, local or on object storage): unit k
  holds the lines that begin in ``[k * unit_bytes, (k + 1) * unit_bytes)``
  (``byte_offsets``). A local file is cut at the first line at or after each
  offset, an object blind at the offsets themselves (its workers find the
  lines), so both give the same lines per unit;
- whole pieces (Parquet row groups, Arrow record batches): ``base.cut_units``
  groups them greedily, and ``join_small_tail`` then applies the tail rule.

The tail rule, for both: a last unit smaller than ``unit_bytes / TAIL_DIVISOR``
joins the unit before it (of the same input), so that a file a little over a
multiple of the unit size is not tokenized as one more tiny unit.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

from .base import InputFile, WorkUnit

__all__ = ["TAIL_DIVISOR", "is_small_tail", "byte_offsets", "join_small_tail", "cut_in_bytes"]

# A last unit under unit_bytes / 4 joins the one before: at most 1.25 x unit_bytes in one unit, and no unit
# of a file cut into several is smaller than a quarter of the unit size.
TAIL_DIVISOR = 4


def is_small_tail(nbytes: int, unit_bytes: int) -> bool:
    """Whether a last unit of ``nbytes`` is small enough to join the unit before it."""
    return nbytes * TAIL_DIVISOR < unit_bytes


def byte_offsets(size: int, unit_bytes: int) -> list[int]:
    """Where the byte ranges of a file of ``size`` bytes begin: the multiples of ``unit_bytes``, tail joined.

    ``[]`` for an empty file. The last range runs to ``size``.
    """
    ranges = -(-size // unit_bytes)
    if ranges >= 2 and is_small_tail(size - (ranges - 1) * unit_bytes, unit_bytes):
        ranges -= 1
    return [k * unit_bytes for k in range(ranges)]


def join_small_tail(units: list[WorkUnit], unit_bytes: int) -> list[WorkUnit]:
    """``units`` (one input's, whole pieces, in order), the last joined to the one before when it is small."""
    if len(units) < 2 or not is_small_tail(units[-1].text_bytes, unit_bytes):
        return units
    before, tail = units[-2], units[-1]
    joined = dataclasses.replace(
        before, stop=tail.stop, rows=before.rows + tail.rows, text_bytes=before.text_bytes + tail.text_bytes
    )
    return units[:-2] + [joined]


def cut_in_bytes(inputs: Sequence[InputFile], units: Sequence[WorkUnit]) -> set[int]:
    """The inputs whose units are cut blind in bytes: a JSON Lines file in several units, or any unit with
    ``first_row`` -1. On object storage such a file's later units learn their rows only then, so a local
    copy (whose lines planning counts) is treated alike: the same bytes."""
    units_of_jsonl = collections.Counter(u.input for u in units if inputs[u.input].kind == "jsonl")
    return {i for i, n in units_of_jsonl.items() if n > 1} | {u.input for u in units if u.first_row < 0}
