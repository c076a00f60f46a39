"""Input files of the tests: Parquet and JSON Lines written here, the sample corpus in parts, generated real
text, and small local vocabularies."""

from __future__ import annotations

import gzip
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from support.paths import MAKE_CORPUS, SAMPLE

# The tiny fixed corpus of the golden-bytes tests. Every token of these texts
# has a cl100k id below 5000, so the truncated 5000-rank vocabulary encodes
# them with the same ids: "a b" = [64, 293], "ok" = [564], "The end." = [791, 842, 13].
TINY_TEXTS = ["a b", "ok", "The end."]
TINY_IDS = [[64, 293], [564], [791, 842, 13]]
SMALL_VOCAB_RANKS = 5000


def write_parquet(path: Path, texts: list[Any], *, column: str = "text", row_group_size: int | None = None, **extra: list[Any]) -> Path:
    """A Parquet file with a string ``column`` (and any ``extra`` columns)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({column: pa.array(texts, type=pa.string()), **extra})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


def write_jsonl(path: Path, records: list[Any], *, newline: str = "\n", trailing: bool = True, bad_line: int | None = None) -> Path:
    """One JSON value per line: a record that is a string is written as it is (a raw line), any other as JSON.

    ``bad_line``: that line becomes an unterminated record. A name ending ``.gz`` or ``.zst`` is compressed so.
    """
    lines = [r if isinstance(r, str) else json.dumps(r, ensure_ascii=False) for r in records]
    if bad_line is not None:
        lines[bad_line] = '{"id": 1, "text": "unterminated'
    data = (newline.join(lines) + (newline if trailing else "")).encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    name = path.name.lower()
    if name.endswith(".gz"):
        path.write_bytes(gzip.compress(data))
    elif name.endswith(".zst"):
        with pa.CompressedOutputStream(str(path), "zstd") as out:
            out.write(data)
    else:
        path.write_bytes(data)
    return path


def text_records(texts: list[str]) -> list[dict[str, Any]]:
    """``{"id": i, "text": t}`` for each text (records for ``write_jsonl``)."""
    return [{"id": i, "text": t} for i, t in enumerate(texts)]


def small_vocab(directory: Path, ranks: int = SMALL_VOCAB_RANKS, name: str = "small5000") -> Path:
    """``directory/NAME.tiktoken``: a rank file of cl100k's first ``ranks`` ranks (``<|endoftext|>`` gets the id
    ``ranks``); by default 5000, so ids fit uint16 and it loads in milliseconds. Written once: kept if there.

    (The subprocess builds of the reliability tests spend most of their time loading the tokenizer; with this
    one a build of the sample corpus takes under a second.)
    """
    import tiktoken_ext

    path = Path(directory) / f"{name}.tiktoken"
    if not path.exists():
        full = Path(list(tiktoken_ext.__path__)[0]) / "data" / "cl100k_base.tiktoken"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\n".join(full.read_bytes().splitlines()[:ranks]) + b"\n")
    return path


def split_sample(directory: Path, sizes: tuple[int, ...] = (15, 15, 15, 16)) -> Path:
    """The sample corpus as ``len(sizes)`` Parquet files ``part0.parquet``... in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    table = pq.read_table(SAMPLE)
    assert sum(sizes) == table.num_rows
    start = 0
    for i, n in enumerate(sizes):
        pq.write_table(table.slice(start, n), directory / f"part{i}.parquet")
        start += n
    return directory


def make_corpus(out: Path, mb: float, files: int, seed: int = 0, rows_per_group: int = 64) -> list[Path]:
    """``make_corpus.py OUT --mb MB --files FILES``: real-text Parquet files, sorted by name."""
    if not MAKE_CORPUS.exists():
        import pytest

        pytest.skip(f"{MAKE_CORPUS} is not available (../shared beside the checkout)")
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, str(MAKE_CORPUS), str(out), "--mb", str(mb), "--files", str(files), "--seed", str(seed),
         "--rows-per-group", str(rows_per_group)],
        check=True,
        capture_output=True,
    )
    return sorted(out.glob("*.parquet"))


def copy_into(files: list[Path], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, directory / f.name)
    return directory
