"""Sources: Parquet files, directories, globs, Arrow IPC files/streams/Feather, saved HF datasets."""

from __future__ import annotations

import json
import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from support.corpus import write_parquet
from support.paths import SAMPLE
from shardflow.errors import ConfigError, InputError
from shardflow.sources import InputKind, discover_inputs, fingerprint_inputs, iter_text_batches, plan_units, split_scores
from shardflow.sources.base import check_schema, cut_units


def read_all(specs, *, text_column="text", unit_bytes=64 << 20, batch_rows=4096, utf8_errors="replace"):
    """Every kept text with its row number, plus the null/empty/invalid counts, through the public steps."""
    inputs = discover_inputs(specs)
    units = plan_units(inputs, text_column=text_column, id_column=None, unit_bytes=unit_bytes)
    texts, rows = [], []
    counts = dict(nulls=0, empties=0, invalid_utf8=0, skipped_invalid=0)
    for unit in units:
        for batch in iter_text_batches(
            inputs[unit.input], unit, text_column=text_column, batch_rows=batch_rows, utf8_errors=utf8_errors
        ):
            assert len(batch.texts) == len(batch.rows)
            texts += batch.texts.to_pylist()
            rows += [(inputs[unit.input].relname, int(r)) for r in batch.rows]
            for k in counts:
                counts[k] += getattr(batch, k)
    return inputs, units, texts, rows, counts


@pytest.fixture(scope="module")
def table() -> pa.Table:
    return pq.read_table(SAMPLE).slice(0, 12)


def test_parquet_file(sample_texts):
    inputs, units, texts, rows, counts = read_all([str(SAMPLE)])
    assert [i.relname for i in inputs] == ["sample.parquet"]
    assert inputs[0].kind == "parquet" and inputs[0].size == SAMPLE.stat().st_size
    assert texts == sample_texts
    assert [r for _, r in rows] == list(range(len(sample_texts)))
    assert counts == dict(nulls=0, empties=0, invalid_utf8=0, skipped_invalid=0)


def test_units_are_whole_row_groups_and_batches_are_bounded(sample_texts):
    # sample.parquet has 4 row groups; a 1-byte unit target gives one unit per row group.
    inputs, units, texts, rows, _ = read_all([str(SAMPLE)], unit_bytes=1, batch_rows=7)
    assert len(units) == pq.ParquetFile(SAMPLE).metadata.num_row_groups == 4
    assert sum(u.rows for u in units) == len(sample_texts)
    assert [u.first_row for u in units] == list(np.cumsum([0] + [u.rows for u in units[:-1]]))
    assert texts == sample_texts
    assert [r for _, r in rows] == list(range(len(sample_texts)))
    inp = inputs[0]
    for unit in units:
        sizes = [len(b.rows) for b in iter_text_batches(inp, unit, text_column="text", batch_rows=7)]
        assert max(sizes) <= 7


def test_directory_recurses_in_sorted_order_and_skips_hidden(tmp_path, table):
    pq.write_table(table.slice(6), tmp_path / "b.parquet")
    (tmp_path / "sub").mkdir()
    pq.write_table(table.slice(0, 6), tmp_path / "sub" / "a.parquet")
    pq.write_table(table, tmp_path / ".hidden.parquet")
    (tmp_path / "notes.txt").write_text("not an input")
    inputs, _, texts, rows, _ = read_all([str(tmp_path)])
    assert [i.relname for i in inputs] == ["b.parquet", "sub/a.parquet"]
    assert texts == table.slice(6).column("text").to_pylist() + table.slice(0, 6).column("text").to_pylist()
    assert rows[0] == ("b.parquet", 0) and rows[-1] == ("sub/a.parquet", 5)


def test_glob(tmp_path, table):
    for k in range(3):
        pq.write_table(table.slice(4 * k, 4), tmp_path / f"part-{k:02d}.parquet")
    pq.write_table(table, tmp_path / "other.parquet")
    inputs, _, texts, _, _ = read_all([str(tmp_path / "part-*.parquet")])
    assert [i.relname for i in inputs] == ["part-00.parquet", "part-01.parquet", "part-02.parquet"]
    assert texts == table.column("text").to_pylist()
    inputs = discover_inputs([str(tmp_path / "**" / "*.parquet")])
    assert [i.relname for i in inputs] == ["other.parquet", "part-00.parquet", "part-01.parquet", "part-02.parquet"]


def test_arrow_ipc_file_stream_and_feather(tmp_path, table):
    expected = table.column("text").to_pylist()
    batches = table.to_batches(max_chunksize=5)
    with pa.ipc.new_file(tmp_path / "f.arrow", table.schema) as w:
        for b in batches:
            w.write_batch(b)
    with pa.ipc.new_stream(tmp_path / "s.arrow", table.schema) as w:
        for b in batches:
            w.write_batch(b)
    feather.write_feather(table, tmp_path / "t.feather", chunksize=5)  # Feather v2, lz4-compressed
    with pa.ipc.new_stream(tmp_path / "s.ipc", table.schema) as w:
        w.write_table(table)
    kinds = {"f.arrow": "arrow-file", "s.arrow": "arrow-stream", "t.feather": "arrow-file", "s.ipc": "arrow-stream"}
    for name, kind in kinds.items():
        inputs, units, texts, rows, _ = read_all([str(tmp_path / name)], unit_bytes=1, batch_rows=3)
        assert inputs[0].kind == kind, name
        assert texts == expected, name
        assert [r for _, r in rows] == list(range(len(expected))), name
        assert len(units) == 1, name  # one unit of all its record batches, as a copy on object storage


def test_saved_hf_dataset(tmp_path, table):
    import datasets

    ds = datasets.Dataset.from_dict({"id": table.column("id").to_pylist(), "body": table.column("text").to_pylist()})
    ds = ds.select(list(reversed(range(len(ds)))))  # an indices mapping: save_to_disk must materialize it
    ds.save_to_disk(str(tmp_path / "ds"), max_shard_size="20KB")
    state = json.loads((tmp_path / "ds" / "state.json").read_text())
    assert len(state["_data_files"]) > 1
    inputs, _, texts, _, _ = read_all([str(tmp_path / "ds")], text_column="body")
    assert [i.relname for i in inputs] == [f["filename"] for f in state["_data_files"]]
    assert texts == list(reversed(table.column("text").to_pylist()))


def test_dataset_dict_directory_is_refused_with_the_split_to_pass(tmp_path, table):
    import datasets

    dd = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": ["x"]}), "test": datasets.Dataset.from_dict({"text": ["y"]})})
    dd.save_to_disk(str(tmp_path / "dd"))
    with pytest.raises(InputError, match=r"DatasetDict with splits test, train; pass one split's directory"):
        discover_inputs([str(tmp_path / "dd")])


def test_text_column_is_selectable(tmp_path):
    path = write_parquet(tmp_path / "x.parquet", ["ignored 1", "ignored 2"], body=["first", "second"])
    assert read_all([str(path)], text_column="body")[2] == ["first", "second"]


def test_missing_column_lists_the_columns(tmp_path):
    path = write_parquet(tmp_path / "x.parquet", ["a"], column="content", id=["1"])
    with pytest.raises(InputError, match=r"no column 'text'; the columns are content, id\. Pick the text column with --text-column NAME"):
        read_all([str(path)])
    with pytest.raises(InputError, match=r"no id column 'doc_id'; the columns are content, id"):
        plan_units(discover_inputs([str(path)]), text_column="content", id_column="doc_id", unit_bytes=1 << 20)


def test_non_string_text_column_is_refused(tmp_path):
    pq.write_table(pa.table({"text": [1, 2]}), tmp_path / "n.parquet")
    with pytest.raises(InputError, match=r"column 'text' has type int64, not a string type"):
        read_all([str(tmp_path / "n.parquet")])


def test_nulls_and_empties_are_skipped_and_counted(tmp_path):
    path = write_parquet(tmp_path / "x.parquet", ["a", None, "", "b", None, "", "", "c"], row_group_size=3)
    _, _, texts, rows, counts = read_all([str(path)], unit_bytes=1, batch_rows=2)
    assert texts == ["a", "b", "c"]
    assert [r for _, r in rows] == [0, 3, 7]
    assert counts["nulls"] == 2 and counts["empties"] == 3


def test_binary_text_column_invalid_utf8_replace_and_skip(tmp_path):
    values = ["ok".encode(), b"bad \xff byte", None, b"", "caf\u00e9".encode()]
    pq.write_table(pa.table({"text": pa.array(values, type=pa.binary())}), tmp_path / "b.parquet")
    _, _, texts, rows, counts = read_all([str(tmp_path / "b.parquet")])
    assert texts == ["ok", "bad \ufffd byte", "caf\u00e9"]
    assert [r for _, r in rows] == [0, 1, 4]
    assert counts == dict(nulls=1, empties=1, invalid_utf8=1, skipped_invalid=0)
    _, _, texts, rows, counts = read_all([str(tmp_path / "b.parquet")], utf8_errors="skip")
    assert texts == ["ok", "caf\u00e9"]
    assert [r for _, r in rows] == [0, 4]
    assert counts == dict(nulls=1, empties=1, invalid_utf8=1, skipped_invalid=1)


def test_input_errors_name_the_problem(tmp_path):
    with pytest.raises(InputError, match=r"nope\.parquet: no such file or directory"):
        discover_inputs([str(tmp_path / "nope.parquet")])
    with pytest.raises(InputError, match=r"the pattern matches no files"):
        discover_inputs([str(tmp_path / "*.parquet")])
    (tmp_path / "data.csv").write_text("text\nx\n")
    with pytest.raises(InputError, match=r"unsupported file type '\.csv'"):
        discover_inputs([str(tmp_path / "data.csv")])
    (tmp_path / "empty.parquet").write_bytes(b"")
    with pytest.raises(InputError, match=r"empty\.parquet: the file is empty \(0 bytes\)"):
        discover_inputs([str(tmp_path / "empty.parquet")])
    (tmp_path / "empty.parquet").write_bytes(b"PAR1 not really parquet")
    with pytest.raises(InputError, match=r"not a readable Parquet file .*corrupt or truncated"):
        read_all([str(tmp_path / "empty.parquet")])
    (tmp_path / "d").mkdir()
    with pytest.raises(InputError, match=r"the directory has no Parquet, Arrow or JSON Lines files"):
        discover_inputs([str(tmp_path / "d")])


def test_a_broken_link_or_an_unreadable_directory_is_refused_never_skipped(tmp_path, table):
    """Skipping either would publish a version without those inputs (a rebuild after a chmod drops them)."""
    import subprocess
    import sys

    (tmp_path / "c" / "sub").mkdir(parents=True)
    pq.write_table(table, tmp_path / "c" / "a.parquet")
    pq.write_table(table, tmp_path / "c" / "sub" / "s.parquet")
    (tmp_path / "c" / "notes.txt").symlink_to(tmp_path / "gone.txt")  # not an input: ignored, as before
    assert [i.relname for i in discover_inputs([str(tmp_path / "c")])] == ["a.parquet", "sub/s.parquet"]
    (tmp_path / "c" / "b.parquet").symlink_to(tmp_path / "gone.parquet")
    for spec in ("c", "c/*.parquet", "c/**/*.parquet"):
        with pytest.raises(InputError, match=r"b\.parquet: a broken symbolic link \(to .*gone\.parquet\); fix its target or remove it"):
            discover_inputs([str(tmp_path / spec)])
    (tmp_path / "c" / "b.parquet").unlink()
    (tmp_path / "c" / "sub").chmod(0)
    # As root (CI), drop the capabilities that read any directory.
    drop = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
    code = "import sys; from shardflow.sources import discover_inputs; discover_inputs(sys.argv[1:])"
    try:
        for spec in ("c", "c/**/*.parquet"):
            run = subprocess.run([*(drop if os.geteuid() == 0 else []), sys.executable, "-c", code, str(tmp_path / spec)],
                                 capture_output=True, text=True)
            assert run.returncode != 0 and re.search(
                rf"{re.escape(spec)}: cannot list the directory .*sub \(Permission denied\); make it readable, or move "
                "it out of the input directory", run.stderr), run.stderr
    finally:
        (tmp_path / "c" / "sub").chmod(0o755)


def test_truncated_parquet_is_an_input_error(tmp_path):
    data = SAMPLE.read_bytes()
    (tmp_path / "cut.parquet").write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=r"cut\.parquet: not a readable Parquet file .*the file is corrupt or truncated"):
        read_all([str(tmp_path / "cut.parquet")])


def test_clashing_input_names_are_qualified_by_their_directory(tmp_path, table):
    for d in ("a", "b"):
        (tmp_path / d / "sub").mkdir(parents=True)
        pq.write_table(table, tmp_path / d / "sub" / "part.parquet")
    # Without a clash, names are relative to their source, as always.
    assert [i.relname for i in discover_inputs([str(tmp_path / "a")])] == ["sub/part.parquet"]
    # Two directories that both hold sub/part.parquet: each name gets its directory's name.
    both = discover_inputs([str(tmp_path / "a"), str(tmp_path / "b" / "*" / "*.parquet")])
    assert [i.relname for i in both] == ["a/sub/part.parquet", "b/sub/part.parquet"]


def test_fingerprints_are_content_hashes_and_cached(tmp_path, table):
    import hashlib

    path = tmp_path / "x.parquet"
    pq.write_table(table, path)
    cache = tmp_path / "cache"
    (inp,) = fingerprint_inputs(discover_inputs([str(path)]), cache_dir=cache)
    assert inp.sha256 == hashlib.sha256(path.read_bytes()).hexdigest()
    assert (cache / ".fingerprints.json").exists()
    assert fingerprint_inputs(discover_inputs([str(path)]), cache_dir=cache)[0].sha256 == inp.sha256
    pq.write_table(table.slice(1), path)  # changed content, new stat key: rehashed
    assert fingerprint_inputs(discover_inputs([str(path)]), cache_dir=cache)[0].sha256 == hashlib.sha256(path.read_bytes()).hexdigest()


def test_split_scores_depend_only_on_seed_name_and_row():
    rows = np.arange(100, dtype=np.int64)
    a = split_scores("x.parquet", rows, 0)
    assert a.dtype == np.uint64
    assert np.array_equal(a[10:20], split_scores("x.parquet", rows[10:20], 0))
    assert not np.array_equal(a, split_scores("x.parquet", rows, 1))
    assert not np.array_equal(a, split_scores("y.parquet", rows, 0))
    assert len(np.unique(a)) == 100


def test_config_rejects_bad_options():
    from shardflow.config import BuildConfig

    with pytest.raises(ConfigError, match=r"no sources given"):
        BuildConfig(name="x", sources=())
    with pytest.raises(ConfigError, match=r"dataset name 'Bad Name' is not allowed"):
        BuildConfig(name="Bad Name", sources=("a",))
    with pytest.raises(ConfigError, match=r"give val_fraction or val_count, not both"):
        BuildConfig(name="x", sources=("a",), val_fraction=0.1, val_count=3)
    with pytest.raises(ConfigError, match=r"val_fraction=1\.0 must be in \[0, 1\)"):
        BuildConfig(name="x", sources=("a",), val_fraction=1.0)
    with pytest.raises(ConfigError, match=r"unknown shard format 'parquet'; use one of nanogpt, nanogpt-legacy, npy, bin"):
        BuildConfig(name="x", sources=("a",), format="parquet")
    with pytest.raises(ConfigError, match=r"unknown build options: bogus"):
        BuildConfig.from_dict({"name": "x", "sources": ["a"], "bogus": 1})


def test_every_arrow_text_type_is_read(tmp_path):
    # Polars writes Arrow IPC with string views; pandas categoricals become dictionaries.
    texts = ["first", None, "", "caf\u00e9 \U0001f642", "last"]
    columns = {
        "string": pa.array(texts, pa.string()),
        "large_string": pa.array(texts, pa.large_string()),
        "dictionary": pa.array(texts, pa.string()).dictionary_encode(),
        "string_view": pa.array(texts, pa.string_view()),
        "binary_view": pa.array([None if t is None else t.encode() for t in texts], pa.binary_view()),
    }
    table = pa.table(columns)
    with pa.ipc.new_file(tmp_path / "types.arrow", table.schema) as w:
        w.write_table(table)
    for column in columns:
        _, _, got, rows, counts = read_all([str(tmp_path / "types.arrow")], text_column=column)
        assert got == ["first", "caf\u00e9 \U0001f642", "last"], column
        assert [r for _, r in rows] == [0, 3, 4], column
        assert (counts["nulls"], counts["empties"]) == (1, 1), column


# --- The input-kind registry: detection, and a new kind as one module plus one registry line ---


def test_registry_names_are_what_the_manifest_records():
    from shardflow.sources import INPUT_KINDS

    assert list(INPUT_KINDS) == ["parquet", "arrow-file", "arrow-stream", "jsonl"]
    assert all(name == kind.name for name, kind in INPUT_KINDS.items())


def test_registry_detects_parquet_by_suffix_and_arrow_file_or_stream_by_magic(tmp_path, table):
    from shardflow.sources import detect_kind, input_suffixes

    assert input_suffixes() == (
        ".parquet", ".pq", ".arrow", ".feather", ".ipc", ".jsonl", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst"
    )
    for name in ("a.parquet", "b.pq", "C.PARQUET"):
        pq.write_table(table, tmp_path / name)
        assert detect_kind(tmp_path / name) == "parquet", name
    for suffix in (".arrow", ".feather", ".ipc"):
        with pa.ipc.new_file(tmp_path / f"file{suffix}", table.schema) as w:
            w.write_table(table)
        with pa.ipc.new_stream(tmp_path / f"stream{suffix}", table.schema) as w:
            w.write_table(table)
        assert detect_kind(tmp_path / f"file{suffix}") == "arrow-file", suffix
        assert detect_kind(tmp_path / f"stream{suffix}") == "arrow-stream", suffix
    feather.write_feather(table, tmp_path / "v2.feather")
    assert detect_kind(tmp_path / "v2.feather") == "arrow-file"
    (tmp_path / "data.csv").write_text("text\nx\n")
    with pytest.raises(
        InputError,
        match=r"data\.csv: unsupported file type '\.csv'; inputs are Parquet \(\.parquet, \.pq\), Arrow \(\.arrow, \.feather, \.ipc\) "
        r"or JSON Lines \(\.jsonl, \.jsonl\.gz, \.json\.gz, \.jsonl\.zst, \.json\.zst\) files$",
    ):
        detect_kind(tmp_path / "data.csv")


class TextLines(InputKind):
    """A test input kind, written as a new module would be.

    A UTF-8 text file, one document per line; its indivisible pieces are runs of two lines.
    """

    name = "text-lines"
    label = "text lines"
    suffixes = (".txtlines",)
    PIECE = 2

    @staticmethod
    def _lines(inp):
        return open(inp.path, encoding="utf-8").read().split("\n")[:-1]

    def plan_units(self, inp, *, input_index, text_column, id_column, unit_bytes, first_index):
        check_schema(inp, pa.schema([("text", pa.string())]), text_column, id_column)
        lines = self._lines(inp)
        pieces = [lines[k : k + self.PIECE] for k in range(0, len(lines), self.PIECE)]
        sizes = [(len(p), sum(len(x.encode()) for x in p)) for p in pieces]
        return cut_units(sizes, input_index=input_index, unit_bytes=unit_bytes, first_index=first_index)

    def iter_batches(self, inp, unit, *, text_column, batch_rows, batch_bytes=32 << 20):
        lines = self._lines(inp)[unit.start * self.PIECE : unit.stop * self.PIECE]
        for k in range(0, len(lines), batch_rows):
            yield pa.array(lines[k : k + batch_rows], pa.string())


@pytest.fixture
def text_lines_kind(monkeypatch):
    """Register ``TextLines`` the way a new module would be: one entry in ``INPUT_KINDS``."""
    from shardflow.sources import INPUT_KINDS

    kind = TextLines()
    monkeypatch.setitem(INPUT_KINDS, kind.name, kind)
    return kind


def test_a_registered_kind_is_discovered_planned_and_read(tmp_path, table, text_lines_kind):
    lines = ["first doc", "second doc", "", "caf\u00e9 \U0001f642", "fifth"]
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "docs.txtlines").write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    pq.write_table(table.slice(0, 3), tmp_path / "d" / "more.parquet")
    inputs, units, texts, rows, counts = read_all([str(tmp_path / "d")], unit_bytes=1, batch_rows=1)
    assert [(i.relname, i.kind) for i in inputs] == [("docs.txtlines", "text-lines"), ("more.parquet", "parquet")]
    # Pieces of two lines, one per unit at a 1-byte target: lines 0-1, 2-3, 4.
    assert [(u.input, u.start, u.stop, u.first_row, u.rows) for u in units if u.input == 0] == [
        (0, 0, 1, 0, 2),
        (0, 1, 2, 2, 2),
        (0, 2, 3, 4, 1),
    ]
    assert [u.index for u in units] == list(range(len(units)))
    assert texts == [x for x in lines if x] + table.slice(0, 3).column("text").to_pylist()
    assert rows[:4] == [("docs.txtlines", r) for r in (0, 1, 3, 4)]
    assert counts["empties"] == 1
    # The registry's suffixes and families reach the messages, with no code naming the kind.
    (tmp_path / "data.csv").write_text("x")
    jsonl = r"\.jsonl, \.jsonl\.gz, \.json\.gz, \.jsonl\.zst, \.json\.zst"
    listing = rf"Parquet \(\.parquet, \.pq\), Arrow \(\.arrow, \.feather, \.ipc\), JSON Lines \({jsonl}\) or text lines \(\.txtlines\)"
    with pytest.raises(InputError, match=rf"inputs are {listing} files"):
        discover_inputs([str(tmp_path / "data.csv")])
    (tmp_path / "e").mkdir()
    suffixes = rf"\.parquet, \.pq, \.arrow, \.feather, \.ipc, {jsonl}, \.txtlines"
    with pytest.raises(InputError, match=rf"no Parquet, Arrow, JSON Lines or text lines files \({suffixes}\)"):
        discover_inputs([str(tmp_path / "e")])


def test_a_registered_kind_builds_and_round_trips(tmp_path, small_vocab, text_lines_kind):
    from shardflow.pipeline import build
    from shardflow.config import BuildConfig
    from shardflow.reader import open_version

    lines = [f"line {i}: the quick brown fox" for i in range(9)] + ["", "the end"]
    src = tmp_path / "corpus.txtlines"
    src.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    config = BuildConfig(name="lines", sources=(str(src),), tokenizer=str(small_vocab), unit_bytes=1, val_count=2)
    result = build(config, data_root=tmp_path / "data", catalog=tmp_path / "catalog", workers=2)
    version = open_version(result.ref, catalog=tmp_path / "catalog")
    assert [i["kind"] for i in version.manifest.inputs] == ["text-lines"]
    assert version.manifest.totals["empty_texts"] == 1
    got = []
    for name in version.splits:
        split = version.split(name)
        got += [split.text(i) for i in range(split.num_documents)]
    assert sorted(got) == sorted(x for x in lines if x)
    assert version.split("val").num_documents == 2
