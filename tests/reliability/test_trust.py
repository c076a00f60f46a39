"""The catalog is the root of trust, and a manifest's paths stay inside its version (issue 26, cases 1-4 and 6).

A tampered version is refused by ``validate`` and the runtime whatever its
manifest says about itself; an incremental build never launders a tampered
parent, and a changed parent shard means its inputs are tokenized again; no
path in a manifest (shard, index, rank or tokenizer file) reaches outside its
version, through ``..``, an absolute path or a symlink; a symlinked data root
and a link to a version directory keep working.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from pathlib import Path

import numpy as np
import pytest
import yaml

from support.builds import assert_same_version, build_in, versions
from support.cli import run_main
from support.corpus import split_sample
from support.paths import SAMPLE
from shardflow.errors import ManifestError, ValidationError
from shardflow.manifest import read_manifest
from shardflow.reader import open_version

NAME = "trust"


def vdir(root: Path) -> Path:
    return root / "data" / NAME / "v1"


def writable(path: Path) -> Path:
    """Published files are read-only (a user other than root could not tamper without this)."""
    path.chmod(path.stat().st_mode | 0o200)
    return path


def edit_manifest(directory: Path, change) -> None:  # noqa: ANN001
    path = writable(directory / "metadata.yaml")
    data = yaml.safe_load(path.read_text())
    change(data)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def tamper_shard(directory: Path) -> tuple[str, str]:
    """Overwrite a few tokens of the first train shard in place; its new SHA-256."""
    shard = read_manifest(directory).splits["train"].shards[0]
    path = writable(directory / shard.file)
    data = bytearray(path.read_bytes())
    data[-40:-20] = bytes(20)  # token id 0, in range, at the end of the shard
    path.write_bytes(bytes(data))
    return shard.file, hashlib.sha256(bytes(data)).hexdigest()


def with_new_sha(file: str, sha: str):  # noqa: ANN201
    def change(data):  # noqa: ANN001, ANN202
        for s in data["splits"]["train"]["shards"]:
            if s["file"] == file:
                s["sha256"] = sha
    return change


def validate(root: Path, ref: str = f"{NAME}@v1") -> tuple[int, str]:
    rc, out, err = run_main("validate", ref, "--catalog", str(root / "catalog"))
    return rc, out + err


# --- case 1: the manifest does not choose what it is checked against ------------------------------------

def test_a_renamed_tampered_manifest_fails_validate_and_the_runtime(root):
    v1 = vdir(root)
    file, sha = tamper_shard(v1)

    def rename(data):  # noqa: ANN001, ANN202
        with_new_sha(file, sha)(data)
        data["name"] = "trust "

    edit_manifest(v1, rename)
    rc, text = validate(root)
    assert rc == 2 and ("changed after" in text or "calls itself" in text), text
    assert "OK " not in text
    with pytest.raises(ValidationError, match=r"calls itself 'trust '@'v1', but the catalog .* as trust@v1"):
        open_version(f"{NAME}@v1", catalog=root / "catalog")


def test_without_the_rename_the_sha_edit_is_still_caught(root):
    v1 = vdir(root)
    edit_manifest(v1, with_new_sha(*tamper_shard(v1)))
    rc, text = validate(root)
    assert rc == 2 and "changed after trust@v1 was published" in text, text


# --- case 3: rank and tokenizer files are confined ------------------------------------------------------

def _refuse_outside(root: Path, key: str, tmp_path: Path, where: str) -> None:  # noqa: ANN001
    """Point ``tokenized_info.KEY`` at a copy of the file outside the version: validate and the runtime refuse it."""
    v1 = vdir(root)
    info = read_manifest(v1).tokenized_info
    outside = tmp_path / "x" / Path(info[key]).name
    outside.parent.mkdir()
    shutil.copy(v1 / info[key], outside)
    name = str(outside) if where == "absolute" else os.path.relpath(outside, v1)
    edit_manifest(v1, lambda d: d["tokenized_info"].__setitem__(key, name))
    # Without the catalog's manifest checksum (an older catalog), the path check alone refuses it.
    _drop_manifest_sha(root)
    rc, text = validate(root)
    assert rc == 2 and f"tokenized_info.{key} names" in text and "not a relative path inside the version" in text, text
    with pytest.raises(ManifestError, match=rf"tokenized_info.{key} names .*not a relative path inside the version"):
        open_version(f"{NAME}@v1", catalog=root / "catalog").tokenizer


@pytest.mark.parametrize("where", ["absolute", "dotdot"])
def test_a_rank_file_outside_the_version_is_refused(root, tmp_path, where):
    assert read_manifest(vdir(root)).tokenized_info.get("rank_file")  # a .tiktoken version
    _refuse_outside(root, "rank_file", tmp_path, where)


@pytest.mark.parametrize("where", ["absolute", "dotdot"])
def test_a_tokenizer_json_outside_the_version_is_refused(bpe_json, tmp_path, where):
    root = tmp_path / "root"
    build_in(root, SAMPLE, NAME, dict(tokenizer=str(bpe_json), shard_tokens=60_000))
    info = read_manifest(vdir(root)).tokenized_info
    assert info.get("tokenizer_file") and not info.get("rank_file")  # a tokenizer.json version
    _refuse_outside(root, "tokenizer_file", tmp_path, where)


# --- case 4: symlinks out of the version ----------------------------------------------------------------

def _drop_manifest_sha(root: Path) -> None:
    cat = root / "catalog" / f"{NAME}.yaml"
    data = yaml.safe_load(cat.read_text())
    data["versions"][0]["manifest_sha256"] = ""
    cat.write_text(yaml.safe_dump(data, sort_keys=False))


def test_a_shard_symlinked_outside_the_version_is_refused(root, tmp_path):
    v1 = vdir(root)
    shard = read_manifest(v1).splits["train"].shards[0]
    outside = tmp_path / "elsewhere.bin"
    shutil.copy(v1 / shard.file, outside)
    os.unlink(v1 / shard.file)
    os.symlink(outside, v1 / shard.file)
    rc, text = validate(root)
    assert rc == 2 and f"shard 0 of split 'train' resolves to {outside}" in text, text
    split = open_version(f"{NAME}@v1", catalog=root / "catalog").split("train")  # no lstat per shard at open
    with pytest.raises(ManifestError, match=r"resolves to .*outside the version directory"):
        split.shard(0)  # the symlink check runs as the shard is first mapped
    with pytest.raises(ManifestError, match=r"resolves to .*outside the version directory"):
        split.shards.first_token(0)  # a read that keeps no map checks it too


def test_a_split_directory_symlinked_outside_is_refused(root, tmp_path):
    v1 = vdir(root)
    outside = tmp_path / "train-elsewhere"
    shutil.copytree(v1 / "train", outside)
    shutil.rmtree(v1 / "train")
    os.symlink(outside, v1 / "train")
    rc, text = validate(root)
    assert rc == 2 and "outside the version directory" in text, text
    split = open_version(f"{NAME}@v1", catalog=root / "catalog").split("train")
    with pytest.raises(ManifestError, match=r"the directory of the index of shard 1 .*outside the version directory"):
        split.shard_starts(1)
    with pytest.raises(ManifestError, match=r"resolves to .*outside the version directory"):
        split.shard(0)


def test_a_symlinked_data_root_and_a_link_to_the_version_keep_working(root, tmp_path):
    linked_root = tmp_path / "linked"
    os.symlink(root, linked_root)
    rc, text = validate(linked_root)
    assert rc == 0 and text.startswith("OK trust@v1"), text
    link = tmp_path / "dataset"
    os.symlink(vdir(root), link)  # as the nanogpt target's printed `ln -s` does
    rc, text = validate(root, str(link))
    assert rc == 0 and text.startswith("OK trust@v1"), text
    v = open_version(link, catalog=root / "catalog", verify=True)
    assert v.split("train").document(0).size > 0


def test_published_files_are_read_only(root):
    v1 = vdir(root)
    files = [p for p in v1.rglob("*") if p.is_file()]
    assert files and all(stat.S_IMODE(p.stat().st_mode) & 0o222 == 0 for p in files)


def test_publishing_never_carries_a_symlink(root, tmp_path):
    """A directory holding a symlink is not published: nothing is renamed into the data root or cataloged."""
    from shardflow.pipeline.publish import publish_out

    out = tmp_path / "out"
    shutil.copytree(vdir(root), out, symlinks=True)
    shard = read_manifest(out).splits["train"].shards[0]
    outside = tmp_path / "elsewhere.bin"
    shutil.move(out / shard.file, outside)
    os.symlink(outside, out / shard.file)
    data, cat = tmp_path / "data", tmp_path / "catalog"
    with pytest.raises(ValidationError, match=rf"{shard.file}: a symlink in the version being published.*Nothing was published"):
        publish_out(out, name=NAME, build_key=read_manifest(out).build_key, data_root=data, catalog=cat)
    assert not (data / NAME).exists() and not (cat / f"{NAME}.yaml").exists()


# --- cases 2 and 6: an incremental build trusts its parent only as the catalog published it --------------

def _grown(tmp_path: Path) -> tuple[Path, Path, Path]:
    src = split_sample(tmp_path / "src", (45, 16))
    held = tmp_path / "part1.parquet"
    shutil.move(src / "part1.parquet", held)
    r = tmp_path / "r"
    v1 = Path(build_in(r, src, "k", dict(shard_tokens=30_000)).manifest_path).parent
    shutil.move(held, src / "part1.parquet")
    return src, r, v1


@pytest.mark.parametrize("edit_sha", [True, False], ids=["manifest-edited", "shard-only"])
def test_a_tampered_parent_is_not_laundered(tmp_path, caplog, edit_sha):
    src, r, v1 = _grown(tmp_path)
    file, sha = tamper_shard(v1)
    if edit_sha:
        edit_manifest(v1, with_new_sha(file, sha))
    caplog.set_level("WARNING", logger="shardflow.pipeline")
    v2 = Path(build_in(r, src, "k", dict(shard_tokens=30_000)).manifest_path).parent
    assert versions(r, "k") == ["v1", "v2"]
    assert "reuse" not in read_manifest(v2).extra
    lines = [rec.getMessage() for rec in caplog.records if "not reusing k@v1" in rec.getMessage()]
    assert len(lines) == 1 and "tokenizing its inputs again" in lines[0], lines
    full = Path(build_in(tmp_path / "full", src, "k", dict(shard_tokens=30_000)).manifest_path).parent
    assert_same_version(v2, full)


def test_a_corrupt_parent_shard_is_never_a_dead_end(tmp_path, caplog):
    src, r, v1 = _grown(tmp_path)
    first = read_manifest(v1).splits["train"].shards[0]  # complete: it would be hard-linked
    path = v1 / first.file
    data = bytearray(path.read_bytes())
    data[5000] ^= 1
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(bytes(data))
    os.replace(tmp, path)  # a new inode
    caplog.set_level("WARNING", logger="shardflow.pipeline")
    v2 = Path(build_in(r, src, "k", dict(shard_tokens=30_000)).manifest_path).parent
    assert any(f"{first.file} changed since k@v1 was published" in rec.getMessage() for rec in caplog.records)
    full = Path(build_in(tmp_path / "full", src, "k", dict(shard_tokens=30_000)).manifest_path).parent
    assert_same_version(v2, full)
    assert np.array_equal(open_version(v2).split("train").shard(0), open_version(full).split("train").shard(0))


def test_a_parent_shard_replaced_by_a_symlink_is_not_carried_into_the_next_version(tmp_path, caplog):
    """Case 4's incremental half: the link is never hard-linked into v2, whose bytes are a full build's."""
    src, r, v1 = _grown(tmp_path)
    first = read_manifest(v1).splits["train"].shards[0]
    outside = tmp_path / "elsewhere.bin"
    shutil.copy(v1 / first.file, outside)  # the same bytes, outside the version
    (v1 / first.file).unlink()
    os.symlink(outside, v1 / first.file)
    caplog.set_level("WARNING", logger="shardflow.pipeline")
    v2 = Path(build_in(r, src, "k", dict(shard_tokens=30_000)).manifest_path).parent
    lines = [rec.getMessage() for rec in caplog.records if "not reusing k@v1" in rec.getMessage()]
    assert len(lines) == 1 and "outside the version directory" in lines[0] and "(through a symlink)" in lines[0], lines
    assert "reuse" not in read_manifest(v2).extra
    links = [p for p in v2.rglob("*") if p.is_symlink()]
    assert links == []
    full = Path(build_in(tmp_path / "full", src, "k", dict(shard_tokens=30_000)).manifest_path).parent
    assert_same_version(v2, full)
