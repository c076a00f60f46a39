"""Versions of manifest schema 2 (one directory per split) still open, validate, decode and serve as parents.

``tests/assets/schema2/`` holds ``two@v1`` as published by the code of schema
2, with its catalog, kept byte for byte (a build at commit c304d2d writes the
same files but for its paths, time and build key):
``tests/assets/schema2/make_fixture.py`` made it (``two.parquet``, 48 Tiny
Shakespeare passages, cl100k, ``--val-fraction 0.1 --shard-tokens 2000``).
The code of a later schema must keep reading it as it is.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import yaml
from support.corpus import write_parquet
from support.paths import ASSETS

from shardflow.pipeline import build
from shardflow.catalog import Catalog
from shardflow.config import BuildConfig
from shardflow.cli.commands import main
from shardflow.formats import bosidx
from shardflow.manifest import read_manifest
from shardflow.reader import open_version
from shardflow.runtime import TokenDataset, open_shards
from shardflow.tokenizers import load_tokenizer
from shardflow.validation import validate_dir

FIXTURE = ASSETS / "schema2"
OPTIONS = dict(name="two", val_fraction=0.1, shard_tokens=2000)
BOS = 100257  # cl100k's <|endoftext|>, placed before every document


@pytest.fixture
def two_root(tmp_path: Path) -> Path:
    """A copy of the fixture: ``data/`` and ``catalog/`` holding ``two@v1`` as its publish left them, and ``two.parquet``.

    A copy is a version moved after its publish: its catalog's record of the shard files' inodes no
    longer matches them, so an incremental build does not trust it as a parent without reading it.
    """
    for name in ("data", "catalog"):
        shutil.copytree(FIXTURE / name, tmp_path / name)
    shutil.copy(FIXTURE / "two.parquet", tmp_path / "two.parquet")
    return tmp_path


def as_published_here(root: Path) -> None:
    """Record the copied shard files' size, inode and mtime as its publish would have (``<catalog>/.published/``),
    and the record's SHA-256 in the catalog entry: the version as if published where it lies."""
    cat = Catalog(root / "catalog")
    [entry] = cat.versions("two")
    directory = cat.version_dir(entry)
    stats = {}
    for split in read_manifest(directory).splits.values():
        for shard in split.shards:
            for name in (shard.file, *(f.file for f in shard.files)):
                st = os.lstat(directory / name)
                stats[name] = [st.st_size, st.st_ino, st.st_mtime_ns]
    record = cat.files_record("two", "v1")
    record.write_text(json.dumps({"files": stats}, sort_keys=True))
    catalog_file = root / "catalog" / "two.yaml"
    data = yaml.safe_load(catalog_file.read_text())
    data["versions"][0]["files_sha256"] = hashlib.sha256(record.read_bytes()).hexdigest()
    catalog_file.write_text(yaml.safe_dump(data, sort_keys=False, width=120))


def test_the_fixture_is_a_schema_2_version_in_split_directories():
    m = read_manifest(FIXTURE / "data" / "two" / "v1")
    assert m.schema_version == 2
    assert {split: len(e.shards) for split, e in m.splits.items()} == {"train": 3, "val": 1}
    assert all(s.file.startswith(f"{split}/") for split, e in m.splits.items() for s in e.shards)
    [entry] = Catalog(FIXTURE / "catalog").versions("two")
    assert entry.version == "v1" and not Path(entry.path).is_absolute()  # the tree can be copied anywhere


def test_a_schema_2_version_opens_validates_and_reads(two_root, capsys):
    catalog = two_root / "catalog"
    directory = two_root / "data" / "two" / "v1"
    m = read_manifest(directory)
    report = validate_dir(directory, published=True, catalog=catalog)
    assert (report.shards, report.tokens) == (4, m.totals["tokens"])
    assert main(["validate", "two@v1", "--catalog", str(catalog)]) == 0
    assert f"OK two@v1: 4 shards, {m.totals['tokens']:,} tokens" in capsys.readouterr().out
    open_version("two@v1", catalog=catalog, verify=True)
    # The runtime reads the shard files' tokens, after their 1024-byte nanogpt headers.
    raw = np.concatenate([np.fromfile(directory / s.file, dtype="<u4", offset=1024) for s in m.splits["train"].shards])
    train = open_shards("two@v1", catalog=catalog)
    assert train.read(0, train.num_tokens).tolist() == raw.tolist()
    ds = TokenDataset("two@v1", catalog=catalog, seq_len=64, verify=True)
    assert len(ds) == sum(s.tokens // 65 for s in m.splits["train"].shards)  # windows of 65 tokens, within shards
    for i in (0, len(ds) // 2, len(ds) - 1):
        k, start = ds.locate(i)
        window = raw[int(train.offsets[k]) + start :][:65]
        assert ds[i]["input_ids"].tolist() == window[:-1].tolist() and ds[i]["labels"].tolist() == window[1:].tolist()


def test_a_schema_2_version_decodes_to_its_texts(two_root):
    texts = pq.read_table(two_root / "two.parquet", columns=["text"]).column("text").to_pylist()
    directory = two_root / "data" / "two" / "v1"
    m = read_manifest(directory)
    tok = load_tokenizer("cl100k_base", backend="tiktoken")
    v = open_version("two@v1", catalog=two_root / "catalog")
    decoded = []
    for split, entry in m.splits.items():
        # Straight from the files: each split's tokens end to end, cut at the .bos.idx entries (a document may
        # continue into the next shard), every document one BOS and its text's tokens.
        tokens, starts, offset = [], [], 0
        for s in entry.shards:
            tokens.append(np.fromfile(directory / s.file, dtype="<u4", offset=1024))
            starts += (bosidx.read(directory / s.index.file, s.tokens).astype(np.int64) + offset).tolist()
            offset += s.tokens
        docs = np.split(np.concatenate(tokens), starts[1:])
        assert starts[0] == 0 and all(d[0] == BOS and BOS not in d[1:] for d in docs)
        decoded += [tok.decode(d[1:].tolist()) for d in docs]
        assert [v.split(split).text(i) for i in range(len(docs))] == decoded[-len(docs) :]  # and through the reader
    assert len(texts) == 48 and sorted(decoded) == sorted(texts)


@pytest.mark.slow
@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "copied"])
def test_a_schema_2_parent_serves_an_incremental_build(two_root, tmp_path, in_place, caplog):
    if in_place:
        as_published_here(two_root)
    new = write_parquet(tmp_path / "new.parquet", [f"an added passage number {i}, " * (i + 3) for i in range(12)])
    sources = (str(two_root / "two.parquet"), str(new))
    grown = build(BuildConfig(sources=sources, **OPTIONS), data_root=two_root / "data", catalog=two_root / "catalog")
    assert grown.ref == "two@v2"
    m2 = read_manifest(Path(grown.manifest_path))
    assert m2.parent == "two@v1"
    assert "reuse" not in m2.extra  # a schema-2 version's shards mix inputs: its inputs are tokenized again, once
    if in_place:  # and the build says why in one line
        assert [r.getMessage() for r in caplog.records if "manifest schema 2" in r.getMessage()] == [
            "two@v1 has manifest schema 2, whose shards mix inputs: this build tokenizes its unchanged inputs again, "
            "once; builds after it reuse them"
        ]
    else:  # moved since its publish: not trusted, so tokenized again as well
        assert "not reusing two@v1, tokenizing its inputs again" in caplog.text and "changed since two@v1 was published" in caplog.text
    validate_dir(Path(grown.manifest_path).parent, published=True, catalog=two_root / "catalog")
    # The same tokens as a build of everything from scratch.
    full = build(BuildConfig(sources=sources, **OPTIONS), data_root=tmp_path / "full", catalog=tmp_path / "fullcat")
    for split in m2.splits:
        a = open_shards(grown.ref, catalog=two_root / "catalog", split=split)
        b = open_shards(full.ref, catalog=tmp_path / "fullcat", split=split)
        assert a.read(0, a.num_tokens).tolist() == b.read(0, b.num_tokens).tolist()
