"""The catalog: publication order, references, messages, locking."""

from __future__ import annotations

import os
import shutil
import threading
from pathlib import Path

import pytest
import yaml

from support.builds import make_builder
from shardflow.catalog import Catalog, VersionEntry, default_catalog, default_data_root, file_lock, resolve_ref
from shardflow.errors import CatalogError
from shardflow.reader import open_version


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory, tiny_parquet):
    """``tiny@v1`` (nanogpt) and ``tiny@v2`` (npy), plus ``other@v1``, in one catalog."""
    root = tmp_path_factory.mktemp("catalog-root")
    make = make_builder(root)
    v1 = make(tiny_parquet, name="tiny")
    v2 = make(tiny_parquet, name="tiny", format="npy")
    make(tiny_parquet, name="other")
    return root, v1, v2


@pytest.mark.slow
def test_references_resolve(two_versions, monkeypatch):
    root, v1, v2 = two_versions
    cat = Catalog(root / "catalog")
    assert (v1.ref, v2.ref) == ("tiny@v1", "tiny@v2")
    assert cat.resolve("tiny@v1") == v1.directory
    assert cat.resolve("tiny@1") == v1.directory
    assert cat.resolve("tiny@v2") == v2.directory
    assert cat.resolve("tiny@latest") == v2.directory
    assert cat.resolve("tiny") == v2.directory
    assert resolve_ref(v1.directory) == v1.directory
    assert resolve_ref(str(v1.directory / "metadata.yaml")) == v1.directory
    monkeypatch.chdir(v1.directory.parent)
    assert resolve_ref("v1") == v1.directory  # a relative version directory
    assert resolve_ref(os.path.join(".", "v1", "metadata.yaml")) == v1.directory
    assert open_version("tiny@latest", catalog=cat).manifest.format_name == "npy"


def test_catalog_file_lists_versions_in_order_with_parents(two_versions):
    root, v1, v2 = two_versions
    data = yaml.safe_load((root / "catalog" / "tiny.yaml").read_text())
    assert data["schema_version"] == 1 and data["name"] == "tiny" and data["latest"] == "v2"
    assert [v["version"] for v in data["versions"]] == ["v1", "v2"]
    assert [v["parent"] for v in data["versions"]] == [None, "tiny@v1"]
    assert data["versions"][0]["path"] == os.path.join("..", "data", "tiny", "v1")  # relative to the catalog
    assert data["versions"][1]["totals"] == {"documents": 3, "tokens": 9, "shards": 1, "bytes": 128 + 36 + 12}
    cat = Catalog(root / "catalog")
    assert cat.datasets() == ["other", "tiny"]
    assert [v.version for v in cat.versions("tiny")] == ["v1", "v2"]
    assert cat.next_version("tiny") == "v3" and cat.next_version("new") == "v1"


def test_unknown_names_and_versions_are_explained(two_versions):
    root, _, _ = two_versions
    cat = Catalog(root / "catalog")
    with pytest.raises(CatalogError, match=r"no dataset 'nosuch' in the catalog .*catalog \(datasets: other, tiny\)"):
        cat.resolve("nosuch@latest")
    with pytest.raises(CatalogError, match=r"no dataset 'nosuch'"):
        cat.resolve("nosuch")
    with pytest.raises(CatalogError, match=r"no version 'v9' of 'tiny' in the catalog .* \(versions: v1, v2\)"):
        cat.resolve("tiny@v9")
    with pytest.raises(CatalogError, match=r"no version 'v7' of 'tiny'"):
        cat.resolve("tiny@7")
    with pytest.raises(CatalogError, match=r"no metadata\.yaml there; a path reference must be a version directory"):
        resolve_ref(str(root / "data" / "tiny"), catalog=cat)
    with pytest.raises(CatalogError, match=r"\(datasets: none\)"):
        resolve_ref("tiny@v1", catalog=root / "empty-catalog")


def test_catalog_and_data_move_together(two_versions, tmp_path):
    root, _, _ = two_versions
    moved = tmp_path / "moved"
    shutil.copytree(root, moved)
    cat = Catalog(moved / "catalog")
    assert cat.resolve("tiny@v1") == moved / "data" / "tiny" / "v1"


def test_versions_are_immutable(tmp_path):
    cat = Catalog(tmp_path / "cat")
    entry = VersionEntry(version="v1", path=str(tmp_path / "d" / "v1"), created_at="t", build_key="k")
    with cat.lock("x"):
        cat.add("x", entry)
        with pytest.raises(CatalogError, match=r"x@v1 is already in the catalog; versions are immutable"):
            cat.add("x", entry)
    assert cat.find_build("x", "k") == VersionEntry(**{**entry.to_dict(), "path": os.path.join("..", "d", "v1")})
    assert cat.find_build("x", "other") is None


def test_bad_catalog_files(tmp_path):
    cat = Catalog(tmp_path)
    (tmp_path / "a.yaml").write_text("schema_version: 99\nversions: []\n")
    with pytest.raises(CatalogError, match=r"a\.yaml: unknown catalog schema_version 99; this shardflow reads 1"):
        cat.versions("a")
    (tmp_path / "b.yaml").write_text("versions: [unclosed\n")
    with pytest.raises(CatalogError, match=r"b\.yaml: the catalog file is not valid YAML"):
        cat.latest("b")
    (tmp_path / "c.yaml").write_text("schema_version: 1\nlatest: null\nversions: []\nremoved: [{version: v1}]\n")
    with pytest.raises(CatalogError, match=r"c\.yaml: removed\[0\]: missing field 'path'; restore the catalog file"):
        cat.removed("c")
    (tmp_path / "d.yaml").write_text("schema_version: 1\nlatest: null\nversions: []\nremoved: 5\n")
    with pytest.raises(CatalogError, match=r"d\.yaml: field 'removed' must be a list of removed versions, not 5"):
        cat.next_version("d")


def test_lock_refuses_a_second_holder(tmp_path):
    cat = Catalog(tmp_path)
    with cat.lock("x"):
        with pytest.raises(CatalogError, match=r"the catalog entry of 'x' is locked by another process .*Wait for it to finish"):
            with cat.lock("x", timeout=0):
                pass
    with cat.lock("x", timeout=0):  # released
        pass
    with file_lock(tmp_path / "k.lock", timeout=0):
        with pytest.raises(CatalogError, match=r"is locked by another process"):
            with file_lock(tmp_path / "k.lock", timeout=0.1):
                pass


def test_concurrent_catalog_updates_get_distinct_versions(tmp_path):
    # Each writer picks the next version and adds it under the dataset's lock; a
    # lock held per open file (flock) also excludes threads of one process.
    cat_dir = tmp_path / "cat"
    got: list[str] = []
    errors: list[BaseException] = []

    def publish(k: int) -> None:
        try:
            cat = Catalog(cat_dir)
            with cat.lock("race"):
                version = cat.next_version("race")
                cat.add("race", VersionEntry(version=version, path=str(tmp_path / "d" / version), created_at="t", build_key=f"k{k}"))
            got.append(version)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=publish, args=(k,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(got, key=lambda v: int(v[1:])) == [f"v{n}" for n in range(1, 9)]
    cat = Catalog(cat_dir)
    assert [v.version for v in cat.versions("race")] == [f"v{n}" for n in range(1, 9)]
    assert cat.latest("race") == "v8"
    assert sorted(v.build_key for v in cat.versions("race")) == sorted(f"k{k}" for k in range(8))


def test_latest_after_rm_is_the_remaining_version_with_the_highest_number(tmp_path):
    """v1, v2 (latest), v3 listed without becoming latest (an embedding of v1, or v1 pushed after v2): removing
    another version keeps @latest; removing @latest makes it the highest number left, not the last published."""
    cat = Catalog(tmp_path / "cat")
    for version, latest in (("v1", True), ("v2", True), ("v10", False), ("v3", False)):
        entry = VersionEntry(version=version, path=str(tmp_path / "d" / version), created_at="t", build_key=version)
        cat.add("n", entry, make_latest=latest)
    assert cat.latest("n") == "v2"
    cat.remove("n", "v1", removed_at="t")
    assert cat.latest("n") == "v2"
    cat.remove("n", "v2", removed_at="t")
    assert cat.latest("n") == "v10"  # by number (v10 > v3), not in publication order
    cat.remove("n", "v10", removed_at="t")
    cat.remove("n", "v3", removed_at="t")
    assert cat.latest("n") is None


def test_defaults_come_from_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("SHARDFLOW_CATALOG", str(tmp_path / "c"))
    monkeypatch.setenv("SHARDFLOW_DATA_ROOT", str(tmp_path / "d"))
    assert default_catalog() == tmp_path / "c" and default_data_root() == tmp_path / "d"
    assert default_catalog(tmp_path / "x") == tmp_path / "x"
    monkeypatch.delenv("SHARDFLOW_CATALOG")
    monkeypatch.chdir(tmp_path)
    assert default_catalog() == Path(tmp_path) / "manifests"


def test_a_removed_lock_file_still_excludes(tmp_path):
    # With remove=True each holder deletes the lock file on release; a waiter that
    # locked the deleted file must notice and lock the new one, or two would hold it.
    lock = tmp_path / "k.lock"
    counter = tmp_path / "counter"
    counter.write_text("0")
    inside: list[int] = []
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(30):
                with file_lock(lock, timeout=30, remove=True):
                    inside.append(1)
                    assert len(inside) == 1, "two threads hold the lock"
                    n = int(counter.read_text())
                    counter.write_text(str(n + 1))
                    inside.pop()
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert counter.read_text() == "180"
    assert not lock.exists()


@pytest.mark.parametrize("call,env,shown", [
    (lambda: default_data_root("s3://bucket/data"), {}, r"s3://bucket/data: the data root"),
    (lambda: default_catalog("gs://bucket/catalog"), {}, r"gs://bucket/catalog: the catalog"),
    (lambda: Catalog(Path("s3://bucket/catalog")), {}, r"s3:/bucket/catalog: the catalog"),  # Path() collapsed the //
    (lambda: default_data_root(), {"SHARDFLOW_DATA_ROOT": "s3://bucket/data"}, r"\$SHARDFLOW_DATA_ROOT=s3://bucket/data: the data root"),
    (lambda: Catalog(), {"SHARDFLOW_CATALOG": "s3://bucket/catalog"}, r"\$SHARDFLOW_CATALOG=s3://bucket/catalog: the catalog"),
])
def test_a_url_data_root_or_catalog_is_refused_until_object_storage_output_exists(tmp_path, monkeypatch, call, env, shown):
    """Not a local directory named ``s3:`` (what ``Path("s3://bucket/data")`` is), silently."""
    from shardflow.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    unset = ", or give" if env else " give"
    with pytest.raises(ConfigError, match=rf"^{shown} must be a local or shared filesystem path, not a URL: the "
                       r"library builds and publishes in a local directory \(to publish to a bucket: shardflow build "
                       r"--data-root s3://BUCKET/data --catalog s3://BUCKET/catalog, or shardflow push\);"
                       rf"( unset SHARDFLOW_\w+)?{unset} a directory instead, e\.g\. /mnt/shared/\w+$"):
        call()
    assert list(tmp_path.iterdir()) == []


def test_a_build_to_a_url_data_root_is_refused_before_anything_is_written(tmp_path, monkeypatch, tiny_parquet):
    from shardflow.pipeline import build
    from shardflow.config import BuildConfig
    from shardflow.errors import ConfigError

    monkeypatch.chdir(tmp_path)
    config = BuildConfig(name="t", sources=(str(tiny_parquet),))
    # A build to a bucket (build() as the command line) needs both places on it: one alone is refused.
    with pytest.raises(ConfigError, match=r"^--catalog catalog: a build to a bucket needs both --data-root and --catalog"):
        build(config, data_root="s3://bucket/data", catalog="catalog")
    with pytest.raises(ConfigError, match=r"^--data-root data: a build to a bucket needs both --data-root and --catalog"):
        build(config, data_root="data", catalog="s3://bucket/catalog")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_lock_held_at_a_fork_is_the_parents_a_child_waiting_for_it_gets_it_when_the_parent_lets_go(tmp_path):
    """A reader's download lock, held on a thread while a DataLoader forks its workers: the worker that wants the
    same file waits for the parent's download, not forever for the lock it inherited."""
    lock = tmp_path / ".shard-00000.bin.lock"
    held, release = threading.Event(), threading.Event()

    def download() -> None:
        with file_lock(lock, timeout=None, what="the cached file", remove=True):
            held.set()
            release.wait(30)

    thread = threading.Thread(target=download)
    thread.start()
    assert held.wait(30)
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker: asks for the same file at once, before the parent lets go
        code = 1
        try:
            with file_lock(lock, timeout=20, what="the cached file", remove=True):
                code = 0
        finally:
            os.write(write_end, bytes([code]))
            os._exit(0)
    os.close(write_end)
    try:
        import time

        time.sleep(0.3)  # the child is waiting now (it may also not have started: the test holds either way)
        release.set()
        thread.join(30)
        got = os.read(read_end, 1)
    finally:
        os.close(read_end)
        os.waitpid(pid, 0)
    assert got == b"\x00", "the forked child never had the lock its parent had let go of"
