"""Work units sized so that every worker gets a share, however little is left to do.

The default unit (``BuildConfig.unit_bytes``, 64 MiB of text) suits a big
build: thousands of units, each worth seconds of a core, so per-task overhead
stays small. But when only a few units are left to do, after an incremental
build reused its unchanged inputs, or for a small corpus, the default can
leave workers idle: one new 62 MB file is one unit, on one worker while the
others wait. So the planner cuts finer when there is little to do:

    if fewer than ``MIN_UNITS`` units are left to do, the inputs that need work
    are cut again with units of ``max(FLOOR_BYTES, bytes left / MIN_UNITS)``
    (never more than ``unit_bytes``), at each input kind's own granularity:
    whole Parquet row groups, whole Arrow record batches, JSON Lines byte
    ranges of whole lines. A file that cannot be cut finer (a compressed JSON
    Lines stream, an Arrow object on object storage, a file of one row group)
    stays one unit.

The rule reads only the plan's own facts (the units' text bytes), never
``--workers``, the runner or the machine: the plan, and so resume (which
empties the staging directory when the plan changes) is the same for any
worker count. And it never changes the output: the layout concatenates the
units' documents in input and row order, the statistics are merged per input,
and neither ``unit_bytes`` nor the units appear in the build key, the
manifest's bytes, ``stats.json`` or the card (``BuildConfig.to_dict`` records
the option as given, not the size chosen here). The floor keeps a unit worth
about 0.1 s of a core, so a tiny corpus (the bundled sample) stays
one unit and a task run's fixed cost stays small beside its work.

What it buys depends on the runner. With worker threads (the default),
gigatoken's ``encode_batch`` already spreads one batch over every core (its
own thread pool: a warm 62 MB batch took 0.070 s wall for 0.135 s of CPU on
the 2-core machine), so a finer cut only overlaps the serial rest of a unit
(Parquet decoding, boundaries, the part files), and each unit costs a task
run: measured neutral at this floor, slower below it. In worker processes
(``--runner dask``) gigatoken encodes on the calling thread only (it detects
a multiprocessing worker), so there one unit is one core, and the pieces of
one file are tokenized side by side.
"""

from __future__ import annotations

import dataclasses

from ..config import BuildConfig
from ..sources import InputFile, WorkUnit, input_kind, plan_units

__all__ = ["MIN_UNITS", "FLOOR_BYTES", "finer_unit_bytes", "cut_for_cores"]

# Fewer units than this left to do: cut finer. Eight gives 2 to 8 workers a share each; the rule must
# not read the worker count (the plan would then depend on it), so it is a constant, not "2 x workers".
MIN_UNITS = 8

# Never cut below this much text per unit: about 0.1 s of one core (decode + encode + part files), a
# few times a Prefect task run's own cost. Measured on the 2-core machine, incremental +1 file (62 MB)
# through the flow against a running server: 4 MiB units (12 of them) made the tokenize phase slower
# (0.78 s against 0.59 s uncut); 16 MiB (4 units) cost nothing measurable (0.56 s against 0.57 s).
FLOOR_BYTES = 16 << 20


def finer_unit_bytes(
    units: list[WorkUnit] | tuple[WorkUnit, ...], unit_bytes: int, *, min_units: int, floor: int
) -> int | None:
    """The smaller unit size to cut ``units`` (the units left to do) with, or None to keep them as they are."""
    if not units or len(units) >= min_units:
        return None
    left = sum(max(u.text_bytes, 0) for u in units)
    finer = max(floor, -(-left // min_units))
    return finer if finer < unit_bytes else None


def cut_for_cores(units: list[WorkUnit], inputs: list[InputFile], config: BuildConfig) -> list[WorkUnit]:
    """``units`` (those left to do, numbered from 0), cut finer when they are few (see the module's rule).

    Only inputs with a unit bigger than the finer size, of a kind that can cut
    them, are planned again; the others keep their units (a greedy cut of whole
    pieces gives a unit no bigger than the finer size back unchanged anyway).
    """
    finer = finer_unit_bytes(units, config.unit_bytes, min_units=MIN_UNITS, floor=FLOOR_BYTES)
    if finer is None:
        return units
    recut = {
        u.input
        for u in units
        if u.text_bytes > finer and input_kind(inputs[u.input]).divisible(inputs[u.input])
    }
    if not recut:
        return units
    cut = plan_units(
        inputs, text_column=config.text_column, id_column=config.id_column, unit_bytes=finer, only=recut
    )
    by_input: dict[int, list[WorkUnit]] = {}
    for u in cut:
        by_input.setdefault(u.input, []).append(u)
    merged: list[WorkUnit] = []
    for i in sorted({u.input for u in units}):  # inputs in order, as plan_units numbers them
        merged += by_input[i] if i in recut else [u for u in units if u.input == i]
    return [dataclasses.replace(u, index=n) for n, u in enumerate(merged)]
