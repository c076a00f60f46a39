"""``shardflow show`` of a version of many shards answers from its manifest and statistics (issue 43, item 5).

A real build cuts 240 short documents into 240 shards of one document each, more than the
``EXACT_LENGTHS_UP_TO`` shards whose every index ``show`` reads. The files ``show`` opens
(an audit hook on the ``open`` event) and stats (``os.stat`` and ``os.lstat`` patched) are
counted: of the split's files, only those of the shards its sample documents come from; in
all, a number that does not grow with the shards (before, ``show`` read every ``.bos.idx``:
240 opens and 480 stats here, and it read the manifest twice). Its length section, from
the statistics, gives what every index gives (octave counts, extremes, mean) and bounds the
median. From a bucket, only the sample shards and their indexes are fetched.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from support.cli import run_main
from support.corpus import write_parquet

from shardflow.config import BuildConfig
from shardflow.pipeline import build
from shardflow.runtime import open_shards
from shardflow.runtime.inspect import EXACT_LENGTHS_UP_TO, length_histogram

pytestmark = pytest.mark.slow  # the build of 240 shards takes several seconds

SHARDS = 240
_WORDS = "the quick brown fox jumps over a lazy dog".split()

_opened: list[list[str]] = []  # the paths opened inside the counting blocks in progress
_hooked: list[bool] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event == "open" and _opened and isinstance(args[0], (str, bytes, os.PathLike)):
        for seen in _opened:
            seen.append(os.fsdecode(args[0]))


@contextmanager
def touched(root: Path) -> Iterator[tuple[list[str], list[str]]]:
    """``(opened, statted)``: the paths under ``root`` opened, and given to ``os.stat``/``os.lstat``, in the block."""
    if not _hooked:  # an audit hook cannot be removed: one for the process, idle outside these blocks
        sys.addaudithook(_audit)
        _hooked.append(True)
    opened: list[str] = []
    statted: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        for name in ("stat", "lstat"):
            real = getattr(os, name)

            def counting(path: Any, *args: Any, _real: Any = real, **kwargs: Any) -> Any:
                if isinstance(path, (str, bytes, os.PathLike)):
                    statted.append(os.fsdecode(path))
                return _real(path, *args, **kwargs)

            patch.setattr(os, name, counting)
        _opened.append(opened)
        try:
            yield opened, statted
        finally:
            _opened.remove(opened)
    under = str(root) + os.sep
    opened[:] = [p for p in opened if p.startswith(under)]
    statted[:] = [p for p in statted if p.startswith(under)]


@pytest.fixture(scope="module")
def many(tmp_path_factory: pytest.TempPathFactory, small_vocab: Path) -> Path:
    """``many@v1`` under ROOT/data and ROOT/catalog: 240 shards of one document each, of 10 to 523 tokens."""
    root = tmp_path_factory.mktemp("show-scale")
    texts = [f"Document {i}: " + " ".join(_WORDS[j % 9] for j in range(3 * (1 + (i * 37) % 97))) for i in range(SHARDS)]
    source = write_parquet(root / "many.parquet", texts)
    # A shard ends with the document that reaches shard_tokens: 8 tokens make one shard per document.
    build(BuildConfig(name="many", sources=(str(source),), tokenizer=str(small_vocab), shard_tokens=8, val_fraction=0.0),
          data_root=root / "data", catalog=root / "catalog", workers=2)
    return root


def _shard_numbers(paths: list[str]) -> set[int]:
    return {int(m.group(1)) for p in paths if (m := re.search(r"/train/many_train_(\d+)\.", p))}


def test_show_of_many_shards_touches_only_the_sample_shards(many: Path) -> None:
    assert SHARDS > EXACT_LENGTHS_UP_TO
    catalog = str(many / "catalog")
    for samples, shards_read in ((0, set()), (2, {0, 1, SHARDS - 1})):
        with touched(many) as (opened, statted):
            run = run_main("show", "many@v1", "--samples", str(samples), "--catalog", catalog)
        assert run.status == 0, run.err
        assert f"Tokens per shard ({SHARDS} shards)" in run.out
        # Documents 0 and 239: the shards they are in; and shard 1, whose first document start ends document 0.
        assert _shard_numbers(opened) == _shard_numbers(statted) == shards_read, (opened, statted)
        # Everything else: the catalog's files, the manifest, the statistics, the tokenizer, the card, the pin.
        assert len(opened) <= 30 and len(statted) <= 120, (len(opened), len(statted))
    assert "--- document 0: " in run.out and f"--- document {SHARDS - 1}: " in run.out


def test_the_length_section_from_the_statistics_is_what_every_index_gives(many: Path) -> None:
    run = run_main("show", "many@v1", "--catalog", str(many / "catalog"))
    assert run.status == 0, run.err
    shards = open_shards(many / "data" / "many" / "v1", split="train")
    starts = shards.all_doc_starts()
    lengths = np.diff(np.append(starts, shards.num_tokens))
    lines = run.out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("Document lengths in tokens"))
    head = re.fullmatch(r"Document lengths in tokens \(boundary token included\): min ([\d,]+), median ([\d,]+)-([\d,]+), "
                        r"mean ([\d,]+), max ([\d,]+) \(from the statistics: the median to a quarter octave\)", lines[at])
    assert head, lines[at]
    low, median_low, median_high, mean, high = (int(g.replace(",", "")) for g in head.groups())
    assert (low, mean, high) == (lengths.min(), int(lengths.mean()), lengths.max())
    assert median_low <= np.median(lengths) <= median_high
    rows = length_histogram(lengths)  # the histogram show printed when it read every index
    assert lines[at + 1 : at + 1 + len(rows)] == rows and lines[at + 1 + len(rows)] == ""
    assert run.out.count("Document lengths in tokens") == 1 and "p50 <=" not in run.out


def test_show_of_many_shards_without_statistics_says_why_it_gives_no_lengths(many: Path) -> None:
    """A version built with --no-stats has its lengths only in every document index: not read, and said so."""
    from shardflow.runtime.inspect import split_report
    from shardflow.reader import open_version

    version = open_version("many@v1", catalog=many / "catalog")
    report = split_report(version.split("train").shards, version.manifest.splits["train"], split="train", samples=1)
    assert "Document lengths in tokens" not in report
    assert f"Document lengths: not shown (many@v1 has no statistics of split 'train', and reading the document index " \
           f"of each of its {SHARDS} shards is what show avoids)" in report


def test_show_of_many_shards_on_a_bucket_fetches_only_the_sample_shards(
        many: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    pytest.importorskip("s3fs", reason="object storage needs the optional extra: pip install 'shardflow[s3]'")
    pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")
    from support.s3 import S3Server, environment, new_bucket

    from shardflow.bucket.push import push_version

    server = S3Server()
    try:
        with environment(server.env):
            bucket = new_bucket(server, "show")
            push_version("many@v1", catalog=many / "catalog", data_root_url=f"s3://{bucket}/data",
                         catalog_url=f"s3://{bucket}/catalog")
            monkeypatch.setenv("SHARDFLOW_CACHE", str(tmp_path / "cache"))
            run = run_main("show", "many@v1", "--catalog", f"s3://{bucket}/catalog")
    finally:
        server.stop()
    assert run.status == 0, run.err
    want = run_main("show", "many@v1", "--catalog", str(many / "catalog"))
    url, local = f"s3://{bucket}/data/many/v1", str(many / "data" / "many" / "v1")
    (directory,) = [p.parent for p in (tmp_path / "cache").rglob("metadata.yaml")]
    assert run.out.replace(url, local).replace(str(directory), local) == want.out
    fetched = [str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and not p.name.startswith(".")]
    assert _shard_numbers([f"/{f}" for f in fetched]) == {0, 1, SHARDS - 1}, fetched
