"""A version on a bucket is trusted for its bytes, not for what a cache or a catalog entry remembers of them.

``shardflow validate`` of a bucket version reads every object from the bucket again and hashes it, so an object
damaged after a first validate filled the cache fails the next one, naming the object and the command that
repairs it; ``shardflow push NAME@vN --repair`` checks the objects by content (a plain push says "already
pushed", a build "nothing new") and restores the damaged ones from verified local copies, after which a reader
with an empty cache reads the version. The version is the reliability suite's sample (``published``), pushed to
moto's S3 server on loopback.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs", reason="object storage needs the optional extra: pip install 'shardflow[s3]'")
pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")

from support.cli import run_main  # noqa: E402
from support.s3 import S3Server, new_bucket, s3_fixture  # noqa: E402
from shardflow.bucket.push import push_version  # noqa: E402
from shardflow.manifest import read_manifest  # noqa: E402
from shardflow.manifest_files import named_files  # noqa: E402
from shardflow.runtime import TokenDataset  # noqa: E402

NAME = "trust"
SEQ = 128

s3 = s3_fixture("module")


@pytest.fixture
def pushed(published: Path, s3: S3Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """``trust@v1`` pushed to a new bucket: ``(its catalog URL, the local version directory)``; the runtime cache
    and the scratch in this test's directory."""
    bucket = new_bucket(s3, "trust")
    monkeypatch.setenv("SHARDFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SHARDFLOW_SCRATCH", str(tmp_path / "scratch"))
    push_version(f"{NAME}@v1", catalog=published / "catalog", data_root_url=f"s3://{bucket}/data",
                 catalog_url=f"s3://{bucket}/catalog")
    return f"s3://{bucket}/catalog", published / "data" / NAME / "v1"


def shard_object(catalog_url: str, k: int = 0) -> str:
    """The key of the version's ``k``-th train shard in the bucket (``bucket/data/trust/v1/train/...``)."""
    return f"{catalog_url[5:].rsplit('/', 1)[0]}/data/{NAME}/v1/train/{NAME}_train_{k:06d}.bin"


def flip(s3: S3Server, key: str, at: int = -1) -> None:
    """One byte of the object changed, its size kept (and the sha256 metadata of its upload dropped, as any write does)."""
    fs = s3.fs()
    data = bytearray(fs.cat_file(key))
    data[at] ^= 0xFF
    fs.pipe_file(key, bytes(data))


def windows(ds: TokenDataset) -> np.ndarray:
    return np.stack([ds.window(i) for i in range(len(ds))])


def test_validate_reads_the_bucket_not_the_cache_and_checks_files_in_parallel(pushed, s3, tmp_path, monkeypatch):
    catalog_url, local = pushed
    manifest = read_manifest(local)
    files, shards = len({f.name for f in named_files(manifest)}), sum(len(s.shards) for s in manifest.splits.values())
    monkeypatch.setenv("SHARDFLOW_PROGRESS_INTERVAL", "0")  # a line per file: what a long run prints, throttled
    rc, out, err = run_main("validate", f"{NAME}@v1", "--catalog", catalog_url, "--workers", "2")
    assert rc == 0 and out.startswith(f"OK {NAME}@v1: "), err
    lines = err.splitlines()
    assert lines[0].startswith(f"shardflow: validate {NAME}@v1: fetched 1 of {files} files (") and len(lines) == files + shards
    assert lines[-1].startswith(f"shardflow: validate {NAME}@v1: checked {shards} of {shards} shards ("), err
    monkeypatch.delenv("SHARDFLOW_PROGRESS_INTERVAL")
    rc, _, err = run_main("validate", str(local), "--catalog", str(local.parents[2] / "catalog"), "--workers", "3")
    assert (rc, err) == (0, ""), err  # a local version too; a short run prints no progress

    key = shard_object(catalog_url)
    flip(s3, key)  # after the first validate filled the cache with the good bytes
    rc, out, err = run_main("validate", f"{NAME}@v1", "--catalog", catalog_url)
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"shardflow: error: s3://{key}: SHA-256 ") and "(fetched twice)" in err, err
    assert f"shardflow push {NAME}@v1 --repair --catalog {catalog_url} (the catalog that lists it" in err, err
    # The cache kept its verified copy: the bucket's bytes replace it only once they verify.
    cached = next((tmp_path / "cache").rglob(Path(key).name))
    assert cached.read_bytes() == (local / "train" / Path(key).name).read_bytes()


def test_push_repair_restores_damaged_objects_from_verified_copies(pushed, s3, tmp_path, monkeypatch):
    catalog_url, local = pushed
    url = f"{catalog_url.rsplit('/', 1)[0]}/data/{NAME}/v1"
    assert run_main("validate", f"{NAME}@v1", "--catalog", catalog_url).status == 0  # the cache filled
    first, second = shard_object(catalog_url, 0), shard_object(catalog_url, 1)
    index = second.replace(".bin", ".bos.idx")
    flip(s3, first)
    s3.fs().rm(index)
    # A push compares the catalog entry only: "already pushed", the objects left as they are.
    rc, out, _ = run_main("push", f"{NAME}@v1", "--catalog", str(local.parents[2] / "catalog"),
                          "--data-root-url", f"{catalog_url.rsplit('/', 1)[0]}/data", "--catalog-url", catalog_url)
    assert rc == 0 and out.startswith(f"{NAME}@v1 was already pushed"), out

    rc, out, err = run_main("push", f"{NAME}@v1", "--repair", "--catalog", catalog_url, "--workers", "3")
    assert rc == 0, err
    cache = str(tmp_path / "cache" / "versions")  # the copies validate verified
    lines = out.splitlines()
    assert lines[0] == f"repaired {NAME}@v1 ({url}/): 2 of {len({f.name for f in named_files(read_manifest(local))}) + 1} " \
                       "objects restored", out
    assert re.fullmatch(rf"  train/{NAME}_train_000000\.bin: SHA-256 [0-9a-f]{{16}}\.\.\., but the manifest says "
                        rf"[0-9a-f]{{16}}\.\.\.; sent again from {re.escape(cache)}/.*/train/{NAME}_train_000000\.bin",
                        lines[1]), out
    assert re.fullmatch(rf"  train/{NAME}_train_000001\.bos\.idx: missing; sent again from {re.escape(cache)}/.*", lines[2]), out
    # A reader with an empty cache reads the version; another repair finds nothing to do.
    remote = TokenDataset(f"{NAME}@v1", catalog=catalog_url, seq_len=SEQ, cache_dir=tmp_path / "fresh")
    assert np.array_equal(windows(remote), windows(TokenDataset(local, seq_len=SEQ)))
    assert run_main("push", f"{NAME}@v1", "--repair", "--catalog", catalog_url).out.endswith("nothing to repair\n")

    # Where this machine has no verified copy (another cache, another scratch): one line saying how to make one.
    flip(s3, first, at=100)
    monkeypatch.setenv("SHARDFLOW_CACHE", str(tmp_path / "other-cache"))
    elsewhere = ["--catalog", catalog_url, "--scratch", str(tmp_path / "other-scratch")]
    rc, out, err = run_main("push", f"{NAME}@v1", "--repair", *elsewhere)
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"shardflow: error: s3://{first}: SHA-256 ") and "no verified copy of it here" in err, err
    assert "run this again with --from DIR: build the version's sources again" in err, err
    # A damaged manifest too (checked against the catalog entry): both restored from a copy given with --from.
    manifest_key = f"{url[5:]}/metadata.yaml"
    s3.fs().pipe_file(manifest_key, s3.fs().cat_file(manifest_key) + b"# changed\n")
    rc, out, err = run_main("push", f"{NAME}@v1", "--repair", *elsewhere, "--from", str(local))
    assert rc == 0, err
    assert [line.split(":")[0] for line in out.splitlines()] == [
        f"repaired {NAME}@v1 (s3", f"  train/{NAME}_train_000000.bin", "  metadata.yaml"], out
    assert out.rstrip().endswith(f"sent again from {local / 'metadata.yaml'}")
    # A build to the bucket keeps its version in the scratch mirror, <scratch>/<bucket>/<data root>/NAME/vN.
    flip(s3, first, at=200)
    shutil.copytree(local, tmp_path / "other-scratch" / url[5:])
    rc, out, err = run_main("push", f"{NAME}@v1", "--repair", *elsewhere)
    assert rc == 0 and out.rstrip().endswith(str(tmp_path / "other-scratch" / first)), (out, err)
    assert run_main("validate", f"{NAME}@v1", "--catalog", catalog_url).status == 0
