"""Bad input: each one a single clear message naming the file (and row), a non-zero exit, nothing published.

Every case runs the real command line (``shardflow build ... --no-prefect``,
in-process through ``shardflow.cli.commands.main``) and checks: exit status 2, the last line
of standard error is ``shardflow: error: ...`` with the expected message, no
traceback, and no version in the catalog or the data root.
"""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from support.cli import CliRun, run_main
from support.corpus import small_vocab
from support.paths import SAMPLE
from shardflow.manifest import read_manifest
from shardflow.reader import open_version
from shardflow.tokenizers import load_tokenizer
from shardflow.validation import validate_dir


def _parquet(path: Path, columns: dict, **kw) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table(columns), path, **kw)
    return path


def run_build(tmp_path: Path, *args: str) -> CliRun:
    return run_main("build", *args, "--no-prefect", "--data-root", str(tmp_path / "data"), "--catalog", str(tmp_path / "catalog"))


def refused(tmp_path: Path, pattern: str, *args: str, name: str = "bad") -> str:
    rc, _, err = run_build(tmp_path, *args, "--name", name)
    last = err.strip().splitlines()[-1] if err.strip() else ""
    assert rc == 2, err
    assert "Traceback" not in err
    assert last.startswith("shardflow: error: "), err
    assert re.search(pattern, last), f"{pattern!r} not in {last!r}"
    # Nothing published.
    assert not (tmp_path / "catalog" / f"{name}.yaml").exists()
    data = tmp_path / "data" / name
    assert not data.exists() or not [p for p in data.iterdir() if re.fullmatch(r"v\d+", p.name)]
    return last


def test_missing_text_column_lists_the_columns(tmp_path):
    f = _parquet(tmp_path / "in" / "a.parquet", {"body": ["x", "y"], "id": [1, 2]})
    refused(tmp_path, rf"{re.escape(str(f))}: no column 'text'; the columns are body, id\. Pick the text column with --text-column NAME", str(f))


def test_text_column_that_is_not_a_string(tmp_path):
    f = _parquet(tmp_path / "in" / "n.parquet", {"text": [1, 2, 3]})
    refused(tmp_path, rf"{re.escape(str(f))}: column 'text' has type int64, not a string type; pick a string column", str(f))


def test_corrupt_parquet_file(tmp_path):
    f = tmp_path / "in" / "garbage.parquet"
    f.parent.mkdir()
    f.write_bytes(os.urandom(5000))
    refused(tmp_path, rf"{re.escape(str(f))}: not a readable Parquet file \(.*\); the file is corrupt or truncated", str(f))


def test_truncated_parquet_file(tmp_path):
    f = tmp_path / "in" / "cut.parquet"
    f.parent.mkdir()
    f.write_bytes(SAMPLE.read_bytes()[: SAMPLE.stat().st_size // 2])
    refused(tmp_path, rf"{re.escape(str(f))}: not a readable Parquet file .*corrupt or truncated", str(f))


def test_damaged_row_group_is_named_with_its_rows(tmp_path):
    texts = pq.read_table(SAMPLE, columns=["text"])
    f = tmp_path / "in" / "damaged.parquet"
    f.parent.mkdir()
    pq.write_table(texts, f, row_group_size=16, compression="snappy")
    md = pq.ParquetFile(f).metadata
    offset = md.row_group(2).column(0).data_page_offset
    data = bytearray(f.read_bytes())
    for i in range(offset, offset + 200):
        data[i] ^= 0x5A
    f.write_bytes(bytes(data))
    last = refused(tmp_path, rf"{re.escape(str(f))}: reading failed in row group [23] \(rows (32 to 47|48 to 60)\) \(", str(f))
    assert "\n" not in last and "corrupt or truncated" in last


def test_zero_byte_file(tmp_path):
    f = tmp_path / "in" / "empty.parquet"
    f.parent.mkdir()
    f.touch()
    refused(tmp_path, rf"{re.escape(str(f))}: the file is empty \(0 bytes\); remove it or regenerate it", str(f))


def test_zero_byte_file_among_good_ones_is_named(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    shutil.copy(SAMPLE, d / "good.parquet")
    (d / "zero.parquet").touch()
    refused(tmp_path, r"zero\.parquet: the file is empty", str(d))


def test_path_that_does_not_exist(tmp_path):
    missing = tmp_path / "nowhere" / "x.parquet"
    refused(tmp_path, rf"{re.escape(str(missing))}: no such file or directory; check the path", str(missing))


def test_directory_without_matching_files(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    (d / "notes.txt").write_text("hello")
    refused(tmp_path, rf"{re.escape(str(d))}: the directory has no Parquet, Arrow or JSON Lines files", str(d))


def test_glob_without_matches(tmp_path):
    refused(tmp_path, r"\*\.parquet: the pattern matches no files", str(tmp_path / "*.parquet"))


def test_unsupported_file_type(tmp_path):
    f = tmp_path / "in" / "data.csv"
    f.parent.mkdir()
    f.write_text("text\nhello\n")
    refused(tmp_path, rf"{re.escape(str(f))}: unsupported file type '\.csv'", str(f))


def test_corrupt_arrow_file(tmp_path):
    f = tmp_path / "in" / "bad.arrow"
    f.parent.mkdir()
    f.write_bytes(b"ARROW1" + os.urandom(300))
    refused(tmp_path, rf"{re.escape(str(f))}: .*not a readable Arrow IPC file|{re.escape(str(f))}: reading failed", str(f))


def test_empty_corpus(tmp_path):
    f = _parquet(tmp_path / "in" / "none.parquet", {"text": pa.array([], type=pa.string())})
    refused(tmp_path, r"the corpus is empty: .*none\.parquet hold no rows", str(f))


def test_every_text_null_or_empty(tmp_path):
    f = _parquet(tmp_path / "in" / "blank.parquet", {"text": pa.array([None, "", None, ""], type=pa.string())})
    refused(
        tmp_path,
        r"the corpus has no text to tokenize: every one of its 4 rows in column 'text' is null \(2\) or empty \(2\); check --text-column",
        str(f),
    )


def test_two_inputs_that_cannot_be_told_apart(tmp_path):
    # Same file name in two directories of the same name: no name tells them apart.
    a = _parquet(tmp_path / "one" / "data" / "x.parquet", {"text": ["a"]})
    b = _parquet(tmp_path / "two" / "data" / "x.parquet", {"text": ["b"]})
    refused(
        tmp_path,
        rf"{re.escape(str(a))} and {re.escape(str(b))} both get the input name 'data/x\.parquet'; rename one of them",
        str(a),
        str(b),
    )


def test_one_file_given_twice(tmp_path):
    a = _parquet(tmp_path / "in" / "x.parquet", {"text": ["a"]})
    refused(tmp_path, rf"{re.escape(str(a))}: the file is given twice", str(a), str(tmp_path / "in"))


def test_missing_id_column(tmp_path):
    f = _parquet(tmp_path / "in" / "a.parquet", {"text": ["x"]})
    refused(tmp_path, rf"{re.escape(str(f))}: no id column 'doc_id'; the columns are text", str(f), "--id-column", "doc_id")


@pytest.mark.parametrize(
    "args, pattern",
    [
        (["--tokenizer", "no_such_encoding"], r"unknown tokenizer 'no_such_encoding'; use one of .*cl100k_base.* or a path to a \.tiktoken rank file"),
        (["--tokenizer", "/nonexistent/ranks.tiktoken"], r"tokenizer rank file '/nonexistent/ranks\.tiktoken' does not exist"),
        (["--format", "arrow"], r"unknown shard format 'arrow'; use one of nanogpt, nanogpt-legacy, npy, bin"),
        (["--format", "nanogpt-legacy"], r"format 'nanogpt-legacy' stores uint16 tokens only, but this tokenizer needs uint32 .*use --format nanogpt"),
        (["--shard-tokens", "0"], r"--shard-tokens 0 is out of range; a shard holds 1 to 2147483647 tokens"),
        (["--shard-tokens", str(2**31)], r"--shard-tokens 2147483648 is out of range"),
        (["--val-fraction", "1.5"], r"--val-fraction 1\.5 must be in \[0, 1\)"),
        (["--val-fraction", "0.1", "--val-count", "3"], r"give --val-fraction or --val-count, not both"),
        (["--workers", "0"], r"--workers must be at least 1, not 0"),
    ],
    ids=["tokenizer", "rank-file", "format", "legacy-vocab", "shard-0", "shard-2^31", "val-fraction", "val-both", "workers"],
)
def test_configuration_mistakes(tmp_path, args, pattern):
    refused(tmp_path, pattern, str(SAMPLE), *args)


def test_bad_name(tmp_path):
    refused(tmp_path, r"dataset name 'Bad Name' is not allowed", str(SAMPLE), name="Bad Name")


def _binary_corpus(path: Path) -> tuple[Path, list[bytes]]:
    raw = [b"good text", b"bad \xff\xfe bytes", None, b"caf\xc3\xa9 ok", b"\x80lone continuation", b""]
    return _parquet(path, {"text": pa.array(raw, type=pa.binary())}), raw


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["replace", "skip"])
def test_invalid_utf8_in_a_binary_column_follows_the_policy_and_is_counted(tmp_path, policy):
    f, raw = _binary_corpus(tmp_path / "in" / "bin.parquet")
    vocab = small_vocab(tmp_path)
    rc, _, err = run_build(tmp_path, str(f), "--name", "utf", "--utf8-errors", policy, "--tokenizer", str(vocab))
    assert rc == 0, err
    v = open_version("utf@v1", catalog=tmp_path / "catalog")
    t = v.manifest.totals
    assert t["invalid_utf8"] == 2 and t["null_texts"] == 1 and t["empty_texts"] == 1 and t["input_rows"] == 6
    train = v.split("train")
    texts = [train.text(i) for i in range(train.num_documents)]
    if policy == "replace":
        assert t["skipped_invalid_utf8"] == 0
        assert texts == ["good text", "bad \ufffd\ufffd bytes", "caf\u00e9 ok", "\ufffdlone continuation"]
    else:
        assert t["skipped_invalid_utf8"] == 2
        assert texts == ["good text", "caf\u00e9 ok"]
    assert v.manifest.inputs[0]["invalid_utf8"] == 2


def test_a_document_longer_than_a_shard_gets_a_shard_of_its_own(tmp_path):
    from support.builds import build_in

    vocab = small_vocab(tmp_path)
    long_text = " ".join(f"word{i}" for i in range(3000))
    texts = ["short one", long_text, "tail", "end"]
    f = _parquet(tmp_path / "in" / "long.parquet", {"text": texts})
    result = build_in(tmp_path, f, "long", dict(tokenizer=str(vocab), shard_tokens=1000))
    directory = Path(result.manifest_path).parent
    validate_dir(directory)
    m = read_manifest(directory)
    tok = load_tokenizer(str(vocab))
    ids = tok.encode_ordinary(long_text)
    assert len(ids) > 3 * 1000
    sizes = [len(tok.encode_ordinary(t)) + 1 for t in texts]  # each document with its BOS
    assert m.splits["train"].tokens == sum(sizes)
    # Never split: the long document is one shard, alone; the documents before and after it are not
    # packed with it, and the two after it share one shard (it holds at most 1000 tokens).
    shards = m.splits["train"].shards
    assert [(s.tokens, s.documents) for s in shards] == [(sizes[0], 1), (sizes[1], 1), (sizes[2] + sizes[3], 2)]
    train = open_version(directory).split("train")
    assert list(train.shard_starts(1)) == [0] and list(train.shard_starts(2)) == [0, sizes[2]]
    assert np.array_equal(train.shard(1)[1:], np.array(ids, dtype=train.shard(1).dtype))
    assert np.array_equal(train.document(1), np.array(ids, dtype=train.document(1).dtype))
    assert [train.text(i) for i in range(4)] == texts


def test_an_arrow_file_with_a_missing_column(tmp_path):
    f = tmp_path / "in" / "t.arrow"
    f.parent.mkdir()
    feather.write_feather(pa.table({"content": ["a", "b"]}), f)
    refused(tmp_path, rf"{re.escape(str(f))}: no column 'text'; the columns are content", str(f))


@pytest.mark.slow
@pytest.mark.parametrize("no_prefect", [False, True], ids=["prefect-temporary-server", "no-prefect"])
def test_an_input_error_is_printed_once_on_both_paths(tmp_path, no_prefect):
    """The ``shardflow`` command in a subprocess, as a user runs it: a JSON Lines file with a bad line, and a
    --text-column that is not there. Before: on the Prefect path the message came four times (the failed
    task's state, the flow's exception, the flow's state, then the command line's own line)."""
    import subprocess
    import sys

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "hello"}\n{"text": bad\n{"text": "x"}\n')
    cases = [
        ([str(bad)], f"{bad} line 2: not valid JSON"),
        ([str(SAMPLE), "--text-column", "nope"], f"{SAMPLE}: no column 'nope'; the columns are id, text, source"),
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "SHARDFLOW_"))}
    # A new database: its first start migrates it, slower than the default 20 s on a busy machine.
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), SHARDFLOW_REUSE_LOCAL_SERVER="0",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="120")
    for k, (sources, message) in enumerate(cases):
        name = f"bad{k}"
        proc = subprocess.run(
            [sys.executable, "-m", "shardflow", "build", *sources, "--name", name, "--data-root", "data",
             "--catalog", "cat", "--progress", "none", *(["--no-prefect"] if no_prefect else [])],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )
        assert proc.returncode == 2 and proc.stdout == "", proc.stderr[-3000:]
        assert proc.stderr.count(message) == 1, proc.stderr[-3000:]
        assert proc.stderr.rstrip().splitlines()[-1].startswith(f"shardflow: error: {message}")
        assert "Traceback" not in proc.stderr and "ERROR" not in proc.stderr, proc.stderr[-3000:]
        assert not (tmp_path / "cat" / f"{name}.yaml").exists()
