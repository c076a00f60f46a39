"""The inspection report behind ``shardflow show``: decoded documents, length histogram, shard sizes."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from support.paths import SAMPLE
from support.shards import counting_shards, write_shards
from shardflow.reader import open_version
from shardflow.runtime import inspect_version
from shardflow.runtime.inspect import length_histogram


def test_report_of_a_version(cat):
    report = inspect_version("wiki@v1", split="train", samples=3, catalog=cat.path)
    v = open_version("wiki@v1", catalog=cat.path)
    split = v.split("train")
    assert report.startswith("wiki@v1  split 'train'")
    assert "nanogpt, uint32 tokens, tokenizer cl100k_base" in report
    assert "'<|endoftext|>' (id 100257) before each document" in report
    assert f"{split.num_tokens:,} tokens, {split.num_documents} documents, {split.num_shards} shards" in report
    # Decoded text of the first document, as it was in the Parquet file.
    texts = pq.read_table(SAMPLE, columns=["text"]).column("text").to_pylist()
    assert split.text(0) in texts
    first_line = split.text(0).split("\n")[0]
    assert "    <|endoftext|>" + first_line in report
    assert len(re.findall(r"--- document \d", report)) == 3
    # The histogram counts every document once.
    hist = [line for line in report.splitlines() if re.match(r"\s+\[\s*[\d,]+,\s*[\d,]+\)", line)]
    assert sum(int(line.split()[-1].replace(",", "")) for line in hist) == split.num_documents
    # One line per shard with its token count.
    for k, shard in enumerate(split.entry.shards):
        assert re.search(rf"\n\s+{k}\s+{re.escape(Path(shard.file).name)}\s+{shard.tokens:,} tokens\s+{shard.documents} documents start", report)


def test_report_of_the_val_split_and_eos_placement(cat):
    val = inspect_version("wiki@v1", split="val", samples=1, catalog=cat.path)
    assert "split 'val'" in val and "_val_000000.bin" in val
    eos = inspect_version("eos@v1", samples=0, catalog=cat.path)
    assert "after each document" in eos and "--- document" not in eos


def test_report_of_a_plain_directory(tmp_path):
    write_shards(tmp_path, counting_shards([50] * 60), starts=[np.array([0, 20])] * 60)
    report = inspect_version(tmp_path, samples=2)
    assert "tokenizer unknown" in report and "token ids (no tokenizer known)" in report
    assert "... 35 more shards ..." in report  # long shard lists are shortened
    assert "120 documents" in report


def test_histogram_buckets():
    lines = length_histogram(np.array([1, 2, 3, 4, 1000, 1023, 1024]))
    assert lines[0].strip().startswith("[") and lines[0].strip().endswith("1")  # [1, 2): one
    counts = [int(line.split()[-1]) for line in lines]
    assert sum(counts) == 7 and counts[1] == 2 and counts[-1] == 1 and counts[-2] == 2
    assert length_histogram(np.array([], dtype=np.int64)) == ["  (no documents)"]
    with pytest.raises(ValueError, match="samples must be"):
        inspect_version("x", samples=-1)
