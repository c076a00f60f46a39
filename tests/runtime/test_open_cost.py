"""What opening a version costs on the filesystem: a constant, not a call per shard (issue 43).

A version of 2,000 small shards (``support.wide_version``: published, listed by
the catalog, valid), with its shards listed in the manifest's YAML and, as a
second version, in a shard table beside it (schema 4). Every call of
``os.stat``, ``os.lstat``, ``os.path.realpath`` and ``os.open`` on a path
outside the catalog directory is counted (``Path.stat``, ``exists``,
``resolve`` and ``realpath``'s own lstats go through them): opening with
``TokenDataset``, ``StreamingTokenDataset`` and ``open_shards`` makes at most
100, and each shard then mapped (with its index read) at most 4 more. The
security checks still hold lazily: a shard symlinked out of the version is
refused when it is first mapped (tests/reliability/test_trust.py).
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pytest

from support.wide_version import WideVersion, wide_version
from shardflow.manifest import read_manifest
from shardflow.runtime import StreamingTokenDataset, TokenDataset, open_shards

SHARDS = 2_000
OPEN_BUDGET = 100
PER_SHARD = 4


@pytest.fixture(scope="module", params=[False, True], ids=["yaml", "table"])
def wide(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> WideVersion:
    return wide_version(tmp_path_factory.mktemp("wide"), SHARDS, table=request.param)


class PathCalls:
    """Counts the filesystem path calls made while ``counting`` is on, except those on the catalog's own files."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, catalog: Path) -> None:
        self.catalog = os.path.realpath(catalog)
        self.calls: Counter[str] = Counter()
        self.on = False
        for module, name in ((os, "stat"), (os, "lstat"), (os.path, "realpath"), (os, "open")):
            monkeypatch.setattr(module, name, self._wrap(name, getattr(module, name)))

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(path: Any, *args: Any, **kwargs: Any) -> Any:
            if self.on and not self._in_catalog(path):
                self.calls[name] += 1
            return fn(path, *args, **kwargs)

        return counted

    def _in_catalog(self, path: Any) -> bool:
        if isinstance(path, int):  # os.stat(fd): not a path lookup
            return True
        p = os.fspath(path)
        p = p.decode() if isinstance(p, bytes) else p
        return os.path.commonpath([self.catalog, os.path.abspath(p)]) == self.catalog

    def count(self, fn: Callable[[], Any]) -> tuple[int, Any]:
        """(calls ``fn`` made, what it returned)."""
        self.calls.clear()
        self.on = True
        try:
            result = fn()
        finally:
            self.on = False
        return sum(self.calls.values()), result


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch, wide: WideVersion) -> Iterator[PathCalls]:
    yield PathCalls(monkeypatch, wide.catalog)


OPENERS = {
    "TokenDataset": lambda w: TokenDataset(w.ref, catalog=w.catalog, seq_len=16),
    "StreamingTokenDataset": lambda w: StreamingTokenDataset(w.ref, catalog=w.catalog, seq_len=16),
    "open_shards": lambda w: open_shards(w.ref, catalog=w.catalog),
}


def test_the_version_is_wide_published_and_tabled_as_asked(wide):
    manifest = read_manifest(wide.directory)
    assert len(manifest.splits["train"].shards) == SHARDS
    assert (manifest.schema_version, manifest.shard_table is not None) in ((3, False), (4, True))
    assert (wide.directory / "shards.tsv").is_file() == (manifest.shard_table is not None)


@pytest.mark.parametrize("opener", list(OPENERS))
def test_opening_makes_a_constant_number_of_path_calls(wide, calls, opener):
    n, ds = calls.count(lambda: OPENERS[opener](wide))
    assert n <= OPEN_BUDGET, f"{opener} made {n} path calls to open {SHARDS} shards: {dict(calls.calls)}"
    shards = ds if opener == "open_shards" else ds.dataset.shards if opener == "StreamingTokenDataset" else ds.shards
    assert shards.num_shards == SHARDS


def test_each_mapped_shard_costs_at_most_four_more(wide, calls):
    n_open, ds = calls.count(lambda: TokenDataset(wide.ref, catalog=wide.catalog, seq_len=16))
    picked = [0, 1, 7, 500, 1999]
    n_read, items = calls.count(lambda: [ds[int(ds.sample_offsets[k])] for k in picked])
    assert n_open + n_read <= OPEN_BUDGET + PER_SHARD * len(picked), dict(calls.calls)
    assert n_read <= 1 + PER_SHARD * len(picked), dict(calls.calls)  # (+1: the split directory, once)
    for k, item in zip(picked, items):  # each sample is of its shard (ids 100 + k after the BOS)
        assert int(item["input_ids"][1]) == 100 + k
    # The same shards again: mapped already, no call.
    assert calls.count(lambda: [ds[int(ds.sample_offsets[k]) + 1] for k in picked])[0] == 0


def test_a_mapped_shard_and_its_index_cost_at_most_four(wide, calls):
    shards = open_shards(wide.ref, catalog=wide.catalog)
    shards.shard(0)  # the split directory, looked at once
    n, starts = calls.count(lambda: (shards.shard(3), shards.doc_starts(3)))
    assert n <= PER_SHARD, dict(calls.calls)
    np.testing.assert_array_equal(starts[1], [0, 32])
