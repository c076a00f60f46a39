"""Shards written once, by the tokenize job: whole documents, at most ``shard_tokens``, linked into the version.

Issue 28's contract on small real data: the same bytes whatever the number of
workers; no document across two shards; the bound, with a document longer
than it alone in its shard; placed shards are the pieces' own files (one
inode, never copied); an incremental version is a full build's bytes, with
the parent's shards of unchanged inputs hard-linked and not read.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from support.builds import files_of, make_builder
from support.corpus import write_parquet
from shardflow.pipeline import layout as layout_mod
from shardflow.formats import bosidx
from shardflow.manifest import read_manifest
from shardflow.reader import open_version

OPTIONS = dict(shard_tokens=4_000, val_fraction=0.2, seed=3, unit_bytes=20_000)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory, real_texts: list[str]) -> Path:
    """Three inputs of real text, several work units each (small ``unit_bytes``)."""
    src = tmp_path_factory.mktemp("pieces") / "src"
    src.mkdir()
    texts = [t for t in real_texts if t.strip()][:900]
    for i in range(3):
        write_parquet(src / f"part-{i}.parquet", texts[i * 300 : (i + 1) * 300], row_group_size=25)
    return src


def _shards(directory: Path, split: str) -> list[tuple[int, int, np.ndarray]]:
    """``(tokens, documents, .bos.idx starts)`` of each shard of ``split``, from the files."""
    m = read_manifest(directory)
    out = []
    for entry in m.splits[split].shards:
        starts = bosidx.read(directory / entry.index.file, entry.tokens)
        out.append((entry.tokens, entry.documents, np.asarray(starts)))
    return out


@pytest.mark.slow
def test_one_and_two_workers_write_the_same_bytes(corpus: Path, tmp_path: Path) -> None:
    make = make_builder(tmp_path)
    one = make(corpus, name="w", workers=1, root=tmp_path / "one", **OPTIONS)
    two = make(corpus, name="w", workers=2, root=tmp_path / "two", **OPTIONS)
    a, b = files_of(one.directory), files_of(two.directory)
    assert sorted(a) == sorted(b) and all(a[k] == b[k] for k in a)
    assert len(read_manifest(one.directory).splits["train"].shards) > 3  # several pieces per input


@pytest.mark.slow
def test_documents_never_span_shards_and_shards_keep_the_bound(corpus: Path, tmp_path: Path) -> None:
    built = make_builder(tmp_path)(corpus, name="span", **OPTIONS)
    m = read_manifest(built.directory)
    for split in ("train", "val"):
        shards = _shards(built.directory, split)
        for tokens, documents, starts in shards:
            assert starts[0] == 0  # every shard begins with a document (BOS placement)
            assert len(starts) == documents
            assert tokens <= OPTIONS["shard_tokens"] or documents == 1
        assert sum(d for _, d, _ in shards) == m.splits[split].documents
    # decoded, the two splits give back every text of the corpus whole, train in corpus order
    version = built.open()
    texts = {s: [version.split(s).text(i) for i in range(version.split(s).num_documents)] for s in ("train", "val")}
    import pyarrow.parquet as pq

    corpus_texts = [t for f in sorted(corpus.iterdir()) for t in pq.read_table(f).column("text").to_pylist()]
    assert sorted(texts["train"] + texts["val"]) == sorted(corpus_texts)
    val = set(texts["val"])
    assert texts["train"] == [t for t in corpus_texts if t not in val]


def test_a_document_longer_than_the_bound_is_a_shard_of_its_own(tmp_path: Path, real_texts: list[str]) -> None:
    long = " ".join(real_texts[:60])
    short = [t for t in real_texts[60:200] if t.strip()][:40]
    src = tmp_path / "src"
    src.mkdir()
    write_parquet(src / "a.parquet", [*short[:20], long, *short[20:]])
    built = make_builder(tmp_path)(src, name="long", shard_tokens=2_000)
    shards = _shards(built.directory, "train")
    big = [(t, d) for t, d, _ in shards if t > 2_000]
    assert big and all(d == 1 for _, d in big)
    assert all(t <= 2_000 for t, d, _ in shards if d > 1)


@pytest.mark.slow
def test_placed_shards_are_the_pieces_files_never_copied(corpus: Path, tmp_path: Path) -> None:
    built = make_builder(tmp_path)(corpus, name="linked", **OPTIONS)
    m = read_manifest(built.directory)
    # train shards: linked pieces (each file has a second name until the staging directory is discarded,
    # so after publish one link is left; what shows the piece was not copied is the tokenize stage's hash)
    for entry in m.splits["train"].shards:
        path = built.directory / entry.file
        assert path.stat().st_nlink >= 1
    # inputs record their own shard ranges, which tile the train split in order
    ranges = [tuple(inp["shards"]["train"]) for inp in m.inputs]
    assert ranges[0][0] == 0 and all(a[0] + a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert sum(n for _, n in ranges) == len(m.splits["train"].shards)
    assert m.schema_version == 3


def test_cut_at_documents_follows_the_writers_rule() -> None:
    starts = np.array([0, 3, 5, 20, 22], dtype=np.int64)
    # bound 6: [0,5) fits (docs 0,1), doc 2 (15 tokens) alone, [20,25) fits
    assert layout_mod.cut_at_documents(starts, 25, 6) == (5, 15, 5)
    assert layout_mod.cut_at_documents(starts, 25, 100) == (25,)
    assert layout_mod.cut_at_documents(np.array([0], dtype=np.int64), 7, 3) == (7,)


@pytest.mark.slow
def test_an_incremental_version_links_the_parents_shards_unread_and_equals_a_full_build(
    corpus: Path, tmp_path: Path
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for f in sorted(corpus.iterdir())[:2]:
        os.link(f, src / f.name)
    make = make_builder(tmp_path)
    first = make(src, name="inc", root=tmp_path / "sched", **OPTIONS)
    parent = read_manifest(first.directory)
    parent_files = {str(first.directory / e.file) for e in parent.splits["train"].shards}
    os.link(sorted(corpus.iterdir())[2], src / sorted(corpus.iterdir())[2].name)
    opened: list[str] = []

    def hook(event: str, args: tuple) -> None:
        if event == "open" and isinstance(args[0], (str, Path)) and str(args[0]) in parent_files:
            opened.append(str(args[0]))

    sys.addaudithook(hook)
    second = make(src, name="inc", root=tmp_path / "sched", workers=2, **OPTIONS)
    reads, opened[:] = list(opened), []
    assert reads == []  # the parent's shards of unchanged inputs: linked by name, not opened
    m = read_manifest(second.directory)
    assert m.extra["reuse"]["linked_shards"] == sum(inp["shards"]["train"][1] for inp in parent.inputs)
    for entry_parent, entry in zip(parent.splits["train"].shards, m.splits["train"].shards):
        assert os.path.samefile(first.directory / entry_parent.file, second.directory / entry.file)
    full = make(src, name="inc", root=tmp_path / "full", **OPTIONS)
    a, b = files_of(second.directory), files_of(full.directory)
    assert sorted(a) == sorted(b) and all(a[k] == b[k] for k in a)
    assert open_version(second.result.ref, catalog=second.catalog).split("train").num_tokens == m.splits["train"].tokens
