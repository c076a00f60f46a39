"""Parquet inputs (``.parquet``, ``.pq``): row groups are the indivisible pieces of a work unit.

Planning reads only the footer (row counts and the text column's uncompressed
size per row group); reading streams the unit's row groups, text column only,
in batches, so a huge row group is never in memory at once. The job that hashes
a local file as it reads it (``sources/hashing.py``) reads the other columns'
chunks too, in file order, for the hash. A text larger
than the batch budget is a bad record (``base.within_budget``): in a row group
of one row it is known from the footer and never decompressed; otherwise its
page is decompressed (a value cannot span pages) but the text is not tokenized.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from .storage import PLAN_BLOCK, READ_BLOCK, is_remote, open_input
from .cuts import join_small_tail
from .hashing import forward_hash
from .base import DEFAULT_BATCH_BYTES, READ_ERRORS, InputFile, InputKind, ParsedColumn, WorkUnit
from .base import budget_words, check_schema, column_path, cut_units, record_limit, select_column, within_budget

__all__ = ["PARQUET_SUFFIXES", "ParquetKind", "PARQUET"]

PARQUET_SUFFIXES = (".parquet", ".pq")
# What a column chunk of one row holds besides its value: page headers, the value's length, statistics.
_PAGE_OVERHEAD = 4096


def _open(inp: InputFile, block_size: int = READ_BLOCK, *, hashing: bool = False) -> pq.ParquetFile:
    try:
        # A buffered stream reads column pages incrementally, so a huge row group
        # never has to be in memory at once (the memory bound is the batch size).
        # An object on object storage is read in place: the footer, then the unit's pages, by ranged reads.
        # ``hashing``: a local file this job hashes as it reads it (``hashing.ForwardHash``), if it does.
        if is_remote(inp.path):
            source: Any = open_input(inp.path, block_size=block_size)
        else:
            source = (forward_hash(inp.path) if hashing else None) or inp.path
        return pq.ParquetFile(source, buffer_size=1 << 20, pre_buffer=False)
    except READ_ERRORS as exc:
        raise InputError(f"{inp.path}: not a readable Parquet file ({exc}); the file is corrupt or truncated") from None


class ParquetKind(InputKind):
    """A Parquet file; units are runs of whole row groups."""

    name = "parquet"
    label = "Parquet"
    suffixes = PARQUET_SUFFIXES

    def plan_units(
        self, inp: InputFile, *, input_index: int, text_column: str, id_column: str | None, unit_bytes: int, first_index: int
    ) -> list[WorkUnit]:
        pf = _open(inp, PLAN_BLOCK)  # the footer only
        check_schema(inp, pf.schema_arrow, text_column, id_column)
        path = column_path(inp, pf.schema_arrow, text_column)
        if len(path) == 1:
            col = pf.schema_arrow.get_field_index(text_column)
        else:  # a struct field (``--text-column meta.text``): its leaf column
            leaves = [pf.schema.column(i).path for i in range(len(pf.schema))]
            col = leaves.index(".".join(path)) if ".".join(path) in leaves else len(leaves)
        md = pf.metadata
        sizes = []  # (rows, text bytes) per row group
        for g in range(md.num_row_groups):
            rg = md.row_group(g)
            # Leaf index equals field index for flat schemas, which text corpora are.
            nbytes = rg.column(col).total_uncompressed_size if col < rg.num_columns else rg.total_byte_size
            sizes.append((rg.num_rows, nbytes))
        units = cut_units(sizes, input_index=input_index, unit_bytes=unit_bytes, first_index=first_index)
        return join_small_tail(units, unit_bytes)  # a small last row group or two: no unit of its own (cuts.py)

    def iter_batches(
        self, inp: InputFile, unit: WorkUnit, *, text_column: str, batch_rows: int, batch_bytes: int = DEFAULT_BATCH_BYTES
    ) -> Iterator[pa.Array | pa.ChunkedArray | ParsedColumn]:
        pf = _open(inp, hashing=True)
        path = column_path(inp, pf.schema_arrow, text_column)
        # A dotted name reads only the struct's text leaf, not its sibling fields.
        columns = [".".join(path)]
        leaves = [pf.schema.column(i).path for i in range(len(pf.schema))]
        leaf = leaves.index(columns[0]) if columns[0] in leaves else None
        row = unit.first_row
        for g in range(unit.start, unit.stop):
            rg = pf.metadata.row_group(g)
            # A row group of one row whose text is over the budget (a page that expands a
            # thousandfold, say) is a bad record known from the footer: never decompressed.
            size = rg.column(leaf).total_uncompressed_size if leaf is not None else 0
            if rg.num_rows == 1 and size - _PAGE_OVERHEAD > record_limit(batch_bytes):
                yield ParsedColumn(pa.nulls(1, pa.large_string()), 1, f"row {row}: {budget_words(size, batch_bytes)}")
                row += 1
                continue
            for batch in pf.iter_batches(batch_size=batch_rows, row_groups=[g], columns=columns):
                col = select_column(batch, path)
                yield within_budget(col, batch_bytes=batch_bytes, first_row=row)
                row += len(col)

    def locate_damage(self, inp: InputFile, unit: WorkUnit, *, text_column: str) -> str | None:
        """Which row group of the unit cannot be read, as ``"in row group G (rows A to B)"``."""
        try:
            pf = pq.ParquetFile(open_input(inp.path) if is_remote(inp.path) else inp.path)
            first = unit.first_row
            for g in range(unit.start, unit.stop):
                n = pf.metadata.row_group(g).num_rows
                try:
                    pf.read_row_group(g, columns=[".".join(column_path(inp, pf.schema_arrow, text_column))])
                except READ_ERRORS:
                    return f"in row group {g} (rows {first} to {first + n - 1})"
                first += n
        except READ_ERRORS:
            return None
        return None


PARQUET = ParquetKind()
