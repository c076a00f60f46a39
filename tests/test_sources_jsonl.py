"""JSON Lines inputs (plain, .gz, .zst), dotted --text-column (JSON and Parquet/Arrow structs), bad records.

What is compared to what, and why:

- A JSON Lines build and a Parquet build of the same texts are compared with
  ``val_fraction=0``: the held-out split scores hash the input's name
  (``corpus.jsonl`` vs ``corpus.parquet``), so with a validation split the two
  legitimately choose other documents; with none, every shard and index byte
  must be the same when both are one work unit, and the manifests agree on
  every count. A file cut into other units holds the same documents in other
  shards (each unit writes its own, manifest schema 3): its token streams are
  compared.
- One unit against many (``unit_bytes=1``) of the same JSON Lines file is
  compared with ``val_fraction > 0``: a document's identity (its line index)
  must not depend on the cut, and with a validation split every split of a
  file cut into several units is gathered whole (``split_decided_late``), so
  the bytes are identical, validation split included.
- A Parquet struct column read through ``meta.text`` is compared with a flat
  Parquet file of the same name in another directory, validation split included.
"""

from __future__ import annotations

import json
import re
import tracemalloc
from pathlib import Path

import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from support.builds import files_of, make_builder
from support.corpus import write_jsonl, write_parquet
from support.paths import SAMPLE
from support.streams import assert_whole_documents, split_streams
from shardflow.errors import InputError
from shardflow.manifest import read_manifest
from shardflow.sources import discover_inputs, iter_text_batches, plan_units
from shardflow.validation import validate_dir


def read_all(spec, *, text_column="text", unit_bytes=64 << 20, batch_rows=4096, on_bad_record="fail", utf8_errors="replace"):
    inputs = discover_inputs([str(spec)])
    units = plan_units(inputs, text_column=text_column, id_column=None, unit_bytes=unit_bytes)
    texts, rows = [], []
    counts = dict(nulls=0, empties=0, invalid_utf8=0, skipped_invalid=0, bad_records=0)
    for unit in units:
        for batch in iter_text_batches(
            inputs[unit.input], unit, text_column=text_column, batch_rows=batch_rows,
            utf8_errors=utf8_errors, on_bad_record=on_bad_record,
        ):
            texts += batch.texts.to_pylist()
            rows += [int(r) for r in batch.rows]
            for k in counts:
                counts[k] += getattr(batch, k)
    return units, texts, rows, counts


@pytest.fixture(scope="module")
def docs(real_texts) -> list[str]:
    """Real documents (WikiText-2 articles, Tiny Shakespeare speeches): a third of them, for speed."""
    return real_texts[::3]


def run_cli(tmp_path: Path, capsys, *args: str) -> tuple[int, str]:
    from shardflow.cli.commands import main

    rc = main(["build", *args, "--no-prefect", "--data-root", str(tmp_path / "data"), "--catalog", str(tmp_path / "catalog")])
    return rc, capsys.readouterr().err


def refused(tmp_path: Path, capsys, pattern: str, *args: str, name: str = "bad") -> str:
    rc, err = run_cli(tmp_path, capsys, *args, "--name", name)
    lines = err.strip().splitlines()
    assert rc == 2, err
    assert "Traceback" not in err
    assert lines and lines[-1].startswith("shardflow: error: "), err
    assert re.search(pattern, lines[-1]), f"{pattern!r} not in {lines[-1]!r}"
    assert not (tmp_path / "catalog" / f"{name}.yaml").exists()
    data = tmp_path / "data" / name
    assert not data.exists() or not [p for p in data.iterdir() if re.fullmatch(r"v\d+", p.name)]
    return lines[-1]


# --- Same texts, same shards ---


@pytest.mark.parametrize(
    "file_name, column",
    [("corpus.jsonl", "text"), ("corpus.jsonl.gz", "text"), ("corpus.json.zst", "text"), ("corpus.jsonl", "meta.text")],
    ids=["jsonl", "jsonl.gz", "json.zst", "nested"],
)
@pytest.mark.slow
def test_jsonl_gives_the_shards_of_a_parquet_build_of_the_same_texts(tmp_path, docs, file_name, column):
    if column == "meta.text":
        records = [{"id": i, "meta": {"source": "real", "text": t}} for i, t in enumerate(docs)]
    else:
        records = [{"id": i, "text": t, "n": len(t)} for i, t in enumerate(docs)]
    src = write_jsonl(tmp_path / "in" / file_name, records)
    pqt = write_parquet(tmp_path / "in-pq" / "corpus.parquet", docs)
    options = dict(name="same", shard_tokens=60_000, workers=2)
    # One unit each (the default unit size): the same shards, byte for byte.
    a = make_builder(tmp_path / "a")(src, text_column=column, **options)
    b = make_builder(tmp_path / "b")(pqt, **options)
    assert files_of(a.directory) == files_of(b.directory)
    validate_dir(a.directory)
    # Cut into byte ranges (an uncompressed file; a compressed one stays one unit): each unit writes its own
    # shards of whole documents, so the shards differ, and the documents in them, in order, do not.
    units, *_ = read_all(src, text_column=column, unit_bytes=200_000)
    assert (len(units) > 1) == (file_name == "corpus.jsonl"), len(units)
    cut = make_builder(tmp_path / "cut")(src, text_column=column, unit_bytes=200_000, **options)
    assert split_streams(cut.directory) == split_streams(b.directory)
    assert assert_whole_documents(cut.directory) >= len(units)
    uncut = lambda m: {k: v for k, v in m.totals.items() if k not in ("shards", "bytes")}  # noqa: E731
    assert uncut(read_manifest(cut.directory)) == uncut(read_manifest(a.directory))
    ma, mb = read_manifest(a.directory), read_manifest(b.directory)
    assert ma.totals["documents"] == len(docs) and ma.totals["bad_records"] == 0
    assert {k: v for k, v in ma.totals.items() if k != "bad_records"} == mb.totals
    assert ma.inputs[0]["kind"] == "jsonl" and ma.inputs[0]["rows"] == len(docs) and ma.inputs[0]["bad_records"] == 0
    assert ma.content_field == column
    # A Parquet build's manifest does not gain the new key or option.
    assert "bad_records" not in mb.totals and "bad_records" not in mb.inputs[0]
    assert "on_bad_record" not in mb.config


@pytest.mark.slow
def test_one_unit_or_many_give_identical_bytes_with_a_validation_split(tmp_path, docs):
    # Blank lines, CRLF line ends, no newline after the last line: the cuts must still fall between lines.
    records = []
    for i, t in enumerate(docs):
        records.append({"text": t})
        if i % 7 == 3:
            records.append("")
            records.append("  \t")
    src = write_jsonl(tmp_path / "in" / "c.jsonl", records, newline="\r\n", trailing=False)
    units, texts, rows, counts = read_all(src, unit_bytes=1)
    assert len(units) == len(records)  # a 1-byte target: one line per unit
    many = make_builder(tmp_path / "many")(src, name="cut", unit_bytes=1, workers=2, val_fraction=0.2, seed=5, shard_tokens=50_000)
    one = make_builder(tmp_path / "one")(src, name="cut", workers=1, val_fraction=0.2, seed=5, shard_tokens=50_000)
    assert files_of(many.directory) == files_of(one.directory)
    m = read_manifest(one.directory)
    assert m.totals["input_rows"] == len(records) and m.totals["empty_texts"] == len(records) - len(docs)
    assert m.splits["val"].documents > 0
    assert read_manifest(many.directory).build_key != m.build_key  # the same bytes; the unit size is in the key


def test_a_json_lines_input_in_several_units_is_reused_by_the_next_build_as_a_full_build_would(tmp_path, docs):
    """Its splits were decided by the layout (cut in bytes); an added input must not make the next build take
    its train split for placed: that build stopped, calling the parent damaged, every time after."""
    src = tmp_path / "in"
    write_jsonl(src / "big.jsonl", [{"text": t} for t in docs[:40]])
    options = dict(name="cut", unit_bytes=20_000, val_fraction=0.2, seed=5, shard_tokens=50_000)
    assert len(plan_units(discover_inputs([str(src)]), text_column="text", id_column=None, unit_bytes=20_000)) > 1
    make = make_builder(tmp_path / "sched")
    make(src, **options)
    write_jsonl(src / "small.jsonl", [{"text": t[:3000]} for t in docs[40:45]])  # one unit: train is placed
    child = make(src, **options)
    m = read_manifest(child.directory)
    assert child.result.ref == "cut@v2" and m.extra["reuse"]["reused_inputs"] == ["big.jsonl"]
    full = make_builder(tmp_path / "full")(src, **options)
    assert files_of(child.directory) == files_of(full.directory)


@pytest.mark.parametrize("unit_bytes", [1, 5, 333, 4096, 50_000, 1 << 30])
def test_units_are_byte_ranges_of_whole_lines_numbered_by_line(tmp_path, docs, unit_bytes):
    records = [{"text": t} for t in docs[:40]] + ["", {"text": None}, {"text": "last, no newline"}]
    src = write_jsonl(tmp_path / "c.jsonl", records, trailing=False)
    data = src.read_bytes()
    units, texts, rows, counts = read_all(src, unit_bytes=unit_bytes, batch_rows=3)
    assert units[0].start == 0 and units[-1].stop == len(data)
    for u, nxt in zip(units, units[1:]):
        assert u.stop == nxt.start and data[u.stop - 1 : u.stop] == b"\n"
        assert nxt.first_row == u.first_row + u.rows == data[: nxt.start].count(b"\n")
    assert sum(u.rows for u in units) == len(records)
    assert texts == docs[:40] + ["last, no newline"]
    assert rows == list(range(40)) + [42]
    assert (counts["empties"], counts["nulls"], counts["bad_records"]) == (1, 1, 0)


def test_compressed_files_are_one_unit_each(tmp_path, docs):
    for name in ("c.jsonl.gz", "c.jsonl.zst"):
        src = write_jsonl(tmp_path / name, [{"text": t} for t in docs[:30]])
        units, texts, rows, _ = read_all(src, unit_bytes=1, batch_rows=4)
        assert len(units) == 1 and units[0].rows == 30
        assert texts == docs[:30] and rows == list(range(30))


def test_invalid_utf8_and_lone_surrogates_follow_utf8_errors(tmp_path):
    src = tmp_path / "u.jsonl"
    src.write_bytes(b'\xef\xbb\xbf{"text": "ok"}\n{"text": "bad \xff byte"}\n{"text": "lone \\ud800 half"}\n{"text": "caf\\u00e9"}\n')
    _, texts, rows, counts = read_all(src)
    assert texts == ["ok", "bad \ufffd byte", "lone \ufffd\ufffd\ufffd half", "caf\u00e9"]
    assert counts["invalid_utf8"] == 2
    _, texts, rows, counts = read_all(src, utf8_errors="skip")
    assert texts == ["ok", "caf\u00e9"] and rows == [0, 3] and counts["skipped_invalid"] == 2


def test_a_key_with_a_dot_wins_over_the_nested_reading(tmp_path):
    src = write_jsonl(tmp_path / "k.jsonl", [{"meta.text": "flat", "meta": {"text": "nested"}}, {"meta": {"text": "only nested"}}])
    _, texts, _, _ = read_all(src, text_column="meta.text")
    assert texts == ["flat", "only nested"]


# --- Bad records ---


BAD = [
    ('{"text": "fine"}', None),
    ('{"text": "unterminated}', r"line 2: not valid JSON \(Unterminated string starting at: column 10\); fix or remove the line"),
    ('{"body": "no text"}', r"line 3: no field 'text' \(the record has fields body\); pick the text field with --text-column NAME"),
    ('{"text": 42}', r"line 4: field 'text' is a number, not a string"),
    ('["a", "list"]', r"line 5: the record is an array, not a JSON object"),
]


@pytest.mark.parametrize("k", range(1, len(BAD)))
def test_a_bad_record_is_one_error_with_file_and_line(tmp_path, k):
    # k good lines, then the bad one: line k + 1, in a unit of its own (a 1-byte unit target).
    src = write_jsonl(tmp_path / "b.jsonl", [BAD[0][0]] * k + [BAD[k][0], BAD[0][0]])
    pattern = BAD[k][1]
    with pytest.raises(InputError, match=rf"^{re.escape(str(src))} {pattern}.*, or pass --on-bad-record skip to skip and count such records$"):
        read_all(src, unit_bytes=1)


@pytest.mark.slow
def test_bad_records_via_the_cli_fail_with_file_and_line_then_skip_and_count(tmp_path, capsys, small_vocab):
    src = write_jsonl(tmp_path / "in" / "b.jsonl", [r for r, _ in BAD] + ['{"text": "after the bad ones"}', "not json at all"])
    refused(tmp_path, capsys, rf"^shardflow: error: {re.escape(str(src))} line 2: not valid JSON", str(src), "--tokenizer", str(small_vocab))
    rc, err = run_cli(tmp_path, capsys, str(src), "--name", "skip", "--tokenizer", str(small_vocab), "--on-bad-record", "skip")
    assert rc == 0, err
    m = read_manifest(tmp_path / "data" / "skip" / "v1")
    assert m.inputs[0]["bad_records"] == 5 and m.totals["bad_records"] == 5
    assert m.totals["input_rows"] == 7 and m.totals["documents"] == 2
    assert m.config["on_bad_record"] == "skip"


def test_a_missing_field_via_the_cli_names_file_line_and_fields(tmp_path, capsys, small_vocab):
    src = write_jsonl(tmp_path / "in" / "m.jsonl.gz", [{"text": "a"}, {"text": "b"}, {"content": "c", "id": 3}])
    refused(
        tmp_path, capsys,
        rf"{re.escape(str(src))} line 3: no field 'text' \(the record has fields content, id\); pick the text field with --text-column NAME",
        str(src), "--tokenizer", str(small_vocab),
    )


def test_skip_also_applies_to_parquet_builds_and_shows_zero_bad_records(tmp_path):
    built = make_builder(tmp_path)(SAMPLE, name="pq", on_bad_record="skip")
    m = read_manifest(built.directory)
    assert m.totals["bad_records"] == 0 and m.inputs[0]["bad_records"] == 0


@pytest.mark.parametrize("name", ["t.jsonl.gz", "t.jsonl.zst"])
def test_a_truncated_compressed_file_is_one_clear_message(tmp_path, capsys, docs, name, small_vocab):
    full = write_jsonl(tmp_path / "full" / name, [{"text": t} for t in docs[:40]])
    cut = tmp_path / "in" / name
    cut.parent.mkdir()
    cut.write_bytes(full.read_bytes()[: full.stat().st_size // 2])
    pattern = rf"{re.escape(str(cut))}: reading failed near line \d+ \(.*\); the compressed file is corrupt or truncated"
    with pytest.raises(InputError, match=pattern):
        read_all(cut)
    refused(tmp_path, capsys, pattern, str(cut), "--tokenizer", str(small_vocab), "--on-bad-record", "skip")


def test_garbage_named_zst_is_refused(tmp_path, capsys):
    f = tmp_path / "in" / "g.jsonl.zst"
    f.parent.mkdir()
    f.write_bytes(b"not zstandard at all" * 10)
    refused(tmp_path, capsys, rf"{re.escape(str(f))}: reading failed near line 1 \(.*\); the compressed file is corrupt", str(f))


@pytest.mark.parametrize(
    "content, shape",
    [('[{"text": "a"},\n {"text": "b"}]\n', "a JSON array"), ('{\n  "text": "a"\n}\n', "one JSON document over several lines")],
)
def test_a_json_document_is_not_json_lines(tmp_path, content, shape):
    f = tmp_path / "doc.json"
    f.write_text(content)
    with pytest.raises(InputError, match=rf"doc\.json: the file is {shape}, not JSON Lines \(one JSON object per line\); convert it"):
        read_all(f)


def test_plain_json_is_read_when_named_but_not_picked_up_by_a_directory_scan(tmp_path, docs):
    d = tmp_path / "corpus"
    write_parquet(d / "part-0.parquet", docs[:3])
    (d / "dataset_infos.json").write_text('{\n  "default": {"features": {}}\n}\n')  # metadata, as hub snapshots have
    write_jsonl(d / "more.json.gz", [{"text": t} for t in docs[3:5]])
    assert [(i.relname, i.kind) for i in discover_inputs([str(d)])] == [("more.json.gz", "jsonl"), ("part-0.parquet", "parquet")]
    named = write_jsonl(tmp_path / "named" / "docs.json", [{"text": t} for t in docs[:2]])
    assert [i.kind for i in discover_inputs([str(named)])] == ["jsonl"]
    assert [i.kind for i in discover_inputs([str(tmp_path / "named" / "*.json")])] == ["jsonl"]
    assert read_all(named)[1] == docs[:2]


def test_missing_id_field_is_named(tmp_path):
    src = write_jsonl(tmp_path / "i.jsonl", ["", {"text": "a"}])
    inputs = discover_inputs([str(src)])
    with pytest.raises(InputError, match=r"i\.jsonl line 2: no id field 'doc_id'; its fields are text"):
        plan_units(inputs, text_column="text", id_column="doc_id", unit_bytes=1 << 20)


# --- Memory ---


def test_a_50mb_file_is_read_in_batches_bounded_by_the_batch_size(tmp_path, real_texts):
    """50 MB of real text, some lines longer than a read block: the reader's memory follows the batch, not the file."""
    src = tmp_path / "big.jsonl"
    long_doc = "\n\n".join(real_texts[:40])  # about 0.5 MB of text in one line
    n = 0
    with open(src, "w", encoding="utf-8") as f:
        while f.tell() < 50 << 20:
            for t in real_texts:
                f.write(json.dumps({"text": t}) + "\n")
                n += 1
            f.write(json.dumps({"text": long_doc * 4}) + "\n")
            n += 1
    size = src.stat().st_size
    inputs = discover_inputs([str(src)])
    (unit,) = plan_units(inputs, text_column="text", id_column=None, unit_bytes=1 << 40)
    assert unit.rows == n and unit.text_bytes == size
    batch_bytes = 1 << 20
    batch_rows = max(1, batch_bytes * unit.rows // unit.text_bytes)  # as the tokenize stage computes it
    base = pa.total_allocated_bytes()
    tracemalloc.start()
    rows = biggest = arrow_peak = 0
    try:
        for batch in iter_text_batches(inputs[0], unit, text_column="text", batch_rows=batch_rows):
            rows += len(batch.rows)
            biggest = max(biggest, batch.texts.nbytes)
            arrow_peak = max(arrow_peak, pa.total_allocated_bytes() - base)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert rows == n
    # A batch holds about batch_bytes (at least one read block, or one long line), never the file.
    assert biggest < 6 * len(long_doc.encode()) < size // 4
    assert peak < 48 << 20, peak  # Python objects of one batch (the file is 50 MB)
    assert arrow_peak < 16 << 20, arrow_peak  # Arrow buffers held while a batch is in hand


@pytest.mark.slow
def test_a_jsonl_file_builds_with_small_batches(tmp_path, docs, small_vocab):
    src = write_jsonl(tmp_path / "in" / "c.jsonl", [{"text": t} for t in docs])
    # The same units (their boundaries come from the file and unit_bytes alone), read in batches of 4 KiB or of
    # the default size: the same shards.
    units, *_ = read_all(src, unit_bytes=100_000)
    assert len(units) > 1
    small = make_builder(tmp_path / "s")(src, name="b", tokenizer=str(small_vocab), batch_bytes=4096, unit_bytes=100_000)
    big = make_builder(tmp_path / "l")(src, name="b", tokenizer=str(small_vocab), unit_bytes=100_000)
    assert files_of(small.directory) == files_of(big.directory)


# --- Dotted --text-column for Parquet and Arrow struct columns ---


def _struct_table(texts: list[str | None]) -> pa.Table:
    meta = pa.array(
        [None if t is None else {"lang": "en", "text": t} for t in texts],
        type=pa.struct([("lang", pa.string()), ("text", pa.string())]),
    )
    return pa.table({"id": list(range(len(texts))), "meta": meta})


@pytest.mark.slow
def test_parquet_struct_column_with_a_dotted_text_column(tmp_path, docs):
    nested = tmp_path / "nested" / "c.parquet"
    nested.parent.mkdir()
    pq.write_table(_struct_table(docs), nested, row_group_size=20)
    flat = write_parquet(tmp_path / "flat" / "c.parquet", docs, row_group_size=20)
    options = dict(name="dot", shard_tokens=40_000, val_fraction=0.25, seed=1, unit_bytes=100_000, workers=2)
    a = make_builder(tmp_path / "a")(nested, text_column="meta.text", **options)
    b = make_builder(tmp_path / "b")(flat, **options)
    assert files_of(a.directory) == files_of(b.directory)
    assert read_manifest(a.directory).content_field == "meta.text"


def test_struct_nulls_are_null_texts_and_arrow_structs_work_too(tmp_path):
    table = _struct_table(["one", None, "three", ""])
    pq.write_table(table, tmp_path / "n.parquet")
    feather.write_feather(table, tmp_path / "n.arrow")
    for name in ("n.parquet", "n.arrow"):
        _, texts, rows, counts = read_all(tmp_path / name, text_column="meta.text")
        assert texts == ["one", "three"] and rows == [0, 2]
        assert (counts["nulls"], counts["empties"]) == (1, 1), name


def test_dotted_column_errors_name_the_struct_and_its_fields(tmp_path):
    pq.write_table(_struct_table(["a"]), tmp_path / "n.parquet")
    with pytest.raises(InputError, match=r"n\.parquet: column 'meta' has no field 'body'; its fields are lang, text\. Pick"):
        read_all(tmp_path / "n.parquet", text_column="meta.body")
    with pytest.raises(InputError, match=r"n\.parquet: column 'id' has type int64, not a struct, so it has no field 'x'"):
        read_all(tmp_path / "n.parquet", text_column="id.x")
    with pytest.raises(InputError, match=r"n\.parquet: no column 'body\.text'; the columns are id, meta\."):
        read_all(tmp_path / "n.parquet", text_column="body.text")


def test_a_column_named_with_a_dot_wins_over_the_struct(tmp_path):
    table = _struct_table(["nested"]).append_column("meta.text", pa.array(["flat"]))
    pq.write_table(table, tmp_path / "w.parquet")
    _, texts, _, _ = read_all(tmp_path / "w.parquet", text_column="meta.text")
    assert texts == ["flat"]


@pytest.mark.slow
def test_an_incremental_build_reuses_unchanged_jsonl_inputs(tmp_path, docs):
    """A JSON Lines input taken from the parent keeps its counts (bad_records included) and bytes."""
    src = tmp_path / "src"
    write_jsonl(src / "a.jsonl", [{"text": t} for t in docs[:30]] + ["oops"])
    write_jsonl(src / "b.jsonl.gz", [{"text": t} for t in docs[30:60]])
    options = dict(name="inc", shard_tokens=40_000, val_fraction=0.2, seed=2, on_bad_record="skip")
    sched = make_builder(tmp_path / "sched")
    sched(src, **options)
    write_jsonl(src / "c.jsonl.zst", [{"text": t} for t in docs[60:80]])
    v2 = sched(src, **options)
    m = read_manifest(v2.directory)
    assert m.extra["reuse"]["reused_inputs"] == ["a.jsonl", "b.jsonl.gz"]
    assert [i["bad_records"] for i in m.inputs] == [1, 0, 0] and m.totals["bad_records"] == 1
    full = make_builder(tmp_path / "full")(src, **options)
    assert files_of(v2.directory) == files_of(full.directory)
