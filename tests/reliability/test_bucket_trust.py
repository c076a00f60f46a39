"""A version on a bucket is trusted for its bytes, not for what a cache or a catalog entry remembers of them.

``shardflow validate`` of a bucket version reads every object from the bucket again and hashes it, so an object
damaged after a first validate filled the cache fails the next one, naming the object and the command that
repairs it; ``shardflow push NAME@vN --repair`` checks the objects by content (a plain push says "already
pushed", a build "nothing new") and restores the damaged ones from verified local copies, or where there is
none, from a rebuild of the version's recorded inputs, after which a reader with an empty cache reads the version. The version is the reliability suite's sample (``published``), pushed to
moto's S3 server on loopback.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

pytest.importorskip("s3fs", reason="object storage needs the optional extra: pip install 'shardflow[s3]'")
pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")

from support.cli import run_main  # noqa: E402
from support.corpus import small_vocab, write_parquet  # noqa: E402
from support.paths import SAMPLE  # noqa: E402
from support.s3 import S3Server, new_bucket, s3_fixture  # noqa: E402
from shardflow.bucket.push import push_version  # noqa: E402
from shardflow.config import BuildConfig  # noqa: E402
from shardflow.manifest import read_manifest  # noqa: E402
from shardflow.manifest_files import named_files  # noqa: E402
from shardflow.pipeline import build  # noqa: E402
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
    rc, out, err = run_main("push", f"{NAME}@v1", "--repair", *elsewhere, "--no-rebuild")  # (its inputs are here)
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


def test_push_repair_rebuilds_what_no_local_copy_has_from_the_recorded_inputs(published, s3, tmp_path, monkeypatch):
    """A version built straight to the bucket keeps no local copy once its scratch is gone: push --repair rebuilds
    the version from the inputs and options its manifest records (in a temporary directory, published nowhere),
    sends the files that verify, and says so; with an input changed since, one line names what it cannot restore."""
    bucket = new_bucket(s3, "rebuild")
    catalog_url, url = f"s3://{bucket}/catalog", f"s3://{bucket}/data/{NAME}/v1"
    monkeypatch.setenv("SHARDFLOW_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("SHARDFLOW_SCRATCH", str(tmp_path / "scratch"))
    corpus = tmp_path / "corpus" / "sample.parquet"
    corpus.parent.mkdir()
    shutil.copyfile(SAMPLE, corpus)
    vocab = small_vocab(tmp_path / "vocab")
    config = BuildConfig(name=NAME, sources=(str(corpus),), tokenizer=str(vocab), shard_tokens=60_000,
                         val_fraction=0.2, seed=1)  # the published sample's options
    build(config, data_root=f"s3://{bucket}/data", catalog=catalog_url)
    shutil.rmtree(tmp_path / "scratch")  # no copy left here: not the scratch's, none in the (empty) cache
    vocab.unlink()  # nor the tokenizer file the build was given: the version's own copy serves
    listed = s3.fs().cat_file(f"{bucket}/catalog/{NAME}.yaml")
    key = shard_object(catalog_url)
    flip(s3, key)

    rc, out, err = run_main("push", f"{NAME}@v1", "--repair", "--catalog", catalog_url)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"repaired {NAME}@v1 ({url}/): 1 of ") and \
        lines[0].endswith(" objects restored (1 rebuilt from the version's inputs)"), out
    assert re.fullmatch(rf"  train/{NAME}_train_000000\.bin: SHA-256 [0-9a-f]{{16}}\.\.\., but the manifest says "
                        rf"[0-9a-f]{{16}}\.\.\.; rebuilt from {re.escape(str(corpus))} and sent again", lines[1]), out
    assert len(lines) == 2 and "rebuilding" in err, (out, err)
    # The rebuild was published nowhere: the bucket's catalog as it was, nothing left in the scratch.
    assert s3.fs().cat_file(f"{bucket}/catalog/{NAME}.yaml") == listed
    assert not list((tmp_path / "scratch").rglob("*.bin")), list((tmp_path / "scratch").rglob("*"))
    # A reader with an empty cache reads the version (the published sample's tokens: the same corpus and options).
    remote = TokenDataset(f"{NAME}@v1", catalog=catalog_url, seq_len=SEQ, cache_dir=tmp_path / "fresh")
    assert np.array_equal(windows(remote), windows(TokenDataset(published / "data" / NAME / "v1", seq_len=SEQ)))
    assert run_main("validate", f"{NAME}@v1", "--catalog", catalog_url).status == 0

    # An input changed since the build: nothing to rebuild from; one line naming the object, the input, the fix.
    texts = pq.read_table(SAMPLE, columns=["text"]).column("text").to_pylist()
    write_parquet(corpus, texts[:-1])
    shutil.rmtree(tmp_path / "cache")  # (validate left verified copies there)
    flip(s3, key, at=100)
    rc, out, err = run_main("push", f"{NAME}@v1", "--repair", "--catalog", catalog_url)
    assert rc == 2 and out == "" and err.count("\n") == 1, err
    assert err.startswith(f"shardflow: error: s3://{key}: SHA-256 ") and "no verified copy of it here" in err, err
    assert f"cannot be rebuilt: its inputs changed since the build: {corpus}" in err and "--from DIR" in err, err
