"""Work units from the input file and the unit size alone (``shardflow.sources.cuts``).

What must hold: an input is cut into the same units whether it is planned
alone, among other inputs, or as the file added to an incremental build (the
planner once cut finer when few units were left, so the cut of a file depended
on the others and on what a parent held); the unit size is part of the build
key; a last unit under a quarter of the unit size joins the unit before it
(Parquet row groups, Arrow record batches, JSON Lines byte ranges); and a
local JSON Lines file holds the same lines per unit as the same bytes on
object storage, which is cut blind at the multiples of the unit size.

The big input is a 20 MB real-text corpus (``make_corpus.py``), as Parquet,
Arrow and JSON Lines: more than the 16 MiB under which the old rule never cut,
less than the default unit, so at the default it is one unit however it is
planned.
"""

from __future__ import annotations

import bisect
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.corpus import write_parquet
from support.paths import MAKE_CORPUS, SAMPLE
from shardflow.pipeline import build, plan_build
from shardflow.config import BuildConfig
from shardflow.sources import discover_inputs, plan_units
from shardflow.sources.cuts import byte_offsets

NAME = "units"
OPTIONS: dict[str, Any] = dict(val_fraction=0.1, seed=3)
DEFAULT_UNIT = BuildConfig(name=NAME, sources=(str(SAMPLE),)).unit_bytes
BIG = {"parquet": "part-99999-big.parquet", "arrow": "part-99999-big.arrow", "jsonl": "part-99999-big.jsonl"}


def _make_corpus(out: Path, mb: float, files: int, seed: int) -> list[Path]:
    if not MAKE_CORPUS.exists():
        pytest.skip(f"{MAKE_CORPUS} is not available")
    subprocess.run(
        [sys.executable, str(MAKE_CORPUS), str(out), "--mb", str(mb), "--files", str(files), "--seed", str(seed)],
        check=True, capture_output=True,
    )
    return sorted(out.glob("*.parquet"))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Two small Parquet files (``small``), and the big file as each kind, each alone in a directory."""
    base = tmp_path_factory.mktemp("units")
    _make_corpus(base / "small", mb=0.3, files=2, seed=0)
    (big,) = _make_corpus(base / "made", mb=20, files=1, seed=17)
    table = pq.read_table(big, columns=["text", "source"])
    found: dict[str, Path] = {"base": base, "small": base / "small"}
    for kind, name in BIG.items():
        path = base / f"alone-{kind}" / name
        path.parent.mkdir()
        if kind == "parquet":
            shutil.copy(big, path)
        elif kind == "arrow":
            with pa.ipc.new_file(str(path), table.schema) as w:
                w.write_table(table, max_chunksize=1024)
        else:
            with path.open("w", encoding="utf-8") as f:
                for text, source in zip(table.column("text").to_pylist(), table.column("source").to_pylist()):
                    f.write(json.dumps({"text": text, "source": source}) + "\n")
        found[kind] = path
    return found


def _config(sources: Path, unit_bytes: int, **options: Any) -> BuildConfig:
    return BuildConfig(name=NAME, sources=(str(sources),), unit_bytes=unit_bytes, **{**OPTIONS, **options})


def _plan(root: Path, sources: Path, unit_bytes: int, **options: Any):
    return plan_build(_config(sources, unit_bytes, **options), data_root=root / "data", catalog=root / "catalog")


def _cut(plan, input_index: int) -> list[tuple[int, int, int, int, int]]:
    """The units of one input, without their numbers (which count the units of the inputs before)."""
    return [(u.start, u.stop, u.first_row, u.rows, u.text_bytes) for u in plan.units if u.input == input_index]


@pytest.fixture(scope="module")
def parents(corpus, tmp_path_factory):
    """``parents(unit_bytes)``: the root of a published version of the two small files (a parent), built once."""
    made: dict[int, Path] = {}

    def parent(unit_bytes: int) -> Path:
        if unit_bytes not in made:
            root = tmp_path_factory.mktemp("parent")
            build(_config(corpus["small"], unit_bytes), data_root=root / "data", catalog=root / "catalog", workers=2)
            made[unit_bytes] = root
        return made[unit_bytes]

    return parent


# --- the same units, however the input is planned ---


@pytest.mark.slow
@pytest.mark.parametrize("unit_bytes", [DEFAULT_UNIT, 6 << 20], ids=["default", "6MiB"])
@pytest.mark.parametrize("kind", sorted(BIG))
def test_an_input_is_cut_the_same_alone_among_others_and_as_the_file_added_to_an_incremental_build(
    corpus, parents, tmp_path, kind, unit_bytes
):
    big = corpus[kind]
    grown = tmp_path / "grown"
    shutil.copytree(corpus["small"], grown)
    shutil.copy(big, grown / big.name)  # named to sort last: input 2
    alone = _cut(_plan(tmp_path / "alone", big.parent, unit_bytes), 0)
    among = _plan(tmp_path / "among", grown, unit_bytes)
    assert among.reuse is None and {u.input for u in among.units} == {0, 1, 2}
    assert _cut(among, 2) == alone
    added = _plan(parents(unit_bytes), grown, unit_bytes)
    assert added.reuse is not None and sorted(added.reuse.inputs) == [0, 1]
    assert {u.input for u in added.units} == {2} and _cut(added, 2) == alone
    # The file's own cut at this size: one unit under the default (the old rule cut a file this size, when it
    # was alone or the file added, into 16 MiB pieces), several at 6 MiB, covering its rows in order.
    if unit_bytes == DEFAULT_UNIT or kind == "arrow":  # an Arrow input is one unit, as on object storage
        assert len(alone) == 1
    else:
        assert len(alone) >= 3
        assert all(a[1] == b[0] and a[2] + a[3] == b[2] for a, b in zip(alone, alone[1:]))


def test_the_unit_size_is_part_of_the_build_key_and_the_batch_size_is_not(tmp_path):
    default = _plan(tmp_path / "a", SAMPLE, DEFAULT_UNIT)
    finer = _plan(tmp_path / "b", SAMPLE, 1)
    batched = _plan(tmp_path / "c", SAMPLE, DEFAULT_UNIT, batch_rows=5, batch_bytes=1 << 20)
    assert (len(default.units), len(finer.units)) == (1, 4)  # one per row group at 1 byte
    assert finer.build_key != default.build_key
    assert batched.build_key == default.build_key
    assert _config(SAMPLE, 1).key_fields()["unit_bytes"] == 1


# --- a small tail joins the unit before ---


def test_byte_ranges_begin_at_the_multiples_of_the_unit_size_a_small_last_one_joined():
    assert byte_offsets(0, 100) == []
    assert byte_offsets(1, 100) == byte_offsets(100, 100) == [0]
    assert byte_offsets(101, 100) == [0]  # 1 byte after the first range: joined
    assert byte_offsets(124, 100) == [0]
    assert byte_offsets(125, 100) == [0, 100]  # a quarter of the unit: a range of its own
    assert byte_offsets(1024, 100) == [0, 100, 200, 300, 400, 500, 600, 700, 800, 900]
    assert byte_offsets(1025, 100) == [0, 100, 200, 300, 400, 500, 600, 700, 800, 900, 1000]
    assert byte_offsets(5, 1) == [0, 1, 2, 3, 4]


def _pieces(tmp_path: Path, kind: str, texts: list[str], per_piece: int) -> tuple[Path, int]:
    """A file of ``texts`` in row groups / record batches of ``per_piece`` rows, and its last piece's text bytes."""
    if kind == "parquet":
        path = write_parquet(tmp_path / "t.parquet", texts, row_group_size=per_piece)
        md = pq.ParquetFile(path).metadata
        return path, md.row_group(md.num_row_groups - 1).column(0).total_uncompressed_size
    path = tmp_path / "t.arrow"
    table = pa.table({"text": pa.array(texts, type=pa.string())})
    with pa.ipc.new_file(str(path), table.schema) as w:
        w.write_table(table, max_chunksize=per_piece)
    reader = pa.ipc.open_file(pa.memory_map(str(path), "r"))
    return path, reader.get_batch(reader.num_record_batches - 1).column(0).nbytes


def test_an_arrow_file_is_one_unit_whatever_the_unit_size(tmp_path, sample_texts):
    # A local file is cut as its copy on object storage is (planned from its schema alone): one unit.
    path, _ = _pieces(tmp_path, "arrow", sample_texts[:40], 10)
    units = plan_units(discover_inputs([str(path)]), text_column="text", id_column=None, unit_bytes=1)
    assert [(u.start, u.stop, u.first_row, u.rows) for u in units] == [(0, 4, 0, 40)]


@pytest.mark.parametrize("kind", ["parquet"])
def test_a_small_last_row_group_or_record_batch_joins_the_unit_before(tmp_path, sample_texts, kind):
    # Four pieces of 10 real documents, then one of a short one: each piece is bigger than the unit sizes below.
    path, tail = _pieces(tmp_path, kind, sample_texts[:40] + ["a short last document"], 10)
    inputs = discover_inputs([str(path)])

    def cut(unit_bytes: int) -> list[tuple[int, int, int, int]]:
        units = plan_units(inputs, text_column="text", id_column=None, unit_bytes=unit_bytes)
        return [(u.start, u.stop, u.first_row, u.rows) for u in units]

    # The tail is a quarter of the unit: a unit of its own. A byte more of unit, and it joins the one before.
    assert cut(4 * tail) == [(0, 1, 0, 10), (1, 2, 10, 10), (2, 3, 20, 10), (3, 4, 30, 10), (4, 5, 40, 1)]
    assert cut(4 * tail + 1) == [(0, 1, 0, 10), (1, 2, 10, 10), (2, 3, 20, 10), (3, 5, 30, 11)]
    assert cut(1 << 30) == [(0, 5, 0, 41)]


@pytest.mark.parametrize("unit_bytes", [333, 4096, 50_000, "thirds", "thirds+tail", 1 << 30])
def test_a_json_lines_file_holds_the_lines_of_its_byte_ranges_as_the_same_bytes_on_object_storage(
    tmp_path, sample_texts, unit_bytes
):
    fsspec = pytest.importorskip("fsspec")
    # Real documents (some longer than several ranges), a blank line, no newline after the last line.
    records = [json.dumps({"text": t}) for t in sample_texts] + ["", json.dumps({"text": "last, no newline"})]
    data = "\n".join(records).encode()
    if unit_bytes == "thirds":  # three ranges, the last a third
        unit_bytes = -(-len(data) // 3)
    elif unit_bytes == "thirds+tail":  # three ranges and 10 bytes: the 10 bytes join the third
        unit_bytes = (len(data) - 10) // 3
    assert isinstance(unit_bytes, int)
    local = tmp_path / "x.jsonl"
    local.write_bytes(data)
    fs = fsspec.filesystem("memory")
    url = f"memory://shardflow-test-units/{tmp_path.name}/x.jsonl"
    fs.pipe(url, data)
    try:
        (remote,) = discover_inputs([url])
        objects = plan_units([remote], text_column="text", id_column=None, unit_bytes=unit_bytes)
    finally:
        fs.rm(url)
    units = plan_units(discover_inputs([str(local)]), text_column="text", id_column=None, unit_bytes=unit_bytes)
    begins = [0] + [k + 1 for k, byte in enumerate(data[:-1]) if byte == ord("\n")]

    def lines_in(start: int, stop: int) -> list[int]:
        """Where the lines that begin in ``[start, stop)`` begin."""
        return begins[bisect.bisect_left(begins, start) : bisect.bisect_left(begins, stop)]

    offsets = byte_offsets(len(data), unit_bytes)
    # The object: cut blind at the offsets; the local file: at the first line at or after each of them.
    assert [(u.start, u.stop) for u in objects] == list(zip(offsets, offsets[1:] + [len(data)]))
    expected = [lines for u in objects if (lines := lines_in(u.start, u.stop))]
    assert [lines_in(u.start, u.stop) for u in units] == expected
    assert [u.start for u in units] == [lines[0] for lines in expected]
    assert sum(u.rows for u in units) == len(records)
    if unit_bytes == (len(data) - 10) // 3:
        assert len(objects) == 3 and unit_bytes + 10 <= objects[-1].stop - objects[-1].start < unit_bytes + 13
