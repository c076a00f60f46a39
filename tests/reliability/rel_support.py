"""Helpers of the reliability tests (imported by name: ``from rel_support import ...``).

Not a conftest: several conftest modules exist under tests/, and ``from
conftest import`` would pick whichever was imported first.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

import shardflow
from shardflow.build import BuildResult, build
from shardflow.catalog import Catalog
from shardflow.config import BuildConfig
from shardflow.manifest import read_manifest

TESTS = Path(__file__).resolve().parent.parent
REPO = TESTS.parent
SAMPLE = TESTS / "assets" / "sample.parquet"
MAKE_CORPUS = REPO.parent / "shared" / "tools" / "make_corpus.py"
SRC_DIR = Path(shardflow.__file__).resolve().parent

SMALL_VOCAB_RANKS = 5000


def small_vocab(directory: Path) -> Path:
    """A ``.tiktoken`` rank file of cl100k's first 5000 ranks: uint16 ids, and it loads in milliseconds.

    (The subprocess builds of these tests spend most of their time loading the
    tokenizer; with this one a build of the sample corpus takes under a second.)
    """
    import tiktoken_ext

    path = Path(directory) / "small5000.tiktoken"
    if not path.exists():
        full = Path(list(tiktoken_ext.__path__)[0]) / "data" / "cl100k_base.tiktoken"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"\n".join(full.read_bytes().splitlines()[:SMALL_VOCAB_RANKS]) + b"\n")
    return path


def fault_options(vocab: Path) -> dict[str, Any]:
    """Options of the fault-injection builds: with 4 inputs (one work unit each) of the
    61 sample documents, two splits (9 train shards, placed; 3 val shards, gathered), small batches."""
    return dict(tokenizer=str(vocab), shard_tokens=25_000, val_fraction=0.2, seed=3, batch_rows=8)


def cli_args(options: dict[str, Any]) -> list[str]:
    """``shardflow build`` flags for BuildConfig ``options``."""
    out: list[str] = []
    for key, value in options.items():
        out += [f"--{key.replace('_', '-')}", str(value)]
    return out


def split_sample(directory: Path, sizes: tuple[int, ...] = (15, 15, 15, 16)) -> Path:
    """The sample corpus as ``len(sizes)`` Parquet files ``part0.parquet``... in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    table = pq.read_table(SAMPLE)
    assert sum(sizes) == table.num_rows
    start = 0
    for i, n in enumerate(sizes):
        pq.write_table(table.slice(start, n), directory / f"part{i}.parquet")
        start += n
    return directory


def run_cli(
    *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """``python -m shardflow.flows.cli ARGS`` in a subprocess (no Prefect: callers pass ``--no-prefect``)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDFLOW_")}
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "shardflow.flows.cli", *args],
        env=full_env,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def build_cli(
    sources: Path | str, root: Path, name: str, options: dict[str, Any], *, fault: str | None = None, workers: int = 2
) -> subprocess.CompletedProcess[str]:
    """``shardflow build SOURCES --no-prefect`` into ``root/data`` + ``root/catalog``, optionally with a fault."""
    return run_cli(
        "build",
        str(sources),
        "--name",
        name,
        "--no-prefect",
        "--data-root",
        str(root / "data"),
        "--catalog",
        str(root / "catalog"),
        "--workers",
        str(workers),
        *cli_args(options),
        env={"SHARDFLOW_FAULT": fault} if fault else None,
    )


def start_build_cli(
    sources: Path | str, root: Path, name: str, options: dict[str, Any], *, env: dict[str, str], workers: int = 2
) -> subprocess.Popen[str]:
    """``build_cli`` started in the background (``communicate()`` collects its output)."""
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("SHARDFLOW_")}
    full_env.update(env)
    return subprocess.Popen(
        [sys.executable, "-m", "shardflow.flows.cli", "build", str(sources), "--name", name, "--no-prefect",
         "--data-root", str(root / "data"), "--catalog", str(root / "catalog"), "--workers", str(workers),
         *cli_args(options)],
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def killed(proc: subprocess.CompletedProcess[str]) -> bool:
    return proc.returncode == -signal.SIGKILL


def build_in(root: Path, sources: Path | str, name: str, options: dict[str, Any], **kwargs: Any) -> BuildResult:
    """The in-process build of the same configuration ``build_cli`` runs."""
    config = BuildConfig(name=name, sources=(str(sources),), **options)
    return build(config, data_root=root / "data", catalog=root / "catalog", **kwargs)


def versions(root: Path, name: str) -> list[str]:
    return [v.version for v in Catalog(root / "catalog").versions(name)]


def version_files(directory: Path) -> dict[str, bytes]:
    """Every file of a version directory but the manifest, by name (hidden files included)."""
    # Not card/: it compares with the parent, which a full build has not (stats.json is compared).
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(Path(directory).rglob("*"))
            if p.is_file() and p.name != "metadata.yaml" and p.relative_to(directory).parts[0] != "card"}


# What legitimately differs between two builds of the same inputs: when and
# where, which version they became and what came before, the tool versions,
# and how an incremental build got its tokens.
VOLATILE = ("created_at", "dataset_path", "version", "parent", "tools", "reuse")


def stable_manifest(directory: Path, drop: tuple[str, ...] = VOLATILE) -> dict[str, Any]:
    m = read_manifest(directory).to_dict()
    for key in drop:
        m.pop(key, None)
    return m


def assert_same_version(a: Path, b: Path, drop: tuple[str, ...] = VOLATILE) -> None:
    """Byte-identical shards and indexes, and the same manifest but for ``drop``."""
    fa, fb = version_files(a), version_files(b)
    assert sorted(fa) == sorted(fb)
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs between {a} and {b}"
    assert stable_manifest(a, drop) == stable_manifest(b, drop)


def leftovers(data_root: Path) -> list[str]:
    """Temporary files and staging directories left anywhere under a data root (lock files are fine)."""
    found = [str(p) for p in data_root.rglob("*.tmp-*")]
    found += [str(p) for p in data_root.glob("*/.staging/*") if p.is_dir()]
    return found


def make_corpus(out: Path, mb: float, files: int, seed: int = 0, rows_per_group: int = 64) -> list[Path]:
    """``make_corpus.py OUT --mb MB --files FILES``: real-text Parquet files, sorted by name."""
    if not MAKE_CORPUS.exists():
        import pytest

        pytest.skip(f"{MAKE_CORPUS} is not available (../shared beside the checkout)")
    out.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [sys.executable, str(MAKE_CORPUS), str(out), "--mb", str(mb), "--files", str(files), "--seed", str(seed),
         "--rows-per-group", str(rows_per_group)],
        check=True,
        capture_output=True,
    )
    return sorted(out.glob("*.parquet"))


def copy_into(files: list[Path], directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for f in files:
        shutil.copy(f, directory / f.name)
    return directory
