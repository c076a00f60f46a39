"""``shardflow push``: local versions published to a bucket (moto's S3 server on loopback) with a catalog there.

Versions are built from the shared corpora and pushed with ``push_version``; what
these show: the pushed version reads as the local one through the bucket catalog
(in a fresh process with an empty cache); a build of ``s3://`` inputs goes to the
bucket end to end; of two concurrent pushes of different builds as one version
exactly one is listed; a push killed before the catalog commit shows nothing and
its rerun skips what was uploaded; an incremental version copies its parent's
shards within the bucket without reading them; damaged versions, ``..`` names
and bytes that are not the manifest's are refused before anything is listed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml

pytest.importorskip("s3fs", reason="object storage needs the optional extra: pip install 'shardflow[s3]'")
pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")

from support.paths import MAKE_CORPUS  # noqa: E402
from support.s3 import new_bucket, s3_fixture, S3Server  # noqa: E402
from shardflow.pipeline import build  # noqa: E402
from shardflow.config import BuildConfig  # noqa: E402
from shardflow.errors import CatalogError, ConfigError, ValidationError  # noqa: E402
from shardflow.manifest import MANIFEST_NAME, read_manifest  # noqa: E402
from shardflow.bucket.push import CLAIM_NAME, _upload, finish_push, prepare_push, push_files, push_version  # noqa: E402
from shardflow.runtime import StreamingTokenDataset, TokenDataset  # noqa: E402

SEQ = 256
PUSH_PY = str(Path(sys.modules["shardflow.bucket.push"].__file__ or ""))


@dataclass(frozen=True)
class Built:
    """rv@v1 from two corpus files, rv@v2 (incremental, parent rv@v1) from those and a third."""

    root: Path

    @property
    def catalog(self) -> Path:
        return self.root / "catalog"

    def version(self, v: str) -> Path:
        return self.root / "data" / "rv" / v


def corpus(base: Path, mb: str, files: int) -> list[str]:
    subprocess.run([sys.executable, str(MAKE_CORPUS), str(base), "--mb", mb, "--files", str(files)], check=True, capture_output=True)
    return [str(p) for p in sorted(base.glob("*.parquet"))]


s3 = s3_fixture("module")


@pytest.fixture
def bucket(s3: S3Server) -> str:
    return new_bucket(s3, "push")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    if not MAKE_CORPUS.exists():
        pytest.skip(f"{MAKE_CORPUS} is not available")
    root = tmp_path_factory.mktemp("push")
    sources = corpus(root / "corpus", "1", 3)
    for files in (sources[:2], sources):
        build(BuildConfig(name="rv", sources=tuple(files), shard_tokens=40_000, val_fraction=0.1),
              data_root=root / "data", catalog=root / "catalog")
    assert read_manifest(root / "data" / "rv" / "v2").parent == "rv@v1"
    return Built(root)


def urls(bucket: str, data: str = "data") -> dict[str, str]:
    return {"data_root_url": f"s3://{bucket}/{data}", "catalog_url": f"s3://{bucket}/catalog"}


def windows(ds: TokenDataset) -> np.ndarray:
    return np.stack([ds.window(i) for i in range(len(ds))])


def bucket_catalog(s3: S3Server, bucket: str, name: str = "rv") -> dict | None:
    fs = s3.fs()
    path = f"{bucket}/catalog/{name}.yaml"
    return yaml.safe_load(fs.cat_file(path)) if fs.exists(path) else None


def version_files(directory: Path) -> int:
    """The files a push sends: those the manifest names, the dataset card's, and the manifest."""
    m = read_manifest(directory)
    named = {f.file for s in m.splits.values() for sh in s.shards for f in (sh, *sh.files)}
    card = [p for p in (directory / "card").rglob("*") if p.is_file()]
    return len(named) + len(m.extra.get("stats", {}).get("files", [])) + len(card) + 1


# --- Pushed, then read from the bucket ---


@pytest.mark.slow
def test_a_pushed_version_reads_as_the_local_one_in_a_fresh_process(built, s3, bucket, tmp_path):
    r = push_version("rv@v1", catalog=built.catalog, **urls(bucket))
    assert (r.uploaded, r.copied, r.skipped, r.already) == (version_files(built.version("v1")), 0, 0, False)
    listed = bucket_catalog(s3, bucket)
    assert listed["latest"] == "v1" and listed["versions"][0]["path"] == "../data/rv/v1"
    assert s3.fs().cat_file(f"{bucket}/data/rv/v1/{MANIFEST_NAME}") == (built.version("v1") / MANIFEST_NAME).read_bytes()
    card = built.version("v1") / "card" / "README.md"
    assert card.exists() and s3.fs().cat_file(f"{bucket}/data/rv/v1/card/README.md") == card.read_bytes()

    local = TokenDataset(built.version("v1"), seq_len=SEQ)
    stream = StreamingTokenDataset(built.version("v1"), seq_len=SEQ, seed=3, shuffle_group=2)
    expected = [hashlib.sha256(windows(local).tobytes()).hexdigest(),
                hashlib.sha256(str([s["input_ids"].tolist() for s in stream]).encode()).hexdigest()]
    script = textwrap.dedent(f"""
        import hashlib, numpy as np
        from shardflow.runtime import StreamingTokenDataset, TokenDataset
        ds = TokenDataset("rv@v1", catalog="s3://{bucket}/catalog", seq_len={SEQ})
        print(hashlib.sha256(np.stack([ds.window(i) for i in range(len(ds))]).tobytes()).hexdigest())
        it = StreamingTokenDataset("rv@latest", catalog="s3://{bucket}/catalog", seq_len={SEQ}, seed=3, shuffle_group=2)
        print(hashlib.sha256(str([s["input_ids"].tolist() for s in it]).encode()).hexdigest())
    """)
    cache = tmp_path / "empty-cache"
    env = {**os.environ, **s3.env, "SHARDFLOW_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == expected
    assert list(cache.rglob("*.bin"))  # read through the fresh cache, not the local version

    again = push_version("rv@v1", catalog=built.catalog, **urls(bucket))
    assert again.already and again.uploaded == 0
    assert bucket_catalog(s3, bucket) == listed


@pytest.mark.slow
def test_a_build_of_s3_inputs_is_pushed_end_to_end(s3, bucket, tmp_path):
    if not MAKE_CORPUS.exists():
        pytest.skip(f"{MAKE_CORPUS} is not available")
    fs = s3.fs()
    for path in corpus(tmp_path / "corpus", "0.5", 2):
        fs.put_file(path, f"{bucket}/inputs/{Path(path).name}")
    result = build(BuildConfig(name="web", sources=(f"s3://{bucket}/inputs/",), shard_tokens=30_000, val_fraction=0.1),
                   data_root=tmp_path / "data", catalog=tmp_path / "catalog")
    local = Path(result.manifest_path).parent
    assert read_manifest(local).inputs[0]["path"].startswith(f"s3://{bucket}/inputs/")
    r = push_version("web@v1", catalog=tmp_path / "catalog", **urls(bucket, "published"))
    assert r.url == f"s3://{bucket}/published/web/v1" and r.uploaded == version_files(local)
    remote = TokenDataset("web@v1", catalog=f"s3://{bucket}/catalog", seq_len=SEQ, cache_dir=tmp_path / "cache")
    assert np.array_equal(windows(remote), windows(TokenDataset(local, seq_len=SEQ)))
    val = TokenDataset("web", catalog=f"s3://{bucket}/catalog", split="val", seq_len=64, cache_dir=tmp_path / "cache")
    assert np.array_equal(windows(val), windows(TokenDataset(local, split="val", seq_len=64)))


@pytest.mark.slow
def test_an_older_version_pushed_after_a_newer_one_is_listed_but_not_made_latest(built, s3, bucket, tmp_path):
    push_version("rv@v2", catalog=built.catalog, **urls(bucket))
    r = push_version("rv@v1", catalog=built.catalog, **urls(bucket))
    assert r.copied > 0  # v1's shards are v2's too (v2 took them from v1): copied from the bucket's latest
    listed = bucket_catalog(s3, bucket)
    assert [v["version"] for v in listed["versions"]] == ["v2", "v1"] and listed["latest"] == "v2"
    latest = TokenDataset("rv@latest", catalog=f"s3://{bucket}/catalog", seq_len=SEQ, cache_dir=tmp_path)
    assert len(latest) == len(TokenDataset(built.version("v2"), seq_len=SEQ))


# --- Incremental versions: the parent's files copied within the bucket ---


_opened: list[tuple[str, bool]] | None = None  # (path, opened by push's _upload), while a test records


@pytest.mark.slow
def test_a_parent_object_deleted_while_its_child_is_pushed_is_sent_instead(built, s3, bucket, tmp_path, monkeypatch):
    import shardflow.bucket.push as push

    push_version("rv@v1", catalog=built.catalog, **urls(bucket))
    real, gone = push._recorded, []

    def recorded(fs, key, *args):  # the first parent object checked is deleted right after (an rm elsewhere)
        found = real(fs, key, *args)
        if found and "/rv/v1/" in key and not gone:
            s3.fs().rm(key)
            gone.append(key)
        return found

    monkeypatch.setattr(push, "_recorded", recorded)
    result = push_version("rv@v2", catalog=built.catalog, **urls(bucket))
    assert gone and result.copied > 0 and result.uploaded > 0
    assert s3.fs().cat_file(gone[0].replace("/v1/", "/v2/")) == (built.version("v1") / gone[0].split("/v1/")[1]).read_bytes()
    remote = TokenDataset("rv@v2", catalog=f"s3://{bucket}/catalog", seq_len=SEQ, cache_dir=tmp_path)
    assert np.array_equal(windows(remote), windows(TokenDataset(built.version("v2"), seq_len=SEQ)))


def _audit(event: str, args: tuple) -> None:
    if _opened is not None and event == "open" and isinstance(args[0], str) and args[0].endswith((".bin", ".idx", ".yaml")):
        by_upload = any(f.name == "_upload" and f.filename == PUSH_PY for f in traceback.extract_stack())
        _opened.append((os.path.realpath(args[0]), by_upload))


@pytest.mark.slow
def test_an_incremental_version_copies_its_parents_files_without_reading_them(built, s3, bucket, tmp_path):
    global _opened
    push_version("rv@v1", catalog=built.catalog, **urls(bucket))
    v1 = {sh.sha256 for s in read_manifest(built.version("v1")).splits.values() for sh in s.shards}
    v2 = read_manifest(built.version("v2"))
    shared = [built.version("v2") / sh.file for s in v2.splits.values() for sh in s.shards if sh.sha256 in v1]
    new = [built.version("v2") / sh.file for s in v2.splits.values() for sh in s.shards if sh.sha256 not in v1]
    assert len(shared) >= 5 and new
    sys.addaudithook(_audit)  # hooks stay for the process: _audit records only while _opened is a list
    _opened = []
    try:
        r = push_version("rv@v2", catalog=built.catalog, **urls(bucket))
        opened = list(_opened)
    finally:
        _opened = None
    uploaded = {p for p, by_upload in opened if by_upload}
    assert r.parent == "rv@v1" and r.copied >= len(shared)  # shards, and their identical .bos.idx files
    assert not uploaded & {os.path.realpath(p) for p in shared}, "a parent's shard was read to be uploaded"
    assert {os.path.realpath(p) for p in new} <= uploaded  # the measurement sees uploads
    assert any(os.path.realpath(p) in {q for q, _ in opened} for p in shared)  # ... and the validation's reads
    assert r.uploaded + r.copied == version_files(built.version("v2"))
    listed = bucket_catalog(s3, bucket)
    assert [v["version"] for v in listed["versions"]] == ["v1", "v2"] and listed["versions"][1]["parent"] == "rv@v1"
    remote = TokenDataset("rv@v2", catalog=f"s3://{bucket}/catalog", seq_len=SEQ, cache_dir=tmp_path)
    assert np.array_equal(windows(remote), windows(TokenDataset(built.version("v2"), seq_len=SEQ)))


# --- Concurrency and crashes ---


@pytest.fixture(scope="module")
def rivals(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Two different builds, each published locally as cc@v1 (their own data root and catalog)."""
    if not MAKE_CORPUS.exists():
        pytest.skip(f"{MAKE_CORPUS} is not available")
    roots = []
    for i, mb in enumerate(("0.3", "0.4")):
        root = tmp_path_factory.mktemp(f"rival{i}")
        build(BuildConfig(name="cc", sources=tuple(corpus(root / "corpus", mb, 1)), shard_tokens=30_000),
              data_root=root / "data", catalog=root / "catalog")
        roots.append(root)
    return roots


@pytest.mark.slow
@pytest.mark.parametrize("data_roots", [("data", "data"), ("data-a", "data-b")], ids=["one-prefix", "two-prefixes"])
def test_of_two_concurrent_pushes_of_different_builds_as_one_version_exactly_one_wins(rivals, s3, bucket, tmp_path,
                                                                                      monkeypatch, data_roots):
    # Both reach the commit together: a pause after their uploads (two prefixes: both upload everything).
    monkeypatch.setenv("SHARDFLOW_FAULT", "sleep0.3:push-uploaded")
    outcome: dict[int, object] = {}
    start = threading.Barrier(2)

    def push(i: int) -> None:
        start.wait()
        try:
            outcome[i] = push_version("cc@v1", catalog=rivals[i] / "catalog", **urls(bucket, data_roots[i]))
        except CatalogError as exc:
            outcome[i] = exc

    threads = [threading.Thread(target=push, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    errors = [i for i in (0, 1) if isinstance(outcome[i], CatalogError)]
    assert len(errors) == 1, outcome
    loser, winner = errors[0], 1 - errors[0]
    assert "another build of cc@v1" in str(outcome[loser])
    listed = bucket_catalog(s3, bucket, "cc")
    assert [v["version"] for v in listed["versions"]] == ["v1"]
    won = read_manifest(rivals[winner] / "data" / "cc" / "v1")
    assert listed["versions"][0]["build_key"] == won.build_key
    remote = TokenDataset("cc@v1", catalog=f"s3://{bucket}/catalog", seq_len=SEQ, cache_dir=tmp_path)
    assert np.array_equal(windows(remote), windows(TokenDataset(rivals[winner] / "data" / "cc" / "v1", seq_len=SEQ)))
    monkeypatch.delenv("SHARDFLOW_FAULT")
    with pytest.raises(CatalogError, match=r"already lists another build of cc@v1 .*push this build under a new version"):
        push_version("cc@v1", catalog=rivals[loser] / "catalog", **urls(bucket, "data-c"))


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """One build made on two machines (data roots) at two times: tw@v1 twice, the same build key and files,
    manifests that differ in their creation time."""
    if not MAKE_CORPUS.exists():
        pytest.skip(f"{MAKE_CORPUS} is not available")
    sources = tuple(corpus(tmp_path_factory.mktemp("twin-corpus"), "0.3", 1))
    roots = []
    for i in (0, 1):
        root = tmp_path_factory.mktemp(f"twin{i}")
        if roots:
            time.sleep(1.0)  # a creation time of its own (the manifest records whole seconds)
        build(BuildConfig(name="tw", sources=sources, shard_tokens=30_000), data_root=root / "data", catalog=root / "catalog")
        roots.append(root)
    manifests = [read_manifest(r / "data" / "tw" / "v1") for r in roots]
    assert manifests[0].build_key == manifests[1].build_key and manifests[0].created_at != manifests[1].created_at
    return roots


@pytest.mark.slow
@pytest.mark.parametrize("first", ["committed", "interrupted"])
def test_two_pushes_of_one_build_from_two_machines_publish_one_readable_version(twins, s3, bucket, tmp_path, monkeypatch,
                                                                                 first):
    # The second push starts (its claim: the same build key) before the first commits, and sends its files after.
    second = prepare_push("tw@v1", catalog=twins[1] / "catalog", **urls(bucket))
    if first == "committed":
        push_version("tw@v1", catalog=twins[0] / "catalog", **urls(bucket))
    else:  # the first push dies between its manifest and its catalog entry
        with monkeypatch.context() as m:
            m.setattr("shardflow.bucket.push._commit", lambda *a, **k: (_ for _ in ()).throw(OSError("killed")))
            with pytest.raises(OSError, match="killed"):
                push_version("tw@v1", catalog=twins[0] / "catalog", **urls(bucket))
    result = finish_push(second, push_files(second, second.files))
    assert result.already == (first == "committed")
    # The bucket's manifest is the first push's, and the catalog entry records it: the version reads.
    fs = s3.fs()
    manifest = fs.cat_file(f"{bucket}/data/tw/v1/{MANIFEST_NAME}")
    assert manifest == (twins[0] / "data" / "tw" / "v1" / MANIFEST_NAME).read_bytes()
    [entry] = bucket_catalog(s3, bucket, "tw")["versions"]
    assert entry["manifest_sha256"] == hashlib.sha256(manifest).hexdigest()
    assert entry["created_at"] == read_manifest(twins[0] / "data" / "tw" / "v1").created_at
    remote = TokenDataset("tw@v1", catalog=f"s3://{bucket}/catalog", seq_len=SEQ, cache_dir=tmp_path)
    assert np.array_equal(windows(remote), windows(TokenDataset(twins[1] / "data" / "tw" / "v1", seq_len=SEQ)))


@pytest.mark.slow
def test_a_manifest_of_other_files_under_the_same_claim_is_never_listed(twins, s3, bucket):
    second = prepare_push("tw@v1", catalog=twins[1] / "catalog", **urls(bucket))
    text = (twins[0] / "data" / "tw" / "v1" / MANIFEST_NAME).read_text()
    shard = read_manifest(twins[0] / "data" / "tw" / "v1").splits["train"].shards[0]
    other = text.replace(shard.sha256, "f" * 64)  # a shard of other bytes, under the same build key
    assert other != text
    s3.fs().pipe_file(f"{bucket}/data/tw/v1/{MANIFEST_NAME}", other.encode())
    with pytest.raises(CatalogError, match=rf"^s3://{bucket}/data/tw/v1/metadata.yaml: another push of tw@v1 sent a "
                                           rf"manifest of other files first; .* delete everything under s3://{bucket}/data/tw/v1/"):
        finish_push(second, push_files(second, second.files))
    assert bucket_catalog(s3, bucket, "tw") is None


@pytest.mark.slow
def test_a_push_killed_before_the_catalog_commit_shows_nothing_and_its_rerun_resumes(built, s3, bucket, tmp_path):
    script = (f"from shardflow.bucket.push import push_version; push_version('rv@v1', catalog={str(built.catalog)!r}, "
              f"data_root_url='s3://{bucket}/data', catalog_url='s3://{bucket}/catalog')")
    env = {**os.environ, **s3.env, "SHARDFLOW_FAULT": "push-uploaded"}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == -9, out.stderr
    assert s3.fs().exists(f"{bucket}/data/rv/v1/{MANIFEST_NAME}")  # everything sent ...
    assert bucket_catalog(s3, bucket) is None  # ... and nothing visible
    with pytest.raises(CatalogError, match=rf"^no dataset 'rv' in the catalog s3://{bucket}/catalog \(datasets: none\)$"):
        TokenDataset("rv@v1", catalog=f"s3://{bucket}/catalog", seq_len=SEQ, cache_dir=tmp_path)
    r = push_version("rv@v1", catalog=built.catalog, **urls(bucket))
    assert (r.skipped, r.uploaded, r.already) == (version_files(built.version("v1")), 0, False)
    assert bucket_catalog(s3, bucket)["latest"] == "v1"
    remote = TokenDataset("rv@v1", catalog=f"s3://{bucket}/catalog", seq_len=SEQ, cache_dir=tmp_path)
    assert np.array_equal(windows(remote), windows(TokenDataset(built.version("v1"), seq_len=SEQ)))


# --- Refusals ---


def test_a_damaged_version_is_refused_before_anything_is_sent(built, s3, bucket, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(built.root / "data", copy / "data")
    shutil.copytree(built.catalog, copy / "catalog")
    shard = copy / "data" / "rv" / "v1" / "train" / "rv_train_000002.bin"
    data = bytearray(shard.read_bytes())
    data[5000:5010] = bytes(b ^ 0xFF for b in data[5000:5010])
    shard.write_bytes(bytes(data))
    with pytest.raises(ValidationError, match=r"rv_train_000002\.bin"):
        push_version("rv@v1", catalog=copy / "catalog", **urls(bucket))
    assert s3.fs().find(bucket) == []


@pytest.mark.parametrize("ref, data_root, catalog_url, message", [
    ("../rv@v1", "s3://{b}/data", "s3://{b}/catalog", r"dataset name '\.\./rv' is not allowed"),
    ("rv@v1", "s3://{b}/data/../other", "s3://{b}/catalog", r"--data-root-url s3://.*/data/\.\./other: the prefix .* '\.\.' part"),
    ("rv@v1", "s3://{b}/data", "s3://{b}/./catalog", r"--catalog-url .* '\.' or '\.\.' part"),
    ("rv@v1", "s3://{b}/data", "s3://elsewhere/catalog", r"different buckets"),
    ("rv@v1", "gs://{b}/data", "s3://{b}/catalog", r"--data-root-url gs://.*: give an s3:// URL"),
])
def test_bad_names_and_urls_are_refused(built, s3, bucket, ref, data_root, catalog_url, message):
    with pytest.raises(ConfigError, match=message):
        push_version(ref, catalog=built.catalog, data_root_url=data_root.format(b=bucket), catalog_url=catalog_url.format(b=bucket))
    assert s3.fs().find(bucket) == []


def test_bytes_that_are_not_the_manifests_are_never_committed(s3, bucket, tmp_path):
    local = tmp_path / "shard.bin"
    local.write_bytes(os.urandom(10_000))
    right = hashlib.sha256(local.read_bytes()).hexdigest()
    fs = s3.fs()
    with pytest.raises(ValidationError, match=r"shard\.bin: 10000 bytes with SHA-256 .* the file changed during the push"):
        _upload(fs, local, f"{bucket}/v/shard.bin", 10_000, "0" * 64)
    assert not fs.exists(f"{bucket}/v/shard.bin")
    _upload(fs, local, f"{bucket}/v/shard.bin", 10_000, right)
    assert fs.cat_file(f"{bucket}/v/shard.bin") == local.read_bytes() and fs.metadata(f"{bucket}/v/shard.bin")["sha256"] == right


def test_a_version_listed_by_one_catalog_is_refused_to_another_over_the_same_data_root(built, s3, bucket, tmp_path):
    staging = {"data_root_url": f"s3://{bucket}/data", "catalog_url": f"s3://{bucket}/catalog-staging"}
    push_version("rv@v1", catalog=built.catalog, **staging)
    with pytest.raises(CatalogError, match=rf"^s3://{bucket}/data/rv/v1 holds rv@v1 for the catalog s3://{bucket}/"
                                           r"catalog-staging: one data root serves one catalog"):
        push_version("rv@v1", catalog=built.catalog, data_root_url=f"s3://{bucket}/data",
                     catalog_url=f"s3://{bucket}/catalog-prod")
    assert bucket_catalog(s3, bucket) is None and not s3.fs().exists(f"{bucket}/catalog-prod/rv.yaml")
    # Another data root: its own objects, which an rm in the first catalog leaves alone.
    assert push_version("rv@v1", catalog=built.catalog, data_root_url=f"s3://{bucket}/data-prod",
                        catalog_url=f"s3://{bucket}/catalog-prod").uploaded > 0


def test_a_version_claimed_by_another_build_is_refused(built, s3, bucket):
    s3.fs().pipe_file(f"{bucket}/data/rv/v1/{CLAIM_NAME}", b'{"ref": "rv@v1", "build_key": "0123456789abcdef0123"}')
    with pytest.raises(CatalogError, match=r"claimed by another build of rv@v1 \(build key 0123456789abcdef\.\.\.\).*If none "
                       rf"is running, delete everything under it \(aws s3 rm --recursive s3://{bucket}/data/rv/v1/\)"):
        push_version("rv@v1", catalog=built.catalog, **urls(bucket))
    assert s3.fs().find(f"{bucket}/data") == [f"{bucket}/data/rv/v1/{CLAIM_NAME}"]


# --- The command line ---


@pytest.mark.slow
def test_the_push_command(built, s3, bucket):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "shardflow", "push", *args, "--catalog", str(built.catalog)],
                              env={**os.environ, **s3.env}, capture_output=True, text=True, timeout=120)

    where = ["--data-root-url", f"s3://{bucket}/data", "--catalog-url", f"s3://{bucket}/catalog"]
    ok = cli("rv@v1", *where)
    assert ok.returncode == 0, ok.stderr
    n = version_files(built.version("v1"))
    assert ok.stdout.strip().startswith(f"pushed rv@v1 to s3://{bucket}/data/rv/v1: {n} files uploaded (")
    assert ok.stdout.strip().endswith(f"listed in s3://{bucket}/catalog/rv.yaml")
    assert cli("rv@v1", *where).stdout.startswith("rv@v1 was already pushed")
    bad = cli("rv@v9", *where)
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert bad.stderr.startswith("shardflow: error: no version 'v9' of 'rv' in the catalog")
