"""Published versions read from object storage (moto's S3 server on loopback) through the local cache.

A version is built locally from the shared corpora, and its version directory
and catalog are uploaded as they are (relative paths kept). What these show:
a version URL and a catalog URL give exactly the local version's samples
(map-style and streaming, in this process and in a fresh one with an empty
cache); a damaged cached file is fetched again and a damaged object is refused
naming it; two processes sharing a cache fetch each file once; a streaming
reader under ``cache_limit_bytes`` evicts what it finished and stays under the
limit, and so does ``TokenDataset`` reading at random; a cold open asks the store
for the catalog entry, the manifest and the one shard it reads; resume
states are exact; a manifest naming a path outside the version is refused.
"""

from __future__ import annotations

import gc
import hashlib
import itertools
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("s3fs", reason="object storage needs the optional extra: pip install 'shardflow[s3]'")
pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")

from support.paths import MAKE_CORPUS  # noqa: E402
from support.s3 import CountingProxy, s3_fixture, S3Server, upload_tree as upload  # noqa: E402
from shardflow.pipeline import build  # noqa: E402
from shardflow.config import BuildConfig  # noqa: E402
from shardflow.errors import CatalogError, ConfigError, ManifestError, ValidationError  # noqa: E402
from shardflow.manifest import read_manifest  # noqa: E402
from shardflow.runtime import MixtureDataset, StreamingTokenDataset, TokenDataset  # noqa: E402

REMOTE_LOG = "shardflow.runtime.remote"
SEQ = 256


@dataclass(frozen=True)
class Published:
    """A version built locally and uploaded: its local directory and catalog, and their URLs."""

    version_dir: Path
    catalog: Path
    bucket: str
    version_url: str
    catalog_url: str

    def shard_entries(self, split: str = "train") -> list:
        return list(read_manifest(self.version_dir).splits[split].shards)


s3 = s3_fixture("module")


@pytest.fixture(scope="module")
def published(s3: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Published:
    """rv@v1 from ~1 MB of the shared corpora: 7 train shards of <= 40,000 tokens and a val split."""
    if not MAKE_CORPUS.exists():
        pytest.skip(f"{MAKE_CORPUS} is not available")
    base = tmp_path_factory.mktemp("remote-versions")
    subprocess.run([sys.executable, str(MAKE_CORPUS), str(base / "corpus"), "--mb", "1", "--files", "2"], check=True, capture_output=True)
    sources = tuple(str(p) for p in sorted((base / "corpus").glob("*.parquet")))
    config = BuildConfig(name="rv", sources=sources, shard_tokens=40_000, val_fraction=0.1)
    result = build(config, data_root=base / "data", catalog=base / "catalog")
    version_dir = Path(result.manifest_path).parent
    bucket = f"rv-{uuid.uuid4().hex[:10]}"
    s3.fs().mkdir(bucket)
    upload(s3, base / "data", f"{bucket}/pre/data")
    upload(s3, base / "catalog", f"{bucket}/pre/catalog")
    return Published(
        version_dir=version_dir,
        catalog=base / "catalog",
        bucket=bucket,
        version_url=f"s3://{bucket}/pre/data/rv/v1",
        catalog_url=f"s3://{bucket}/pre/catalog",
    )


def windows(ds: TokenDataset) -> np.ndarray:
    return np.stack([ds.window(i) for i in range(len(ds))])


def stream_ids(samples) -> list[list[int]]:
    return [s["input_ids"].tolist() for s in samples]


def fetched(caplog: pytest.LogCaptureFixture, suffix: str = ".bin") -> list[str]:
    """The objects fetched, as logged (one line per download renamed into place)."""
    return [r.args[0] for r in caplog.records if r.name == REMOTE_LOG and r.msg.startswith("fetched") and r.args[0].endswith(suffix)]


def damaged_copy(s3: S3Server, published: Published, prefix: str, edit) -> str:
    """The version uploaded again under ``prefix`` after ``edit(directory)``; returns its URL."""
    copy = Path(str(published.version_dir) + f"-{prefix}")
    shutil.copytree(published.version_dir, copy)
    edit(copy)
    upload(s3, copy, f"{published.bucket}/{prefix}/rv/v1")
    return f"s3://{published.bucket}/{prefix}/rv/v1"


# --- The same samples as the local version ---


def test_a_version_url_and_a_catalog_url_give_the_local_tokens(published, tmp_path):
    local = TokenDataset(published.version_dir, seq_len=SEQ, pack_sequences=True)
    by_url = TokenDataset(published.version_url, seq_len=SEQ, pack_sequences=True, cache_dir=tmp_path / "a")
    by_catalog = TokenDataset("rv@latest", catalog=published.catalog_url, seq_len=SEQ, pack_sequences=True, cache_dir=tmp_path / "b")
    assert len(by_url) == len(local) == len(by_catalog) > 100
    assert np.array_equal(windows(by_url), windows(local)) and np.array_equal(windows(by_catalog), windows(local))
    for i in (0, 17, len(local) - 1):  # packing reads the cached .bos.idx
        assert all(np.array_equal(by_catalog[i][key], local[i][key]) for key in local[i])
    assert by_url.fingerprint == local.fingerprint  # so resume states carry over
    val = TokenDataset("rv@v1", catalog=published.catalog_url, split="val", seq_len=SEQ, align_to_bos=True, cache_dir=tmp_path / "b")
    assert np.array_equal(windows(val), windows(TokenDataset(published.version_dir, split="val", seq_len=SEQ, align_to_bos=True)))


def test_streaming_from_the_bucket_gives_the_local_stream(published, tmp_path):
    options = dict(seq_len=SEQ, seed=5, shuffle_group=3)
    local = StreamingTokenDataset(published.version_dir, **options)
    remote = StreamingTokenDataset("rv@v1", catalog=published.catalog_url, cache_dir=tmp_path, **options)
    assert not list(tmp_path.rglob("*.bin"))  # nothing fetched at open
    assert stream_ids(remote) == stream_ids(local)
    assert len(list(tmp_path.rglob("*.bin"))) == len(published.shard_entries())  # no limit: all kept


@pytest.mark.slow
def test_a_fresh_process_with_an_empty_cache_reads_the_version(published, s3, tmp_path):
    local = TokenDataset(published.version_dir, seq_len=SEQ)
    stream = StreamingTokenDataset(published.version_dir, seq_len=SEQ, seed=1, shuffle_group=2)
    expected = [hashlib.sha256(windows(local).tobytes()).hexdigest(), hashlib.sha256(str(stream_ids(stream)).encode()).hexdigest()]
    script = textwrap.dedent(
        f"""
        import hashlib, numpy as np
        from shardflow.runtime import StreamingTokenDataset, TokenDataset
        ds = TokenDataset("rv@v1", catalog={published.catalog_url!r}, seq_len={SEQ})
        print(hashlib.sha256(np.stack([ds.window(i) for i in range(len(ds))]).tobytes()).hexdigest())
        it = StreamingTokenDataset({published.version_url!r}, seq_len={SEQ}, seed=1, shuffle_group=2, cache_limit_bytes=400_000)
        print(hashlib.sha256(str([s["input_ids"].tolist() for s in it]).encode()).hexdigest())
        """
    )
    cache = tmp_path / "node-cache"  # $SHARDFLOW_CACHE, empty
    env = {**os.environ, **s3.env, "SHARDFLOW_CACHE": str(cache)}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == expected
    assert (cache / "versions" / published.bucket).is_dir()


def test_a_mixture_reads_a_remote_component(published, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(published.version_dir, copy)
    options = dict(split="train", seq_len=SEQ, seed=2, samples_per_epoch=300)
    remote = MixtureDataset({published.version_url: 0.7, str(copy): 0.3}, cache_dir=tmp_path / "cache", **options)
    local = MixtureDataset({str(published.version_dir): 0.7, str(copy): 0.3}, **options)
    assert stream_ids(remote) == stream_ids(local)


# --- Verification: damaged cache files, damaged objects, paths ---


def test_a_damaged_cached_file_is_fetched_again(published, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=REMOTE_LOG)
    local = windows(TokenDataset(published.version_dir, seq_len=SEQ))
    assert np.array_equal(windows(TokenDataset(published.version_url, seq_len=SEQ, cache_dir=tmp_path)), local)
    shards = sorted(tmp_path.rglob("rv_train_*.bin"))
    assert len(fetched(caplog)) == len(shards) == 7

    def reopen(**options) -> list[str]:
        caplog.clear()
        assert np.array_equal(windows(TokenDataset(published.version_url, seq_len=SEQ, cache_dir=tmp_path, **options)), local)
        return [Path(u).name for u in fetched(caplog)]

    def flip(path: Path) -> None:
        data = bytearray(path.read_bytes())
        data[100:110] = bytes(b ^ 0xFF for b in data[100:110])
        path.write_bytes(bytes(data))

    assert reopen() == []  # trusted by size and marker: nothing rehashed, nothing fetched
    with open(shards[0], "r+b") as f:
        f.truncate(1000)
    assert reopen() == [shards[0].name]
    flip(shards[1])  # same size, rewritten: its inode and mtime no longer match the marker
    assert reopen() == [shards[1].name]
    (shards[2].parent / f".{shards[2].name}.ok").unlink()  # no marker: rehashed, still good, so kept
    assert reopen() == []
    flip(shards[3])
    (shards[3].parent / f".{shards[3].name}.ok").unlink()  # no marker and damaged: fetched again
    assert reopen() == [shards[3].name]
    st = shards[4].stat()
    flip(shards[4])
    os.utime(shards[4], ns=(st.st_atime_ns, st.st_mtime_ns))  # undetectable without rehashing ...
    assert reopen(verify=True) == [shards[4].name]  # ... which verify=True does


@pytest.mark.slow
def test_a_damaged_object_is_refused_after_one_retry(published, s3, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=REMOTE_LOG)
    name = published.shard_entries()[2].file

    def flip(directory: Path) -> None:
        path = directory / name
        data = bytearray(path.read_bytes())
        data[-5] ^= 0xFF
        path.write_bytes(bytes(data))

    url = damaged_copy(s3, published, "flipped", flip)
    refused = rf"{url}/{name}: SHA-256 [0-9a-f]{{64}}, but the manifest says .*fetched twice.*shardflow push NAME@VERSION --repair"
    with pytest.raises(ValidationError, match=refused):
        windows(TokenDataset(url, seq_len=SEQ, cache_dir=tmp_path))  # when the shard is first read
    retries = [r for r in caplog.records if r.name == REMOTE_LOG and "fetching it again" in r.getMessage()]
    assert len(retries) == 1 and name in retries[0].getMessage(), [r.getMessage() for r in retries]
    cached = next(tmp_path.rglob("train"))
    assert not (cached / Path(name).name).exists() and not list(cached.glob(f".{Path(name).name}.tmp-*"))

    url = damaged_copy(s3, published, "short", lambda d: (d / name).write_bytes((d / name).read_bytes()[:-8]))
    with pytest.raises(ValidationError, match=rf"{Path(name).name}: \d+ bytes, but the manifest says \d+ \(fetched twice\)"):
        list(StreamingTokenDataset(url, seq_len=SEQ, shuffle=False, cache_dir=tmp_path))


@pytest.mark.parametrize("bad", ["../escape.bin", "/etc/passwd"])
def test_a_manifest_naming_a_path_outside_the_version_is_refused(published, s3, tmp_path, bad):
    name = published.shard_entries()[0].file

    def edit(directory: Path) -> None:
        path = directory / "metadata.yaml"
        path.write_text(path.read_text().replace(f"file: {name}", f"file: {bad}", 1))

    url = damaged_copy(s3, published, f"escape{len(bad)}", edit)
    with pytest.raises(ManifestError, match=rf"^{url}/metadata.yaml.*'{bad}' escapes the version directory"):
        TokenDataset(url, seq_len=SEQ, cache_dir=tmp_path)
    assert not list(tmp_path.rglob("*.bin")) and not (tmp_path.parent / "escape.bin").exists()


def test_a_changed_manifest_is_refused_through_the_catalog(published, s3, tmp_path):
    fs = s3.fs()
    key = f"{published.bucket}/pre/data/rv/v1/metadata.yaml"
    original = fs.cat_file(key)
    fs.pipe_file(key, original.replace(b"description: ", b"description: edited ", 1))
    try:
        with pytest.raises(ValidationError, match=r"metadata.yaml: the manifest is not the one published as rv@v1 .*catalog s3://"):
            TokenDataset("rv@v1", catalog=published.catalog_url, seq_len=SEQ, cache_dir=tmp_path)
    finally:
        fs.pipe_file(key, original)
    with pytest.raises(CatalogError, match=r"no dataset 'nope' in the catalog s3://.*\(datasets: rv\)"):
        TokenDataset("nope@v1", catalog=published.catalog_url, seq_len=SEQ, cache_dir=tmp_path)
    with pytest.raises(CatalogError, match=r"no version 'v9' of 'rv' in the catalog s3://.*\(versions: v1\)"):
        TokenDataset("rv@9", catalog=published.catalog_url, seq_len=SEQ, cache_dir=tmp_path)


@pytest.mark.slow
def test_without_s3fs_the_error_names_the_pip_install(published, s3):
    script = f"""
import sys
sys.modules["s3fs"] = None  # as if the optional extra were not installed
from shardflow.runtime import TokenDataset
try:
    TokenDataset({published.version_url!r}, seq_len=8)
except Exception as exc:
    print(type(exc).__name__, exc)
"""
    out = subprocess.run([sys.executable, "-c", script], env={**os.environ, **s3.env}, capture_output=True, text=True, timeout=60)
    assert "InputError" in out.stdout and "pip install 'shardflow[s3]'" in out.stdout, out.stdout + out.stderr


# --- Sharing the cache between processes ---


@pytest.mark.slow
def test_two_processes_sharing_a_cache_fetch_each_file_once(published, s3, tmp_path):
    proxy = CountingProxy(s3.endpoint)
    go = tmp_path / "go"
    script = textwrap.dedent(
        f"""
        import hashlib, os, sys, time
        import numpy as np
        from shardflow.runtime import TokenDataset
        while not os.path.exists({str(go)!r}):
            time.sleep(0.01)
        ds = TokenDataset({published.version_url!r}, seq_len={SEQ}, cache_dir={str(tmp_path / 'cache')!r})
        print(hashlib.sha256(np.stack([ds.window(i) for i in range(len(ds))]).tobytes()).hexdigest())
        """
    )
    env = {**os.environ, **s3.env, "AWS_ENDPOINT_URL": proxy.endpoint}
    procs = [
        subprocess.Popen([sys.executable, "-c", script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    time.sleep(1.0)  # both imported and waiting
    go.touch()
    outs = [p.communicate(timeout=120) for p in procs]
    proxy.close()
    assert all(p.returncode == 0 for p in procs), [err for _, err in outs]
    expected = hashlib.sha256(windows(TokenDataset(published.version_dir, seq_len=SEQ)).tobytes()).hexdigest()
    assert [out.strip() for out, _ in outs] == [expected, expected]
    for e in published.shard_entries():
        assert proxy.bytes_asked(f"{published.bucket}/pre/data/rv/v1/{e.file}", e.bytes) == e.bytes, e.file
        assert proxy.bytes_asked(f"{published.bucket}/pre/data/rv/v1/{e.index.file}", e.index.bytes) == 0  # not needed


# --- A cache size limit ---


def cached_bytes(root: Path) -> int:
    """Bytes of shard files in the cache, downloads in progress included (not the small indexes and markers)."""
    total = 0
    for p in root.rglob("*"):
        if p.suffix == ".bin" or ".bin.tmp-" in p.name:
            try:
                total += p.stat().st_size
            except FileNotFoundError:  # the prefetch thread renamed or evicted it since the listing
                pass
    return total


def test_streaming_under_a_limit_evicts_finished_shards_and_stays_under_it(published, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=REMOTE_LOG)
    sizes = sorted(e.bytes for e in published.shard_entries())
    limit = sizes[-1] + sizes[-2]  # two shards: one shuffle group of 2
    options = dict(seq_len=SEQ, seed=3, shuffle_group=2)
    remote = StreamingTokenDataset(published.version_url, cache_dir=tmp_path, cache_limit_bytes=limit, **options)
    got, peak, held = [], 0, set()
    for sample in remote:
        got.append(sample["input_ids"].tolist())
        peak = max(peak, cached_bytes(tmp_path))
        held.add(len(list(tmp_path.rglob("*.bin"))))
    assert got == stream_ids(StreamingTokenDataset(published.version_dir, **options))
    assert sizes[-1] <= peak <= limit and 2 <= max(held) < len(sizes)
    assert len(fetched(caplog)) == len(sizes)  # each shard once: evicted only when finished
    assert cached_bytes(tmp_path) == 0  # the pass is over: nothing held


def test_a_shard_another_reader_pins_is_not_evicted(published, tmp_path):
    from shardflow.runtime.remote import open_remote_split

    sizes = sorted(e.bytes for e in published.shard_entries())
    other = open_remote_split(published.version_url, split="train", cache_dir=tmp_path)  # its own pins, as another process's
    name = published.shard_entries()[3].file
    other.cache.pin(name)
    other.fetch(3)
    options = dict(seq_len=SEQ, seed=8, shuffle_group=2, cache_dir=tmp_path, cache_limit_bytes=2 * sizes[-1])
    it = StreamingTokenDataset(published.version_url, **options)
    assert len(list(it)) == len(it.dataset)
    assert [p.name for p in tmp_path.rglob("*.bin")] == [Path(name).name]  # the rest were evicted after use
    assert not other.cache.try_evict(name)  # still pinned
    other.cache.unpin(name)
    assert other.cache.try_evict(name) and not list(tmp_path.rglob("*.bin"))


def test_a_limit_smaller_than_the_shards_read_at_once_is_refused(published, tmp_path):
    sizes = sorted(e.bytes for e in published.shard_entries())
    with pytest.raises(ConfigError, match=r"cache_limit_bytes=[\d,]+ cannot hold the largest shard of rv@v1"):
        StreamingTokenDataset(published.version_url, seq_len=SEQ, cache_dir=tmp_path, cache_limit_bytes=sizes[-1] - 1)
    it = StreamingTokenDataset(published.version_url, seq_len=SEQ, cache_dir=tmp_path, cache_limit_bytes=sizes[-1] + 1, shuffle_group=4)
    too_small = r"cache_limit_bytes=[\d,]+ is too small for rv@v1: 1 shards .* raise cache_limit_bytes .* or lower shuffle_group"
    with pytest.raises(ConfigError, match=too_small):
        list(it)
    assert cached_bytes(tmp_path) <= sizes[-1] + 1


def test_token_dataset_under_a_limit_reads_at_random_and_keeps_at_most_the_limit(published, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=REMOTE_LOG)
    sizes = sorted(e.bytes for e in published.shard_entries())
    limit = sizes[-1] + sizes[-2]  # two shards
    local = TokenDataset(published.version_dir, seq_len=SEQ)
    remote = TokenDataset(published.version_url, seq_len=SEQ, cache_dir=tmp_path, cache_limit_bytes=limit)
    assert not list(tmp_path.rglob("*.bin"))  # nothing fetched at open
    order = np.random.default_rng(0).permutation(len(local))[:300]
    peak = 0
    for i in order.tolist():
        assert np.array_equal(remote[i]["input_ids"], local[i]["input_ids"])
        peak = max(peak, cached_bytes(tmp_path))
    assert sizes[-1] <= peak <= limit
    assert len(fetched(caplog)) > len(sizes)  # shards evicted, then fetched again when read again

    def mapped() -> int:  # this process's maps of the cache's shard files, evicted (deleted) ones included
        return sum(1 for line in Path("/proc/self/maps").read_text().splitlines() if str(tmp_path) in line and ".bin" in line)

    wrong: list[int] = []

    def read(seed: int) -> None:
        for i in np.random.default_rng(seed).permutation(len(local))[:150].tolist():
            if not np.array_equal(remote[i]["input_ids"], local[i]["input_ids"]):
                wrong.append(i)

    threads = [threading.Thread(target=read, args=(seed,)) for seed in (1, 2)]  # two threads of one process
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    gc.collect()
    assert not wrong and mapped() <= 2 and cached_bytes(tmp_path) <= limit  # no shard left mapped outside the count
    with pytest.raises(ConfigError, match=r"cache_limit_bytes=[\d,]+ cannot hold the largest shard of rv@v1 .*raise it"):
        TokenDataset(published.version_url, seq_len=SEQ, cache_dir=tmp_path, cache_limit_bytes=sizes[-1] - 1)
    with pytest.raises(ConfigError, match=r"cache_dir and cache_limit_bytes are for versions on object storage"):
        TokenDataset(published.version_dir, seq_len=SEQ, cache_limit_bytes=500_000)


def test_a_shard_sampler_on_the_bucket_fetches_its_next_shards_ahead(published, tmp_path, caplog):
    from shardflow.runtime import ShardSampler

    caplog.set_level(logging.INFO, logger=REMOTE_LOG)
    local = TokenDataset(published.version_dir, seq_len=SEQ)
    remote = TokenDataset(published.version_url, seq_len=SEQ, cache_dir=tmp_path)
    sampler = ShardSampler(remote, rank=1, world_size=2, seed=4, shuffle_group=2)
    indices = list(ShardSampler(local, rank=1, world_size=2, seed=4, shuffle_group=2))
    got = [remote[i]["input_ids"] for i in sampler]
    assert len(got) == len(indices) and all(np.array_equal(a, local[i]["input_ids"]) for a, i in zip(got, indices))
    read = {local.locate(i)[0] for i in indices}
    records = [r for r in caplog.records if r.name == REMOTE_LOG and r.msg.startswith("fetched") and r.args[0].endswith(".bin")]
    assert len(records) == len(read) < len(published.shard_entries())  # its shards, each once
    assert any(r.threadName.startswith("shardflow-readahead") for r in records)  # fetched before the reader got there


def test_a_cold_open_asks_the_store_for_the_catalog_entry_the_manifest_and_one_shard(published, s3, tmp_path):
    proxy = CountingProxy(s3.endpoint)
    script = textwrap.dedent(
        f"""
        from shardflow.runtime import TokenDataset
        ds = TokenDataset("rv@v1", catalog={published.catalog_url!r}, seq_len={SEQ})
        print(ds[0]["input_ids"][:4].tolist())
        """
    )
    env = {**os.environ, **s3.env, "AWS_ENDPOINT_URL": proxy.endpoint, "SHARDFLOW_CACHE": str(tmp_path / "cold")}
    try:
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    finally:
        proxy.close()
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[0] == str(TokenDataset(published.version_dir, seq_len=SEQ)[0]["input_ids"][:4].tolist())
    first = published.shard_entries()[0].file
    asked = {(method, path.split("?")[0]) for method, path, _ in proxy.requests}
    allowed = {f"/{published.bucket}/pre/catalog/rv.yaml", f"/{published.bucket}/pre/data/rv/v1/metadata.yaml",
               f"/{published.bucket}/pre/data/rv/v1/{first}"}
    assert {method for method, _ in asked} <= {"GET", "HEAD"}
    assert {path for _, path in asked} <= allowed, sorted(asked)
    assert f"/{published.bucket}/pre/data/rv/v1/{first}" in {path for _, path in asked}
    per_object = {path: sum(1 for m, p, _ in proxy.requests if p.split("?")[0] == path) for path in allowed}
    assert all(n <= 3 for n in per_object.values()), per_object  # HEAD, GET (and a retry at most)


# --- Exact resume ---


def test_resume_from_a_state_dict_on_the_remote_version(published, tmp_path):
    sizes = sorted(e.bytes for e in published.shard_entries())
    options = dict(seq_len=SEQ, seed=11, shuffle_group=2)
    full = stream_ids(StreamingTokenDataset(published.version_dir, **options))
    first = StreamingTokenDataset(published.version_url, cache_dir=tmp_path / "a", cache_limit_bytes=2 * sizes[-1], **options)
    head = []
    for sample in first:
        head.append(sample["input_ids"].tolist())
        if len(head) == len(full) // 3:
            break
    state = first.state_dict()
    resumed = StreamingTokenDataset(
        "rv@v1", catalog=published.catalog_url, cache_dir=tmp_path / "b", cache_limit_bytes=2 * sizes[-1], **options
    )
    resumed.load_state_dict(state)
    assert head + stream_ids(resumed) == full
    local = StreamingTokenDataset(published.version_dir, **options)
    local.load_state_dict(state)  # the same stream, whichever the copy
    assert stream_ids(local) == full[len(head) :]


def test_a_worker_share_across_epochs_fetches_each_shard_once_per_epoch(published, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger=REMOTE_LOG)
    sizes = sorted(e.bytes for e in published.shard_entries())
    options = dict(seq_len=SEQ, seed=4, shuffle_group=2, infinite=True)
    remote = StreamingTokenDataset(published.version_url, cache_dir=tmp_path, cache_limit_bytes=3 * sizes[-1], **options)
    local = StreamingTokenDataset(published.version_dir, **options)
    n = remote.epoch_samples
    start, stop = n // 2, n // 2 + 2 * n  # from mid-epoch 0 into epoch 2
    split = dict(worker_id=1, num_workers=3, block_size=5)
    got = stream_ids(remote.iter_range(start, stop, **split))
    assert got == stream_ids(local.iter_range(start, stop, **split))
    # The plan saw the worker's samples exactly: each shard fetched once per epoch it is read in.
    positions = [p for p in range(start, stop) if ((p - start) // 5) % 3 == 1]
    ids = list(local.indices(start, stop, **split))
    assert len(ids) == len(positions) == len(got)
    epochs = {}
    for p, i in zip(positions, ids):
        epochs.setdefault(p // n, set()).add(local.dataset.locate(i)[0])
    assert len(fetched(caplog)) == sum(len(s) for s in epochs.values()) and len(epochs) == 3


@pytest.mark.slow
def test_a_dataloader_with_workers_under_a_limit_gives_the_local_batches(published, tmp_path):
    pytest.importorskip("torch")
    from shardflow.runtime import StreamingLoader

    sizes = sorted(e.bytes for e in published.shard_entries())
    options = dict(seq_len=SEQ, seed=6, shuffle_group=2)
    remote = StreamingTokenDataset(published.version_url, cache_dir=tmp_path, cache_limit_bytes=2 * sizes[-1], **options)
    local = StreamingTokenDataset(published.version_dir, **options)
    got = [b["input_ids"].numpy() for b in StreamingLoader(remote, batch_size=4, num_workers=2)]
    want = [b["input_ids"].numpy() for b in StreamingLoader(local, batch_size=4, num_workers=0)]
    assert len(got) == len(want) and all(np.array_equal(a, b) for a, b in zip(got, want))
    assert cached_bytes(tmp_path) == 0


FAILING_CACHE = r"""
import resource, signal, sys
from shardflow.errors import ShardflowError
from shardflow.runtime import TokenDataset
if sys.argv[2] == "small-files":  # a cache that cannot hold a shard: writes past 20 kB fail (as on a full disk)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))
try:
    TokenDataset(sys.argv[1], seq_len=256, cache_dir=sys.argv[3])[0]
except ShardflowError as exc:
    sys.exit(f"{type(exc).__name__}: {exc}")
"""


@pytest.mark.parametrize("case", ["small-files", "endpoint-down"])
def test_a_cache_that_cannot_take_a_file_and_an_unreachable_store_are_one_line(published, s3, tmp_path, case):
    env = {**os.environ, **s3.env, "AWS_MAX_ATTEMPTS": "1"}
    if case == "endpoint-down":
        env["AWS_ENDPOINT_URL"] = "http://127.0.0.1:9"  # nothing listens there
    out = subprocess.run([sys.executable, "-c", FAILING_CACHE, published.version_url, case, str(tmp_path / "cache")],
                         env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 1 and out.stdout == "" and out.stderr.count("\n") == 1, out.stderr
    if case == "small-files":
        assert re.fullmatch(rf"ConfigError: {published.version_url}/train/\S+\.bin: cannot be cached in "
                            rf"{tmp_path}/cache/\S+ \(File too large\); free space there, set cache_limit_bytes, "
                            r"or give another cache_dir \(or \$SHARDFLOW_CACHE\)\n", out.stderr), out.stderr
    else:
        assert re.fullmatch(rf"InputError: {published.version_url}/metadata.yaml: the object store could not be "
                            r"reached \(Could not connect to the endpoint URL: .*\), 3 tries; check AWS_ENDPOINT_URL "
                            r"and the network, then run again\n", out.stderr), out.stderr


def test_two_worker_slices_merged_in_one_process_under_a_cache_limit(published, tmp_path):
    """Two passes at once over one stream (a process merging worker slices itself): the second is fetched on use,
    and the first's fetch-ahead plan and cache limit count only its own samples (they counted both: a false
    'cache_limit_bytes is too small' mid-epoch)."""
    def merged(ds: StreamingTokenDataset) -> list[list[int]]:
        slices = [ds.iter_range(0, ds.epoch_samples, worker_id=w, num_workers=2, block_size=4) for w in (0, 1)]
        out: list[list[int]] = []
        while len(out) < ds.epoch_samples:
            for s in slices:
                out += [x["input_ids"].tolist() for x in itertools.islice(s, 4)]
        return out

    opts = dict(seq_len=SEQ, seed=3, shuffle_group=2)
    local = merged(StreamingTokenDataset(published.version_dir, **opts))
    remote = StreamingTokenDataset(published.version_url, cache_dir=tmp_path, cache_limit_bytes=340_000, **opts)
    assert merged(remote) == local
