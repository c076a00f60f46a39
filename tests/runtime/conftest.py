"""Fixtures of the runtime tests: built versions in a private catalog, made once per session.

The versions are built from ``tests/assets/sample.parquet`` (61 real documents,
about 148k cl100k tokens) with small shards, so there are many of them.
Synthetic shard directories are written with ``support.shards``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from shardflow.config import BuildConfig
from shardflow.pipeline import build
from support.corpus import small_vocab
from support.paths import SAMPLE


@dataclass(frozen=True)
class RtCatalog:
    """A session catalog: ``ref(name)`` is ``NAME@latest``; ``path`` goes to ``catalog=``."""

    path: Path
    data_root: Path


@pytest.fixture(scope="session")
def cat(tmp_path_factory: pytest.TempPathFactory) -> RtCatalog:
    """Versions: wiki@v1 (BOS, 20k-token shards, train+val), wiki@v2 (30k shards), eos@v1 (EOS placement),
    one@v1 (a single shard), small@v1 (uint16 ids, nanogpt-legacy), npy@v1 (npy format)."""
    base = tmp_path_factory.mktemp("rt-catalog")
    c = RtCatalog(path=base / "manifests", data_root=base / "data")

    def make(name: str, **options: object) -> None:
        config = BuildConfig(name=name, sources=(str(SAMPLE),), **options)  # type: ignore[arg-type]
        build(config, data_root=c.data_root, catalog=c.path)

    make("wiki", shard_tokens=20_000, val_fraction=0.1)
    make("wiki", shard_tokens=30_000, val_fraction=0.1)
    make("eos", shard_tokens=20_000, boundary="eos")
    make("one", shard_tokens=1_000_000)
    make("small", shard_tokens=15_000, tokenizer=str(small_vocab(base)), format="nanogpt-legacy")
    make("npy", shard_tokens=25_000, format="npy")
    return c
