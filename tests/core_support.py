"""Helpers shared by the core tests (imported by name: ``from core_support import ...``).

Kept out of ``conftest.py`` because several conftest modules exist under
tests/ and ``from conftest import`` would pick whichever was imported first.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from shardflow.build import BuildResult, build
from shardflow.config import BuildConfig
from shardflow.manifest import read_manifest
from shardflow.reader import Version, open_version

# The longest test files first. The suite is CPU-bound on 2 cores and xdist hands out whole files
# (``--dist loadfile``, with ``--no-loadscope-reorder`` in pyproject.toml; conftest's hook sorts): started in collection
# order, a 60-200 s file that comes last runs alone while the other worker idles. Serial wall
# seconds per file, measured with ``python -m pytest -q -n 0 --durations=0``; a stale list only
# costs balance, never coverage (every other file follows, in collection order).
LONGEST_FIRST = (
    "tests/test_docs.py",  # 207 s
    "tests/flows/test_dask_cluster.py",  # 67
    "tests/test_object_storage.py",  # 66
    "tests/test_embeddings.py",  # 66
    "tests/test_bucket_build.py",  # 61
    "tests/test_bucket_lifecycle.py",  # 58
    "tests/flows/test_deploy.py",  # 21 serial, 57 beside another worker (it waits on a process worker's polls)
    "tests/test_tokenizer_families.py",  # 44
    "tests/reliability/test_hostile_runtime.py",  # 40
    "tests/flows/test_bucket_build_cluster.py",  # 35
    "tests/flows/test_ops_dask.py",  # 20 serial, 34 beside another worker
    "tests/reliability/test_hostile_memory.py",  # 29
    "tests/targets/test_targets.py",  # 29
    "tests/test_model_tokenizers_e2e.py",  # 27
    "tests/test_push.py",  # 27
    "tests/build/test_embed_parallel.py",  # 23
    "tests/flows/test_build_flow.py",  # 23
    "tests/test_cli.py",  # 22
)

COLLECTED = pytest.StashKey[set]()
"""The files the session collected tests from, before any -k/-m deselection (conftest records them;
``test_collection.py`` reads them)."""

IDLE_SERVER_SERVICES = {
    f"PREFECT_SERVER_SERVICES_{name}_ENABLED": "false"
    for name in ("LATE_RUNS", "FOREMAN", "PAUSE_EXPIRATIONS", "TRIGGERS", "CANCELLATION_CLEANUP", "REPOSSESSOR")
}
"""The environment of a test's ``prefect server start``: its loop services that no test uses, off. Each polls the
database while the server idles (an idle server took about 7% of a core, about half with these off), and the
suite keeps several servers up on its 2 cores."""

TESTS = Path(__file__).resolve().parent
REPO = TESTS.parent
ASSETS = TESTS / "assets"
SAMPLE = ASSETS / "sample.parquet"
SHARED = REPO.parent / "shared"
CORPORA = SHARED / "corpora"
MAKE_CORPUS = SHARED / "tools" / "make_corpus.py"

# The tiny fixed corpus of the golden-bytes tests. Every token of these texts
# has a cl100k id below 5000, so the truncated 5000-rank vocabulary encodes
# them with the same ids: "a b" = [64, 293], "ok" = [564], "The end." = [791, 842, 13].
TINY_TEXTS = ["a b", "ok", "The end."]
TINY_IDS = [[64, 293], [564], [791, 842, 13]]
SMALL_VOCAB_RANKS = 5000
# What a version holds besides its data: the statistics (stats.json, stats.vocab.npy) and the card/ directory.
STATS_AND_CARD = frozenset({"stats.json", "stats.vocab.npy", "card"})


def write_parquet(path: Path, texts: list[Any], *, column: str = "text", row_group_size: int | None = None, **extra: list[Any]) -> Path:
    """A Parquet file with a string ``column`` (and any ``extra`` columns)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    table = pa.table({column: pa.array(texts, type=pa.string()), **extra})
    pq.write_table(table, path, row_group_size=row_group_size)
    return path


@dataclass
class Built:
    """A finished build: its result, where it lives, and the opened version."""

    result: BuildResult
    data_root: Path
    catalog: Path

    @property
    def ref(self) -> str:
        return self.result.ref

    @property
    def directory(self) -> Path:
        return Path(self.result.manifest_path).parent

    def open(self) -> Version:
        return open_version(self.ref, catalog=self.catalog)


BuildFactory = Callable[..., Built]


def make_builder(base: Path) -> BuildFactory:
    """``make(sources, name=..., workers=..., root=..., **BuildConfig options)``: build under ``base`` (or ``root``)."""

    def make(sources: Any, *, name: str = "t", workers: int = 1, root: Path | None = None, **options: Any) -> Built:
        root = base if root is None else root
        if isinstance(sources, (str, Path)):
            sources = (sources,)
        config = BuildConfig(name=name, sources=tuple(str(s) for s in sources), **options)
        data_root, catalog = root / "data", root / "catalog"
        result = build(config, data_root=data_root, catalog=catalog, workers=workers)
        return Built(result=result, data_root=data_root, catalog=catalog)

    return make


# Used by the build stage tests (tests/build/).
def files_of(directory: Path) -> dict[str, bytes]:
    """Every shard and index file of a version directory, by name (the manifest has a timestamp)."""
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))  # the split directories too (manifest schema 2)
        if p.is_file() and p.name != "metadata.yaml" and p.relative_to(directory).parts[0] not in STATS_AND_CARD
    }


def stable_manifest(directory: Path) -> dict:
    """The manifest without what legitimately differs between two builds of the same thing."""
    m = read_manifest(directory).to_dict()
    for key in ("created_at", "dataset_path", "inputs", "tools"):
        m.pop(key)
    m["config"].pop("backend")
    m["config"].pop("unit_bytes")
    m["config"].pop("batch_rows")
    m["config"].pop("batch_bytes")
    m["tokenized_info"].pop("backend")
    return m


OPTIONS = dict(name="det", shard_tokens=30_011, val_fraction=0.2, seed=7)
