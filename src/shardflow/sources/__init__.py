"""Sources: find the input files, cut them into work units, and read texts in bounded batches.

Inputs are Parquet files, Arrow IPC files or streams (``.arrow``, ``.feather``,
``.ipc``), JSON Lines (plain, gzip- or Zstandard-compressed; see ``jsonl``),
directories or globs of those, and Hugging Face ``datasets`` saved with
``save_to_disk`` (a directory with ``state.json``; its Arrow files are read
directly, in the dataset's order). A work unit is a run of whole row groups (or
record batches) of one file, or a byte range of whole lines of a JSON Lines
file, about ``unit_bytes`` of text; units are read with ``iter_batches`` in
batches of about ``batch_bytes`` of text, so memory depends on the batch size
and never on the corpus size.

The text column is ``text_column``; a dotted name (``meta.text``) reaches a
field of a struct column (Parquet, Arrow) or of a nested object (JSON Lines),
and a column or key spelled with the dot itself wins over that reading.
Null and empty texts are skipped and counted; invalid UTF-8 in a binary text
column is replaced or skipped (``utf8_errors``) and counted; a record that
cannot be read is refused with its file and line, or skipped and counted
(``on_bad_record``).

The modules:

    base         InputFile, WorkUnit, TextBatch, the InputKind contract, text cleaning, split scores
    parquet      Parquet files (row groups)          arrow        Arrow IPC files and streams (record batches)
    jsonl        JSON Lines, plain, .gz or .zst (byte ranges of whole lines)
    lines        a byte stream's lines in bounded memory (a line over the limit is read past, not held)
    hf_dataset   save_to_disk directories             discover     files, directories and globs to inputs
    fingerprint  content hashes of the inputs, and their stat-keyed cache
    hashing      a local input hashed by the worker that reads it, from the bytes it reads
    storage      objects on object storage (s3://, gs://, memory://): listing, identity, reading in place

Adding an input kind: write one module with a subclass of ``base.InputKind``
(``name``, which the manifest records and so never changes; ``label`` and
``suffixes``, for directory scans and messages; ``detect`` if the suffix alone
does not decide; ``plan_units``, which checks the schema with ``check_schema``
and cuts units, with ``cut_units`` when the file is made of indivisible
pieces; ``iter_batches``, which yields the unit's raw text column in slices of
at most ``batch_rows`` rows, or ``ParsedColumn`` slices when it parses records
that can be bad; ``locate_damage`` optionally; ``divisible`` when some of its
files are one unit whatever the unit size; ``mapped`` when it memory-maps
local files instead of reading them through ``open_input``), and add its
instance to ``INPUT_KINDS`` below. Discovery, the "unsupported file type"
message, cleaning, row numbering and read-error messages then cover it.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Collection, Iterator
from pathlib import Path

from ..errors import InputError
from . import discover as _discover
from .arrow import ARROW_FILE, ARROW_STREAM, ARROW_SUFFIXES
from .base import (
    DEFAULT_BATCH_BYTES,
    READ_ERRORS,
    DirectoryLayout,
    InputFile,
    InputKind,
    ParsedColumn,
    TextBatch,
    WorkUnit,
    clean_texts,
    split_scores,
)
from .fingerprint import fingerprint_inputs
from .storage import hashing_reads, is_remote, storage_error
from .hf_dataset import HF_SAVED_DATASET
from .jsonl import JSONL, JSONL_SUFFIXES
from .parquet import PARQUET, PARQUET_SUFFIXES

__all__ = [
    "InputFile",
    "WorkUnit",
    "TextBatch",
    "discover_inputs",
    "plan_units",
    "iter_text_batches",
    "fingerprint_inputs",
    "split_scores",
    "InputKind",
    "DirectoryLayout",
    "INPUT_KINDS",
    "DIRECTORY_LAYOUTS",
    "input_kind",
    "detect_kind",
    "input_suffixes",
    "PARQUET_SUFFIXES",
    "ARROW_SUFFIXES",
    "JSONL_SUFFIXES",
    "ON_BAD_RECORD",
]

# The input kinds, by the name InputFile.kind (and the manifest) records. The
# order is the order of detection and of the supported suffixes in messages.
INPUT_KINDS: dict[str, InputKind] = {k.name: k for k in (PARQUET, ARROW_FILE, ARROW_STREAM, JSONL)}

# Objects planned at once (round trips in flight) when the inputs are on object storage.
_PLAN_THREADS = 32

# What to do with a record that cannot be read (``BuildConfig.on_bad_record``).
ON_BAD_RECORD = ("fail", "skip")

# Directories with a layout of their own, tried in order before a directory is scanned for files.
DIRECTORY_LAYOUTS: list[DirectoryLayout] = [HF_SAVED_DATASET]


def input_kind(inp: InputFile) -> InputKind:
    """The registered kind that reads ``inp``."""
    try:
        return INPUT_KINDS[inp.kind]
    except KeyError:
        raise InputError(f"{inp.path}: unknown input kind {inp.kind!r}; known kinds are {', '.join(INPUT_KINDS)}") from None


def input_suffixes() -> tuple[str, ...]:
    """Every file suffix some registered kind reads (what a directory scan, or a staged mirror, picks up)."""
    return _discover.input_suffixes(INPUT_KINDS)


def detect_kind(path: str | Path) -> str:
    """The kind name of one file, by its suffix (and first bytes); ``InputError`` if no kind reads it."""
    return _discover.detect_kind(Path(path), INPUT_KINDS)


def discover_inputs(specs: tuple[str, ...] | list[str]) -> list[InputFile]:
    """Expand files, directories, globs and saved datasets into an ordered list of inputs."""
    return _discover.discover(specs, INPUT_KINDS, DIRECTORY_LAYOUTS)


def plan_units(
    inputs: list[InputFile],
    *,
    text_column: str,
    id_column: str | None,
    unit_bytes: int,
    only: Collection[int] | None = None,
    digests: dict[int, str] | None = None,
) -> list[WorkUnit]:
    """Cut every input into work units of whole row groups / record batches, about ``unit_bytes`` each.

    ``only``: cut just these inputs (by index in ``inputs``, which their units
    still carry as ``input``); None: all of them. Units are numbered from 0.
    ``digests``: a local input without a SHA-256 that its kind reads in full
    to cut it (a JSON Lines file's lines are counted) is hashed in that same
    pass, and its SHA-256 put here, by index (``sources/hashing.py``).

    Objects on object storage are planned on a pool of threads: each costs a
    round trip or two (a footer, a head), so thousands of them in sequence
    would take minutes of waiting, not of work. Local files stay sequential.
    """

    def one(i: int) -> list[WorkUnit]:
        inp = inputs[i]
        hashed = digests is not None and not inp.sha256 and not is_remote(inp.path)
        with hashing_reads(inp.path) if hashed else contextlib.nullcontext() as read:
            units = input_kind(inp).plan_units(
                inp, input_index=i, text_column=text_column, id_column=id_column, unit_bytes=unit_bytes, first_index=0
            )
        digest = read.digest(inp.size) if read is not None else None
        if digests is not None and digest:
            digests[i] = digest
        return units

    chosen = range(len(inputs)) if only is None else sorted(only)
    if any(is_remote(inputs[i].path) for i in chosen) and len(chosen) > 1:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(max_workers=min(_PLAN_THREADS, len(chosen))) as pool:
            per_input = list(pool.map(one, chosen))  # in order; the first error is raised
    else:
        per_input = [one(i) for i in chosen]
    units: list[WorkUnit] = []
    for cut in per_input:
        units += [dataclasses.replace(u, index=len(units) + k) for k, u in enumerate(cut)]
    return units


def iter_text_batches(
    inp: InputFile,
    unit: WorkUnit,
    *,
    text_column: str,
    batch_rows: int,
    utf8_errors: str = "replace",
    on_bad_record: str = "fail",
    batch_bytes: int = DEFAULT_BATCH_BYTES,
) -> Iterator[TextBatch]:
    """The unit's texts in batches of at most ``batch_rows`` rows, in file order.

    A bad record (``ParsedColumn``) raises one ``InputError`` naming the file and
    the line (``on_bad_record="fail"``), or is skipped and counted (``"skip"``).
    A record larger than ``batch_bytes`` is a bad record (see ``InputKind.iter_batches``).
    """
    kind = input_kind(inp)
    row = max(unit.first_row, 0)  # -1: numbered from the unit's first line (see sources/jsonl.py)
    try:
        for col in kind.iter_batches(inp, unit, text_column=text_column, batch_rows=batch_rows, batch_bytes=batch_bytes):
            if isinstance(col, ParsedColumn):
                if col.bad_records and on_bad_record != "skip":
                    raise InputError(
                        f"{inp.path} {col.first_bad}, or pass --on-bad-record skip to skip and count such records"
                    )
                yield clean_texts(col.values, inp, row, utf8_errors, col.bad_records)
            else:
                yield clean_texts(col, inp, row, utf8_errors)
            row += len(col)
    except READ_ERRORS as exc:
        failed = storage_error(inp.path, exc) if is_remote(inp.path) else None
        if failed is not None:  # an object deleted, or access denied, while it was read
            raise failed from None
        if isinstance(exc, OSError) and exc.errno is not None:
            raise  # an I/O error of the disk or mount (EIO, ...), not bad data: the caller may retry
        where = kind.locate_damage(inp, unit, text_column=text_column) or f"near row {row}"
        detail = " ".join(str(exc).split())
        raise InputError(
            f"{inp.path}: reading failed {where} ({detail}); the file is corrupt or truncated: "
            "replace it, or remove it from the sources"
        ) from None
