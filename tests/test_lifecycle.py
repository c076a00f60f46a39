"""A version's end: ``shardflow rm`` (``remove_version``) and ``shardflow gc`` (``collect_garbage``).

Real builds of a Parquet corpus made from ../shared/corpora: ``x@v1`` from one
file, ``x@v2`` from both (an incremental build: v1's shards hard-linked). Each
test works on its own copy of that data root and catalog (``cp -a`` keeps the
hard links). Interruptions: the fault-injection kill before the catalog is
written, and the removal's steps run by hand for a crash after it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from support.builds import make_builder
from support.cli import cli_env, run_cli
from support.paths import MAKE_CORPUS
from shardflow.pipeline.staging import Staging, staging_lock
from shardflow.catalog import Catalog, resolve_ref
from shardflow.errors import CatalogError, ConfigError
from shardflow.cli.lifecycle import byte_size as size
from shardflow.lifecycle import collect_garbage, disk_usage, remove_version, trash_path
from shardflow.manifest import read_manifest
from shardflow.reader import open_version
from shardflow.validation import validate_dir


@pytest.fixture(scope="module")
def chain_base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``x@v1`` (one input) and its incremental child ``x@v2`` (both inputs), under ``data/`` and ``catalog/``."""
    if not MAKE_CORPUS.exists():
        pytest.skip(f"{MAKE_CORPUS} is not available")
    base = tmp_path_factory.mktemp("lifecycle")
    corpus = base / "corpus"
    subprocess.run([sys.executable, str(MAKE_CORPUS), str(corpus), "--mb", "0.2", "--files", "2"], check=True,
                   capture_output=True)
    a, b = sorted(corpus.glob("*.parquet"))
    make = make_builder(base)
    assert make([a], name="x", shard_tokens=20_000).ref == "x@v1"
    assert make([a, b], name="x", shard_tokens=20_000).ref == "x@v2"
    return base


@pytest.fixture
def chain(chain_base: Path, tmp_path: Path) -> Path:
    """A private copy of ``chain_base`` (hard links kept), to remove versions from."""
    root = tmp_path / "root"
    subprocess.run(["cp", "-a", str(chain_base), str(root)], check=True)
    return root


def tokens(ref: str, catalog: Path) -> dict[str, np.ndarray]:
    version = open_version(ref, catalog=catalog)
    return {s: np.array(version.split(s).tokens(0, version.split(s).num_tokens)) for s in version.splits}


def listed(root: Path) -> tuple[list[str], str | None]:
    data = yaml.safe_load((root / "catalog" / "x.yaml").read_text())
    return [v["version"] for v in data["versions"]], data["latest"]


def test_the_chain_is_a_parent_and_its_child_sharing_shards(chain):
    """What the other tests rely on: v2's parent is v1, and they share shard files by hard links."""
    v1, v2 = chain / "data" / "x" / "v1", chain / "data" / "x" / "v2"
    assert read_manifest(v2).parent == "x@v1"
    assert {p.stat().st_ino for p in v1.rglob("*.bin")} & {p.stat().st_ino for p in v2.rglob("*.bin")}
    assert disk_usage(v1)[1] > 0  # some of v1's bytes are linked from v2 too


def test_rm_of_a_parent_is_refused_naming_its_child_and_force(chain):
    cat = chain / "catalog"
    with pytest.raises(CatalogError, match=r"^x@v1 is the parent of x@v2, which remains\. .*pass --force to remove x@v1"):
        remove_version("x@v1", catalog=cat)
    assert listed(chain) == (["v1", "v2"], "v2") and (chain / "data" / "x" / "v1" / "metadata.yaml").is_file()


def test_rm_of_the_latest_makes_the_newest_remaining_latest_and_its_name_is_never_reused(chain):
    cat = chain / "catalog"
    v2 = chain / "data" / "x" / "v2"
    freed_expected = disk_usage(v2)[0]
    r = remove_version("x@2", catalog=cat)  # NAME@N, as references take it
    assert (r.ref, r.directory, r.freed, r.resumed, r.orphaned) == ("x@v2", v2, freed_expected, False, ())
    assert r.shared > 0  # the shards it linked from v1 are v1's too: not freed
    assert not v2.exists() and not trash_path(v2).exists()
    assert not Catalog(cat).files_record("x", "v2").exists()
    assert listed(chain) == (["v1"], "v1")
    assert resolve_ref("x", cat) == chain / "data" / "x" / "v1"
    with pytest.raises(CatalogError, match=r"^x@v2 was removed \(shardflow rm, 20\d\d-.*lists x's versions: v1$"):
        resolve_ref("x@v2", cat)
    assert Catalog(cat).next_version("x") == "v3"  # x@v2 keeps meaning the removed data, never new data
    assert validate_dir(chain / "data" / "x" / "v1", read_manifest(chain / "data" / "x" / "v1"), published=True,
                        catalog=cat).tokens > 0
    remove_version("x@v1", catalog=cat)
    assert listed(chain) == ([], None) and not (chain / "data" / "x" / "v1").exists()
    with pytest.raises(CatalogError, match=r"^'x' has no versions left in the catalog .*build it again"):
        resolve_ref("x", cat)


@pytest.mark.slow
def test_rm_of_the_latest_of_three_makes_the_one_published_before_it_latest(chain):
    a = sorted((chain / "corpus").glob("*.parquet"))[0]
    assert make_builder(chain)([a], name="x", shard_tokens=20_000, format="npy").ref == "x@v3"
    remove_version("x@v3", catalog=chain / "catalog")
    assert listed(chain) == (["v1", "v2"], "v2")
    assert open_version("x", catalog=chain / "catalog").ref == "x@v2"


def test_a_forced_rm_of_a_parent_leaves_its_child_reading_the_same_tokens(chain, cli):
    cat = chain / "catalog"
    before = tokens("x@v2", cat)
    status, out, err = cli("rm", "x@v1", "--force", "--catalog", "catalog", cwd=chain)
    assert status == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"removed x@v1 ({chain / 'data' / 'x' / 'v1'}): ") and "freed; " in lines[0]
    assert "kept, hard-linked by other versions" in lines[0]
    assert lines[1:] == ["  x@v2 named it as its parent; its shards are its own hard links, so it still reads and validates"]
    assert not (chain / "data" / "x" / "v1").exists() and listed(chain) == (["v2"], "v2")
    after = tokens("x@v2", cat)
    assert before.keys() == after.keys() and all(np.array_equal(before[s], after[s]) for s in before)
    status, out, err = cli("validate", "x@v2", "--catalog", "catalog", cwd=chain)
    assert status == 0 and out.startswith("OK x@v2: "), err


def test_rm_of_an_unknown_version_or_without_a_version_is_one_message(chain, cli):
    cat = chain / "catalog"
    with pytest.raises(CatalogError, match=r"^no version 'v9' of 'x' in the catalog .* \(versions: v1, v2\)$"):
        remove_version("x@v9", catalog=cat)
    with pytest.raises(ConfigError, match=r"^x@latest: name the version to remove, NAME@vN \(x's versions: v1, v2\)$"):
        remove_version("x@latest", catalog=cat)
    with pytest.raises(CatalogError, match=r"^no dataset 'y' in the catalog .*\(datasets: x\)$"):
        remove_version("y@v1", catalog=cat)
    status, out, err = cli("rm", "x", "--catalog", "catalog", cwd=chain)
    assert (status, out) == (2, "") and err == "shardflow: error: x: name the version to remove, NAME@vN (x's versions: v1, v2)\n"
    assert listed(chain) == (["v1", "v2"], "v2")


def test_rm_never_deletes_a_directory_that_is_not_a_version(chain):
    (chain / "data" / "x" / "v2" / "metadata.yaml").unlink()
    with pytest.raises(CatalogError, match=r"/x/v2: the catalog places x@v2 here, but it holds no metadata.yaml"):
        remove_version("x@v2", catalog=chain / "catalog")
    assert (chain / "data" / "x" / "v2").is_dir() and listed(chain) == (["v1", "v2"], "v2")


def test_rm_waits_for_a_running_build_that_reads_the_version(chain):
    """A build whose plan's parent is the version holds its staging lock: rm is refused until it ends."""
    staging = chain / "data" / "x" / ".staging" / ("ab" * 8)
    staging.mkdir(parents=True)
    (staging / "plan.json").write_text('{"reuse": {"parent": "x@v2"}}')
    with staging_lock(Staging(staging), "x", timeout=0):
        with pytest.raises(CatalogError, match=r"^x@v2 is being read by a running build \(.*\), whose parent it is"):
            remove_version("x@v2", catalog=chain / "catalog")
        assert listed(chain) == (["v1", "v2"], "v2")
    assert remove_version("x@v2", catalog=chain / "catalog").ref == "x@v2"


def test_rm_killed_before_the_catalog_is_written_changes_nothing(chain):
    """The existing fault point ``catalog-write`` (before the catalog file is replaced): SIGKILL there."""
    proc = run_cli(["rm", "x@v2", "--catalog", "catalog"], cli_env({"SHARDFLOW_FAULT": "kill:catalog-write"}), chain,
                   timeout=120)
    assert proc.returncode == -9, proc.stderr
    assert listed(chain) == (["v1", "v2"], "v2")
    v2 = chain / "data" / "x" / "v2"
    assert validate_dir(v2, read_manifest(v2), published=True, catalog=chain / "catalog").tokens > 0
    assert remove_version("x@v2", catalog=chain / "catalog").resumed is False and not v2.exists()


def test_rm_interrupted_after_the_catalog_entry_is_finished_by_a_rerun(chain, cli):
    """Killed between the commit point and the deleting: no reader resolves it; ``rm`` again deletes it."""
    cat, v2 = Catalog(chain / "catalog"), chain / "data" / "x" / "v2"
    with cat.lock("x"):
        cat.remove("x", "v2", removed_at="2026-01-01T00:00:00Z")  # step 2 of remove_version, then the "crash"
    assert v2.is_dir() and listed(chain) == (["v1"], "v1")
    with pytest.raises(CatalogError, match=r"^x@v2 was removed \(shardflow rm, 2026-01-01T00:00:00Z\)"):
        open_version("x@v2", catalog=cat.path)
    status, out, err = cli("rm", "x@v2", "--catalog", "catalog", cwd=chain)
    assert status == 0, err
    assert out.startswith(f"finished removing x@v2 ({v2}): ") and "freed" in out
    assert not v2.exists() and not trash_path(v2).exists() and not cat.files_record("x", "v2").exists()
    status, out, err = cli("rm", "x@v2", "--catalog", "catalog", cwd=chain)
    assert (status, out) == (0, f"x@v2 was already removed; nothing of it was left in {v2.parent}\n"), err


def test_gc_deletes_what_an_interrupted_rm_left(chain, cli):
    """Killed after the rename to ``.v2.removed`` (and another killed before it): gc lists both, then deletes them."""
    cat = Catalog(chain / "catalog")
    v1, v2 = chain / "data" / "x" / "v1", chain / "data" / "x" / "v2"
    with cat.lock("x"):
        cat.remove("x", "v2", removed_at="2026-01-01T00:00:00Z")
    os.replace(v2, trash_path(v2))
    sizes = {trash_path(v2): disk_usage(trash_path(v2))[0]}
    found = collect_garbage(data_root=chain / "data", catalog=cat.path, dry_run=True)
    assert [(g.path, g.freed) for g in found] == list(sizes.items())
    assert "interrupted shardflow rm of x@v2" in found[0].why and trash_path(v2).is_dir()
    with cat.lock("x"):
        cat.remove("x", "v1", removed_at="2026-01-01T00:00:01Z")  # a second one, killed before its rename
    sizes[v1] = disk_usage(v1)[0]
    status, out, err = cli("gc", "--data-root", "data", "--catalog", "catalog", cwd=chain)
    assert status == 0, err
    lines = out.splitlines()
    assert lines == [
        f"removed {trash_path(v2)} ({size(sizes[trash_path(v2)])}): what an interrupted shardflow rm of x@v2 left",
        f"removed {v1} ({size(sizes[v1])}): x@v1, removed from the catalog by an interrupted shardflow rm",
        f"freed {size(sum(sizes.values()))} (2 directories)",
    ]
    assert not v1.exists() and not trash_path(v1).exists() and not trash_path(v2).exists()
    assert cli("gc", "--data-root", "data", "--catalog", "catalog", cwd=chain)[1] == f"nothing to remove under {chain / 'data'}\n"


def test_gc_removes_abandoned_staging_directories_never_a_resumable_or_running_one(chain):
    """Through ``remove_abandoned``: a staging directory whose build is published goes; an unfinished build's stays,
    and so does an abandoned one whose lock a live process holds."""
    cat = Catalog(chain / "catalog")
    staging = chain / "data" / "x" / ".staging"
    v1_key = cat.entry("x", "v1").build_key

    def stage(key: str) -> Path:
        path = staging / key[:16]
        (path / "parts").mkdir(parents=True)
        (path / "plan.json").write_text(f'{{"build_key": "{key}"}}')
        (path / "parts" / "unit-000000.bin").write_bytes(b"\0" * 5000)
        return path

    published, running, unfinished = stage(v1_key), stage(cat.entry("x", "v2").build_key), stage("cd" * 32)
    expected_size = disk_usage(published)[0]
    assert expected_size >= 5000
    with staging_lock(Staging(running), "x", timeout=0):
        found = collect_garbage(data_root=chain / "data", catalog=cat.path, dry_run=True)
        assert [(g.path, g.freed) for g in found] == [(published, expected_size)]
        assert found[0].why == "a staging directory no rerun resumes: its build is published"
        assert published.is_dir()  # a dry run removes nothing
        removed = collect_garbage(data_root=chain / "data", catalog=cat.path)
        assert [(g.path, g.freed) for g in removed] == [(published, expected_size)]
    assert not published.exists() and running.is_dir() and unfinished.is_dir()
    assert [g.path for g in collect_garbage(data_root=chain / "data", catalog=cat.path)] == [running]
    assert unfinished.is_dir() and listed(chain) == (["v1", "v2"], "v2")


@pytest.mark.slow
def test_gc_removes_the_staging_directory_of_a_build_killed_after_its_publish(chain, cli):
    """A real leftover: the rebuild after ``rm`` is killed once its catalog entry is written (fault point
    ``publish-cataloged``); gc --dry-run shows its staging directory and size, gc removes it, the version stays."""
    corpus = sorted((chain / "corpus").glob("*.parquet"))
    remove_version("x@v2", catalog=chain / "catalog")
    proc = run_cli(
        ["build", *corpus, "--name", "x", "--shard-tokens", "20000", "--no-prefect", "--workers", "1",
         "--data-root", "data", "--catalog", "catalog", "--progress", "none"],
        cli_env({"SHARDFLOW_FAULT": "kill:publish-cataloged"}), chain, timeout=300,
    )
    assert proc.returncode == -9, proc.stderr
    assert listed(chain) == (["v1", "v3"], "v3")  # v2's name is not given again
    assert read_manifest(chain / "data" / "x" / "v3").parent == "x@v1"
    [left] = [p for p in (chain / "data" / "x" / ".staging").iterdir() if p.is_dir()]
    status, out, err = cli("gc", "--dry-run", "--data-root", "data", "--catalog", "catalog", cwd=chain)
    assert status == 0, err
    assert out.splitlines()[0].startswith(f"would remove {left} (") and left.is_dir()
    assert out.splitlines()[0].endswith("): a staging directory no rerun resumes: its build is published")
    status, out, err = cli("gc", "--data-root", "data", "--catalog", "catalog", cwd=chain)
    assert status == 0 and out.splitlines()[0].startswith(f"removed {left} ("), err
    assert not left.exists()
    assert cli("validate", "x@v3", "--catalog", "catalog", cwd=chain)[0] == 0


@pytest.mark.parametrize("args,env,message", [
    (("gc", "--data-root", "s3://bucket/data", "--catalog", "catalog"), {},
     "--catalog catalog: gc on a bucket needs both --data-root and --catalog on it, in one bucket"),
    (("gc", "--catalog", "catalog"), {"SHARDFLOW_DATA_ROOT": "s3://bucket/data"},
     "--catalog catalog: gc on a bucket needs both --data-root and --catalog on it, in one bucket"),
    (("rm", "x@v1", "--catalog", "gs://bucket/catalog"), {},
     "--catalog gs://bucket/catalog: give an s3:// URL, s3://BUCKET/PREFIX (other stores have no conditional writes"),
])
def test_a_url_data_root_or_catalog_rm_and_gc_cannot_use_is_refused_and_creates_nothing(tmp_path, cli, monkeypatch,
                                                                                        args, env, message):
    """A local catalog with a bucket's data root (or the reverse), or a store without conditional writes (gs://);
    rm and gc on an s3:// bucket are tests/test_bucket_lifecycle.py."""
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    status, out, err = cli(*args, cwd=tmp_path)
    assert (status, out) == (2, "") and err.count("\n") == 1 and err.startswith(f"shardflow: error: {message}"), err
    assert list(tmp_path.iterdir()) == []  # no directory named s3:
    monkeypatch.delenv("SHARDFLOW_DATA_ROOT", raising=False)
    with pytest.raises(ConfigError, match=r"^s3://bucket/data: the data root must be a local or shared filesystem "
                       r"path, not a URL: the library builds and publishes in a local directory \(to publish to a "
                       r"bucket: shardflow build --data-root s3://BUCKET/data --catalog s3://BUCKET/catalog, or "
                       r"shardflow push\); give a directory instead"):
        collect_garbage(data_root="s3://bucket/data", catalog=tmp_path / "catalog")
    assert list(tmp_path.iterdir()) == []
