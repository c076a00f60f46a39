"""Crash-safe resume, proved by fault injection: SIGKILL the build at many points, rerun, compare bytes.

Each scenario runs ``shardflow build ... --no-prefect`` in a subprocess with
``SHARDFLOW_FAULT`` naming the point where the process kills itself
(``shardflow.faults``). Then, for every scenario:

* the process died by SIGKILL and the catalog shows no new version;
* the rerun (in this process) tokenizes no unit and writes no shard that the
  killed run had committed (the build logs each unit and shard it really does);
* the published version is byte-identical to an uninterrupted build's (every
  shard and index; the manifest but for its creation time and path);
* no staging directory and no temporary file is left anywhere.

The scenarios run in parallel subprocesses, so the suite takes seconds.
"""

from __future__ import annotations

import logging
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from support.builds import assert_same_version, build_in, fault_options, leftovers, versions
from support.cli import build_cli, killed
from support.corpus import small_vocab, split_sample
from shardflow.catalog import Catalog, resolve_ref
from shardflow.errors import CatalogError
from shardflow.faults import POINTS
from shardflow.manifest import read_manifest

NAME = "crash"
# How the rerun's output is compared with the uninterrupted build's: all but when and where.
DROP = ("created_at", "dataset_path")

# scenario id -> the faults of consecutive killed runs (each one SIGKILLs its run)
SCENARIOS: dict[str, list[str]] = {
    "fingerprint-cache-write": ["atomic-write:1"],
    "plan": ["plan"],
    "reading-batch-3": ["tokenize-batch:3"],
    "unit-tokens-before-json": ["tokenize-tokens:2"],
    "after-3-units": ["tokenize-done:3"],
    "layout": ["layout"],
    "mid-shard": ["shard-mid:3"],
    "shard-before-index": ["shard-written:2"],  # a gathered (val) shard: a placed one is linked index first
    "index-before-json": ["shard-indexed:7"],
    "staged-manifest": ["finalize-manifest"],
    "validating": ["validate:4"],
    "validated": ["finalize-done"],
    "stamped-manifest": ["publish-stamped"],
    "renamed-before-catalog": ["publish-renamed"],
    "catalog-write": ["catalog-write"],
    "atomic-write-9": ["atomic-write:9"],
    "three-crashes": ["tokenize-done:2", "shard-written:3", "publish-renamed"],
}
# Killed after the catalog entry: the version is published; the rerun only reports it.
PUBLISHED_SCENARIO = {"after-catalog-entry": ["publish-cataloged"]}


@pytest.fixture(scope="module")
def crashes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run every scenario's killed builds (in parallel), and one uninterrupted build."""
    base = tmp_path_factory.mktemp("crashes")
    src = split_sample(base / "src")
    options = fault_options(small_vocab(base))
    jobs = {**SCENARIOS, **PUBLISHED_SCENARIO, "reference": []}

    def run(sid: str) -> list[Any]:
        root = base / sid
        procs = [build_cli(src, root, NAME, options, fault=fault) for fault in jobs[sid]]
        if not jobs[sid]:
            procs.append(build_cli(src, root, NAME, options))
        return procs

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = dict(zip(jobs, pool.map(run, jobs)))
    ref = results["reference"][0]
    assert ref.returncode == 0, ref.stderr
    return {
        "base": base,
        "src": src,
        "options": options,
        "procs": results,
        "reference": base / "reference" / "data" / NAME / "v1",
    }


def test_scenarios_cover_many_distinct_points():
    points = {f.split(":")[0] for faults in SCENARIOS.values() for f in faults}
    assert len(points) >= 14 and points <= set(POINTS)


def _staging(root: Path) -> Path | None:
    dirs = [p for p in (root / "data" / NAME / ".staging").glob("*") if p.is_dir()]
    assert len(dirs) <= 1
    return dirs[0] if dirs else None


def _committed(staging: Path | None) -> tuple[set[int], set[tuple[str, int]]]:
    """Units and shards the killed run had committed (their .json exists)."""
    if staging is None:
        return set(), set()
    units = {int(p.name[5:11]) for p in (staging / "parts").glob("unit-*.json")}
    shards = set()
    for p in (staging / "layout").glob("*.shard.json"):
        split, k = re.match(r"(\w+)-(\d+)\.shard\.json", p.name).groups()
        shards.add((split, int(k)))
    return units, shards


def _redone(caplog: pytest.LogCaptureFixture) -> tuple[set[int], set[tuple[str, int]]]:
    units, shards = set(), set()
    for rec in caplog.records:
        msg = rec.getMessage()
        if m := re.match(r"tokenized unit (\d+) ", msg):
            units.add(int(m.group(1)))
        elif m := re.match(r"(?:wrote|placed|linked) (\w+) shard (\d+) ", msg):
            shards.add((m.group(1), int(m.group(2))))
    return units, shards


@pytest.mark.slow
@pytest.mark.parametrize("sid", list(SCENARIOS))
def test_killed_build_resumes_to_identical_bytes(crashes, sid, caplog):
    root = crashes["base"] / sid
    procs = crashes["procs"][sid]
    for proc, fault in zip(procs, SCENARIOS[sid]):
        assert killed(proc), f"{fault}: exit {proc.returncode}\n{proc.stderr[-2000:]}"
        assert "Traceback" not in proc.stderr
    # No partial version is ever visible: no catalog entry, no resolvable reference.
    assert versions(root, NAME) == []
    with pytest.raises(CatalogError):
        resolve_ref(f"{NAME}@latest", root / "catalog")
    staging = _staging(root)
    units, shards = _committed(staging)
    if sid == "mid-shard":
        assert list((staging / "out").rglob(".*.tmp-*")), "the killed writer left its temporary shard"
    if sid == "shard-before-index":
        written = list((staging / "out" / "val").glob(f"{NAME}_val_*.bin"))
        assert [p for p in written if not p.with_suffix(".bos.idx").exists()], "no val shard was left without its index"
    if sid in ("renamed-before-catalog", "catalog-write", "three-crashes"):
        # The renamed directory exists but is not published.
        assert (root / "data" / NAME / "v1" / "metadata.yaml").exists()
        assert staging is not None and not (staging / "out").exists()

    caplog.set_level(logging.INFO, logger="shardflow.pipeline")
    caplog.clear()
    result = build_in(root, crashes["src"], NAME, crashes["options"], workers=2)
    assert result.created and result.ref == f"{NAME}@v1"
    redone_units, redone_shards = _redone(caplog)
    assert not redone_units & units, f"units {sorted(redone_units & units)} were tokenized twice"
    assert not redone_shards & shards, f"shards {sorted(redone_shards & shards)} were written twice"
    if sid in ("staged-manifest", "validating", "validated", "stamped-manifest", "renamed-before-catalog", "catalog-write"):
        total_shards = read_manifest(crashes["reference"]).totals["shards"]
        assert len(units) == 4 and len(shards) == total_shards and not redone_units and not redone_shards

    assert versions(root, NAME) == ["v1"]
    assert_same_version(Path(result.manifest_path).parent, crashes["reference"], DROP)
    assert leftovers(root / "data") == []
    assert sorted(p.name for p in (root / "data" / NAME).iterdir() if not p.name.startswith(".")) == ["v1"]


@pytest.mark.slow
def test_kill_after_the_catalog_entry_leaves_a_published_version(crashes, caplog):
    root = crashes["base"] / "after-catalog-entry"
    (proc,) = crashes["procs"]["after-catalog-entry"]
    assert killed(proc)
    # The catalog entry is the commit point: the version is complete and valid.
    assert versions(root, NAME) == ["v1"]
    v1 = resolve_ref(f"{NAME}@v1", root / "catalog")
    assert_same_version(v1, crashes["reference"], DROP)
    assert _staging(root) is not None  # killed before cleaning up
    caplog.set_level(logging.INFO, logger="shardflow.pipeline")
    caplog.clear()
    again = build_in(root, crashes["src"], NAME, crashes["options"])
    assert not again.created and again.ref == f"{NAME}@v1"
    assert _redone(caplog) == (set(), set())
    assert leftovers(root / "data") == []


@pytest.mark.slow
def test_catalog_entry_records_the_manifest_checksum(crashes):
    import hashlib

    root = crashes["base"] / "reference"
    (entry,) = Catalog(root / "catalog").versions(NAME)
    manifest = crashes["reference"] / "metadata.yaml"
    assert entry.manifest_sha256 == hashlib.sha256(manifest.read_bytes()).hexdigest()


@pytest.mark.slow
def test_killed_incremental_build_resumes_to_the_same_bytes_as_a_full_build(tmp_path, caplog):
    """Kill an incremental build right after it hard-linked a shard from its parent, then finish it."""
    src = split_sample(tmp_path / "src")
    options = fault_options(small_vocab(tmp_path))
    later = tmp_path / "later"
    later.mkdir()
    shutil.move(src / "part3.parquet", later / "part3.parquet")
    root = tmp_path / "inc"
    build_in(root, src, NAME, options)  # v1 from part0..2
    shutil.move(later / "part3.parquet", src / "part3.parquet")
    proc = build_cli(src, root, NAME, options, fault="shard-linked:2", workers=1)
    assert killed(proc), proc.stderr
    assert versions(root, NAME) == ["v1"]
    staging = _staging(root)
    units, shards = _committed(staging)
    assert len(shards) >= 1
    caplog.set_level(logging.INFO, logger="shardflow.pipeline")
    caplog.clear()  # only the rerun's lines (an earlier test's flow may have left the logger at INFO: v1's lines)
    v2 = build_in(root, src, NAME, options)
    assert v2.ref == f"{NAME}@v2"
    redone_units, redone_shards = _redone(caplog)
    assert not redone_shards & shards
    # Only the new input was tokenized, by the killed run or the rerun: once.
    assert len(units | redone_units) == 1 and not units & redone_units
    full = build_in(tmp_path / "full", src, NAME, options)
    assert_same_version(Path(v2.manifest_path).parent, Path(full.manifest_path).parent)
    assert leftovers(root / "data") == []
