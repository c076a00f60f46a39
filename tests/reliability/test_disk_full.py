"""Disk full while writing: a clean failure, nothing published, the catalog intact, and a rerun succeeds.

Two ways: a real size-limited filesystem (a small tmpfs, where this machine
lets the tests mount one; skipped elsewhere), and ENOSPC injected at chosen
write points (``SHARDFLOW_FAULT=enospc:POINT``), which runs everywhere.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from support.builds import assert_same_version, build_in, versions
from support.cli import CliRun, run_main
from support.corpus import small_vocab, split_sample
from support.paths import SAMPLE
from shardflow import faults
from shardflow.validation import validate_dir

NAME = "full"


def run_build(root: Path, src: Path, vocab: Path, extra: tuple[str, ...] = ()) -> CliRun:
    return run_main("build", str(src), "--name", NAME, "--no-prefect", "--data-root", str(root / "data"), "--catalog",
                    str(root / "catalog"), "--tokenizer", str(vocab), "--shard-tokens", "30000", "--workers", "2", *extra)


def assert_clean_disk_full(rc: int, err: str) -> None:
    last = err.strip().splitlines()[-1]
    assert rc == 1, err
    assert "Traceback" not in err
    assert last.startswith("shardflow: error: ") and "No space left on device" in last, last
    assert "Nothing was published and the catalog is unchanged" in last and "run the same command again" in last


def no_temporary_files(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*.tmp-*")]


@pytest.fixture
def tmpfs(tmp_path: Path):
    """A 4 MiB tmpfs at tmp_path/small (needs root and CAP_SYS_ADMIN; skipped otherwise)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    proc = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True, text=True)
    if proc.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}); ENOSPC is injected instead")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)


def _resize(mnt: Path, size_bytes: int) -> None:
    subprocess.run(["mount", "-o", f"remount,size={size_bytes}", str(mnt)], check=True, capture_output=True)


@pytest.mark.slow
def test_a_real_full_disk(tmpfs, tmp_path):
    vocab = small_vocab(tmp_path)
    src = tmp_path / "src"
    src.mkdir()
    shutil.copy(SAMPLE, src / "a.parquet")
    root = tmpfs  # data root and catalog on the small filesystem
    rc, _, err = run_build(root, src, vocab)
    assert rc == 0, err
    catalog_file = root / "catalog" / f"{NAME}.yaml"
    before = catalog_file.read_bytes()
    # Leave ~200 KiB free; the next version needs several times that.
    st = os.statvfs(tmpfs)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    _resize(tmpfs, used + 200 * 1024)
    for extra in ("b.parquet", "c.parquet"):
        shutil.copy(SAMPLE, src / extra)
    rc, _, err = run_build(root, src, vocab)
    assert_clean_disk_full(rc, err)
    assert catalog_file.read_bytes() == before
    assert versions(root, NAME) == ["v1"]
    validate_dir(root / "data" / NAME / "v1", published=True, catalog=root / "catalog")
    assert no_temporary_files(root) == []
    # Space is freed: the same command finishes the build.
    _resize(tmpfs, 64 << 20)
    rc, _, err = run_build(root, src, vocab)
    assert rc == 0, err
    assert versions(root, NAME) == ["v1", "v2"]
    full = build_in(tmp_path / "elsewhere", src, NAME, dict(tokenizer=str(vocab), shard_tokens=30_000))
    assert_same_version(root / "data" / NAME / "v2", Path(full.manifest_path).parent)
    assert no_temporary_files(root) == []


@pytest.mark.parametrize(
    "point",
    ["enospc:tokenize-batch", "enospc:tokenize-tokens", "enospc:layout", "enospc:shard-mid:2", "enospc:atomic-write:6", "enospc:finalize-manifest", "enospc:catalog-write"],
)
@pytest.mark.slow
def test_injected_disk_full(tmp_path, monkeypatch, point):
    # shard-mid is reached only while a gathered shard is copied (a placed one is hard-linked): a
    # held-out val split of half the documents is gathered into 3 shards, so the 2nd one fails.
    extra, options = ((), {}) if "shard-mid" not in point else (("--val-fraction", "0.5"), {"val_fraction": 0.5})
    vocab = small_vocab(tmp_path)
    src = split_sample(tmp_path / "src", (30, 31))
    held = tmp_path / "part1.parquet"
    shutil.move(src / "part1.parquet", held)
    root = tmp_path / "root"
    rc, _, err = run_build(root, src, vocab, extra)
    assert rc == 0, err
    catalog_file = root / "catalog" / f"{NAME}.yaml"
    before = catalog_file.read_bytes()
    shutil.move(held, src / "part1.parquet")

    faults.reset()
    monkeypatch.setenv(faults.ENV, point)
    rc, _, err = run_build(root, src, vocab, extra)
    assert_clean_disk_full(rc, err)
    assert catalog_file.read_bytes() == before
    assert versions(root, NAME) == ["v1"]
    validate_dir(root / "data" / NAME / "v1", published=True, catalog=root / "catalog")
    assert no_temporary_files(root) == []

    monkeypatch.delenv(faults.ENV)
    rc, _, err = run_build(root, src, vocab, extra)
    assert rc == 0, err
    assert versions(root, NAME) == ["v1", "v2"]
    full = build_in(tmp_path / "elsewhere", src, NAME, dict(tokenizer=str(vocab), shard_tokens=30_000, **options))
    assert_same_version(root / "data" / NAME / "v2", Path(full.manifest_path).parent)
    assert no_temporary_files(root) == []
