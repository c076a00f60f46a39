"""Versions of manifest schema 1 (every file flat in the version directory) still open, validate and serve as parents.

``tests/assets/schema1/`` holds a small version published by the code before
split directories (commit 3dfc23b: ``old.parquet``, 40 Shakespeare passages,
cl100k, ``--val-fraction 0.1 --shard-tokens 4000``), kept byte for byte.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import numpy as np
import pytest
from support.corpus import write_parquet
from support.paths import ASSETS

from shardflow.cli.commands import main
from shardflow.pipeline import build
from shardflow.catalog import Catalog, VersionEntry
from shardflow.config import BuildConfig
from shardflow.manifest import read_manifest
from shardflow.reader import open_version
from shardflow.runtime import open_shards
from shardflow.validation import validate_dir

FIXTURE = ASSETS / "schema1"
OPTIONS = dict(name="old", val_fraction=0.1, shard_tokens=4000)


@pytest.fixture
def old_root(tmp_path: Path) -> Path:
    """A data root and catalog holding the schema-1 version as ``old@v1``, as its publish left them."""
    version = tmp_path / "data" / "old" / "v1"
    shutil.copytree(FIXTURE / "v1", version)
    shutil.copy(FIXTURE / "old.parquet", tmp_path / "old.parquet")
    manifest = read_manifest(version)
    cat = Catalog(tmp_path / "catalog")
    with cat.lock("old"):
        cat.add(
            "old",
            VersionEntry(
                version="v1",
                path=str(version),
                created_at=manifest.created_at,
                build_key=manifest.build_key,
                totals={k: manifest.totals[k] for k in ("documents", "tokens", "shards", "bytes")},
                manifest_sha256=hashlib.sha256((version / "metadata.yaml").read_bytes()).hexdigest(),
            ),
        )
    return tmp_path


def test_the_fixture_is_a_flat_schema_1_version():
    m = read_manifest(FIXTURE / "v1")
    assert m.schema_version == 1
    assert all("/" not in s.file for e in m.splits.values() for s in e.shards)
    assert sorted(p.name for p in (FIXTURE / "v1").iterdir() if p.is_dir()) == []


def test_a_schema_1_version_opens_validates_and_reads(old_root, capsys):
    directory = old_root / "data" / "old" / "v1"
    report = validate_dir(directory, published=True, catalog=old_root / "catalog")
    assert report.shards == 4 and report.tokens == 9627
    v = open_version("old@v1", catalog=old_root / "catalog", verify=True)
    train = open_shards("old@v1", catalog=old_root / "catalog")
    raw = np.concatenate([np.fromfile(directory / s.file, dtype="<u4", offset=1024) for s in v.manifest.splits["train"].shards])
    assert train.read(0, train.num_tokens).tolist() == raw.tolist()
    assert main(["validate", "old@v1", "--catalog", str(old_root / "catalog")]) == 0
    assert "OK old@v1: 4 shards, 9,627 tokens" in capsys.readouterr().out


@pytest.mark.slow
def test_a_schema_1_parent_serves_an_incremental_build_of_the_new_layout(old_root, tmp_path):
    new = write_parquet(tmp_path / "new.parquet", [f"an added passage number {i}, " * (i + 3) for i in range(12)])
    sources = (str(old_root / "old.parquet"), str(new))
    grown = build(BuildConfig(sources=sources, **OPTIONS), data_root=old_root / "data", catalog=old_root / "catalog")
    assert grown.ref == "old@v2"
    m2 = read_manifest(Path(grown.manifest_path))
    assert m2.schema_version == 3 and m2.parent == "old@v1"
    assert "reuse" not in m2.extra  # its shards mix inputs: tokenized again, once (tests/test_schema2.py: the line)
    (a0, an), (b0, bn) = (inp["shards"]["train"] for inp in m2.inputs)  # each input's own shards, for the next build
    assert (a0, b0) == (0, an) and an > 1 and bn >= 1 and an + bn == len(m2.splits["train"].shards)
    assert all(s.file.startswith(f"{split}/") for split, e in m2.splits.items() for s in e.shards)
    # The same tokens as a build of everything from scratch.
    full = build(BuildConfig(sources=sources, **OPTIONS), data_root=tmp_path / "full", catalog=tmp_path / "fullcat")
    for split in m2.splits:
        a = open_shards(grown.ref, catalog=old_root / "catalog", split=split)
        b = open_shards(full.ref, catalog=tmp_path / "fullcat", split=split)
        assert a.read(0, a.num_tokens).tolist() == b.read(0, b.num_tokens).tolist()
    validate_dir(Path(grown.manifest_path).parent, published=True, catalog=old_root / "catalog")


def test_validate_for_a_globbing_target_refuses_the_flat_layout(old_root, capsys):
    # NeMo reads this format and placement, but its glob over the flat directory would take the val shards too.
    rc = main(["validate", "old@v1", "--catalog", str(old_root / "catalog"), "--for", "nemo"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "split 'train' shares the version directory with other files (a version of manifest schema 1)" in err
    assert "Rebuild it with --target nemo" in err
