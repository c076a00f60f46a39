"""What every input kind shares: the input/unit/batch records, the ``InputKind`` contract, text cleaning.

An input kind (Parquet, Arrow IPC file, Arrow IPC stream, ...) knows three
things about its files: which files are its own (``detect``), how to cut one
file into work units of whole indivisible pieces (row groups, record
batches, ...) with their row counts (``plan_units``), and how to read a unit's
text column back in bounded batches (``iter_batches``). Everything else, the
cleaning of the texts (nulls, empties, invalid UTF-8), the row numbering, the
error messages for damaged files, the held-out split scores, is done once,
here and in ``__init__``, for every kind alike.
"""

from __future__ import annotations

import hashlib
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .._arrow import bool_array, large_strings
from ..errors import InputError

__all__ = [
    "InputFile",
    "WorkUnit",
    "TextBatch",
    "ParsedColumn",
    "InputKind",
    "DirectoryLayout",
    "READ_ERRORS",
    "has_suffix",
    "file_name",
    "check_schema",
    "column_path",
    "select_column",
    "is_text_type",
    "cut_units",
    "clean_texts",
    "split_scores",
    "DEFAULT_BATCH_BYTES",
    "budget_words",
    "record_limit",
    "within_budget",
]

# What a damaged or truncated file raises while pyarrow reads it. An OSError
# with an errno is the disk's or the mount's, not the data's: callers re-raise it.
READ_ERRORS = (pa.ArrowInvalid, pa.ArrowIOError, OSError)

DEFAULT_BATCH_BYTES = 32 << 20
"""The batch budget when the caller names none (``BuildConfig.batch_bytes``'s default, ``--batch-mb 32``)."""


@dataclass(frozen=True, kw_only=True)
class InputFile:
    """One input file. ``relname`` is stable across machines and is what the manifest records.

    ``kind`` is the name of its input kind in ``INPUT_KINDS`` ("parquet",
    "arrow-file", "arrow-stream"); the manifest records it, so a kind's name never changes.
    """

    path: str
    relname: str
    kind: str
    size: int
    sha256: str = ""
    """The SHA-256 of the file's bytes. Empty while planning has not read it: an object on object storage
    (``identity`` stands in for it), or a local file that no version holds by its name and size and that the
    fingerprint cache does not know (``stat`` stands in for it); the worker that reads its first unit hashes it
    (``UnitResult.input_sha256``), so that its bytes are read once (``pipeline/plan.py``)."""
    identity: str = ""
    """For an object on object storage (``path`` is its URL): the storage's identity of this version of it
    (``"ETag=..."``, ``"VersionId=..."``, see ``storage.identity``), which the build key and incremental
    reuse compare instead of a content hash; ``sha256`` is then filled in by the worker that reads it.
    Empty for local files, and then left out of ``to_dict``, so local plans and manifests keep their bytes."""
    stat: str = ""
    """For a local file: its size, mtime, ctime and inode when planning hashed it (``fingerprint.local_stat``);
    the worker that reads it refuses it if they changed, as an object's identity. Recorded in the plan, not in
    the manifest; empty for objects (and in plans written before it was recorded)."""

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for optional in ("identity", "stat"):
            if not d[optional]:
                del d[optional]
        return d

    @property
    def key_identity(self) -> str:
        """What the build key records of the content: the SHA-256, else the storage identity of a remote object,
        or a local file's stat (size, mtime, ctime, inode) when planning left it to be hashed by its reader."""
        return self.sha256 or (f"object:{self.identity}" if self.identity else f"file:{self.stat}")


@dataclass(frozen=True, kw_only=True)
class WorkUnit:
    """Pieces ``[start, stop)`` of one input: row groups (Parquet), record batches (Arrow), ...

    What ``start`` and ``stop`` count is the input kind's business; ``first_row``
    and ``rows`` are row numbers within the input file, the same for every kind.
    """

    index: int
    input: int
    start: int
    stop: int
    first_row: int
    rows: int
    text_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, kw_only=True)
class TextBatch:
    """Texts to tokenize (no nulls, no empties) and their row numbers in the input file."""

    texts: pa.Array
    rows: np.ndarray
    nulls: int
    empties: int
    invalid_utf8: int
    skipped_invalid: int
    bad_records: int = 0
    """Records that could not be read (a line that is not JSON, a record without the text field),
    skipped under ``on_bad_record="skip"``; they are rows, so ``rows`` numbering goes on past them."""


@dataclass(frozen=True)
class ParsedColumn:
    """A slice of text column parsed from records (JSON Lines), with the records that were bad.

    A kind whose files are parsed record by record yields this instead of a bare
    array: ``values`` has one entry per row, a bad record being a null there;
    ``bad_records`` says how many of those nulls are bad records, and
    ``first_bad`` where the first one is and what is wrong with it (``"line 12:
    not valid JSON (...)"``). The caller raises it (``on_bad_record="fail"``)
    or skips and counts them (``"skip"``).
    """

    values: pa.Array
    bad_records: int = 0
    first_bad: str | None = None

    def __len__(self) -> int:
        return len(self.values)


def record_limit(batch_bytes: int) -> int:
    """The largest record a batch budget admits: the budget, but never under 1 MiB.

    The command line's budget is whole megabytes; a smaller one (the API's, to
    tune batching) is no reason to refuse a record that costs next to nothing.
    """
    return max(batch_bytes, 1 << 20)


def budget_words(size: int, batch_bytes: int) -> str:
    """Why a record of ``size`` bytes is bad, and how to fix it, for a ``ParsedColumn.first_bad``."""
    limit = record_limit(batch_bytes)
    return (
        f"a record of {size:,} bytes, larger than the batch budget of {limit:,} bytes (--batch-mb "
        f"{limit / (1 << 20):g}); raise --batch-mb above it, or remove the record"
    )


def _lengths(col: pa.Array) -> np.ndarray:
    """The byte length of every value of a text array (0 for a null), without a Python scalar."""
    if isinstance(col, pa.ChunkedArray):
        return np.concatenate([_lengths(c) for c in col.chunks]) if col.num_chunks else np.zeros(0, np.int64)
    ty = col.type
    if pa.types.is_string(ty) or pa.types.is_binary(ty) or pa.types.is_large_string(ty) or pa.types.is_large_binary(ty):
        wide = pa.types.is_large_string(ty) or pa.types.is_large_binary(ty)
        offsets = np.frombuffer(col.buffers()[1], dtype=np.int64 if wide else np.int32)
        lengths = np.diff(offsets[col.offset : col.offset + len(col) + 1]).astype(np.int64)
    elif str(ty) in ("string_view", "binary_view"):  # no length kernel for views
        return _lengths(col.cast(pa.large_string() if str(ty) == "string_view" else pa.large_binary()))
    else:  # dictionary-encoded: its lengths computed
        out = pc.binary_length(col.dictionary_decode() if pa.types.is_dictionary(ty) else col)
        wide = out.type == pa.int64()
        lengths = np.frombuffer(out.buffers()[1], dtype=np.int64 if wide else np.int32)[out.offset : out.offset + len(out)]
        lengths = lengths.astype(np.int64)
    if col.null_count:
        lengths = np.where(bool_array(pc.is_valid(col)), lengths, 0)
    return lengths


def within_budget(
    col: pa.Array | pa.ChunkedArray, *, batch_bytes: int, first_row: int
) -> pa.Array | pa.ChunkedArray | ParsedColumn:
    """``col`` itself, or, when a value is over ``record_limit(batch_bytes)``, a ``ParsedColumn`` with those values bad.

    The texts of columnar files are read before this check (a page or a
    batch is decompressed whole), but never tokenized: one document larger
    than the budget would take many times its size to tokenize.
    """
    lengths = _lengths(col)
    limit = record_limit(batch_bytes)
    if not len(lengths) or int(lengths.max()) <= limit:
        return col
    over = lengths > limit
    k = int(np.argmax(over))
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    values = pc.replace_with_mask(col, pa.array(over), pa.nulls(int(over.sum()), col.type))
    return ParsedColumn(values, int(over.sum()), f"row {first_row + k}: {budget_words(int(lengths[k]), batch_bytes)}")


def file_name(path: Path | str) -> str:
    """The last component of a local path or a URL (``Path`` would fold ``s3://`` into ``s3:/``)."""
    return str(path).rstrip("/").rsplit("/", 1)[-1]


def has_suffix(name: str, suffixes: Sequence[str]) -> bool:
    """Whether a file name ends with one of ``suffixes`` (lower-case, with the dot), ignoring case.

    Like ``Path.suffix in suffixes`` for one-dot suffixes (a bare ``.pq`` has no
    suffix), and it also matches two-dot suffixes such as ``.jsonl.gz``.
    """
    lower = name.lower()
    return any(lower.endswith(s) and len(lower) > len(s) for s in suffixes)


class InputKind(ABC):
    """One kind of input file. A new kind is one module with a subclass, plus one line in ``INPUT_KINDS``."""

    name: str
    """Stored in ``InputFile.kind`` and the manifest; never rename it."""
    label: str
    """For messages: "inputs are Parquet (.parquet, .pq) or ..."; kinds of one family share it."""
    suffixes: tuple[str, ...]
    """Lower-case file name endings, with the dot, that directory scans pick up."""
    mapped: bool = False
    """Whether a local file is memory-mapped to be read, never read through ``storage.open_input``: the job that
    hashes it does so over the mapping (``hashing.finish_hash``)."""

    def detect(self, path: Path | str) -> str | None:
        """The kind name of ``path`` (a local path, or an object's URL) if this kind (or its family) reads it, else None.

        The default decides by suffix alone; a family that needs the file's first
        bytes (Arrow IPC file vs stream) overrides it and may name a sibling kind.
        """
        return self.name if has_suffix(file_name(path), self.suffixes) else None

    @abstractmethod
    def plan_units(
        self, inp: InputFile, *, input_index: int, text_column: str, id_column: str | None, unit_bytes: int, first_index: int
    ) -> list[WorkUnit]:
        """Check the schema (``check_schema``) and cut ``inp`` into units of about ``unit_bytes`` of text.

        Units are numbered from ``first_index``, carry ``input=input_index``, and
        together cover the file's rows in order (``cut_units`` does this for kinds
        made of indivisible pieces). An unreadable file raises ``InputError``.
        """

    @abstractmethod
    def iter_batches(
        self, inp: InputFile, unit: WorkUnit, *, text_column: str, batch_rows: int, batch_bytes: int = DEFAULT_BATCH_BYTES
    ) -> Iterator[pa.Array | pa.ChunkedArray | ParsedColumn]:
        """The unit's raw text column, in file order, in slices of at most ``batch_rows`` rows.

        Nulls, empties and binary text are left as they are (the caller cleans
        them); a kind that parses records yields ``ParsedColumn`` slices, its bad
        records marked (the caller applies ``on_bad_record``); pyarrow's read errors (``READ_ERRORS``) may propagate: the caller turns
        them into one ``InputError`` naming the file and the place.

        ``batch_bytes`` is the batch budget (``--batch-mb``): one record larger
        than it (``record_limit``) is a bad record (``within_budget``), never
        tokenized, and held no longer than reading it needs, so a hostile file
        cannot exhaust memory.
        """

    def divisible(self, inp: InputFile) -> bool:
        """Whether a smaller ``unit_bytes`` may cut ``inp`` into more units (False: always one unit).

        (A compressed stream is one unit whatever its size.)
        """
        return True

    def locate_damage(self, inp: InputFile, unit: WorkUnit, *, text_column: str) -> str | None:
        """Where in ``unit`` reading failed, e.g. ``"in row group 2 (rows 32 to 47)"``; None: unknown.

        Called only after ``iter_batches`` failed; the message then says "near row N".
        """
        return None


class DirectoryLayout(Protocol):
    """A directory with a layout of its own (a saved ``datasets`` dataset), read as a list of inputs."""

    def expand(self, path: Path, spec: str) -> list[tuple[Path, str, str]] | None:
        """``(file, relname, kind name)`` per input, in order; None: not this layout (scan it as files)."""


def is_text_type(ty: pa.DataType) -> bool:
    """String or binary, plain, large, view (polars writes Arrow IPC with views) or dictionary-encoded."""
    if pa.types.is_dictionary(ty):
        ty = ty.value_type
    return (
        pa.types.is_string(ty)
        or pa.types.is_large_string(ty)
        or pa.types.is_binary(ty)
        or pa.types.is_large_binary(ty)
        or str(ty) in ("string_view", "binary_view")
    )


def column_path(inp: InputFile, schema: pa.Schema, text_column: str) -> tuple[str, ...]:
    """The field names leading to the text column: ``("text",)``, or ``("meta", "text")`` for ``meta.text``.

    A column whose name is ``text_column`` itself wins over the dotted reading; else a
    dotted name reaches into struct columns, one field per dot. An ``InputError``
    names what is missing and what there is.
    """
    names = schema.names
    if text_column in names:
        return (text_column,)
    parts = tuple(text_column.split("."))
    if len(parts) > 1 and parts[0] in names and all(parts):
        ty = schema.field(parts[0]).type
        for depth, part in enumerate(parts[1:], start=1):
            where = ".".join(parts[:depth])
            if not pa.types.is_struct(ty):
                raise InputError(
                    f"{inp.path}: column {where!r} has type {ty}, not a struct, so it has no field {part!r}; "
                    "pick the text column with --text-column NAME (a dotted NAME reaches into struct columns)"
                )
            if ty.get_field_index(part) < 0:
                fields = ", ".join(ty.field(i).name for i in range(ty.num_fields))
                raise InputError(
                    f"{inp.path}: column {where!r} has no field {part!r}; its fields are {fields}. "
                    "Pick the text column with --text-column NAME"
                )
            ty = ty.field(part).type
        return parts
    raise InputError(
        f"{inp.path}: no column {text_column!r}; the columns are {', '.join(names)}. "
        "Pick the text column with --text-column NAME"
    )


def _path_type(schema: pa.Schema, path: Sequence[str]) -> pa.DataType:
    ty = schema.field(path[0]).type
    for part in path[1:]:
        ty = ty.field(part).type
    return ty


def select_column(data: pa.RecordBatch | pa.Table, path: Sequence[str]) -> pa.Array | pa.ChunkedArray:
    """The column at ``path`` (see ``column_path``); a null struct gives a null text."""
    col = data.column(path[0])
    for part in path[1:]:
        col = pc.struct_field(col, part)  # propagates the parent's nulls, unlike StructArray.field
    return col


def check_schema(inp: InputFile, schema: pa.Schema, text_column: str, id_column: str | None) -> None:
    """Refuse a file without the text column (or the id column), or whose text column is not text."""
    names = schema.names
    ty = _path_type(schema, column_path(inp, schema, text_column))
    if not is_text_type(ty):
        raise InputError(
            f"{inp.path}: column {text_column!r} has type {ty}, not a string type; "
            "pick a string column with --text-column NAME"
        )
    if id_column is not None and id_column not in names:
        raise InputError(f"{inp.path}: no id column {id_column!r}; the columns are {', '.join(names)}")


def cut_units(sizes: Sequence[tuple[int, int]], *, input_index: int, unit_bytes: int, first_index: int) -> list[WorkUnit]:
    """Group indivisible pieces, given as ``(rows, text bytes)`` each, into units of about ``unit_bytes``.

    A unit takes whole pieces while it stays within ``unit_bytes`` and always at
    least one, so a piece bigger than the target is a unit of its own.
    """
    units: list[WorkUnit] = []
    row = 0
    start = 0
    while start < len(sizes):
        stop, rows, nbytes = start, 0, 0
        while stop < len(sizes) and (stop == start or nbytes + sizes[stop][1] <= unit_bytes):
            rows += sizes[stop][0]
            nbytes += sizes[stop][1]
            stop += 1
        units.append(WorkUnit(index=first_index + len(units), input=input_index, start=start, stop=stop,
                              first_row=row, rows=rows, text_bytes=nbytes))
        row += rows
        start = stop
    return units


def clean_texts(
    col: pa.Array | pa.ChunkedArray, inp: InputFile, first_row: int, utf8_errors: str, bad_records: int = 0
) -> TextBatch:
    """Drop nulls and empties, decode binary text; keep the row number of every kept text.

    ``bad_records`` of the nulls are records that could not be read (``ParsedColumn``), counted apart.
    """
    if isinstance(col, pa.ChunkedArray):
        col = col.combine_chunks()
    if pa.types.is_dictionary(col.type):
        col = col.dictionary_decode()
    if str(col.type) in ("string_view", "binary_view"):  # tokenizers read offsets + data buffers
        col = col.cast(pa.large_string() if str(col.type) == "string_view" else pa.large_binary())
    n = len(col)
    invalid = skipped = 0
    if pa.types.is_binary(col.type) or pa.types.is_large_binary(col.type):
        target = pa.large_string() if pa.types.is_large_binary(col.type) else pa.string()
        try:
            col = col.cast(target)  # validates UTF-8; the common case costs one pass
        except pa.ArrowInvalid:
            values: list[str | None] = []
            for raw in col.to_pylist():
                if raw is None:
                    values.append(None)
                    continue
                try:
                    values.append(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    invalid += 1
                    if utf8_errors == "skip":
                        skipped += 1
                        values.append(None)
                    else:
                        values.append(raw.decode("utf-8", errors="replace"))
            col = large_strings(values).cast(target)  # as pa.array(values, type=target), without pandas
    nulls = col.null_count - skipped - bad_records
    # Kept: neither null nor empty. The Kleene AND (false wins over null) of validity and the length
    # cast to bool, read from its bitmap: a Python scalar (pa.scalar, fill_null(x, 0)) or a
    # BooleanArray's to_numpy would import pandas, on the GIL of every build process (_arrow.py, docs/PERFORMANCE.md).
    keep = pc.and_kleene(pc.is_valid(col), pc.cast(pc.binary_length(col), pa.bool_()))
    keep_np = bool_array(keep)
    kept = int(keep_np.sum())
    empties = n - nulls - skipped - bad_records - kept
    rows = np.flatnonzero(keep_np).astype(np.int64) + first_row
    texts = col if kept == n else col.filter(keep)
    return TextBatch(texts=texts, rows=rows, nulls=nulls, empties=empties, invalid_utf8=invalid,
                     skipped_invalid=skipped, bad_records=bad_records)


def split_scores(relname: str, rows: np.ndarray, seed: int) -> np.ndarray:
    """A uint64 pseudo-random score per document, from (seed, input name, row).

    It depends on nothing else (not the worker count, not the other inputs), so
    the held-out split is the same however the build is cut up, and an
    incremental build reuses the same choices for unchanged files.
    """
    h = hashlib.blake2b(f"{seed}\0{relname}".encode(), digest_size=8).digest()
    base = np.uint64(int.from_bytes(h, "little"))
    # splitmix64 over (base + row): a good 64-bit mix, vectorized; wraps mod 2**64.
    with np.errstate(over="ignore"):
        z = rows.astype(np.uint64) + base
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z
