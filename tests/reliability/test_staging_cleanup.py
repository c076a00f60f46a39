"""Abandoned staging directories are removed, resumable ones kept (issue 26, case 10).

A staging directory that no rerun will resume is removed when any build of the
dataset starts: one whose build key is published (a publish killed after its
catalog entry), one staged by an older shardflow, and one that a killed clean-up
left half-deleted. One whose lock a live process holds is never touched, and the
staging directory of an unpublished build stays, and its rerun resumes it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from support.builds import build_in, fault_options, leftovers, versions
from support.cli import build_cli, killed
from support.corpus import small_vocab, split_sample
from shardflow.pipeline.staging import Staging, discard_staging
from shardflow.catalog import file_lock

NAME = "stale"


def staging_dirs(root: Path) -> list[Path]:
    parent = root / "data" / NAME / ".staging"
    return sorted(p for p in parent.iterdir() if p.is_dir()) if parent.is_dir() else []


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, dict]:
    """(root, sources: the sample as 4 Parquet files, the fault-injection build options)."""
    return tmp_path / "root", split_sample(tmp_path / "src"), fault_options(small_vocab(tmp_path))


def killed_build(root: Path, src: Path, options: dict, fault: str) -> Path:
    """A build killed at ``fault``; its staging directory, the only one."""
    proc = build_cli(src, root, NAME, options, fault=fault)
    assert killed(proc), proc.stderr[-2000:]
    (left,) = staging_dirs(root)
    return left


@pytest.mark.slow
def test_a_published_builds_staging_directory_is_removed_when_another_build_starts(setup) -> None:
    root, src, options = setup
    left = killed_build(root, src, options, "publish-cataloged")  # killed after the catalog entry, before clean-up
    assert versions(root, NAME) == ["v1"]
    build_in(root, src, NAME, {**options, "seed": 4})  # another build of the dataset (another build key)
    assert versions(root, NAME) == ["v1", "v2"]
    assert not left.exists()
    assert leftovers(root / "data") == []


@pytest.mark.slow
def test_a_staging_directory_whose_lock_is_held_is_kept(setup) -> None:
    root, src, options = setup
    left = killed_build(root, src, options, "publish-cataloged")
    with file_lock(Staging(left).lock_file, timeout=0):  # a live process holds it (another open file: flock refuses)
        build_in(root, src, NAME, {**options, "seed": 4})
        assert left.is_dir() and (left / "plan.json").exists()
    build_in(root, src, NAME, {**options, "seed": 4})  # released: the next start (a no-op rebuild here) removes it
    assert not left.exists()
    assert leftovers(root / "data") == []


@pytest.mark.slow
def test_an_unpublished_builds_staging_directory_is_kept_and_resumed(setup) -> None:
    root, src, options = setup
    left = killed_build(root, src, options, "layout")  # every unit tokenized, nothing published
    build_in(root, src, NAME, {**options, "seed": 4})  # another build publishes v1 meanwhile
    assert left.is_dir() and (left / "plan.json").exists()
    # The rerun resumes it: with every unit done it tokenizes nothing, so a kill at the first batch never happens.
    proc = build_cli(src, root, NAME, options, fault="tokenize-batch")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert versions(root, NAME) == ["v1", "v2"]
    assert leftovers(root / "data") == []


@pytest.mark.slow
def test_a_staging_directory_of_an_older_shardflow_is_removed(setup) -> None:
    root, src, options = setup
    left = killed_build(root, src, options, "layout")
    plan = json.loads((left / "plan.json").read_text())
    plan["manifest_schema"] = plan["manifest_schema"] - 1  # what a shardflow before schema 2 wrote
    (left / "plan.json").write_text(json.dumps(plan))
    build_in(root, src, NAME, {**options, "seed": 4})
    assert not left.exists()
    assert leftovers(root / "data") == []


@pytest.mark.slow
def test_a_half_discarded_staging_directory_is_removed_and_a_live_ones_kept(tmp_path: Path) -> None:
    root, src = tmp_path / "root", split_sample(tmp_path / "src", (30, 31))
    parent = root / "data" / NAME / ".staging"
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    gone = parent / f".0123456789abcdef.tmp-{int(dead.stdout)}"  # discard_staging's rename, its process killed
    (gone / "parts").mkdir(parents=True)
    (gone / "parts" / "unit-000000.tok").write_bytes(b"\0" * 64)
    live = parent / ".fedcba9876543210.tmp-1"  # pid 1 runs: a discard in progress
    live.mkdir()
    build_in(root, src, NAME, dict(tokenizer=str(small_vocab(tmp_path)), shard_tokens=60_000))
    assert not gone.exists()
    assert live.is_dir()


def test_discarding_a_staging_directory_leaves_nothing(tmp_path: Path) -> None:
    staging = tmp_path / ".staging" / "0123456789abcdef"
    (staging / "parts").mkdir(parents=True)
    (staging / "plan.json").write_text("{}")
    discard_staging(staging)
    discard_staging(staging)  # already gone: nothing to do
    assert list((tmp_path / ".staging").iterdir()) == []
    shutil.rmtree(tmp_path / ".staging")
