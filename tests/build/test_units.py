"""Work units cut finer when few are left to do (``shardflow.build.units``), and the output unchanged by it.

A 4 MB real-text Parquet file (``make_corpus.py``, row groups of 64 rows,
about 0.25 MB of text each) is one unit at the default size; beside two small
files it is cut into units of about the floor (several row groups each). The
floor is lowered to 1 MiB for these builds (``small_floor``: the real 16 MiB
would need a corpus four times this size for the same cut; the rule and every
code path are the same). What must hold: such a build publishes the bytes of
one cut at the default (shards, ``.bos.idx``, the manifest, ``stats.json`` with
its ``--stats-column`` counts), for 1 worker as for 2; an incremental build that
adds the big file plans several units for it and none for the unchanged files;
a build killed after its first unit resumes without tokenizing that unit again.

"Cut at the default" is the same build with the rule turned off
(``MIN_UNITS`` set to 1 for that in-process build): nothing on the data path
is replaced, only the planner's thresholds.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from core_support import MAKE_CORPUS, files_of
from shardflow.build import build, plan_build, units as units_mod
from shardflow.build.units import FLOOR_BYTES, MIN_UNITS, finer_unit_bytes
from shardflow.config import BuildConfig
from shardflow.manifest import read_manifest
from shardflow.sources import INPUT_KINDS, InputFile, WorkUnit

NAME = "fine"
OPTIONS: dict[str, Any] = dict(stats_column="source", val_fraction=0.15, seed=3, shard_tokens=700_000)
# What differs between two builds of the same inputs: when and where, which version, and how tokens were obtained.
VOLATILE = ("created_at", "dataset_path", "version", "parent", "tools", "reuse")


def _corpus(out: Path, mb: float, files: int, seed: int, rows_per_group: int) -> list[Path]:
    if not MAKE_CORPUS.exists():
        pytest.skip(f"{MAKE_CORPUS} is not available")
    subprocess.run(
        [sys.executable, str(MAKE_CORPUS), str(out), "--mb", str(mb), "--files", str(files), "--seed", str(seed),
         "--rows-per-group", str(rows_per_group)],
        check=True, capture_output=True,
    )
    return sorted(out.glob("*.parquet"))


SMALL_FLOOR = 1 << 20


@pytest.fixture(scope="module")
def small_floor():
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(units_mod, "FLOOR_BYTES", SMALL_FLOOR)
        yield SMALL_FLOOR


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Two small files (``src``), and the same plus a 4 MB file named to sort last (``grown``)."""
    base = tmp_path_factory.mktemp("fine-units")
    small = _corpus(base / "small", mb=1.2, files=2, seed=0, rows_per_group=64)
    (big,) = _corpus(base / "big", mb=4, files=1, seed=17, rows_per_group=64)
    src, grown = base / "src", base / "grown"
    for d in (src, grown):
        d.mkdir()
        for f in small:
            shutil.copy(f, d / f.name)
    shutil.copy(big, grown / "part-99999-big.parquet")
    return {"base": base, "src": src, "grown": grown, "big": grown / "part-99999-big.parquet"}


def _build(root: Path, sources: Path, *, workers: int = 2, **kwargs: Any) -> Path:
    config = BuildConfig(name=NAME, sources=(str(sources),), **OPTIONS)
    result = build(config, data_root=root / "data", catalog=root / "catalog", workers=workers, **kwargs)
    return Path(result.manifest_path).parent


def _plan(root: Path, sources: Path):
    config = BuildConfig(name=NAME, sources=(str(sources),), **OPTIONS)
    return plan_build(config, data_root=root / "data", catalog=root / "catalog")


def _stable(directory: Path) -> dict[str, Any]:
    m = read_manifest(directory).to_dict()
    for key in VOLATILE:
        m.pop(key, None)
    # Where the inputs were (an incremental build's source directory is another one); names, sizes, hashes stay.
    m["config"].pop("sources")
    for inp in m["inputs"]:
        inp.pop("path")
    return m


def assert_same_version(a: Path, b: Path) -> None:
    """Every shard and index byte for byte, ``stats.json`` and the manifest (but when, where, which version)."""
    fa, fb = files_of(a), files_of(b)
    assert sorted(fa) == sorted(fb) and len(fa) >= 4
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs between {a} and {b}"
    assert (a / "stats.json").read_bytes() == (b / "stats.json").read_bytes()
    assert (a / "stats.vocab.npy").read_bytes() == (b / "stats.vocab.npy").read_bytes()
    assert _stable(a) == _stable(b)


@pytest.fixture(scope="module")
def default_cut(corpus, small_floor, tmp_path_factory) -> Path:
    """The grown corpus built with the rule off: the big file is one unit."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(units_mod, "MIN_UNITS", 1)
        root = tmp_path_factory.mktemp("default-cut")
        assert len(_plan(root / "p", corpus["grown"]).units) == 3  # one per file
        return _build(root, corpus["grown"])


# --- the rule ---


def _units(*sizes: int) -> list[WorkUnit]:
    return [WorkUnit(index=k, input=k, start=0, stop=1, first_row=0, rows=10, text_bytes=s) for k, s in enumerate(sizes)]


def test_the_rule_cuts_finer_only_when_fewer_than_min_units_are_left_and_never_below_the_floor():
    def finer(units, unit_bytes=64 << 20):
        return finer_unit_bytes(units, unit_bytes, min_units=MIN_UNITS, floor=FLOOR_BYTES)

    assert finer(_units(*[60 << 20] * MIN_UNITS)) is None  # enough units: kept
    assert finer(_units()) is None  # nothing to do
    # A 62 MB file left: cut into units of the floor (62 MB / 8 is below it).
    assert finer(_units(62_000_000)) == FLOOR_BYTES
    # Several big files left, still fewer than MIN_UNITS units: an eighth of the bytes left.
    assert finer(_units(*[60 << 20] * 4)) == (4 * (60 << 20)) // MIN_UNITS
    # A unit size already at or below what the rule would choose is kept (--unit-bytes small on purpose).
    assert finer(_units(100_000_000), FLOOR_BYTES) is None
    assert finer(_units(*[60 << 20] * 7), 50 << 20) is None
    # The bundled sample (0.6 MB) is one unit, and stays one: under the floor.
    assert finer(_units(600_000)) == FLOOR_BYTES > 600_000


def test_compressed_json_lines_and_arrow_objects_are_not_planned_twice():
    def inp(path: str, kind: str) -> InputFile:
        return InputFile(path=path, relname=path.rsplit("/", 1)[-1], kind=kind, size=1)

    assert INPUT_KINDS["jsonl"].divisible(inp("/d/a.jsonl", "jsonl"))
    assert not INPUT_KINDS["jsonl"].divisible(inp("/d/a.jsonl.gz", "jsonl"))
    assert not INPUT_KINDS["jsonl"].divisible(inp("s3://b/a.jsonl.zst", "jsonl"))
    assert INPUT_KINDS["arrow-file"].divisible(inp("/d/a.arrow", "arrow-file"))
    assert not INPUT_KINDS["arrow-stream"].divisible(inp("s3://b/a.arrow", "arrow-stream"))
    assert INPUT_KINDS["parquet"].divisible(inp("/d/a.parquet", "parquet"))


# --- same bytes, however cut ---


@pytest.mark.slow
def test_a_finer_cut_publishes_the_bytes_of_the_default_cut_for_1_or_2_workers(corpus, small_floor, default_cut, tmp_path):
    plan = _plan(tmp_path / "p", corpus["grown"])
    big = [u for u in plan.units if u.input == 2]
    rows = pq.ParquetFile(corpus["big"]).metadata.num_rows
    # The 10 MB file in units of whole row groups, each about the floor, covering its rows in order.
    assert len(big) >= 3 and len(plan.units) == len(big) + 2
    assert [u.first_row for u in big] == [sum(v.rows for v in big[:k]) for k in range(len(big))]
    assert sum(u.rows for u in big) == rows and big[0].start == 0
    assert all(a.stop == b.start for a, b in zip(big, big[1:]))
    assert all(u.text_bytes <= small_floor for u in big)
    one = _build(tmp_path / "w1", corpus["grown"], workers=1)
    two = _build(tmp_path / "w2", corpus["grown"], workers=2)
    assert_same_version(one, default_cut)
    assert_same_version(two, default_cut)


@pytest.mark.slow
def test_the_statistics_of_a_finer_cut_count_each_source_value_at_its_rows(corpus, small_floor, tmp_path):
    """Documents per ``--stats-column`` value of the cut file, counted from the Parquet file itself."""
    version = _build(tmp_path / "b", corpus["grown"])
    stats = json.loads((version / "stats.json").read_text())
    entry = next(e for e in stats["inputs"] if e["relname"] == corpus["big"].name)
    table = pq.read_table(corpus["big"], columns=["text", "source"])
    expected = Counter(s for t, s in zip(table.column("text").to_pylist(), table.column("source").to_pylist()) if t)
    assert {k: v[0] for k, v in entry["by_column"].items()} == dict(expected)
    assert sum(expected.values()) == entry["documents"] == table.num_rows


# --- incremental: the added file cut finer, nothing else planned ---


@pytest.mark.slow
def test_an_incremental_build_cuts_only_the_added_file_into_several_units(corpus, small_floor, default_cut, tmp_path):
    root = tmp_path / "sched"
    src = tmp_path / "src"
    shutil.copytree(corpus["src"], src)
    _build(root, src)
    shutil.copy(corpus["big"], src / corpus["big"].name)
    plan = _plan(root, src)
    assert plan.reuse is not None and sorted(plan.reuse.inputs) == [0, 1]
    assert {u.input for u in plan.units} == {2}
    assert len(plan.units) >= 3 and [u.index for u in plan.units] == list(range(len(plan.units)))
    v2 = _build(root, src)
    assert read_manifest(v2).version == "v2"
    assert_same_version(v2, default_cut)


# --- resume after a kill ---


@pytest.mark.slow
def test_a_build_killed_after_its_first_finer_unit_resumes_without_tokenizing_it_again(
    corpus, small_floor, default_cut, tmp_path, caplog
):
    root = tmp_path / "crash"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDFLOW_")}
    env["SHARDFLOW_FAULT"] = "tokenize-done:1"
    flags = ["--stats-column", "source", "--val-fraction", "0.15", "--seed", "3", "--shard-tokens", "700000"]
    proc = subprocess.run(
        # The command line, with the planner's floor lowered as in this process (see small_floor).
        [sys.executable, "-c", f"import sys; from shardflow.build import units; units.FLOOR_BYTES = {small_floor}; "
         "from shardflow.flows.cli import main; sys.exit(main(sys.argv[1:]))", "build", str(corpus["grown"]), "--name", NAME, "--no-prefect",
         "--data-root", str(root / "data"), "--catalog", str(root / "catalog"), "--workers", "1", *flags],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    (staging,) = [p for p in (root / "data" / NAME / ".staging").iterdir() if p.is_dir()]
    planned = json.loads((staging / "plan.json").read_text())["units"]
    assert len(planned) >= 5  # the two small files and the big one cut finer
    committed = {int(p.stem.split("-")[1]) for p in (staging / "parts").glob("unit-*.json")}
    assert committed == {0}
    with caplog.at_level(logging.INFO, logger="shardflow.build"):
        version = _build(root, corpus["grown"])
    redone = {int(m.group(1)) for line in caplog.messages if (m := re.match(r"tokenized unit (\d+) of", line))}
    assert redone == set(range(1, len(planned)))  # the same plan resumed: unit 0 is not tokenized again
    assert_same_version(version, default_cut)
    assert not (root / "data" / NAME / ".staging").exists() or not any((root / "data" / NAME / ".staging").iterdir())


# --- Arrow IPC: record batches are the pieces ---


@pytest.mark.slow
def test_an_arrow_file_is_cut_at_record_batches_and_publishes_the_default_cuts_bytes(corpus, small_floor, tmp_path):
    import pyarrow as pa

    table = pq.read_table(corpus["big"], columns=["text", "source"])
    path = tmp_path / "corpus" / "big.arrow"
    path.parent.mkdir()
    with pa.ipc.new_file(str(path), table.schema) as w:
        w.write_table(table, max_chunksize=64)
    plan = _plan(tmp_path / "p", path)
    assert len(plan.units) >= 3 and sum(u.rows for u in plan.units) == table.num_rows
    assert all(a.stop == b.start for a, b in zip(plan.units, plan.units[1:]))  # whole record batches, in order
    fine = _build(tmp_path / "fine", path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(units_mod, "MIN_UNITS", 1)
        assert len(_plan(tmp_path / "p1", path).units) == 1
        default = _build(tmp_path / "default", path)
    assert_same_version(fine, default)
