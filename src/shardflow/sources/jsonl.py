"""JSON Lines inputs: one JSON object per line, plain or compressed.

Files: ``.jsonl`` and ``.json`` (read as JSON Lines; a ``.json`` file holding
one JSON array or one pretty-printed object is refused with how to convert
it), and the same compressed with gzip (``.jsonl.gz``, ``.json.gz``) or
Zstandard (``.jsonl.zst``, ``.json.zst``), decompressed by pyarrow's
compressed input streams (no other dependency).

A plain ``.json`` file is read when it is named (as a file or by a glob), but a
directory scan does not pick it up: beside the data files of a corpus
directory, ``.json`` files are usually metadata (``dataset_infos.json``), and
directories that build today must keep building. Compressed ``.json.gz`` /
``.json.zst`` files are data (C4 ships as ``.json.gz``), and are scanned.

The text is the field ``--text-column`` names; ``meta.text`` reaches the field
``text`` of the object in the field ``meta`` (a top-level key spelled
``meta.text`` wins over the dotted reading, as a column of that name does for
Parquet).

Rows. A row is a line, and a document's row number is the index of its line in
the file, counted from 0 (messages say "line N", counted from 1 as editors
do). The row number is the document's identity for the held-out split
(``split_scores(relname, row, seed)``), so it must not depend on how the file
is cut into units; the line index does not, and it is what a person can find
in the file (``sed -n Np``). The alternative, the line's byte offset, would
spare planning a read of the file but name documents by numbers nobody can
use, and a "line N" message would need that count anyway. The cost: planning
reads every JSON Lines file once, counting lines (a ``bytes.count`` per
megabyte, disk speed), on the planning machine; compressed files are
decompressed for it. A file the fingerprint cache does not know is hashed in
that same pass (``sources/hashing.py``), so a local JSON Lines file is read
twice in a first build: counted and hashed, then tokenized. An object on object storage is not read by planning beyond its first
16 KiB: it is cut blind into byte ranges (``JsonLinesKind._plan_object``),
whose workers find their line boundaries and count their rows; the layout
places each range's rows after those of the ranges before it, so line
indexes, split scores and bytes are those of a local copy.

Units. An uncompressed file is cut into byte ranges of whole lines, so a big
file is tokenized in parallel: unit k holds the lines that begin in ``[k *
unit_bytes, (k + 1) * unit_bytes)``, a last range under a quarter of
``unit_bytes`` joined to the one before (``cuts.byte_offsets``). A local file
is cut at the first line at or after each offset (``start``/``stop`` are byte
offsets, ``first_row`` the index of the unit's first line; an offset inside a
line that runs past the next one gives no unit of its own); an object at the
offsets themselves. So a local copy and an object hold the same lines per
unit. A compressed file is one unit (``start``/``stop`` span its decompressed
bytes): a gzip or Zstandard stream cannot be entered in the middle.

Reading. A unit is read in 1 MiB blocks, split into lines, and decoded line
by line with the standard ``json`` module into slices of at most
``batch_rows`` records and about the unit's bytes per row x ``batch_rows``
bytes; so memory is bounded by the batch, never by the file. A line longer
than the batch budget (``--batch-mb``) is a bad record, read past without
being held or decoded (one 200 MB line, or a gzip or Zstandard stream that
expands into one, costs a block, not the line). The standard ``json`` module
on purpose, not orjson when installed: decoders differ at the edges (lone surrogate escapes, huge integers), and whether a
record is good must not depend on what else is installed.

What each line gives:

- a JSON object whose field is a string: a text (invalid UTF-8 in it, or a
  lone surrogate escape, follows ``utf8_errors`` like a binary column);
- a field that is JSON ``null``: a null text, skipped and counted, as a null
  in a Parquet column;
- a blank line (nothing but JSON whitespace): an empty text, skipped and
  counted as ``empty_texts``; it is still a row, so line numbers stay the row
  numbers and ``rows = documents + nulls + empties + bad records``;
- anything else, a bad record: a line that is not JSON, a value that is not
  an object, an object without the field, a field that is not a string.
  ``on_bad_record="fail"`` (the default) stops the build with one message
  ``FILE line N: what is wrong; how to fix it``; ``"skip"`` skips them and
  counts them (``bad_records`` per input and in the totals).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa

from .._arrow import large_binaries, large_strings
from ..errors import InputError
from .base import DEFAULT_BATCH_BYTES, READ_ERRORS, InputFile, InputKind, ParsedColumn, WorkUnit
from .base import budget_words, file_name, has_suffix, record_limit
from .cuts import byte_offsets
from .lines import BLOCK, Oversized, range_lines, read_lines
from .storage import PLAN_BLOCK, READ_BLOCK, hashing, is_remote, open_input, read_head

__all__ = ["JSONL_SUFFIXES", "JsonLinesKind", "JSONL"]

_PLAIN = (".jsonl", ".json")
_CODECS = {".gz": "gzip", ".zst": "zstd"}
_NAMED_ONLY = (".json",)  # read when named, not picked up by directory scans (see above)
JSONL_SUFFIXES = (".jsonl",) + tuple(p + c for c in _CODECS for p in _PLAIN)

_BLOCK = BLOCK
_BOM = b"\xef\xbb\xbf"
_JSON_SPACE = b" \t\r\n"
_FIELDS_SHOWN = 12


def _codec(path: str) -> str | None:
    """``"gzip"``, ``"zstd"`` or None (not compressed), by the file name."""
    lower = path.lower()
    return next((codec for suffix, codec in _CODECS.items() if lower.endswith(suffix)), None)


def _open(path: str, block_size: int = READ_BLOCK) -> BinaryIO:
    """The file's (decompressed) bytes; an object on object storage is read in place, by ranged reads."""
    codec = _codec(path)
    if codec is None:
        return open_input(path, block_size=block_size)
    # Through a Python file object where the raw bytes are read in place or hashed as they are read.
    hashed = is_remote(path) or hashing(path)
    raw = pa.PythonFile(open_input(path, block_size=block_size), mode="r") if hashed else pa.OSFile(path)
    return pa.CompressedInputStream(raw, codec)  # type: ignore[return-value]


def _read_failed(inp: InputFile, line: int, exc: BaseException, *, at: int | None = None) -> InputError:
    detail = " ".join(str(exc).split())
    what = "compressed file" if _codec(inp.path) else "file"
    where = f"near line {line + 1}" if at is None else f"near byte {at}"
    return InputError(
        f"{inp.path}: reading failed {where} ({detail}); the {what} is corrupt or truncated: "
        "replace it, or remove it from the sources"
    )


def _kind_of(value: Any) -> str:
    """How a message names a JSON value's type."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return "null"


def _fields(record: dict[str, Any]) -> str:
    keys = list(record)
    shown = ", ".join(keys[:_FIELDS_SHOWN]) + (f", ... ({len(keys)} in all)" if len(keys) > _FIELDS_SHOWN else "")
    return shown or "none"


def _field(record: dict[str, Any], field: str) -> tuple[Any, str | None]:
    """The value at ``field`` (a key, or a dotted path), or the reason there is none."""
    if field in record:
        return record[field], None
    parts = field.split(".")
    value: Any = record
    for depth, part in enumerate(parts):
        if not isinstance(value, dict) or part not in value:
            if depth and not isinstance(value, dict):
                where = ".".join(parts[:depth])
                return None, f"field {where!r} is {_kind_of(value)}, not an object, so it has no field {part!r}"
            where = f"the object in {'.'.join(parts[:depth])!r}" if depth else "the record"
            return None, (
                f"no field {field!r} ({where} has fields {_fields(value)}); "
                "pick the text field with --text-column NAME (a dotted NAME reaches nested fields)"
            )
        value = value[part]
    return value, None


# Python refuses to convert integers of more digits than this from text (CVE-2020-10735).
_INT_DIGITS = sys.get_int_max_str_digits() if hasattr(sys, "get_int_max_str_digits") else 4300


def _text(line: bytes, field: str) -> tuple[str | None, str | None]:
    """One line's text (``""`` for a blank line, None for a JSON null), or None and why the record is bad."""
    if not line.strip(_JSON_SPACE):
        return "", None
    # Invalid UTF-8 survives decoding as lone surrogates; the text's bytes are restored from them.
    try:
        record = json.loads(line.decode("utf-8", "surrogateescape"))
    except json.JSONDecodeError as exc:
        return None, f"not valid JSON ({exc.msg}: column {exc.colno}); fix or remove the line"
    except RecursionError:
        return None, "not valid JSON (nested too deeply); fix or remove the line"
    except ValueError as exc:  # json's other ValueError: an integer past Python's int-string limit
        if "digits" not in str(exc):
            return None, f"not valid JSON ({exc}); fix or remove the line"
        return None, f"a JSON integer of more than {_INT_DIGITS:,} digits; fix or remove the line"
    if not isinstance(record, dict):
        return None, f"the record is {_kind_of(record)}, not a JSON object; each line must be one object"
    value, why = _field(record, field)
    if why is not None:
        return None, why
    if value is None or isinstance(value, str):
        return value, None
    return None, f"field {field!r} is {_kind_of(value)}, not a string; pick a string field with --text-column NAME"


def _utf8(text: str) -> bytes:
    """A text's bytes, invalid UTF-8 and lone surrogate escapes kept as invalid bytes."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass")


def _column(values: list[str | None]) -> pa.Array:
    try:
        return large_strings(values)
    except UnicodeEncodeError:  # lone surrogates: binary, so that utf8_errors decides and counts
        return large_binaries([None if v is None else _utf8(v) for v in values])


def _not_json_lines(inp: InputFile, head: bytes) -> None:
    """Refuse a file that is one JSON document (an array, a pretty-printed object), not JSON Lines."""
    body = head[len(_BOM) :] if head.startswith(_BOM) else head
    first = body.lstrip(_JSON_SPACE)
    line = first.split(b"\n", 1)[0].strip(_JSON_SPACE)
    if first.startswith(b"[") or line == b"{":
        shape = "a JSON array" if first.startswith(b"[") else "one JSON document over several lines"
        raise InputError(
            f"{inp.path}: the file is {shape}, not JSON Lines (one JSON object per line); convert it, "
            f"e.g. jq -c '{'.[]' if shape.endswith('array') else '.'}' FILE > FILE.jsonl"
        )


_HEAD = 16 << 10


def _head(inp: InputFile) -> bytes:
    """The first few KiB of an object's (decompressed) text, from one small ranged read.

    Enough to tell JSON Lines from one JSON document; a compressed head that
    does not decompress is left to the worker, which names the line.
    """
    raw = read_head(inp.path, _HEAD)
    codec = _codec(inp.path)
    if codec is None:
        return raw
    try:
        return pa.CompressedInputStream(pa.BufferReader(raw), codec).read(4096)  # type: ignore[no-any-return]
    except READ_ERRORS:
        return b""


class JsonLinesKind(InputKind):
    """JSON Lines, plain or gzip/Zstandard-compressed; units are byte ranges of whole lines."""

    name = "jsonl"
    label = "JSON Lines"
    suffixes = JSONL_SUFFIXES

    def detect(self, path: Path | str) -> str | None:
        return self.name if has_suffix(file_name(path), self.suffixes + _NAMED_ONLY) else None

    def divisible(self, inp: InputFile) -> bool:
        return _codec(inp.path) is None  # a gzip or Zstandard stream is one unit

    def plan_units(
        self, inp: InputFile, *, input_index: int, text_column: str, id_column: str | None, unit_bytes: int, first_index: int
    ) -> list[WorkUnit]:
        if is_remote(inp.path):
            return self._plan_object(
                inp, input_index=input_index, id_column=id_column, unit_bytes=unit_bytes, first_index=first_index
            )
        # (byte offset, line index, k) where a unit starts: at the first line at or after k * unit_bytes.
        found = [(0, 0, 0)]
        k: int | None = 1 if _codec(inp.path) is None else None  # a compressed stream is one unit
        pos = lines = 0
        last = b"\n"
        try:
            with _open(inp.path) as f:
                while block := f.read(_BLOCK):
                    if pos == 0:
                        _not_json_lines(inp, block)
                    end = pos + len(block)
                    # Cut before the first line that starts at or after the offset k * unit_bytes.
                    while k is not None and k * unit_bytes <= end:
                        nl = block.find(b"\n", max(k * unit_bytes - 1 - pos, 0))
                        if nl < 0:
                            break
                        at = pos + nl + 1
                        found.append((at, lines + block.count(b"\n", 0, nl + 1), k))
                        # The offsets up to this cut have no line of their own (it begins after them).
                        k = at // unit_bytes + 1
                    lines += block.count(b"\n")
                    pos = end
                    last = block[-1:]
        except READ_ERRORS as exc:
            if isinstance(exc, OSError) and exc.errno is not None:
                raise  # the disk's or the mount's, not the data's
            raise _read_failed(inp, lines, exc) from None
        total = lines + (1 if pos and last != b"\n" else 0)
        # The ranges of the bytes read (a small last one joined to the one before), as for an object.
        ranges = max(len(byte_offsets(pos, unit_bytes)), 1)
        starts = [(at, first) for at, first, n in found if at < pos and n < ranges] or [(0, 0)]
        if id_column is not None:
            self._check_id(inp, id_column)
        units = []
        for k, (start, first) in enumerate(starts):
            stop, next_first = starts[k + 1] if k + 1 < len(starts) else (pos, total)
            units.append(
                WorkUnit(
                    index=first_index + k,
                    input=input_index,
                    start=start,
                    stop=stop,
                    first_row=first,
                    rows=next_first - first,
                    text_bytes=stop - start,
                )
            )
        return units

    def _plan_object(
        self, inp: InputFile, *, input_index: int, id_column: str | None, unit_bytes: int, first_index: int
    ) -> list[WorkUnit]:
        """An object on object storage, planned from its size and its first bytes alone.

        Counting its lines here would read the whole corpus on the planning
        machine. So an uncompressed object is cut into byte ranges blind: a unit
        holds the lines that begin in its range, which its worker finds (the
        first after the range's start, the last running past its end); a
        compressed one is one unit. ``rows`` is -1 (not known until read), and
        a unit after the first has ``first_row`` -1: its worker numbers its lines
        from 0, and the layout adds the line counts of the units before it
        (``pipeline/layout.py``), so row numbers are still line indexes in the
        object and the bytes are those of a local build.
        """
        _not_json_lines(inp, _head(inp))
        if id_column is not None:
            self._check_id(inp, id_column)
        # Uncompressed: byte ranges at the multiples of unit_bytes (cuts.py), cut at the first line
        # boundary at or after each offset by the workers themselves; a compressed stream is one unit.
        offsets = byte_offsets(inp.size, unit_bytes) if _codec(inp.path) is None else [0] if inp.size else []
        cuts = offsets + [inp.size]
        return [
            WorkUnit(
                index=first_index + k,
                input=input_index,
                start=start,
                stop=stop,
                first_row=0 if start == 0 else -1,
                rows=-1,
                text_bytes=stop - start,
            )
            for k, (start, stop) in enumerate(zip(cuts, cuts[1:]))
        ]

    def _check_id(self, inp: InputFile, id_column: str) -> None:
        """The id field must be in the first record (as a Parquet file must have the id column)."""
        with _open(inp.path, PLAN_BLOCK) as f:
            for n, line in enumerate(read_lines(f, None, DEFAULT_BATCH_BYTES)):
                if isinstance(line, Oversized):
                    return  # a bad record: reported (or skipped) when it is read
                if not line.strip(_JSON_SPACE):
                    continue
                try:
                    record = json.loads(line.removeprefix(_BOM).decode("utf-8", "surrogateescape"))
                except (ValueError, RecursionError):  # JSONDecodeError, or an integer too long to convert
                    return  # a bad record: reported (or skipped) when it is read
                if isinstance(record, dict) and _field(record, id_column)[1] is not None:
                    raise InputError(f"{inp.path} line {n + 1}: no id field {id_column!r}; its fields are {_fields(record)}")
                return

    def iter_batches(
        self, inp: InputFile, unit: WorkUnit, *, text_column: str, batch_rows: int, batch_bytes: int = DEFAULT_BATCH_BYTES
    ) -> Iterator[ParsedColumn]:
        # Bound a slice by bytes too: about batch_rows rows of this unit's average size.
        # (Rows not known yet, -1: an object on object storage, planned without reading it.)
        per_row = unit.text_bytes // unit.rows if unit.rows > 0 else _BLOCK // 64
        max_bytes = max(_BLOCK, batch_rows * per_row)
        limit = record_limit(batch_bytes)  # a longer line is a bad record, never held whole
        values: list[str | None] = []
        bad = 0
        first_bad: str | None = None
        nbytes = 0
        # A unit of an object whose place in it is known only in bytes (first_row -1) numbers its
        # lines from 0, and messages name a bad line by its byte offset.
        relative = unit.first_row < 0
        line = max(unit.first_row, 0)
        pos = unit.start
        try:
            with _open(inp.path) as f:
                if is_remote(inp.path) and _codec(inp.path) is None:
                    lines, pos = range_lines(f, unit.start, unit.stop, limit)
                else:
                    if unit.start:
                        f.seek(unit.start)
                    length = unit.stop - unit.start if _codec(inp.path) is None and unit.rows >= 0 else None
                    lines = read_lines(f, length, limit)
                for raw in lines:
                    if len(raw) > limit:  # an Oversized line, or one that ran up to a block past the limit
                        # Never decoded: a record over the budget would take many times its size.
                        text, why = None, budget_words(len(raw), batch_bytes)
                    else:
                        if line == 0 and not relative and raw.startswith(_BOM):
                            raw = raw[len(_BOM) :]
                        text, why = _text(raw, text_column)
                    if why is not None:
                        bad += 1
                        if first_bad is None:
                            first_bad = f"{f'the line at byte {pos}' if relative else f'line {line + 1}'}: {why}"
                    values.append(text)
                    nbytes += len(raw) + 1
                    pos += len(raw) + 1
                    line += 1
                    if len(values) >= batch_rows or nbytes >= max_bytes:
                        yield ParsedColumn(_column(values), bad, first_bad)
                        values, bad, first_bad, nbytes = [], 0, None, 0
        except READ_ERRORS as exc:
            if isinstance(exc, (FileNotFoundError, PermissionError)) or (isinstance(exc, OSError) and exc.errno is not None):
                raise  # the storage's (an object deleted, access denied) or the disk's, not the data's
            raise _read_failed(inp, line, exc, at=pos if relative else None) from None
        if values:
            yield ParsedColumn(_column(values), bad, first_bad)
        if unit.rows >= 0 and line - unit.first_row != unit.rows:
            raise InputError(
                f"{inp.path}: has {line - unit.first_row} lines from line {unit.first_row + 1} where planning counted "
                f"{unit.rows}; the file changed during the build: rebuild"
            )


JSONL = JsonLinesKind()
