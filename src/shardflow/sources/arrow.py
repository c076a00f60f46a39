"""Arrow IPC inputs (``.arrow``, ``.feather``, ``.ipc``): the file format and the stream format.

Both share the suffixes; the first bytes tell them apart (the file format, and
Feather v2, which is that format, start with ``ARROW1``), so either kind's
``detect`` names the right one. An Arrow input is one work unit: an object on
object storage is planned from its schema alone (its batches' sizes would mean
reading it) and read batch by batch in place, and a local file is cut the same
way, so that both give the same shards. Files are memory-mapped, so holding a
file's batches costs address space, not memory, until their buffers are touched.
A text larger than the batch budget is a bad record (``base.within_budget``).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa

from ..errors import InputError
from .storage import PLAN_BLOCK, READ_BLOCK, is_remote, open_input, read_head
from .base import DEFAULT_BATCH_BYTES, READ_ERRORS, InputFile, InputKind, ParsedColumn, WorkUnit
from .base import check_schema, column_path, file_name, has_suffix, select_column, within_budget

__all__ = ["ARROW_SUFFIXES", "ArrowFileKind", "ArrowStreamKind", "ARROW_FILE", "ARROW_STREAM"]

ARROW_SUFFIXES = (".arrow", ".feather", ".ipc")
_ARROW_FILE_MAGIC = b"ARROW1"


class _ArrowIPCKind(InputKind):
    """What the file and the stream format share: detection, planning and reading by record batch."""

    label = "Arrow"
    suffixes = ARROW_SUFFIXES
    mapped = True  # a local file: pa.memory_map (see _open)

    def detect(self, path: Path | str) -> str | None:
        if not has_suffix(file_name(path), self.suffixes):
            return None
        return ARROW_FILE.name if read_head(str(path), 6) == _ARROW_FILE_MAGIC else ARROW_STREAM.name

    @abstractmethod
    def _reader(self, source: pa.NativeFile) -> Any:
        """The pyarrow reader of this format over ``source``."""

    @abstractmethod
    def _read_all(self, reader: Any) -> list[pa.RecordBatch]:
        """Every record batch of ``reader``, in order."""

    def _open(self, inp: InputFile, block_size: int = READ_BLOCK) -> Any:
        try:
            if is_remote(inp.path):  # read in place, by ranged reads
                return self._reader(pa.PythonFile(open_input(inp.path, block_size=block_size), mode="r"))
            return self._reader(pa.memory_map(inp.path, "r"))
        except READ_ERRORS as exc:
            raise InputError(f"{inp.path}: not a readable Arrow IPC file ({exc}); the file is corrupt or truncated") from None

    def _batches(self, inp: InputFile) -> list[pa.RecordBatch]:
        reader = self._open(inp)
        try:
            return self._read_all(reader)
        except READ_ERRORS as exc:
            raise InputError(f"{inp.path}: reading failed ({exc}); the file is corrupt or truncated") from None

    def divisible(self, inp: InputFile) -> bool:
        return False  # one unit, local or on object storage (see plan_units)

    def plan_units(
        self, inp: InputFile, *, input_index: int, text_column: str, id_column: str | None, unit_bytes: int, first_index: int
    ) -> list[WorkUnit]:
        if is_remote(inp.path):
            # An object on object storage: one unit, planned from its schema alone (the file format's
            # footer, the stream's first message); its batches' sizes would mean reading all of it.
            schema = self._open(inp, PLAN_BLOCK).schema
            check_schema(inp, schema, text_column, id_column)
            return [
                WorkUnit(index=first_index, input=input_index, start=0, stop=-1, first_row=0, rows=-1, text_bytes=inp.size)
            ]
        batches = self._batches(inp)
        schema = batches[0].schema if batches else self._open(inp).schema
        check_schema(inp, schema, text_column, id_column)
        path = column_path(inp, schema, text_column)
        # One unit, as on object storage (where the batches' sizes would mean reading the object): a unit's
        # tokens are its own shards, so a local copy must be cut as the object is to give the same bytes.
        rows = sum(b.num_rows for b in batches)
        text = sum(select_column(b, path).nbytes for b in batches)
        return [WorkUnit(index=first_index, input=input_index, start=0, stop=len(batches), first_row=0, rows=rows, text_bytes=text)]

    def _each(self, inp: InputFile) -> Iterator[pa.RecordBatch]:
        """Every record batch, read one at a time (an object read in place is not held whole)."""
        reader = self._open(inp)
        if hasattr(reader, "num_record_batches"):  # the file format: random access
            for i in range(reader.num_record_batches):
                yield reader.get_batch(i)
        else:
            yield from reader

    def iter_batches(
        self, inp: InputFile, unit: WorkUnit, *, text_column: str, batch_rows: int, batch_bytes: int = DEFAULT_BATCH_BYTES
    ) -> Iterator[pa.Array | pa.ChunkedArray | ParsedColumn]:
        # (rows -1: a whole object on object storage, planned without reading its batches)
        batches = self._each(inp) if unit.rows < 0 else self._batches(inp)[unit.start : unit.stop]
        row = max(unit.first_row, 0)
        for b in batches:
            col = select_column(b, column_path(inp, b.schema, text_column))
            for k in range(0, b.num_rows, batch_rows):
                piece = col.slice(k, batch_rows)
                yield within_budget(piece, batch_bytes=batch_bytes, first_row=row)  # a text over budget: a bad record
                row += len(piece)


class ArrowFileKind(_ArrowIPCKind):
    """The Arrow IPC file format (random access to its record batches); Feather v2 is this format."""

    name = "arrow-file"

    def _reader(self, source: pa.NativeFile) -> Any:
        return pa.ipc.open_file(source)

    def _read_all(self, reader: Any) -> list[pa.RecordBatch]:
        return [reader.get_batch(i) for i in range(reader.num_record_batches)]


class ArrowStreamKind(_ArrowIPCKind):
    """The Arrow IPC stream format (what ``datasets`` ``save_to_disk`` writes): batches read in sequence."""

    name = "arrow-stream"

    def _reader(self, source: pa.NativeFile) -> Any:
        return pa.ipc.open_stream(source)

    def _read_all(self, reader: Any) -> list[pa.RecordBatch]:
        return list(reader)


ARROW_FILE = ArrowFileKind()
ARROW_STREAM = ArrowStreamKind()
