"""Parquet inputs (``.parquet``, ``.pq``): row groups are the indivisible pieces of a work unit.

Planning reads only the footer (row counts and the text column's uncompressed
size per row group); reading streams the unit's row groups, text column only,
in batches, so a huge row group is never in memory at once.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from ..errors import InputError
from .storage import PLAN_BLOCK, READ_BLOCK, is_remote, open_input
from .base import READ_ERRORS, InputFile, InputKind, WorkUnit, check_schema, column_path, cut_units, select_column

__all__ = ["PARQUET_SUFFIXES", "ParquetKind", "PARQUET"]

PARQUET_SUFFIXES = (".parquet", ".pq")


def _open(inp: InputFile, block_size: int = READ_BLOCK) -> pq.ParquetFile:
    try:
        # A buffered stream reads column pages incrementally, so a huge row group
        # never has to be in memory at once (the memory bound is the batch size).
        # An object on object storage is read in place: the footer, then the unit's pages, by ranged reads.
        source = open_input(inp.path, block_size=block_size) if is_remote(inp.path) else inp.path
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
        return cut_units(sizes, input_index=input_index, unit_bytes=unit_bytes, first_index=first_index)

    def iter_batches(
        self, inp: InputFile, unit: WorkUnit, *, text_column: str, batch_rows: int
    ) -> Iterator[pa.Array | pa.ChunkedArray]:
        pf = _open(inp)
        path = column_path(inp, pf.schema_arrow, text_column)
        # A dotted name reads only the struct's text leaf, not its sibling fields.
        columns = [".".join(path)]
        for batch in pf.iter_batches(batch_size=batch_rows, row_groups=list(range(unit.start, unit.stop)), columns=columns):
            yield select_column(batch, path)

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
