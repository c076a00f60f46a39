"""Fixtures of the trainer-target tests: the GPT-2-sized vocabulary the uint16 stacks take."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.corpus import small_vocab

GPT2_SIZED_RANKS = 50_256


@pytest.fixture(scope="session")
def gpt2_sized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local ``.tiktoken`` rank file of cl100k's first 50,256 ranks: ``<|endoftext|>`` gets the id 50256."""
    return small_vocab(tmp_path_factory.mktemp("gpt2sized"), GPT2_SIZED_RANKS, name="gpt2sized")
