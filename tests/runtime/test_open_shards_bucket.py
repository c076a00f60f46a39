"""``open_shards`` on a version in a bucket (moto's S3 server on loopback): a catalog ref or a version URL.

A version is built locally from ``tests/assets/sample.parquet`` and its version
directory and catalog are uploaded as they are (relative paths kept). What these
show: from a fresh process with an empty cache, ``open_shards("NAME@v1",
catalog="s3://...")`` and the version URL give the local version's vocabulary,
shards and tokens; opening fetches the manifest and no shard (the cache holds
none, and the store saw no GET of one), and reading a shard fetches that shard
alone; a missing dataset, version or version URL is one clear message.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import textwrap
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs", reason="object storage needs the optional extra: pip install 'shardflow[s3]'")
pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")

from support.paths import PYTHON, SAMPLE  # noqa: E402
from support.s3 import CountingProxy, S3Server, s3_fixture, upload_tree as upload  # noqa: E402
from shardflow.config import BuildConfig  # noqa: E402
from shardflow.errors import CatalogError, ConfigError, InputError, ShardflowError  # noqa: E402
from shardflow.manifest import read_manifest  # noqa: E402
from shardflow.pipeline import build  # noqa: E402
from shardflow.runtime import open_shards  # noqa: E402
from shardflow.runtime.remote import RemoteShardSet  # noqa: E402

s3 = s3_fixture("module")


@dataclass(frozen=True)
class Bucketed:
    """bk@v1 built locally and uploaded: its local directory, and the URLs of the version and the catalog."""

    version_dir: Path
    bucket: str
    version_url: str
    catalog_url: str

    def entries(self, split: str = "train") -> list:
        return list(read_manifest(self.version_dir).splits[split].shards)


@pytest.fixture(scope="module")
def bucketed(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Bucketed:
    """bk@v1: the sample's ~148k tokens in 20,000-token shards (train and val), in a new bucket."""
    base = tmp_path_factory.mktemp("open-shards-bucket")
    result = build(BuildConfig(name="bk", sources=(str(SAMPLE),), shard_tokens=20_000, val_fraction=0.1),
                   data_root=base / "data", catalog=base / "catalog")
    bucket = f"osb-{uuid.uuid4().hex[:10]}"
    s3.fs().mkdir(bucket)
    upload(s3, base / "data" / "bk", f"{bucket}/pre/data/bk")
    upload(s3, base / "catalog", f"{bucket}/pre/catalog")
    return Bucketed(
        version_dir=Path(result.manifest_path).parent,
        bucket=bucket,
        version_url=f"s3://{bucket}/pre/data/bk/v1",
        catalog_url=f"s3://{bucket}/pre/catalog",
    )


def digest(a: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()


# Opens the reference, lists the shards the cache holds, reads shard 0, lists them again.
FRESH = textwrap.dedent(
    """
    import hashlib, json, sys
    from pathlib import Path
    from shardflow.runtime import open_shards
    ref, catalog, cache = sys.argv[1], sys.argv[2] or None, Path(sys.argv[3])
    cached = lambda: sorted(p.name for p in cache.rglob("*.bin"))
    shards = open_shards(ref, catalog=catalog)
    report = {"type": type(shards).__name__, "vocab_size": shards.vocab_size, "num_shards": shards.num_shards,
              "num_tokens": shards.num_tokens, "dtype": shards.dtype.name, "after_open": cached()}
    report["shard0"] = hashlib.sha256(shards.shard(0).tobytes()).hexdigest()
    report["after_read"] = cached()
    print(json.dumps(report))
    """
)


@pytest.mark.parametrize("form", ["catalog", "url"])
def test_a_fresh_process_opens_a_bucket_version_and_fetches_a_shard_only_when_read(bucketed, s3, tmp_path, form):
    local = open_shards(bucketed.version_dir)
    entries = bucketed.entries()
    ref, catalog = ("bk@v1", bucketed.catalog_url) if form == "catalog" else (bucketed.version_url, "")
    cache = tmp_path / "node-cache"  # $SHARDFLOW_CACHE, empty
    proxy = CountingProxy(s3.endpoint)
    env = {**os.environ, **s3.env, "AWS_ENDPOINT_URL": proxy.endpoint, "SHARDFLOW_CACHE": str(cache)}
    try:
        out = subprocess.run([PYTHON, "-c", FRESH, ref, catalog, str(cache)], env=env, capture_output=True, text=True,
                             timeout=120)
    finally:
        proxy.close()
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout.strip().splitlines()[-1])
    assert report["type"] == "RemoteShardSet"
    assert report["vocab_size"] == local.vocab_size and local.vocab_size is not None
    assert (report["num_shards"], report["num_tokens"], report["dtype"]) == (local.num_shards, local.num_tokens, local.dtype.name)
    assert report["num_shards"] == len(entries) > 3
    assert report["shard0"] == digest(local.shard(0))
    assert report["after_open"] == []  # opening read the manifest, no shard
    assert report["after_read"] == [Path(entries[0].file).name]  # reading shard 0 fetched it alone
    root = f"{bucketed.bucket}/pre/data/bk/v1"
    assert proxy.bytes_asked(f"{root}/metadata.yaml", 1) > 0
    assert proxy.bytes_asked(f"{root}/{entries[0].file}", entries[0].bytes) == entries[0].bytes
    for e in entries[1:]:
        assert proxy.bytes_asked(f"{root}/{e.file}", e.bytes) == 0, e.file
    for e in entries:  # reading tokens needs no index
        assert proxy.bytes_asked(f"{root}/{e.index.file}", e.index.bytes) == 0, e.index.file


@pytest.mark.parametrize("form", ["catalog", "url"])
def test_a_bucket_version_reads_as_the_local_one(bucketed, tmp_path, form):
    ref, catalog = ("bk@latest", bucketed.catalog_url) if form == "catalog" else (bucketed.version_url + "/metadata.yaml", None)
    for split in ("train", "val"):
        local = open_shards(bucketed.version_dir, split=split)
        remote = open_shards(ref, catalog=catalog, split=split, cache_dir=tmp_path, verify=True)
        assert isinstance(remote, RemoteShardSet)
        assert not list(tmp_path.rglob(f"*_{split}_*.bin"))  # nothing of the split fetched at open
        assert (remote.name, remote.vocab_size, remote.fingerprint) == (local.name, local.vocab_size, local.fingerprint)
        assert remote.boundary_token == local.boundary_token and np.array_equal(remote.offsets, local.offsets)
        for k in range(local.num_shards):
            assert np.array_equal(remote.shard(k), local.shard(k))
            assert np.array_equal(remote.doc_starts(k), local.doc_starts(k))  # its .bos.idx fetched on demand
        assert np.array_equal(remote.read(0, remote.num_tokens), local.read(0, local.num_tokens))
        mid = local.offsets[1] - 5  # across a shard boundary
        assert np.array_equal(remote.read(mid, mid + 10), local.read(mid, mid + 10))


def test_a_missing_dataset_version_or_url_is_one_clear_error(bucketed, tmp_path):
    with pytest.raises(CatalogError, match=r"no version 'v9' of 'bk' in the catalog s3://.*\(versions: v1\)"):
        open_shards("bk@v9", catalog=bucketed.catalog_url, cache_dir=tmp_path)
    with pytest.raises(CatalogError, match=r"no dataset 'nope' in the catalog s3://.*\(datasets: bk\)"):
        open_shards("nope@latest", catalog=bucketed.catalog_url, cache_dir=tmp_path)
    missing = f"s3://{bucketed.bucket}/pre/data/bk/v7"
    with pytest.raises(InputError, match=rf"^{missing}/metadata.yaml: no such object"):
        open_shards(missing, cache_dir=tmp_path)
    with pytest.raises(KeyError, match="no split 'test'"):
        open_shards(bucketed.version_url, split="test", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="dtype is for plain directories of shards; s3://.* is a published version"):
        open_shards(bucketed.version_url, dtype="uint16", cache_dir=tmp_path)
    with pytest.raises(ConfigError, match="cache_dir is for versions on object storage"):
        open_shards(bucketed.version_dir, cache_dir=tmp_path)
    assert issubclass(CatalogError, ShardflowError) and issubclass(InputError, ShardflowError)
