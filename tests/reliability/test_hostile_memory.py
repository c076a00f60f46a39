"""Hostile inputs meet bounded memory: one huge JSON line, compression bombs, a Parquet page that expands.

A record larger than the batch budget (``--batch-mb``) is a bad record: the
build stops with one message naming the file and the line (or row), or, with
``--on-bad-record skip``, skips and counts it. It is never held whole, decoded
or tokenized: a 200 MB line took 4.86 GB before (most of it tokenizing one
200 MB document), and under ``ulimit -v`` the process died of a Rust
allocation failure with no message. The fast cases use ``--batch-mb 1`` and
a 5 MB record; the 200 MB cases (slow) measure the build's peak RSS in a
subprocess.
"""

from __future__ import annotations

import gzip
import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from support.cli import CliRun, run_main
from support.corpus import small_vocab
from shardflow.manifest import read_manifest
from shardflow.sources import discover_inputs, iter_text_batches, plan_units

NAME = "big"
WORDS = b"hello world "  # words, so that the old reader's tokenizer got through the big record quickly
FIRST, THIRD = "The first document.", "The third document."


def _filler(size: int) -> bytes:
    return (WORDS * (size // len(WORDS) + 1))[:size]


def _write_big_line(out, size: int) -> None:
    """``{"text": "<size bytes of words>"}`` in a few large writes (a 200 MB line in about a second)."""
    out.write(b'{"text": "')
    chunk = _filler(8 << 20)
    left = size
    while left > 0:
        out.write(chunk[: min(left, len(chunk))])
        left -= len(chunk)
    out.write(b'"}')


def big_jsonl(path: Path, size: int) -> Path:
    """Three lines, the second a single record of about ``size`` bytes; ``.gz`` / ``.zst`` compress it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    name = path.name
    if name.endswith(".gz"):
        out = gzip.open(path, "wb", compresslevel=1)
    elif name.endswith(".zst"):
        out = pa.CompressedOutputStream(str(path), "zstd")
    else:
        out = open(path, "wb")
    with out:
        out.write(json.dumps({"text": FIRST}).encode() + b"\n")
        _write_big_line(out, size)
        out.write(b"\n" + json.dumps({"text": THIRD}).encode() + b"\n")
    return path


def parquet_bomb(path: Path, size: int, *, row_group_size: int) -> Path:
    """Three texts, the second of ``size`` bytes: zstd squeezes it a thousandfold and more."""
    path.parent.mkdir(parents=True, exist_ok=True)
    big = pa.array([FIRST.encode(), _filler(size), THIRD.encode()], pa.large_binary()).cast(pa.large_string())
    pq.write_table(pa.table({"text": big}), path, compression="zstd", row_group_size=row_group_size)
    return path


def run_build(tmp_path: Path, source: Path, *flags: str) -> CliRun:
    return run_main("build", str(source), "--name", NAME, "--tokenizer", str(small_vocab(tmp_path / "vocab")),
                    "--no-prefect", "--data-root", str(tmp_path / "data"), "--catalog", str(tmp_path / "catalog"),
                    "--progress", "none", *flags)


def assert_one_error(rc: int, err: str, pattern: str) -> None:
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert err.count("shardflow: error:") == 1, err
    assert "\n" not in err.strip(), err
    assert re.search(pattern, err), f"{pattern!r} not in {err!r}"


def assert_skipped(tmp_path: Path, run: CliRun) -> None:
    rc, _, err = run
    assert rc == 0, err
    totals = read_manifest(tmp_path / "data" / NAME / "v1").totals
    assert totals["bad_records"] == 1 and totals["documents"] == 2, totals


def _refused(source: Path, where: str, size: int) -> str:
    return (re.escape(str(source)) + f" {where}: a record of {size:,} bytes, larger than the batch budget of "
            r"1,048,576 bytes \(--batch-mb 1\); raise --batch-mb above it.*--on-bad-record skip")


FIVE_MB = 5 << 20
LINE = len(b'{"text": "') + FIVE_MB + len(b'"}')  # the big line's bytes


# --- one record over the budget (--batch-mb 1, a 5 MB record) ----------------------------------------------------


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_a_json_line_over_the_budget_fails_naming_the_file_and_line(tmp_path, suffix):
    source = big_jsonl(tmp_path / "in" / f"big{suffix}", FIVE_MB)
    rc, _, err = run_build(tmp_path, source, "--batch-mb", "1")
    assert_one_error(rc, err, _refused(source, "line 2", LINE))
    assert not (tmp_path / "catalog" / f"{NAME}.yaml").exists()
    assert not (tmp_path / "data" / NAME / "v1").exists()


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.gz", ".jsonl.zst"])
def test_a_json_line_over_the_budget_is_skipped_and_counted(tmp_path, suffix):
    source = big_jsonl(tmp_path / "in" / f"big{suffix}", FIVE_MB)
    assert_skipped(tmp_path, run_build(tmp_path, source, "--batch-mb", "1", "--on-bad-record", "skip"))


def test_a_json_line_within_the_budget_is_read(tmp_path):
    source = big_jsonl(tmp_path / "in" / "big.jsonl", FIVE_MB)
    rc, _, err = run_build(tmp_path, source, "--batch-mb", "6")
    assert rc == 0, err
    assert read_manifest(tmp_path / "data" / NAME / "v1").totals["documents"] == 3


def _texts(source: Path, *, batch_bytes: int) -> tuple[list[str], int]:
    """The texts the reader gives, in order, and the bad records it skipped (units of 64 KiB)."""
    inputs = discover_inputs([str(source)])
    texts, bad = [], 0
    for unit in plan_units(inputs, text_column="text", id_column=None, unit_bytes=64 << 10):
        for batch in iter_text_batches(inputs[unit.input], unit, text_column="text", batch_rows=4,
                                       on_bad_record="skip", batch_bytes=batch_bytes):
            texts += batch.texts.to_pylist()
            bad += batch.bad_records
    return texts, bad


def test_lines_around_an_oversized_line_keep_their_numbers(tmp_path):
    # Short lines before and after the long one, cut into units of 64 KiB; the long line spans many
    # 1 MiB blocks, starts mid-block and ends mid-block: the lines after it are read whole, in order.
    path = tmp_path / "in" / "mixed.jsonl"
    path.parent.mkdir()
    before = [json.dumps({"text": f"line {k}"}) for k in range(5000)]
    with open(path, "wb") as out:
        out.write("\n".join(before).encode() + b"\n")
        _write_big_line(out, (3 << 20) + 12345)
        out.write(b"\n" + "\n".join(json.dumps({"text": f"after {k}"}) for k in range(5000)).encode())  # no final newline
    texts, bad = _texts(path, batch_bytes=1 << 20)
    assert bad == 1
    assert texts == [f"line {k}" for k in range(5000)] + [f"after {k}" for k in range(5000)]
    assert _texts(path, batch_bytes=32 << 20) == (texts[:5000] + [_filler((3 << 20) + 12345).decode()] + texts[5000:], 0)


def test_byte_ranges_of_an_object_read_past_an_oversized_line_once(tmp_path):
    # How a JSON Lines object on object storage is read: blind byte ranges, each worker finding its
    # lines (sources/lines.py range_lines). Cuts inside the long line must neither hold it nor lose
    # or repeat a line.
    from shardflow.sources.lines import Oversized, range_lines

    path = tmp_path / "cut.jsonl"
    big = (3 << 20) + 7
    with open(path, "wb") as out:
        out.write(b"a\nbb\n")
        out.write(_filler(big))
        out.write(b"\nccc\nd")
    size = path.stat().st_size
    cuts = [0, 4, 5, 6, 7, 1 << 20, (2 << 20) + 3, size - 5, size - 4, size - 1, size]
    got = []
    with open(path, "rb") as f:
        for start, stop in zip(cuts, cuts[1:]):
            lines, _ = range_lines(f, start, stop, 1 << 20)
            got += [("big", len(x)) if isinstance(x, Oversized) else x for x in lines]
    assert got == [b"a", b"bb", ("big", big), b"ccc", b"d"]


# --- a Parquet page that expands a thousandfold --------------------------------------------------------------------


@pytest.mark.parametrize("row_group_size", [1, 3], ids=["own-row-group", "shared-row-group"])
def test_a_parquet_text_over_the_budget_fails_naming_the_file_and_row(tmp_path, row_group_size):
    source = parquet_bomb(tmp_path / "in" / "bomb.parquet", FIVE_MB, row_group_size=row_group_size)
    assert source.stat().st_size * 1000 < FIVE_MB  # a bomb: it expands more than a thousandfold
    rc, _, err = run_build(tmp_path, source, "--batch-mb", "1")
    assert_one_error(rc, err, re.escape(str(source)) + r" row 1: a record of 5,2\d\d,\d\d\d bytes, larger than the batch budget")
    assert not (tmp_path / "catalog" / f"{NAME}.yaml").exists()


@pytest.mark.parametrize("row_group_size", [1, 3], ids=["own-row-group", "shared-row-group"])
def test_a_parquet_text_over_the_budget_is_skipped_and_counted(tmp_path, row_group_size):
    source = parquet_bomb(tmp_path / "in" / "bomb.parquet", FIVE_MB, row_group_size=row_group_size)
    assert_skipped(tmp_path, run_build(tmp_path, source, "--batch-mb", "1", "--on-bad-record", "skip"))


def test_an_arrow_text_over_the_budget_is_a_bad_record(tmp_path):
    path = tmp_path / "in" / "big.arrow"
    path.parent.mkdir()
    table = pa.table({"text": pa.array([FIRST.encode(), _filler(FIVE_MB), THIRD.encode()]).cast(pa.string())})
    with pa.ipc.new_file(str(path), table.schema) as writer:
        writer.write_table(table)
    texts, bad = _texts(path, batch_bytes=1 << 20)
    assert (texts, bad) == ([FIRST, THIRD], 1)


# --- 200 MB: peak memory of the whole build, in a subprocess ---------------------------------------------------------

_PEAK = textwrap.dedent(
    """
    import json, resource, subprocess, sys
    proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB, the largest waited-for descendant
    print(json.dumps({"rc": proc.returncode, "err": proc.stderr, "peak_kib": peak}))
    """
)

BIG = 200 << 20


def measured_build(tmp_path: Path, source: Path, *flags: str) -> dict:
    args = [sys.executable, "-m", "shardflow", "build", str(source), "--name", NAME,
            "--tokenizer", str(small_vocab(tmp_path / "vocab")), "--no-prefect", "--progress", "none",
            "--data-root", str(tmp_path / "data"), "--catalog", str(tmp_path / "catalog"), *flags]
    proc = subprocess.run([sys.executable, "-c", _PEAK, *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["fail", "skip"])
@pytest.mark.parametrize("kind", ["jsonl", "jsonl.zst", "jsonl.gz", "parquet", "parquet-shared"])
def test_a_200_mb_record_is_refused_or_skipped_under_1_gb(tmp_path, kind, policy):
    if kind.startswith("parquet"):  # the record in a row group of its own (known from the footer), or not
        source = parquet_bomb(tmp_path / "in" / "bomb.parquet", BIG, row_group_size=3 if kind.endswith("shared") else 1)
    else:
        source = big_jsonl(tmp_path / "in" / f"big.{kind}", BIG)
    result = measured_build(tmp_path, source, "--on-bad-record", policy)
    where = "row 1" if kind.startswith("parquet") else "line 2"
    if policy == "fail":
        assert result["rc"] == 2, result["err"][-3000:]
        assert result["err"].count("shardflow: error:") == 1 and "Traceback" not in result["err"], result["err"][-3000:]
        assert re.search(re.escape(str(source)) + f" {where}: a record of 209,7\\d\\d,\\d\\d\\d bytes, larger than the "
                         r"batch budget of 33,554,432 bytes \(--batch-mb 32\)", result["err"]), result["err"][-3000:]
    else:
        assert result["rc"] == 0, result["err"][-3000:]
        totals = read_manifest(tmp_path / "data" / NAME / "v1").totals
        assert totals["bad_records"] == 1 and totals["documents"] == 2, totals
    print(f"{kind} {policy}: peak RSS {result['peak_kib'] / 1024:.0f} MiB")
    assert result["peak_kib"] < 1 << 20, f"peak RSS {result['peak_kib'] / 1024:.0f} MiB"
