"""Fixtures of the reliability tests: a sample version published once per module, and a private copy of it per test.

A module that uses them names its dataset in ``NAME``. Helpers are in tests/support.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from support.builds import build_in
from support.corpus import small_vocab
from support.paths import SAMPLE


@pytest.fixture(scope="module")
def published(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A root with ``data/`` and ``catalog/`` holding ``NAME@v1`` (the module's ``NAME``): the sample corpus,
    built with the 5000-rank vocabulary, 60,000-token shards and a 20% held-out split."""
    name = request.module.NAME
    root = tmp_path_factory.mktemp(name)
    vocab = small_vocab(root / "vocab")
    build_in(root, SAMPLE, name, dict(tokenizer=str(vocab), shard_tokens=60_000, val_fraction=0.2, seed=1))
    return root


@pytest.fixture
def root(published: Path, tmp_path: Path) -> Path:
    """A private copy of the published root (the catalog's relative paths still hold)."""
    copy = tmp_path / "root"
    shutil.copytree(published, copy, symlinks=True)
    return copy
