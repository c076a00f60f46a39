"""Builds write the shard table (manifest schema 4) for a version of more than ``SHARD_TABLE_ABOVE`` shards,
and every path that reads a version's manifest, local or on a bucket, reads it.

The threshold (500 shards) is lowered to 3 in this process (``monkeypatch`` of the one constant) so that
builds of half the sample corpus (4 shards) and of all of it (9) are tabled in seconds; the golden test
(tests/pipeline/test_golden_sample.py) and the default builds here show that a small version stays schema 3.
What these show, locally: a tabled build is the schema-3 build of the same inputs, shard for shard and token
for token (``open_shards``, ``TokenDataset``), validates, and is an incremental parent (of a tabled child or of a
schema-3 one; a schema-3 parent of a tabled child too). On a bucket (moto on loopback): a build to the bucket
sends the table, and the version opens from a fresh cache; an incremental build from another machine's empty
scratch fetches the tabled parent and reuses it; a build of the same objects keyed by their identity finds
the version through its tabled manifest; ``validate``, ``show``, ``diff`` and ``rm`` work on it; a push copies a
tabled parent's shards within the bucket, takes over the manifest of an interrupted push of the same build,
and ``push --repair`` restores a damaged table and shard, or says what it needs.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import shardflow.manifest as manifest_module
from support.cli import run_main
from support.corpus import split_sample
from shardflow.config import BuildConfig
from shardflow.manifest import SCHEMA_VERSION, SHARD_TABLE_ABOVE, TABLE_SCHEMA_VERSION, read_manifest
from shardflow.pipeline import build
from shardflow.runtime import TokenDataset, open_shards
from shardflow.shard_table import TABLE_MAGIC, TABLE_NAME

LOW = 3
"""The threshold in this process for a tabled build: half the sample is 4 shards, all of it 9."""
OPTIONS = dict(shard_tokens=20_000, val_fraction=0.1)
SEQ = 64


@pytest.fixture(scope="module")
def halves(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """The sample corpus as two Parquet inputs (rows 0-29, 30-60): part0.parquet, part1.parquet."""
    return sorted(split_sample(tmp_path_factory.mktemp("halves"), (30, 31)).glob("*.parquet"))


def build_with(above: int, sources: list[Path] | list[str], root: Path | str, catalog: Path | str | None = None) -> str:
    """``tb`` built from ``sources`` with the shard-table threshold at ``above``; its ``NAME@vN``."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(manifest_module, "SHARD_TABLE_ABOVE", above)
        if catalog is None:  # a local data root and catalog under ``root``
            root, catalog = Path(root) / "data", Path(root) / "catalog"
        return build(BuildConfig(name="tb", sources=tuple(map(str, sources)), **OPTIONS), data_root=root,
                     catalog=catalog).ref


CHAINS = {  # v1 from half the sample, v2 (incremental, parent v1) from both halves: each built with this threshold
    "yaml-then-table": (SHARD_TABLE_ABOVE, LOW),
    "table-then-table": (LOW, LOW),
    "table-then-yaml": (LOW, SHARD_TABLE_ABOVE),
}


@pytest.fixture(scope="module")
def chains(tmp_path_factory: pytest.TempPathFactory, halves: list[Path]) -> dict[str, Path]:
    """Each chain of ``CHAINS`` in a data root and catalog of its own; ``table-then-yaml``'s v1 is built a second
    later than ``table-then-table``'s (a twin: the same build and files, a manifest of its own creation time)."""
    roots = {name: tmp_path_factory.mktemp(name) for name in CHAINS}
    finished = 0.0
    for name, (first, _) in CHAINS.items():
        if name == "table-then-yaml":
            time.sleep(max(0.0, 1.05 - (time.monotonic() - finished)))  # (the manifest records whole seconds)
        assert build_with(first, halves[:1], roots[name]) == "tb@v1"
        finished = time.monotonic()
    for name, (_, second) in CHAINS.items():
        assert build_with(second, halves, roots[name]) == "tb@v2"
    return roots


def version(root: Path, v: str) -> Path:
    return root / "data" / "tb" / v


def windows(ds: TokenDataset) -> np.ndarray:
    return np.stack([ds.window(i) for i in range(len(ds))])


def test_the_default_threshold_keeps_small_builds_at_schema_3():
    assert SCHEMA_VERSION == 3 and TABLE_SCHEMA_VERSION == 4 and SHARD_TABLE_ABOVE == 500


def test_a_build_above_the_threshold_writes_a_table_and_reads_as_the_yaml_build(chains):
    for name, thresholds in CHAINS.items():
        for v, above in zip(("v1", "v2"), thresholds):
            directory = version(chains[name], v)
            manifest = read_manifest(directory)
            tabled = above == LOW
            assert manifest.schema_version == (TABLE_SCHEMA_VERSION if tabled else SCHEMA_VERSION), (name, v)
            assert (manifest.shard_table is not None) == tabled == (directory / TABLE_NAME).is_file(), (name, v)
            raw = yaml.safe_load((directory / "metadata.yaml").read_text())
            if tabled:  # the YAML counts the shards; the table lists them
                assert all(isinstance(s["shards"], int) for s in raw["splits"].values())
                assert (directory / TABLE_NAME).read_bytes().startswith(TABLE_MAGIC)
                assert raw["shard_table"] == {"file": TABLE_NAME, "bytes": manifest.shard_table.bytes,
                                              "sha256": manifest.shard_table.sha256}
            else:
                assert "shard_table" not in raw and all(isinstance(s["shards"], list) for s in raw["splits"].values())
    # The same inputs make the same shards whatever lists them: entries, tokens and samples.
    for v in ("v1", "v2"):
        directories = {name: version(root, v) for name, root in chains.items()}
        manifests = {name: read_manifest(d) for name, d in directories.items()}
        first = manifests["yaml-then-table"]
        assert sum(len(s.shards) for s in first.splits.values()) > LOW
        for name, m in manifests.items():
            assert m.splits == first.splits and m.build_key == first.build_key, (name, v)
            for split in m.splits:
                got, want = open_shards(directories[name], split=split), open_shards(directories["yaml-then-table"], split=split)
                assert got.num_shards == want.num_shards
                for k in range(got.num_shards):
                    np.testing.assert_array_equal(got.shard(k), want.shard(k))
        tabled = TokenDataset(directories["table-then-table"], seq_len=SEQ)
        assert np.array_equal(windows(tabled), windows(TokenDataset(directories["table-then-yaml"], seq_len=SEQ)))


def test_each_incremental_build_reused_its_parent_whatever_lists_its_shards(chains):
    for name, root in chains.items():
        child = read_manifest(version(root, "v2"))
        assert child.parent == "tb@v1" and child.extra["reuse"]["parent"] == "tb@v1", name
        assert child.extra["reuse"]["linked_shards"] > 0 and child.extra["reuse"]["reused_inputs"] == ["part0.parquet"], name


def test_validate_checks_a_built_table(chains):
    root = chains["table-then-table"]
    for v in ("v1", "v2"):
        run = run_main("validate", f"tb@{v}", "--catalog", root / "catalog")
        assert run.status == 0 and run.out.startswith(f"OK tb@{v}: "), run.out + run.err


# --- on a bucket ------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3():
    pytest.importorskip("s3fs", reason="object storage needs the optional extra: pip install 'shardflow[s3]'")
    pytest.importorskip("moto.server", reason="the loopback S3 server is moto[server] (the test extra)")
    from support.s3 import S3Server, environment

    server = S3Server()
    with environment(server.env):
        yield server
    server.stop()


def new_bucket(s3) -> str:
    from support.s3 import new_bucket

    return new_bucket(s3, "tabled")


@pytest.fixture
def bucket(s3) -> str:
    return new_bucket(s3)


def on(bucket: str) -> dict[str, str]:
    return {"data_root_url": f"s3://{bucket}/data", "catalog_url": f"s3://{bucket}/catalog"}


def objects(s3, bucket: str, prefix: str) -> set[str]:
    try:
        return {k.rpartition(f"{prefix}/")[2] for k in s3.fs().find(f"{bucket}/{prefix}/")}
    except FileNotFoundError:
        return set()


@pytest.mark.slow
def test_a_build_to_a_bucket_sends_the_table_and_incremental_builds_and_readers_read_it(s3, bucket, halves, chains,
                                                                                        tmp_path, monkeypatch):
    fs = s3.fs()
    for p in halves:
        fs.put_file(str(p), f"{bucket}/in/{p.name}")
    inputs = [f"s3://{bucket}/in/{p.name}" for p in halves]
    data_root, catalog = f"s3://{bucket}/data", f"s3://{bucket}/catalog"
    monkeypatch.setenv("SHARDFLOW_SCRATCH", str(tmp_path / "scratch-1"))
    assert build_with(LOW, inputs[:1], data_root, catalog) == "tb@v1"
    assert {TABLE_NAME, "metadata.yaml"} <= objects(s3, bucket, "data/tb/v1")
    assert yaml.safe_load(fs.cat_file(f"{bucket}/data/tb/v1/metadata.yaml"))["schema_version"] == TABLE_SCHEMA_VERSION
    local = chains["table-then-table"]
    remote = TokenDataset("tb@v1", catalog=catalog, seq_len=SEQ, cache_dir=tmp_path / "cache-1")  # a fresh cache
    assert np.array_equal(windows(remote), windows(TokenDataset(version(local, "v1"), seq_len=SEQ)))
    # Another machine (an empty scratch) builds both halves: the tabled parent is fetched, verified, and reused.
    monkeypatch.setenv("SHARDFLOW_SCRATCH", str(tmp_path / "scratch-2"))
    assert build_with(LOW, inputs, data_root, catalog) == "tb@v2"
    fetched = read_manifest(tmp_path / "scratch-2" / bucket / "data" / "tb" / "v1")
    assert fetched.shard_table is not None
    cache = tmp_path / "cache-2"
    monkeypatch.setenv("SHARDFLOW_CACHE", str(cache))
    run = run_main("validate", "tb@v2", "--catalog", catalog)
    assert run.status == 0 and run.out.startswith("OK tb@v2: "), run.out + run.err
    child = read_manifest(next(cache.rglob("metadata.yaml")).parent)
    assert child.shard_table is not None and child.extra["reuse"]["linked_shards"] > 0
    remote = TokenDataset("tb@v2", catalog=catalog, seq_len=SEQ, cache_dir=tmp_path / "cache-3")
    assert np.array_equal(windows(remote), windows(TokenDataset(version(local, "v2"), seq_len=SEQ)))
    # A build of v1's inputs planned where no catalog recorded them (as one that waited for the lease of a
    # concurrent first build of new objects) is keyed by the objects' identity, not the SHA-256 the bucket's catalog
    # records: the version is found by its manifest, read with its table, which records the same inputs.
    from shardflow.bucket.build import bucket_places
    from shardflow.bucket.driving import published_version
    from shardflow.pipeline.plan import plan_build

    plan = plan_build(BuildConfig(name="tb", sources=tuple(inputs[:1]), **OPTIONS), data_root=tmp_path / "plan",
                      catalog=tmp_path / "plan-catalog")
    assert not plan.inputs[0].sha256
    assert published_version(bucket_places(data_root, catalog, tmp_path / "scratch-3"), plan) == "v1"
    for command in (("show", "tb@v2"), ("diff", "tb@v1", "tb@v2")):
        run = run_main(*command, "--catalog", catalog)
        assert run.status == 0, run.err
    assert "tb@v2" in run_main("show", "tb@v2", "--catalog", catalog).out
    run = run_main("rm", "tb@v2", "--catalog", catalog)
    assert run.status == 0 and objects(s3, bucket, "data/tb/v2") == set(), run.err


def test_a_push_copies_a_tabled_parent_and_takes_over_an_interrupted_twin(s3, bucket, chains):
    from shardflow.bucket.push import push_version

    tabled = chains["table-then-table"]
    first = push_version("tb@v1", catalog=tabled / "catalog", **on(bucket))
    assert first.uploaded > 0 and TABLE_NAME in objects(s3, bucket, "data/tb/v1")
    child = push_version("tb@v2", catalog=tabled / "catalog", **on(bucket))
    assert child.parent == "tb@v1" and child.copied > 0, child  # the parent's manifest read with its table
    # The same build pushed from two machines: the first dies between its manifest and its catalog entry; the
    # second finds that manifest (tabled, of the same files) and lists the version with it.
    other = new_bucket(s3)
    twin = chains["table-then-yaml"]  # its v1: tabled, the same files, another creation time
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("shardflow.bucket.push._commit", lambda *a, **k: (_ for _ in ()).throw(OSError("killed")))
        with pytest.raises(OSError, match="killed"):
            push_version("tb@v1", catalog=twin / "catalog", **on(other))
    result = push_version("tb@v1", catalog=tabled / "catalog", **on(other))
    assert not result.already
    listed = yaml.safe_load(s3.fs().cat_file(f"{other}/catalog/tb.yaml"))["versions"]
    assert [e["created_at"] for e in listed] == [read_manifest(version(twin, "v1")).created_at]


def test_push_repair_restores_a_damaged_table_or_says_what_it_needs(s3, bucket, chains, tmp_path):
    from shardflow.bucket.push import push_version
    from shardflow.bucket.repair import repair_bucket_version
    from shardflow.errors import ValidationError

    tabled = chains["table-then-table"]
    push_version("tb@v1", catalog=tabled / "catalog", **on(bucket))
    fs = s3.fs()
    shard = read_manifest(version(tabled, "v1")).splits["train"].shards[1].file
    for name in (TABLE_NAME, shard):
        fs.pipe_file(f"{bucket}/data/tb/v1/{name}", b"damaged")
    where = dict(catalog_url=f"s3://{bucket}/catalog", scratch=tmp_path / "scratch", cache_dir=tmp_path / "cache")
    with pytest.raises(ValidationError, match=rf"/data/tb/v1/{TABLE_NAME}: the shard table the manifest names is not "
                                              r"the manifest's on the bucket \(7 bytes, but the manifest says \d+ "
                                              r"\(fetched twice\)\), and no copy here"):
        repair_bucket_version("tb@v1", no_rebuild=True, **where)
    result = repair_bucket_version("tb@v1", sources=[version(tabled, "v1")], **where)
    assert sorted(f for f, _, _ in result.restored) == sorted([TABLE_NAME, shard]) and not result.rebuilt
    remote = TokenDataset("tb@v1", catalog=where["catalog_url"], seq_len=SEQ, cache_dir=tmp_path / "fresh")
    assert np.array_equal(windows(remote), windows(TokenDataset(version(tabled, "v1"), seq_len=SEQ)))
