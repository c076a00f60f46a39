"""``stats.vocab.npy`` written input by input (``VocabFileWriter``): np.save's bytes, never held whole.

The expected bytes are numpy's own (``np.save`` of the concatenated rows);
a whole build's file is checked against counts taken from its shards in
``tests/test_stats.py``.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

import numpy as np
import pytest

from shardflow.pipeline.collect_stats import VocabFileWriter
from shardflow.stats import VOCAB_DTYPE


def _rows(input_index: int, ids: list[int]) -> np.ndarray:
    rows = np.zeros(len(ids), dtype=VOCAB_DTYPE)
    rows["input"], rows["id"], rows["count"] = input_index, ids, [7 * k + 1 for k in ids]
    return rows


def _np_save(rows: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, rows)
    return buf.getvalue()


@pytest.mark.parametrize("sizes", [[], [0], [1], [3, 0, 5], [9, 1], [100, 1000, 3]])
def test_rows_appended_input_by_input_give_np_saves_bytes_and_their_hash(tmp_path: Path, sizes: list[int]):
    # Row counts of 0 to 4 digits: the header (written last) has the same length for all of them.
    parts = [_rows(i, list(range(2, 2 + 3 * n, 3))) for i, n in enumerate(sizes)]
    path = tmp_path / "stats.vocab.npy"
    with VocabFileWriter(path) as w:
        for rows in parts:
            w.append(rows)
        entry = w.commit()
    expected = _np_save(np.concatenate(parts) if parts else np.empty(0, dtype=VOCAB_DTYPE))
    assert path.read_bytes() == expected
    assert entry == {"file": "stats.vocab.npy", "bytes": len(expected), "sha256": hashlib.sha256(expected).hexdigest()}
    assert [p.name for p in tmp_path.iterdir()] == ["stats.vocab.npy"]  # no temporary file left
    assert np.array_equal(np.load(path), np.concatenate(parts) if parts else np.empty(0, dtype=VOCAB_DTYPE))


def test_the_npy_header_has_one_length_for_every_possible_row_count():
    # What lets the header be written last, in place: numpy pads the shape to 21 digits, so every
    # count up to 2**63 - 1 (the most rows a file can have) gives as many bytes as 0 rows.
    def header(n: int) -> bytes:
        buf = io.BytesIO()
        np.lib.format.write_array_header_1_0(
            buf, {"descr": np.lib.format.dtype_to_descr(VOCAB_DTYPE), "fortran_order": False, "shape": (n,)}
        )
        return buf.getvalue()

    lengths = {len(header(10**k - 1)) for k in range(1, 19)} | {len(header(0)), len(header(2**63 - 1))}
    assert lengths == {len(header(0))}
    # ... and it is np.save's header (format 1.0) for the same count.
    assert _np_save(_rows(0, [1, 2, 3]))[: len(header(3))] == header(3)


def test_a_write_that_fails_leaves_neither_the_file_nor_its_temporary(tmp_path: Path):
    path = tmp_path / "stats.vocab.npy"
    with pytest.raises(RuntimeError, match="the merge failed"):
        with VocabFileWriter(path) as w:
            w.append(_rows(0, [1, 2]))
            raise RuntimeError("the merge failed")
    assert list(tmp_path.iterdir()) == []
