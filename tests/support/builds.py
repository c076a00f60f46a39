"""Builds in this process, and what to compare between the versions they publish."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from shardflow.catalog import Catalog
from shardflow.config import BuildConfig
from shardflow.manifest import read_manifest
from shardflow.pipeline import BuildResult, build
from shardflow.reader import Version, open_version

# What a version holds besides its data: the statistics (stats.json, stats.vocab.npy) and the card/ directory.
STATS_AND_CARD = frozenset({"stats.json", "stats.vocab.npy", "card"})


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


def build_in(root: Path, sources: Path | str, name: str, options: dict[str, Any], **kwargs: Any) -> BuildResult:
    """The in-process build of the configuration ``cli.build_cli`` runs: into ``root/data`` and ``root/catalog``."""
    config = BuildConfig(name=name, sources=(str(sources),), **options)
    return build(config, data_root=root / "data", catalog=root / "catalog", **kwargs)


def fault_options(vocab: Path) -> dict[str, Any]:
    """Options of the fault-injection builds: with 4 inputs (one work unit each) of the
    61 sample documents, two splits (9 train shards, placed; 3 val shards, gathered), small batches."""
    return dict(tokenizer=str(vocab), shard_tokens=25_000, val_fraction=0.2, seed=3, batch_rows=8)


def versions(root: Path, name: str) -> list[str]:
    return [v.version for v in Catalog(root / "catalog").versions(name)]


def files_of(directory: Path) -> dict[str, bytes]:
    """Every shard and index file of a version directory, by name: not the manifest (it has a timestamp), nor
    the statistics and the card (``STATS_AND_CARD``)."""
    return {
        p.relative_to(directory).as_posix(): p.read_bytes()
        for p in sorted(directory.rglob("*"))  # the split directories too (manifest schema 2)
        if p.is_file() and p.name != "metadata.yaml" and p.relative_to(directory).parts[0] not in STATS_AND_CARD
    }


def version_files(directory: Path) -> dict[str, bytes]:
    """Every file of a version directory but the manifest and the card, by name (hidden files and the
    statistics included)."""
    # Not card/: a view of stats.json (which is compared), and it compares with the parent, which a full build has not.
    return {p.relative_to(directory).as_posix(): p.read_bytes() for p in sorted(Path(directory).rglob("*"))
            if p.is_file() and p.name != "metadata.yaml" and p.relative_to(directory).parts[0] != "card"}


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


# What legitimately differs between two builds of the same inputs: when and
# where, which version they became and what came before, the tool versions,
# and how an incremental build got its tokens.
VOLATILE = ("created_at", "dataset_path", "version", "parent", "tools", "reuse")


def assert_same_version(a: Path, b: Path, drop: tuple[str, ...] = VOLATILE) -> None:
    """Byte-identical shards and indexes, and the same manifest but for ``drop``."""
    fa, fb = version_files(a), version_files(b)
    assert sorted(fa) == sorted(fb)
    for name in fa:
        assert fa[name] == fb[name], f"{name} differs between {a} and {b}"
    ma, mb = read_manifest(a).to_dict(), read_manifest(b).to_dict()
    for key in drop:
        ma.pop(key, None)
        mb.pop(key, None)
    assert ma == mb


def leftovers(data_root: Path) -> list[str]:
    """Temporary files and staging directories left anywhere under a data root (lock files are fine)."""
    found = [str(p) for p in data_root.rglob("*.tmp-*")]
    found += [str(p) for p in data_root.glob("*/.staging/*") if p.is_dir()]
    return found
