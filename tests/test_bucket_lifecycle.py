"""``shardflow rm`` and ``shardflow gc`` on a bucket (``shardflow.bucket.lifecycle``), against moto's S3 server on loopback.

``bk@v1`` (half of the sample) and its incremental child ``bk@v2`` (all of it) are
built once locally, then pushed to a new bucket per test. What these show: ``rm``
takes the entry out of the bucket's ``bk.yaml`` (under ``removed``, ``latest`` the
newest remaining) and then deletes every object of the version, and the remaining
one still reads; a parent is refused without ``--force`` and its child reads after
it is gone; an ``rm`` killed between the two steps is finished by its rerun (or by
``gc``); ``gc`` aborts a real incomplete multipart upload and deletes an abandoned
push's prefix, keeps what is younger than ``--older-than``, deletes nothing with
``--dry-run`` and never touches a listed version; entry paths that leave the bucket,
a wrong catalog and half-bucket places are refused in one line. What builds to a bucket
leave: ``gc`` deletes a published version's staging prefix at once, an abandoned build's once
old and its lease expired (by age alone without ``sends.json``), a crashed holder's lease, never
a live lease or the staging it keeps, nothing with ``--dry-run``, and looks again before each
delete. ``diff`` of two versions
on the bucket reads their manifests alone, and ``show`` what it shows; both say what they
say of the versions' local copies.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("s3fs", reason="object storage needs the optional extra: pip install 'shardflow[s3]'")
pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")

from support.paths import SAMPLE  # noqa: E402
from support.s3 import S3Server, new_bucket, s3_fixture  # noqa: E402
from shardflow.bucket.lifecycle import collect_bucket_garbage, remove_bucket_version  # noqa: E402
from shardflow.pipeline import build  # noqa: E402
from shardflow.config import BuildConfig  # noqa: E402
from shardflow.errors import CatalogError, ConfigError, ShardflowError  # noqa: E402
from shardflow.cli.lifecycle import byte_size as size  # noqa: E402
from shardflow.manifest import read_manifest  # noqa: E402
from shardflow.bucket.push import CLAIM_NAME, push_version  # noqa: E402
from shardflow.runtime import TokenDataset  # noqa: E402

s3 = s3_fixture("module")


@pytest.fixture(scope="module")
def local(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``bk@v1`` from rows 0-29 of the sample, ``bk@v2`` (parent ``bk@v1``) from all of it, under data/ and catalog/."""
    import pyarrow.parquet as pq

    root = tmp_path_factory.mktemp("bucket-lifecycle")
    table = pq.read_table(SAMPLE)
    half = root / "a.parquet"
    pq.write_table(table.slice(0, 30), half)
    for sources in ((str(half),), (str(half), str(SAMPLE))):
        build(BuildConfig(name="bk", sources=sources, shard_tokens=20_000, val_fraction=0.1),
              data_root=root / "data", catalog=root / "catalog")
    assert read_manifest(root / "data" / "bk" / "v2").parent == "bk@v1"
    return root


def urls(bucket: str) -> dict[str, str]:
    return {"data_root_url": f"s3://{bucket}/data", "catalog_url": f"s3://{bucket}/catalog"}


@pytest.fixture
def bucket(s3: S3Server, local: Path) -> str:
    """A new bucket with ``bk@v1`` and ``bk@v2`` pushed (``bk@v2``'s shards copied from ``bk@v1``'s in the bucket)."""
    name = new_bucket(s3, "life")
    push_version("bk@v1", catalog=local / "catalog", **urls(name))
    assert push_version("bk@v2", catalog=local / "catalog", **urls(name)).copied > 0
    return name


def objects(s3: S3Server, bucket: str, prefix: str) -> dict[str, int]:
    """``{key: size}`` under ``bucket/prefix/``."""
    fs = s3.fs()
    try:
        return {k: v["size"] for k, v in fs.find(f"{bucket}/{prefix}/", detail=True).items()}
    except FileNotFoundError:
        return {}


def catalog_file(s3: S3Server, bucket: str) -> dict:
    return yaml.safe_load(s3.fs().cat_file(f"{bucket}/catalog/bk.yaml"))


def windows(ref: str, bucket: str, cache: Path) -> np.ndarray:
    ds = TokenDataset(ref, catalog=f"s3://{bucket}/catalog", seq_len=64, cache_dir=cache)
    return np.stack([ds.window(i) for i in range(len(ds))])


def uploads(bucket: str) -> list[str]:
    import botocore.session

    client = botocore.session.get_session().create_client("s3")
    return sorted(u["Key"] for u in client.list_multipart_uploads(Bucket=bucket).get("Uploads") or [])


# --- rm ---


@pytest.mark.slow
def test_rm_takes_the_entry_out_then_deletes_every_object(s3, bucket, cli, tmp_path):
    before = objects(s3, bucket, "data/bk/v2")
    v1 = objects(s3, bucket, "data/bk/v1")
    status, out, err = cli("rm", "bk@v2", "--catalog", f"s3://{bucket}/catalog")
    assert status == 0, err
    assert out == (f"removed bk@v2 (s3://{bucket}/data/bk/v2/): {len(before)} objects deleted, "
                   f"{size(sum(before.values()))}\n")
    listed = catalog_file(s3, bucket)
    assert [v["version"] for v in listed["versions"]] == ["v1"] and listed["latest"] == "v1"
    assert [(r["version"], r["path"]) for r in listed["removed"]] == [("v2", "../data/bk/v2")]
    assert objects(s3, bucket, "data/bk/v2") == {} and objects(s3, bucket, "data/bk/v1") == v1
    assert len(windows("bk@latest", bucket, tmp_path / "cache")) > 0
    with pytest.raises(ShardflowError, match=r"^bk@v2 was removed \(shardflow rm, "):
        TokenDataset("bk@v2", catalog=f"s3://{bucket}/catalog", seq_len=64, cache_dir=tmp_path / "cache")
    status, out, err = cli("rm", "bk@v2", "--catalog", f"s3://{bucket}/catalog")
    assert (status, out) == (0, f"bk@v2 was already removed; nothing of it was left under s3://{bucket}/data/bk/v2/\n")


def test_diff_of_two_bucket_versions_reads_their_manifests_alone_and_equals_the_local_diff(s3, bucket, local, cli,
                                                                                            monkeypatch, tmp_path):
    status, want, err = cli("diff", "bk@v1", "bk@v2", "--catalog", str(local / "catalog"))
    assert status == 0, err
    monkeypatch.setenv("SHARDFLOW_CACHE", str(tmp_path / "cache"))
    status, out, err = cli("diff", "bk@v1", "bk@v2", "--catalog", f"s3://{bucket}/catalog")
    assert (status, out) == (0, want), err
    assert out.startswith("bk@v1 -> bk@v2\ninputs: 1 added, 0 removed, 0 changed, 1 unchanged\n"), out
    fetched = sorted(p.name for p in (tmp_path / "cache").rglob("*") if p.is_file())
    assert fetched == ["bk.yaml", "metadata.yaml", "metadata.yaml"], fetched  # the catalog file, no shard, no index


def test_show_of_a_bucket_version_fetches_what_it_shows_and_says_what_show_of_its_local_copy_says(
        s3, bucket, local, cli, monkeypatch, tmp_path):
    status, want, err = cli("show", "bk@v2", "--catalog", str(local / "catalog"))
    assert status == 0, err
    monkeypatch.setenv("SHARDFLOW_CACHE", str(tmp_path / "cache"))
    status, out, err = cli("show", "bk@v2", "--catalog", f"s3://{bucket}/catalog")
    assert status == 0, err
    url = f"s3://{bucket}/data/bk/v2"
    cached = tmp_path / "cache" / "versions"
    (directory,) = [p.parent for p in cached.rglob("metadata.yaml")]
    # The same report, where the local one names the version's directory the bucket's names its URL (and the
    # report's shard directory is the cache's copy).
    local_dir = str(local / "data" / "bk" / "v2")
    assert out.splitlines()[0] == f"bk@v2  ({url})"
    assert out.replace(url, local_dir).replace(str(directory), local_dir) == want
    status, out, err = cli("show", "bk@v2", "--card", "--catalog", f"s3://{bucket}/catalog")
    assert (status, out) == (0, f"{url}/card/README.md\n"), err
    assert s3.fs().exists(f"{bucket}/data/bk/v2/card/README.md")
    # Fetched: the statistics, the train split's indexes, and only the shards its samples come from.
    m = read_manifest(local / "data" / "bk" / "v2")
    shards = [s.file for s in m.splits["train"].shards]
    fetched = {str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file() and not p.name.startswith(".")}
    assert {"metadata.yaml", "stats.json", "stats.vocab.npy"} <= fetched
    assert not [f for f in fetched if f.startswith("val/")], fetched
    assert 0 < len([f for f in fetched if f in shards]) < len(shards), (fetched, shards)


@pytest.mark.slow
def test_rm_refuses_a_parent_without_force_and_its_child_reads_after_it_is_gone(s3, bucket, cli, tmp_path):
    child = windows("bk@v2", bucket, tmp_path / "before")
    catalog_before = s3.fs().cat_file(f"{bucket}/catalog/bk.yaml")
    v1 = objects(s3, bucket, "data/bk/v1")
    status, out, err = cli("rm", "bk@v1", "--catalog", f"s3://{bucket}/catalog")
    assert (status, out) == (2, "")
    assert err.splitlines() == [
        "shardflow: error: bk@v1 is the parent of bk@v2, which remains. Its objects in the bucket are its own and would "
        "keep working, but its lineage would name a removed version: remove it first, or pass --force to remove bk@v1 anyway"]
    assert s3.fs().cat_file(f"{bucket}/catalog/bk.yaml") == catalog_before and objects(s3, bucket, "data/bk/v1") == v1
    status, out, err = cli("rm", "bk@v1", "--force", "--catalog", f"s3://{bucket}/catalog")
    assert status == 0, err
    assert out.splitlines() == [
        f"removed bk@v1 (s3://{bucket}/data/bk/v1/): {len(v1)} objects deleted, {size(sum(v1.values()))}",
        "  bk@v2 named it as its parent; its objects are its own copies in the bucket, so it still reads"]
    assert objects(s3, bucket, "data/bk/v1") == {}
    listed = catalog_file(s3, bucket)
    assert ([v["version"] for v in listed["versions"]], listed["latest"]) == (["v2"], "v2")
    np.testing.assert_array_equal(windows("bk@v2", bucket, tmp_path / "after"), child)  # a fresh cache: from the bucket


@pytest.mark.slow
def test_an_rm_killed_between_the_catalog_and_the_objects_is_finished_by_its_rerun(s3, bucket, cli, tmp_path):
    v2 = objects(s3, bucket, "data/bk/v2")
    proc = subprocess.run([sys.executable, "-m", "shardflow", "rm", "bk@v2", "--catalog", f"s3://{bucket}/catalog"],
                          env={**os.environ, "SHARDFLOW_FAULT": "bucket-rm-cataloged"}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == -9, proc.stderr
    listed = catalog_file(s3, bucket)
    assert [v["version"] for v in listed["versions"]] == ["v1"] and [r["version"] for r in listed["removed"]] == ["v2"]
    assert objects(s3, bucket, "data/bk/v2") == v2  # committed out of the catalog, nothing deleted yet
    status, out, err = cli("rm", "bk@v2", "--catalog", f"s3://{bucket}/catalog")
    assert status == 0, err
    assert out == f"finished removing bk@v2 (s3://{bucket}/data/bk/v2/): {len(v2)} objects deleted, {size(sum(v2.values()))}\n"
    assert objects(s3, bucket, "data/bk/v2") == {}
    assert len(windows("bk@v1", bucket, tmp_path / "cache")) > 0


@pytest.mark.slow
def test_gc_deletes_what_an_interrupted_rm_left_whatever_its_age(s3, bucket, cli, monkeypatch):
    v2 = objects(s3, bucket, "data/bk/v2")
    monkeypatch.setenv("SHARDFLOW_FAULT", "eio:bucket-rm-cataloged")  # the same point as a kill, in this process
    with pytest.raises(OSError, match="injected at bucket-rm-cataloged"):
        remove_bucket_version("bk@v2", catalog_url=f"s3://{bucket}/catalog")
    monkeypatch.delenv("SHARDFLOW_FAULT")
    status, out, err = cli("gc", "--data-root", f"s3://{bucket}/data", "--catalog", f"s3://{bucket}/catalog")
    assert status == 0, err
    assert out.splitlines() == [
        f"deleted s3://{bucket}/data/bk/v2/ ({len(v2)} objects, {size(sum(v2.values()))}): bk@v2, removed from the "
        "catalog by an interrupted shardflow rm",
        f"freed {size(sum(v2.values()))} (1 item)"]
    assert objects(s3, bucket, "data/bk/v2") == {} and objects(s3, bucket, "data/bk/v1")


# --- gc ---


@pytest.mark.slow
def test_gc_aborts_an_incomplete_upload_and_deletes_an_abandoned_push_never_a_listed_version(s3, local, cli, monkeypatch,
                                                                                           tmp_path):
    import botocore.session

    bucket = new_bucket(s3, "gc")
    push_version("bk@v1", catalog=local / "catalog", **urls(bucket))
    monkeypatch.setenv("SHARDFLOW_FAULT", "eio:push-files")  # bk@v2's push dies after its files, before its manifest
    with pytest.raises(OSError, match="injected at push-files"):
        push_version("bk@v2", catalog=local / "catalog", **urls(bucket))
    monkeypatch.delenv("SHARDFLOW_FAULT")
    abandoned = objects(s3, bucket, "data/bk/v2")
    assert f"{bucket}/data/bk/v2/{CLAIM_NAME}" in abandoned and len(abandoned) > 1
    # Another program's objects under the data root, shaped like versions but never claimed by a push: kept.
    foreign = {f"{bucket}/data/site/v2/index.html": b"<html>", f"{bucket}/data/models/v3/weights.bin": b"w" * 10}
    s3.fs().pipe(foreign)
    client = botocore.session.get_session().create_client("s3")
    for key in ("data/bk/v3/train-00000.bin", "elsewhere/big.bin"):  # the second: not under the data root
        started = client.create_multipart_upload(Bucket=bucket, Key=key)
        client.upload_part(Bucket=bucket, Key=key, UploadId=started["UploadId"], PartNumber=1, Body=b"z" * 1000)
    v1 = objects(s3, bucket, "data/bk/v1")
    catalog = s3.fs().cat_file(f"{bucket}/catalog/bk.yaml")
    places = ("--data-root", f"s3://{bucket}/data", "--catalog", f"s3://{bucket}/catalog")
    upload_line = f"s3://{bucket}/data/bk/v3/train-00000.bin (1 part, 1000 B): an incomplete multipart upload (id "
    prefix_line = f"s3://{bucket}/data/bk/v2/ ({len(abandoned)} objects, {size(sum(abandoned.values()))}): bk@v2, not in the catalog, last written "

    # The default threshold, 24 hours: moto dates every upload 2010-11-10, so the upload is old; the abandoned push is not.
    status, out, err = cli("gc", "--dry-run", *places)
    assert status == 0, err
    lines = out.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"would abort {upload_line}") and lines[1] == "would free 1000 B (1 item)"
    assert lines[0].endswith("...), initiated 2010-11-10T20:48:33Z")
    # An upload younger than the threshold is kept: against 1,000,000 hours (114 years), 2010 is recent.
    status, out, err = cli("gc", "--dry-run", "--older-than", "1000000", *places)
    assert (status, out) == (0, f"nothing to remove under s3://{bucket}/data (uploads, unlisted versions and builds' job "
                                "records written in the last 1000000 hours are kept, and those of a build whose lease "
                                "is live)\n"), err

    status, out, err = cli("gc", "--dry-run", "--older-than", "0", *places)
    assert status == 0, err
    lines = out.splitlines()
    assert len(lines) == 3 and lines[0].startswith(f"would abort {upload_line}")
    assert lines[1].startswith(f"would delete {prefix_line}")
    assert lines[1].endswith(f"an abandoned push or build (its {CLAIM_NAME} would refuse a later push of bk@v2)")
    assert lines[2] == f"would free {size(sum(abandoned.values()) + 1000)} (2 items)"
    assert objects(s3, bucket, "data/bk/v2") == abandoned and uploads(bucket) == ["data/bk/v3/train-00000.bin", "elsewhere/big.bin"]

    status, out, err = cli("gc", "--older-than", "0", *places)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"aborted {upload_line}") and lines[1].startswith(f"deleted {prefix_line}")
    assert uploads(bucket) == ["elsewhere/big.bin"] and objects(s3, bucket, "data/bk/v2") == {}
    assert all(s3.fs().cat_file(key) == data for key, data in foreign.items())
    assert objects(s3, bucket, "data/bk/v1") == v1 and s3.fs().cat_file(f"{bucket}/catalog/bk.yaml") == catalog
    assert len(windows("bk@v1", bucket, tmp_path / "cache")) > 0
    status, out, err = cli("gc", "--older-than", "0", *places)
    assert (status, out) == (0, f"nothing to remove under s3://{bucket}/data (uploads, unlisted versions and builds' job "
                                "records written in the last 0 hours are kept, and those of a build whose lease is "
                                "live)\n")
    # Its claim gone, bk@v2 is pushed afresh.
    assert push_version("bk@v2", catalog=local / "catalog", **urls(bucket)).ref == "bk@v2"


def _interrupted_push(s3: S3Server, local: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A new bucket with ``bk@v1`` listed and ``bk@v2``'s push killed between its objects and its catalog entry."""
    bucket = new_bucket(s3, "resume")
    push_version("bk@v1", catalog=local / "catalog", **urls(bucket))
    with monkeypatch.context() as m:
        m.setattr("shardflow.bucket.push._commit", lambda *a, **k: (_ for _ in ()).throw(OSError("killed")))
        with pytest.raises(OSError, match="killed"):
            push_version("bk@v2", catalog=local / "catalog", **urls(bucket))
    return bucket


@pytest.mark.slow
def test_a_push_resumed_after_the_gc_threshold_is_not_taken_for_abandoned(s3, local, monkeypatch, tmp_path):
    import time

    from shardflow.bucket.push import finish_push, prepare_push, push_files

    import shardflow.bucket.lifecycle as lifecycle

    bucket = _interrupted_push(s3, local, monkeypatch)
    written = max(i["LastModified"] for i in s3.fs().find(f"{bucket}/data/bk/v2/", detail=True).values())
    time.sleep(1.1)  # S3 dates objects to the second: the rerun's renewal is dated after every object of the push
    # The rerun renews its claim as it starts: gc, with its threshold just after the push's objects (so before
    # the renewal), sees a push at work and keeps the prefix.
    plan = prepare_push("bk@v2", catalog=local / "catalog", **urls(bucket))
    with monkeypatch.context() as m:
        m.setattr(lifecycle, "_now", lambda: written + lifecycle._dt.timedelta(seconds=0.5))
        assert collect_bucket_garbage(**urls(bucket), older_than_hours=0) == []
    done = push_files(plan, plan.files)
    assert set(done) == {"skipped"}
    # gc a day later (its clock moved), between the rerun's files and its commit: it deletes them, and the rerun
    # then refuses to list a version whose objects are gone; its next run sends them again.
    real_now = lifecycle._now
    monkeypatch.setattr(lifecycle, "_now", lambda: real_now() + lifecycle._dt.timedelta(hours=48))
    assert [g.url for g in collect_bucket_garbage(**urls(bucket))] == [f"s3://{bucket}/data/bk/v2/"]
    with pytest.raises(CatalogError, match=rf"^s3://{bucket}/data/bk/v2/\S+ \(and \d+ more\): gone during the push "
                                           r"\(a shardflow gc or rm took it for abandoned\); nothing was listed: push again$"):
        finish_push(plan, done)
    assert [v["version"] for v in catalog_file(s3, bucket)["versions"]] == ["v1"]
    again = push_version("bk@v2", catalog=local / "catalog", **urls(bucket))
    assert again.uploaded + again.copied == len(plan.files) + 1 and not again.already
    assert len(windows("bk@v2", bucket, tmp_path / "cache")) > 0


@pytest.mark.slow
def test_gc_keeps_a_push_committed_after_it_read_the_catalog(s3, local, monkeypatch, tmp_path):
    import shardflow.bucket.lifecycle as lifecycle
    from shardflow.bucket.push import finish_push, prepare_push, push_files

    bucket = _interrupted_push(s3, local, monkeypatch)
    plan = prepare_push("bk@v2", catalog=local / "catalog", **urls(bucket))
    done = push_files(plan, plan.files)
    real_now, real_state = lifecycle._now, lifecycle._catalog_state
    committed = []

    def state_then_commit(*args):  # gc has listed the objects and read the catalog: the rerun commits now
        found = real_state(*args)
        if not committed:
            committed.append(finish_push(plan, done))
        return found

    monkeypatch.setattr(lifecycle, "_now", lambda: real_now() + lifecycle._dt.timedelta(hours=48))
    monkeypatch.setattr(lifecycle, "_catalog_state", state_then_commit)
    assert collect_bucket_garbage(**urls(bucket)) == []
    assert committed and [v["version"] for v in catalog_file(s3, bucket)["versions"]] == ["v1", "v2"]
    assert len(windows("bk@v2", bucket, tmp_path / "cache")) > 0


def test_gc_refuses_a_catalog_that_lists_nothing_under_the_data_root(s3):
    bucket = new_bucket(s3, "gcwrong")
    stage(s3, bucket, "../data/bk/v1")
    with pytest.raises(CatalogError, match=rf"^s3://{bucket}/other lists no version under s3://{bucket}/data, which "
                       r"holds versions \(bk@v1\); nothing is deleted: give the catalog they are listed in"):
        collect_bucket_garbage(data_root_url=f"s3://{bucket}/data", catalog_url=f"s3://{bucket}/other", older_than_hours=0)
    assert len(objects(s3, bucket, "data")) == 2


# --- refusals ---


def stage(s3: S3Server, bucket: str, path: str, *, manifest: bool = True) -> None:
    """A catalog file listing only ``bk@v1``, at ``path``, and two objects under ``data/bk/v1/`` (a manifest among
    them, with ``manifest``): what the refusals below need, without a build or a push."""
    entry = {"version": "v1", "path": path, "created_at": "2026-01-01T00:00:00Z", "build_key": "0" * 64, "parent": None,
             "totals": {}, "manifest_sha256": "", "files_sha256": ""}
    listed = {"schema_version": 1, "name": "bk", "latest": "v1", "versions": [entry]}
    fs = s3.fs()
    fs.pipe(f"{bucket}/catalog/bk.yaml", yaml.safe_dump(listed, sort_keys=False).encode())
    fs.pipe(f"{bucket}/data/bk/v1/{'metadata.yaml' if manifest else 'other.bin'}", b"m")
    fs.pipe(f"{bucket}/data/bk/v1/train.bin", b"t")


@pytest.mark.parametrize("path", ["../../elsewhere/bk/v1", "../data/bk/../../..", "..", ".", "/abs/bk/v1"])
def test_rm_refuses_an_entry_path_that_is_not_a_version_prefix_of_the_bucket(s3, path):
    """Leaving the bucket, the bucket's root, the catalog's own prefix, an absolute path: nothing is deleted."""
    bucket = new_bucket(s3, "rmpath")
    stage(s3, bucket, path)
    before = objects(s3, bucket, "")
    with pytest.raises(CatalogError, match=rf"^s3://{bucket}/catalog/bk.yaml: bk@v1 has the path '{re.escape(path)}', "
                       rf"which is not a version's prefix in the bucket {bucket} .*; nothing is deleted: fix the entry's path"):
        remove_bucket_version("bk@v1", catalog_url=f"s3://{bucket}/catalog")
    assert objects(s3, bucket, "") == before


def test_rm_refuses_a_prefix_without_a_manifest_and_an_unknown_version(s3):
    bucket = new_bucket(s3, "rmman")
    stage(s3, bucket, "../data/bk/v1", manifest=False)
    catalog = s3.fs().cat_file(f"{bucket}/catalog/bk.yaml")
    with pytest.raises(CatalogError, match=rf"^s3://{bucket}/data/bk/v1: the catalog places bk@v1 here, but it holds no "
                       r"metadata.yaml, so nothing is deleted"):
        remove_bucket_version("bk@v1", catalog_url=f"s3://{bucket}/catalog")
    assert s3.fs().cat_file(f"{bucket}/catalog/bk.yaml") == catalog  # refused before the commit
    assert len(objects(s3, bucket, "data/bk/v1")) == 2
    with pytest.raises(CatalogError, match=rf"^no version 'v7' of 'bk' in the catalog s3://{bucket}/catalog \(versions: v1\)$"):
        remove_bucket_version("bk@v7", catalog_url=f"s3://{bucket}/catalog")
    with pytest.raises(CatalogError, match=rf"^no dataset 'zz' in the catalog s3://{bucket}/catalog \(datasets: bk\)$"):
        remove_bucket_version("zz@v1", catalog_url=f"s3://{bucket}/catalog")
    with pytest.raises(ConfigError, match=r"^bk@latest: name the version to remove, NAME@vN"):
        remove_bucket_version("bk@latest", catalog_url=f"s3://{bucket}/catalog")


@pytest.mark.parametrize("args,env,message", [
    (("gc", "--data-root", "s3://b/data", "--catalog", "cat"), {},
     "--catalog cat: gc on a bucket needs both --data-root and --catalog on it, in one bucket"),
    (("gc", "--catalog", "s3://b/cat"), {}, "--data-root (unset): gc on a bucket needs both"),
    (("gc", "--catalog", "cat"), {"SHARDFLOW_DATA_ROOT": "s3://b/data"}, "--catalog cat: gc on a bucket needs both"),
    (("gc", "--data-root", "gs://b/data", "--catalog", "gs://b/cat"), {},
     "--data-root gs://b/data: give an s3:// URL, s3://BUCKET/PREFIX (other stores have no conditional writes"),
    (("gc", "--data-root", "s3://a/data", "--catalog", "s3://b/cat"), {},
     "--data-root and --catalog are in different buckets (a, b)"),
    (("gc", "--data-root", "s3://b/data", "--catalog", "s3://b/cat", "--older-than", "-1"), {},
     "--older-than -1: give 0 or more hours"),
    (("gc", "--older-than", "2"), {}, "--older-than 2: only gc on a bucket has an age threshold"),
    (("rm", "x@v1", "--catalog", "gs://b/cat"), {}, "--catalog gs://b/cat: give an s3:// URL"),
    (("rm", "x@v1"), {"SHARDFLOW_CATALOG": "gs://b/cat"}, "$SHARDFLOW_CATALOG gs://b/cat: give an s3:// URL"),
    (("card", "x@v1", "--catalog", "s3://b/cat"), {}, "--catalog s3://b/cat: a URL, but --catalog must be a local "
     "directory for this command (build, serve and push publish to a bucket, rm and gc remove from one, ls, validate, "
     "show and diff read one"),
])
def test_places_rm_and_gc_cannot_use_are_refused_in_one_line(cli, tmp_path, monkeypatch, args, env, message):
    monkeypatch.chdir(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    status, out, err = cli(*args)
    assert (status, out) == (2, "") and err.splitlines() == [err.strip()], err
    assert err.startswith(f"shardflow: error: {message}"), err
    assert list(tmp_path.iterdir()) == []  # no directory named s3: or gs:



# --- gc of what builds to the bucket leave: staging prefixes and leases ---

KEY = "ab" * 32  # a build key
WORK = "0123456789abcdef"  # a staging prefix's ID


def later(monkeypatch: pytest.MonkeyPatch, hours: float) -> None:
    """gc's clock ``hours`` ahead (its threshold counts from it); a lease's liveness is still read on the real clock."""
    import shardflow.bucket.lifecycle as lifecycle

    real_now = lifecycle._now
    monkeypatch.setattr(lifecycle, "_now", lambda: real_now() + lifecycle._dt.timedelta(hours=hours))


def target_of(bucket: str):
    from shardflow.bucket.layout import bucket_target

    return bucket_target(f"s3://{bucket}/data", f"s3://{bucket}/catalog")


def build_staging(s3: S3Server, bucket: str, *, version: str = "v2", build_key: str = KEY, work: str = WORK,
                  sends: bool = True) -> dict[str, int]:
    """A build's staging prefix ``data/bk/.staging/WORK/`` as a build on workers that share no filesystem leaves it
    (with ``sends``, its ``sends.json`` naming ``bk@version`` and ``build_key``); returns its ``{key: size}``."""
    from shardflow.bucket.remote_jobs import Sends

    prefix = f"{bucket}/data/bk/.staging/{work}"
    files = {f"{prefix}/parts/unit-000000.json": b"{}", f"{prefix}/parts/unit-000000.docs.npy": b"d" * 64,
             f"{prefix}/parts/unit-000000/train-0.bin": b"t" * 1000}
    if sends:
        record = Sends(version=version, version_url=f"s3://{bucket}/data/bk/{version}", staging_url=f"s3://{prefix}",
                       target=target_of(bucket), catalog_url=f"s3://{bucket}/catalog", build_key=build_key)
        files[f"{prefix}/sends.json"] = json.dumps(record.to_dict(), sort_keys=True).encode()
    s3.fs().pipe(files)
    return objects(s3, bucket, f"data/bk/.staging/{work}")


def put_lease(s3: S3Server, bucket: str, *, expires_in: float, build_key: str = KEY) -> str:
    """The lease of ``build_key`` as its holder left it, expiring ``expires_in`` seconds from now; returns its key."""
    from shardflow.bucket.lease import LeaseRecord, lease_key

    now = time.time()
    record = LeaseRecord(name="bk", build_key=build_key, host="node-7", pid=4242, token="f" * 16,
                         acquired_at=now - 7200, expires_at=now + expires_in, ttl=60.0, renewals=3)
    key = f"{bucket}/{lease_key(target_of(bucket), 'bk', build_key)}"
    s3.fs().pipe(key, record.to_bytes())
    return key


def test_gc_deletes_the_staging_of_a_published_version_whatever_its_age(s3):
    bucket = new_bucket(s3, "gcpub")
    stage(s3, bucket, "../data/bk/v1")  # bk@v1 listed
    staged = build_staging(s3, bucket, version="v1")
    other = build_staging(s3, bucket, version="v2", work="fedcba9876543210")  # bk@v2 not listed: a build at work
    found = collect_bucket_garbage(**urls(bucket))  # the default threshold, 24 hours: the prefix is seconds old
    assert [(g.url, g.why, g.objects, g.bytes) for g in found] == [
        (f"s3://{bucket}/data/bk/.staging/{WORK}/", "bk@v1's staging, a build's job records, its version published",
         len(staged), sum(staged.values()))]
    assert objects(s3, bucket, f"data/bk/.staging/{WORK}") == {}
    assert objects(s3, bucket, "data/bk/.staging/fedcba9876543210") == other
    assert len(objects(s3, bucket, "data/bk/v1")) == 2


def test_gc_deletes_an_abandoned_builds_staging_once_old_and_its_lease_expired(s3, monkeypatch):
    bucket = new_bucket(s3, "gcabandon")
    stage(s3, bucket, "../data/bk/v1")
    staged = build_staging(s3, bucket)  # bk@v2's build, never published
    put_lease(s3, bucket, expires_in=-60)  # its holder crashed a minute ago
    assert collect_bucket_garbage(**urls(bucket)) == []  # younger than the threshold
    later(monkeypatch, 25)
    found = collect_bucket_garbage(**urls(bucket))
    assert [g.url for g in found] == [f"s3://{bucket}/data/bk/.staging/{WORK}/",
                                      f"s3://{bucket}/data/bk/.leases/{KEY}.json"]
    assert (found[0].objects, found[0].bytes) == (len(staged), sum(staged.values()))
    assert re.fullmatch(rf"abandoned build of bk \(build key {KEY[:16]}\), last written \S+Z: its job records "
                        r"\(a rerun of it redoes its jobs\)", found[0].why), found[0].why
    assert objects(s3, bucket, "data/bk/.staging") == {} and objects(s3, bucket, "data/bk/.leases") == {}
    assert len(objects(s3, bucket, "data/bk/v1")) == 2


def test_gc_judges_a_staging_prefix_without_sends_json_by_its_age_alone(s3, monkeypatch):
    bucket = new_bucket(s3, "gcnosends")
    stage(s3, bucket, "../data/bk/v1")
    staged = build_staging(s3, bucket, sends=False)
    s3.fs().pipe(f"{bucket}/data/bk/.staging/not-a-work-id/x.json", b"{}")  # not a build's prefix: never touched
    assert collect_bucket_garbage(**urls(bucket)) == []
    later(monkeypatch, 25)
    found = collect_bucket_garbage(**urls(bucket))
    assert [(g.url, g.objects) for g in found] == [(f"s3://{bucket}/data/bk/.staging/{WORK}/", len(staged))]
    assert found[0].why.startswith("abandoned build of bk, last written ")
    assert list(objects(s3, bucket, "data/bk/.staging")) == [f"{bucket}/data/bk/.staging/not-a-work-id/x.json"]


def test_gc_deletes_a_crashed_builds_lease_never_a_live_one(s3, monkeypatch):
    bucket = new_bucket(s3, "gclease")
    stage(s3, bucket, "../data/bk/v1")
    crashed = put_lease(s3, bucket, expires_in=-48 * 3600, build_key="1" * 64)
    recent = put_lease(s3, bucket, expires_in=-3600, build_key="2" * 64)  # ended an hour ago: within the threshold
    live = put_lease(s3, bucket, expires_in=600, build_key="3" * 64)
    size = len(s3.fs().cat_file(crashed))
    found = collect_bucket_garbage(**urls(bucket))
    assert [(g.url, g.objects, g.bytes) for g in found] == [(f"s3://{crashed}", 1, size)]
    assert re.fullmatch(rf"lease of a build that ended \S+Z \(bk, build key {'1' * 16}, held by host node-7 "
                        r"\(pid 4242\) since \S+Z\)", found[0].why), found[0].why
    assert sorted(objects(s3, bucket, "data/bk/.leases")) == sorted([recent, live])
    later(monkeypatch, 48)  # the live one stays live, whatever gc's threshold: a taker reads it on its own clock
    assert [g.url for g in collect_bucket_garbage(**urls(bucket), older_than_hours=0)] == [f"s3://{recent}"]
    assert list(objects(s3, bucket, "data/bk/.leases")) == [live]


def test_a_live_lease_keeps_its_staging_prefix(s3, monkeypatch):
    from shardflow.bucket.lease import Lease

    bucket = new_bucket(s3, "gclive")
    stage(s3, bucket, "../data/bk/v1")
    staged = build_staging(s3, bucket)
    later(monkeypatch, 48)  # every object of the build is old to gc: only its lease says it runs
    lease = Lease.acquire(target_of(bucket), "bk", KEY, ttl=60)
    assert lease is not None
    try:
        assert collect_bucket_garbage(**urls(bucket), older_than_hours=0) == []
        assert objects(s3, bucket, f"data/bk/.staging/{WORK}") == staged
    finally:
        lease.release()  # the build ends without publishing: its lease goes, its staging is abandoned
    assert [g.url for g in collect_bucket_garbage(**urls(bucket))] == [f"s3://{bucket}/data/bk/.staging/{WORK}/"]


def test_gc_dry_run_deletes_nothing_of_what_builds_leave(s3, cli, monkeypatch):
    bucket = new_bucket(s3, "gcdry")
    stage(s3, bucket, "../data/bk/v1")
    published = build_staging(s3, bucket, version="v1", work="1" * 16)
    abandoned = build_staging(s3, bucket, work="2" * 16)
    lease = put_lease(s3, bucket, expires_in=-60)
    before = objects(s3, bucket, "")
    later(monkeypatch, 25)
    places = ("--data-root", f"s3://{bucket}/data", "--catalog", f"s3://{bucket}/catalog")
    status, out, err = cli("gc", "--dry-run", *places)
    assert status == 0, err
    lines = out.splitlines()
    assert [line.split(" (")[0] for line in lines[:3]] == [
        f"would delete s3://{bucket}/data/bk/.staging/{'1' * 16}/", f"would delete s3://{bucket}/data/bk/.staging/{'2' * 16}/",
        f"would delete s3://{lease}"]
    assert lines[0].endswith("bk@v1's staging, a build's job records, its version published")
    assert ": abandoned build of bk (build key " in lines[1] and ": lease of a build that ended " in lines[2]
    freed = sum(published.values()) + sum(abandoned.values()) + before[lease]
    assert lines[3:] == [f"would free {size(freed)} (3 items)"]
    assert objects(s3, bucket, "") == before
    status, out, err = cli("gc", *places)
    assert status == 0 and out.splitlines()[-1] == f"freed {size(freed)} (3 items)", err
    assert objects(s3, bucket, "") == {k: v for k, v in before.items() if "/.staging/" not in k and "/.leases/" not in k}


def test_gc_looks_again_before_deleting_a_builds_leftovers(s3, monkeypatch):
    """A build that takes its expired lease over after gc judged its staging prefix abandoned keeps it, and a lease
    renewed after gc read it is not deleted (its ETag changed)."""
    import shardflow.bucket.leftovers as leftovers
    from shardflow.bucket.lease import Lease

    bucket = new_bucket(s3, "gcagain")
    stage(s3, bucket, "../data/bk/v1")
    staged = build_staging(s3, bucket)
    lease_object = put_lease(s3, bucket, expires_in=-48 * 3600)
    other = put_lease(s3, bucket, expires_in=-48 * 3600, build_key="9" * 64)
    later(monkeypatch, 25)
    real_list, real_read = leftovers.list_objects, leftovers.read_with_etag
    taken: list[Lease] = []

    def take_over_then_list(fs, root):  # gc looks again before deleting: the build has come back meanwhile
        if not taken:
            taken.append(Lease.acquire(target_of(bucket), "bk", KEY, ttl=600))
        return real_list(fs, root)

    def read_then_renew(url):  # gc has read the other lease: a build takes it over and renews it
        got = real_read(url)
        if url == f"s3://{other}" and got is not None:
            s3.fs().pipe(other, got[0].replace(b'"renewals": 3', b'"renewals": 4'))
        return got

    monkeypatch.setattr(leftovers, "list_objects", take_over_then_list)
    monkeypatch.setattr(leftovers, "read_with_etag", read_then_renew)
    try:
        assert collect_bucket_garbage(**urls(bucket)) == []
        assert taken and taken[0] is not None
        assert objects(s3, bucket, f"data/bk/.staging/{WORK}") == staged
        assert sorted(objects(s3, bucket, "data/bk/.leases")) == sorted([lease_object, other])
    finally:
        taken[0].release()
