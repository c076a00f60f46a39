"""Fixtures and helpers of the runtime tests: built versions in a private catalog, synthetic shard directories.

This is not a ``conftest.py`` on purpose: other test modules do ``from conftest
import ...``, and a second ``conftest`` module would shadow ``tests/conftest.py``
for the modules collected after this directory. Test modules import the
fixtures from here; the session fixtures cache their result per process, so
the versions are built once however many modules import them.

The versions are built once per session from ``tests/assets/sample.parquet``
(61 real documents, about 148k cl100k tokens) with small shards, so there are
many of them. Synthetic directories are written with the real shard formats
when a test needs exact control over shard sizes and document starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from shardflow.build import build
from shardflow.config import BuildConfig
from shardflow.formats import bosidx, get_format

TESTS = Path(__file__).resolve().parent.parent
SAMPLE = TESTS / "assets" / "sample.parquet"


@dataclass(frozen=True)
class RtCatalog:
    """A session catalog: ``ref(name)`` is ``NAME@latest``; ``path`` goes to ``catalog=``."""

    path: Path
    data_root: Path


_CACHE: dict[str, object] = {}


def small_vocab(directory: Path) -> Path:
    """The first 5000 ranks of cl100k as a local rank file: ids fit uint16 (``<|endoftext|>`` = 5000)."""
    import tiktoken_ext

    full = Path(list(tiktoken_ext.__path__)[0]) / "data" / "cl100k_base.tiktoken"
    lines = full.read_bytes().splitlines()[:5000]
    path = directory / "small5000.tiktoken"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


@pytest.fixture(scope="session")
def cat(tmp_path_factory: pytest.TempPathFactory) -> RtCatalog:
    """Versions: wiki@v1 (BOS, 20k-token shards, train+val), wiki@v2 (30k shards), eos@v1 (EOS placement),
    one@v1 (a single shard), small@v1 (uint16 ids, nanogpt-legacy), npy@v1 (npy format)."""
    if "cat" in _CACHE:
        return _CACHE["cat"]  # type: ignore[return-value]
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
    _CACHE["cat"] = c
    return c


def write_shards(
    directory: Path,
    shards: list[np.ndarray],
    *,
    format: str = "nanogpt",
    dtype: str = "uint32",
    starts: list[np.ndarray] | None = None,
    stem: str = "data_train",
) -> list[Path]:
    """Write ``shards`` (token arrays) as ``{stem}_{k:06d}.{ext}`` in ``format``, with ``.bos.idx`` when ``starts``."""
    fmt = get_format(format)
    dt = np.dtype(dtype).newbyteorder("<")
    directory.mkdir(parents=True, exist_ok=True)
    paths = []
    for k, toks in enumerate(shards):
        path = directory / f"{stem}_{k:06d}.{fmt.extension}"
        path.write_bytes(fmt.header(len(toks), dt) + np.asarray(toks, dtype=dt).tobytes())
        if starts is not None:
            bosidx.index_path(path).write_bytes(bosidx.encode(starts[k]))
        paths.append(path)
    return paths


def counting_shards(sizes: list[int]) -> list[np.ndarray]:
    """Shards whose tokens are their split-wide positions: a window's content names where it came from."""
    out, base = [], 0
    for n in sizes:
        out.append(np.arange(base, base + n, dtype=np.uint32))
        base += n
    return out


BOS = 7  # the boundary token of the synthetic document shards


def document_shards(doc_lengths: list[int], shard_tokens: int, *, placement: str = "bos") -> tuple[list[np.ndarray], list[np.ndarray]]:
    """A token stream of documents (boundary token included in each length), cut into shards.

    Non-boundary tokens are 100 + the document's number (mod 50000), so a
    token tells which document it belongs to. Returns (shards, per-shard starts).
    """
    stream_parts = []
    for d, n in enumerate(doc_lengths):
        doc = np.full(n, 100 + d % 50000, dtype=np.uint32)
        if placement == "bos":
            doc[0] = BOS
        else:
            doc[-1] = BOS
        stream_parts.append(doc)
    stream = np.concatenate(stream_parts) if stream_parts else np.empty(0, np.uint32)
    doc_starts = np.concatenate(([0], np.cumsum(doc_lengths)[:-1])).astype(np.int64) if doc_lengths else np.empty(0, np.int64)
    shards, starts = [], []
    for lo in range(0, len(stream), shard_tokens):
        hi = min(lo + shard_tokens, len(stream))
        shards.append(stream[lo:hi])
        inside = doc_starts[(doc_starts >= lo) & (doc_starts < hi)] - lo
        starts.append(inside)
    return shards, starts
