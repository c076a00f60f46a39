"""``shardflow build --data-root s3://B/data --catalog s3://B/catalog``: versions built for, and published to, a bucket.

The bucket is moto's S3 server on loopback; every build is the command users
run (``--no-prefect`` here: tests/flows/test_bucket_build_cluster.py runs the
flow on a Dask cluster). What these show: the version reads back from the
bucket, in a fresh cache, as the same build on a local data root; version names
follow the bucket's catalog whichever scratch directory builds, and a fresh
scratch fetches the parent (verified) rather than tokenizing its inputs again; a build killed
between its shard uploads and its manifest shows nothing, and its rerun resumes;
of two builds that both took one version name, the bucket lists one, and the
other's rerun publishes the next; half-bucket places are refused in one line.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

pytest.importorskip("s3fs", reason="object storage needs the optional extra: pip install 'shardflow[s3]'")
pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")

from support.paths import SAMPLE  # noqa: E402
from support.s3 import S3Server, new_bucket, s3_fixture  # noqa: E402
from shardflow.errors import ShardflowError  # noqa: E402
from shardflow.runtime import TokenDataset  # noqa: E402

SHARDFLOW = [sys.executable, "-m", "shardflow", "build"]
OPTIONS = ["--name", "bk", "--shard-tokens", "20000", "--val-fraction", "0.1", "--no-prefect", "--progress", "none"]

s3 = s3_fixture("module")


@pytest.fixture
def bucket(s3: S3Server) -> str:
    return new_bucket(s3, "build")


@pytest.fixture(scope="module")
def halves(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The sample corpus as two Parquet inputs (rows 0-29, 30-60)."""
    out = tmp_path_factory.mktemp("halves")
    table = pq.read_table(SAMPLE)
    paths = [out / "a.parquet", out / "b.parquet"]
    pq.write_table(table.slice(0, 30), paths[0])
    pq.write_table(table.slice(30), paths[1])
    return paths


def _write_plain(path: Path, table: pa.Table) -> None:
    """Parquet whose size depends only on its text's lengths: no compression, dictionary or statistics."""
    pq.write_table(table, path, compression="none", use_dictionary=False, write_statistics=False)


def _one_letter_changed(table: pa.Table) -> pa.Table:
    """``table`` with one ASCII letter of its last document's text swapped for another (the same length)."""
    texts = table.column("text").to_pylist()
    last = texts[-1]
    k = next(i for i in range(len(last) // 2, len(last)) if last[i].isascii() and last[i].isalpha())
    texts[-1] = last[:k] + ("x" if last[k] != "x" else "y") + last[k + 1:]
    return table.set_column(table.schema.get_field_index("text"), "text", pa.array(texts, pa.string()))


def shardflow(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SHARDFLOW, *args], cwd=cwd, env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=300)


def to_bucket(bucket: str, scratch: Path) -> list[str]:
    return ["--data-root", f"s3://{bucket}/data", "--catalog", f"s3://{bucket}/catalog", "--scratch", str(scratch)]


def windows(ds: TokenDataset) -> np.ndarray:
    return np.stack([ds.window(i) for i in range(len(ds))])


def bucket_catalog(s3: S3Server, bucket: str) -> dict:
    return yaml.safe_load(s3.fs().cat_file(f"{bucket}/catalog/bk.yaml"))


@pytest.mark.slow
def test_a_build_to_a_bucket_reads_back_as_the_same_build_on_local_disk(s3, bucket, halves, tmp_path):
    res = shardflow([*map(str, halves), *OPTIONS, *to_bucket(bucket, tmp_path / "scratch")], tmp_path)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [f"published bk@v1 to s3://{bucket}/data/bk/v1", f"s3://{bucket}/data/bk/v1/metadata.yaml"]
    assert not (tmp_path / "s3:").exists()
    local = shardflow([*map(str, halves), *OPTIONS, "--data-root", "data", "--catalog", "cat"], tmp_path)
    assert local.returncode == 0, local.stderr
    local_dir = Path(local.stdout.splitlines()[-1]).parent
    for split, seq in (("train", 128), ("val", 32)):
        remote = TokenDataset("bk@v1", catalog=f"s3://{bucket}/catalog", split=split, seq_len=seq,
                              cache_dir=tmp_path / f"cache-{split}")
        assert np.array_equal(windows(remote), windows(TokenDataset(local_dir, split=split, seq_len=seq)))
    # Built again from another machine's (empty) scratch: the bucket's catalog knows it.
    again = shardflow([*map(str, halves), *OPTIONS, *to_bucket(bucket, tmp_path / "other")], tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[0] == f"nothing new: bk@v1 is identical at s3://{bucket}/data/bk/v1"
    assert [v["version"] for v in bucket_catalog(s3, bucket)["versions"]] == ["v1"]
    ls = subprocess.run([*SHARDFLOW[:-1], "ls", "bk", "--catalog", f"s3://{bucket}/catalog"], capture_output=True,
                        text=True, timeout=60)
    assert ls.returncode == 0 and ls.stdout.startswith("* bk@v1\t"), ls.stderr
    assert ls.stdout.rstrip().endswith(f"\tparent -\ts3://{bucket}/data/bk/v1")


@pytest.mark.slow
def test_validate_reads_a_bucket_version_back_and_names_a_damaged_object(s3, bucket, halves, tmp_path):
    res = shardflow([*map(str, halves), *OPTIONS, *to_bucket(bucket, tmp_path / "scratch")], tmp_path)
    assert res.returncode == 0, res.stderr

    def validate(*args: str, cache: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*SHARDFLOW[:-1], "validate", *args], cwd=tmp_path, capture_output=True, text=True,
                              env={**os.environ, "SHARDFLOW_CACHE": str(tmp_path / cache)}, timeout=120)

    ok = validate("bk@v1", "--catalog", f"s3://{bucket}/catalog", cache="c1")
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.startswith("OK bk@v1: ") and f"  path:          s3://{bucket}/data/bk/v1\n" in ok.stdout
    assert validate(f"s3://{bucket}/data/bk/v1", cache="c1").returncode == 0  # by URL, from the verified cache
    fs = s3.fs()
    shard = sorted(p for p in fs.find(f"{bucket}/data/bk/v1/") if p.endswith(".bin"))[0]
    data = bytearray(fs.cat_file(shard))
    data[-1] ^= 0xFF  # one token changed, the size kept
    fs.pipe_file(shard, bytes(data))
    bad = validate("bk@v1", "--catalog", f"s3://{bucket}/catalog", cache="c2")
    assert bad.returncode == 2 and bad.stdout == "" and bad.stderr.count("\n") == 1, bad.stderr
    assert bad.stderr.startswith(f"shardflow: error: s3://{shard}: SHA-256 ") and "(fetched twice)" in bad.stderr


@pytest.mark.slow
def test_version_names_follow_the_bucket_and_a_parent_from_any_machine_is_reused(s3, bucket, halves, tmp_path):
    first = shardflow([str(halves[0]), *OPTIONS, *to_bucket(bucket, tmp_path / "a")], tmp_path)
    assert first.returncode == 0, first.stderr
    # Another scratch, without bk@v1's files (a fresh machine): v1 is fetched into it, verified, so version v2
    # tokenizes only the new input, and v1's shards are copied within the bucket, not sent.
    fs = s3.fs()
    v1_shards = {p.rpartition("/")[2]: fs.info(p)["ETag"] for p in fs.find(f"{bucket}/data/bk/v1/train/") if p.endswith(".bin")}
    second = shardflow([*map(str, halves), *OPTIONS, *to_bucket(bucket, tmp_path / "b")], tmp_path)
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines()[0] == f"published bk@v2 to s3://{bucket}/data/bk/v2"
    assert second.stderr == "" and not list((tmp_path / "b").rglob(".fetch-*"))  # (no "not reusing bk@v1" line)
    v2 = yaml.safe_load(fs.cat_file(f"{bucket}/data/bk/v2/metadata.yaml"))
    assert v2["reuse"]["parent"] == "bk@v1" and v2["reuse"]["tokenized_inputs"] == ["b.parquet"]
    assert v2["reuse"]["reused_inputs"] == ["a.parquet"] and v2["reuse"]["linked_shards"] == len(v1_shards) > 0
    v2_shards = {p.rpartition("/")[2]: fs.info(p)["ETag"] for p in fs.find(f"{bucket}/data/bk/v2/train/") if p.endswith(".bin")}
    assert {n: e for n, e in v2_shards.items() if n in v1_shards} == v1_shards  # the same objects' bytes
    # The same build from a third fresh scratch: the bucket lists it, nothing is fetched or built.
    again = shardflow([*map(str, halves), *OPTIONS, *to_bucket(bucket, tmp_path / "c")], tmp_path)
    assert again.returncode == 0 and again.stdout.startswith("nothing new: bk@v2"), again.stderr
    assert not list((tmp_path / "c").rglob("*.bin"))  # the inputs v2 lists: v2 is not fetched
    # The second scratch has v2's files: its next build is incremental (v2's shards hard-linked there).
    c = halves[0].parent / "c.parquet"
    _write_plain(c, pq.read_table(halves[1]))
    third = shardflow([*map(str, halves), str(halves[0].parent / "c.parquet"), *OPTIONS, *to_bucket(bucket, tmp_path / "b")],
                      tmp_path)
    assert third.returncode == 0, third.stderr
    assert third.stdout.splitlines()[0] == f"published bk@v3 to s3://{bucket}/data/bk/v3"
    assert "not reusing" not in third.stderr
    listed = bucket_catalog(s3, bucket)
    assert [v["version"] for v in listed["versions"]] == ["v1", "v2", "v3"] and listed["latest"] == "v3"
    assert listed["versions"][2]["parent"] == "bk@v2"
    # An input changed within its size, from a fresh scratch: compared by content, v3 is fetched and the changed
    # input alone is tokenized.
    changed = _one_letter_changed(pq.read_table(halves[1]))
    size = c.stat().st_size
    _write_plain(c, changed)
    assert c.stat().st_size == size  # (the same size, other bytes)
    fifth = shardflow([*map(str, halves), str(c), *OPTIONS, *to_bucket(bucket, tmp_path / "e")], tmp_path)
    assert fifth.returncode == 0 and fifth.stderr == "", fifth.stderr
    assert fifth.stdout.splitlines()[0] == f"published bk@v4 to s3://{bucket}/data/bk/v4"
    v4 = yaml.safe_load(fs.cat_file(f"{bucket}/data/bk/v4/metadata.yaml"))
    assert v4["reuse"]["parent"] == "bk@v3" and v4["reuse"]["tokenized_inputs"] == ["c.parquet"]
    # A damaged parent in the bucket is refused as it is fetched (named, one line), and never reused: a fresh
    # scratch tokenizes every input, and the damaged object is not copied into the new version.
    damaged = sorted(p for p in fs.find(f"{bucket}/data/bk/v4/train/") if p.endswith(".bin"))[0]
    good = fs.cat_file(damaged)
    fs.pipe_file(damaged, good[:-1] + bytes([good[-1] ^ 0xFF]))
    (halves[0].parent / "d.parquet").write_bytes(halves[0].read_bytes())
    inputs = [*map(str, halves), str(c), str(halves[0].parent / "d.parquet")]
    fourth = shardflow([*inputs, *OPTIONS, *to_bucket(bucket, tmp_path / "d")], tmp_path)
    assert fourth.returncode == 0, fourth.stderr
    assert fourth.stdout.splitlines()[0] == f"published bk@v5 to s3://{bucket}/data/bk/v5"
    assert fourth.stderr.startswith(f"not fetching bk@v4 from s3://{bucket}/data to reuse it: s3://{damaged}: SHA-256 ")
    assert fourth.stderr.count("\n") == 1, fourth.stderr
    v5 = yaml.safe_load(fs.cat_file(f"{bucket}/data/bk/v5/metadata.yaml"))
    assert "reuse" not in v5 and fs.cat_file(damaged.replace("/v4/", "/v5/")) == good


@pytest.mark.slow
def test_a_build_killed_between_its_shard_uploads_and_its_manifest_shows_nothing_then_resumes(s3, bucket, halves, tmp_path):
    args = [*map(str, halves), *OPTIONS, *to_bucket(bucket, tmp_path / "scratch")]
    killed = shardflow(args, tmp_path, SHARDFLOW_FAULT="push-files")
    assert killed.returncode == -9, killed.stderr
    fs = s3.fs()
    sent = fs.find(f"{bucket}/data/bk/v1/")
    assert any(p.endswith(".bin") for p in sent) and not any(p.endswith("metadata.yaml") for p in sent)
    assert not fs.exists(f"{bucket}/catalog/bk.yaml")
    with pytest.raises(ShardflowError, match=rf"s3://{bucket}/catalog"):
        TokenDataset("bk@v1", catalog=f"s3://{bucket}/catalog", seq_len=64, cache_dir=tmp_path / "cache")
    rerun = shardflow(args, tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.splitlines()[0] == f"published bk@v1 to s3://{bucket}/data/bk/v1"
    assert bucket_catalog(s3, bucket)["latest"] == "v1"
    assert len(TokenDataset("bk@v1", catalog=f"s3://{bucket}/catalog", seq_len=64, cache_dir=tmp_path / "cache")) > 0


@pytest.mark.slow
def test_one_build_on_two_machines_publishes_once_and_both_scratches_reuse_it(s3, bucket, halves, tmp_path):
    # Machine B builds bk@v1 and is killed while pushing it (its files sent, not its manifest); machine A builds
    # the same inputs and publishes bk@v1 with its own manifest (another creation time).
    b = [str(halves[0]), *OPTIONS, *to_bucket(bucket, tmp_path / "b")]
    assert shardflow(b, tmp_path, SHARDFLOW_FAULT="push-files").returncode == -9
    a = shardflow([str(halves[0]), *OPTIONS, *to_bucket(bucket, tmp_path / "a")], tmp_path)
    assert a.returncode == 0 and a.stdout.splitlines()[0] == f"published bk@v1 to s3://{bucket}/data/bk/v1", a.stderr
    published = s3.fs().cat_file(f"{bucket}/data/bk/v1/metadata.yaml")
    [b_v1] = (tmp_path / "b").rglob("bk/v1/metadata.yaml")
    assert b_v1.read_bytes() != published
    # B again: the bucket lists its build; its copy takes the bucket's manifest, and B's next build reuses it.
    again = shardflow(b, tmp_path)
    assert again.returncode == 0 and again.stdout.startswith("nothing new: bk@v1"), again.stderr
    assert b_v1.read_bytes() == published
    third = shardflow([*map(str, halves), *OPTIONS, *to_bucket(bucket, tmp_path / "b")], tmp_path)
    assert third.returncode == 0 and third.stderr == "", third.stderr
    v2 = yaml.safe_load(s3.fs().cat_file(f"{bucket}/data/bk/v2/metadata.yaml"))
    assert v2["reuse"]["parent"] == "bk@v1" and v2["reuse"]["tokenized_inputs"] == ["b.parquet"]


@pytest.mark.slow
def test_of_two_builds_that_took_one_version_name_the_bucket_lists_one_and_the_other_publishes_the_next(
        s3, bucket, halves, tmp_path):
    # Build A is killed after its uploads, before its catalog entry; build B (other inputs, another machine's
    # scratch) then publishes v1; A's commit can no longer win, and its rerun publishes v2.
    a = [str(halves[0]), *OPTIONS, *to_bucket(bucket, tmp_path / "a")]
    killed = shardflow(a, tmp_path, SHARDFLOW_FAULT="push-uploaded")
    assert killed.returncode == -9, killed.stderr
    b = shardflow([str(halves[1]), *OPTIONS, "--data-root", f"s3://{bucket}/data-b", "--catalog", f"s3://{bucket}/catalog",
                   "--scratch", str(tmp_path / "b")], tmp_path)
    assert b.returncode == 0, b.stderr
    assert b.stdout.splitlines()[0] == f"published bk@v1 to s3://{bucket}/data-b/bk/v1"
    rerun = shardflow(a, tmp_path)
    assert rerun.returncode == 0, rerun.stderr
    assert "discarding the local copy" in rerun.stderr
    assert rerun.stdout.splitlines()[0] == f"published bk@v2 to s3://{bucket}/data/bk/v2"
    listed = bucket_catalog(s3, bucket)
    assert [(v["version"], v["path"]) for v in listed["versions"]] == [("v1", "../data-b/bk/v1"), ("v2", "../data/bk/v2")]
    for version, data, half in (("v1", "data-b", halves[1]), ("v2", "data", halves[0])):
        manifest = yaml.safe_load(s3.fs().cat_file(f"{bucket}/{data}/bk/{version}/metadata.yaml"))
        assert [i["path"] for i in manifest["inputs"]] == [str(half)]
        assert len(TokenDataset(f"bk@{version}", catalog=f"s3://{bucket}/catalog", seq_len=64, cache_dir=tmp_path / version))


@pytest.mark.parametrize("places, message", [
    (["--data-root", "s3://b1/data"], r"--catalog \(unset\): a build to a bucket needs both --data-root and --catalog"),
    (["--data-root", "s3://b1/data", "--catalog", "cat"], r"--catalog cat: a build to a bucket needs both"),
    (["--data-root", "data", "--catalog", "s3://b1/catalog"], r"--data-root data: a build to a bucket needs both"),
    (["--data-root", "s3://b1/data", "--catalog", "s3://b2/catalog"], r"--data-root and --catalog are in different buckets"),
    (["--data-root", "s3://b1/a/../data", "--catalog", "s3://b1/catalog"], r"the prefix 'a/\.\./data' has an empty, '\.' or '\.\.' part"),
    (["--data-root", "gs://b1/data", "--catalog", "gs://b1/catalog"], r"--data-root gs://b1/data: give an s3:// URL"),
    # Quoted by one client and not another: the manifest went to "d r/", the shards to "d%20r/".
    (["--data-root", "s3://b1/d%20r", "--catalog", "s3://b1/catalog"], r"--data-root s3://b1/d%20r: '%' in a bucket URL"),
    # A fragment to urlparse, a key to s3fs: the catalog was written to "cat/", and read from "cat#1/".
    (["--data-root", "s3://b1/data", "--catalog", "s3://b1/cat#1?x"], r"--catalog s3://b1/cat#1\?x: '#' '\?' in a bucket"),
])
def test_a_build_to_half_a_bucket_or_a_bad_prefix_is_refused_in_one_line(places, message, halves, tmp_path):
    res = shardflow([str(halves[0]), *OPTIONS, *places], tmp_path, SHARDFLOW_CATALOG="", SHARDFLOW_DATA_ROOT="")
    assert res.returncode == 2 and res.stdout == ""
    assert len(res.stderr.splitlines()) == 1 and res.stderr.startswith("shardflow: error: "), res.stderr
    import re

    assert re.search(message, res.stderr), res.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []
