"""Fixtures of the trainer-target tests: the GPT-2-sized vocabulary the uint16 stacks take."""

from __future__ import annotations

from pathlib import Path

import pytest

GPT2_SIZED_RANKS = 50_256


@pytest.fixture(scope="session")
def gpt2_sized(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local ``.tiktoken`` rank file of cl100k's first 50,256 ranks: ``<|endoftext|>`` gets the id 50256."""
    import tiktoken_ext

    full = Path(list(tiktoken_ext.__path__)[0]) / "data" / "cl100k_base.tiktoken"
    path = tmp_path_factory.mktemp("gpt2sized") / "gpt2sized.tiktoken"
    path.write_bytes(b"\n".join(full.read_bytes().splitlines()[:GPT2_SIZED_RANKS]) + b"\n")
    return path
