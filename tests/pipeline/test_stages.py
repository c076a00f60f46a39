"""The stage table: declared once, run in order by build() and by the Prefect flow alike."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from support.builds import files_of
from support.paths import SAMPLE

from shardflow.pipeline import STAGES, build, build_lock, plan_build, run_stages, stage
from shardflow.pipeline.model import Layout, ShardResult, UnitResult
from shardflow.config import BuildConfig
from shardflow.manifest import Manifest


def test_the_stages_their_order_fan_out_and_retry_classes():
    table = [(s.name, s.fan_out, s.retry) for s in STAGES]
    assert table == [
        ("tokenize-unit", "units", "io"),
        ("layout", "one", "never"),
        ("stats-card", "one", "never"),
        ("write-shard", "shards", "io"),
        ("embed-fit", "one", "never"),
        ("embed-shard", "shards", "never"),
        ("embed", "one", "never"),
        ("validate", "one", "never"),
        ("publish", "one", "io"),
    ]
    with pytest.raises(KeyError, match="no build stage 'nope'; the stages are tokenize-unit, layout"):
        stage("nope")


@pytest.mark.slow
def test_run_stages_hands_typed_results_from_stage_to_stage(tmp_path):
    config = BuildConfig(name="stg", sources=(str(SAMPLE),), shard_tokens=40_000, unit_bytes=1, val_count=5)
    plan = plan_build(config, data_root=tmp_path / "data", catalog=tmp_path / "cat")
    calls: list[tuple[str, tuple]] = []

    def run_jobs(s, jobs):
        calls.extend((s.name, job) for job in jobs)
        return [s(plan, *job) for job in jobs]

    with build_lock(plan) as plan:
        done = run_stages(plan, run_jobs)
    assert "embed" not in done  # no --embed: the stage does not apply
    nshards = len(done["write-shard"])
    # No background runner given: the stats-card stage runs in its place, after the layout.
    assert [c[0] for c in calls] == ["tokenize-unit"] * 4 + ["layout", "stats-card"] + ["write-shard"] * nshards + [
        "validate", "publish"]
    assert all(isinstance(r, UnitResult) for r in done["tokenize-unit"])
    layout = done["layout"][0]
    assert isinstance(layout, Layout) and set(layout.splits) == {"train", "val"}
    # The write stage's jobs come from the layout, one per shard, in manifest order.
    assert [job for name, job in calls if name == "write-shard"] == layout.shard_jobs()
    assert all(isinstance(r, ShardResult) for r in done["write-shard"])
    manifest = done["validate"][0]
    assert isinstance(manifest, Manifest) and manifest.totals["documents"] == layout.splits["train"].documents + 5
    assert done["publish"] == ["stg@v1"]

    # The same bytes as build() itself, which walks the same table on a thread pool.
    again = build(config, data_root=tmp_path / "other", catalog=tmp_path / "cat2", workers=2)
    assert files_of(Path(again.manifest_path).parent) == files_of(tmp_path / "data" / "stg" / "v1")


def test_a_stage_can_be_replaced_for_one_run(tmp_path):
    """What the Prefect wiring tests rely on: a stage is data, so a test swaps its function."""
    seen = []
    real = stage("layout")
    patched = dataclasses.replace(real, run=lambda plan: seen.append(plan.build_key) or real.run(plan))
    config = BuildConfig(name="swap", sources=(str(SAMPLE),))
    plan = plan_build(config, data_root=tmp_path / "data", catalog=tmp_path / "cat")
    with build_lock(plan) as plan:
        done = run_stages(plan, lambda s, jobs: [(patched if s.name == "layout" else s)(plan, *j) for j in jobs])
    assert seen == [plan.build_key] and done["publish"] == ["swap@v1"]


def test_a_shard_replaced_after_its_write_is_caught_at_finalize_and_nothing_is_published(tmp_path):
    """No shard is read back after its write: finalize compares each one's record with its files' size, inode and
    mtime. Shard 1 replaced by a copy with one token byte changed (same size) is another file: every shard is then
    validated in full, and its SHA-256 (taken as it was written) fails. Without the identity check it would publish."""
    import os

    from shardflow.catalog import Catalog
    from shardflow.errors import ValidationError
    from shardflow.pipeline.staging import Staging

    config = BuildConfig(name="dmg", sources=(str(SAMPLE),), shard_tokens=40_000, unit_bytes=1, stats=False)
    plan = plan_build(config, data_root=tmp_path / "data", catalog=tmp_path / "cat")
    staging = Staging(plan.staging)
    done_so_far: dict = {}

    def run_jobs(s, jobs):
        if s.name == "validate":
            path = staging.out / done_so_far["write-shard"][1].entry.file
            data = bytearray(path.read_bytes())
            data[-3] ^= 0x01
            (staging.out / "copy").write_bytes(bytes(data))
            os.replace(staging.out / "copy", path)
        results = [s(plan, *job) for job in jobs]
        done_so_far[s.name] = results
        return results

    with build_lock(plan) as plan:
        with pytest.raises(ValidationError, match=r"validation of .* failed \(1 problem\):\n.*dmg_train_000001.*SHA-256"):
            run_stages(plan, run_jobs)
    written = done_so_far["write-shard"]
    assert staging.shard_checked("train", 0, written[0].entry) and not staging.shard_checked("train", 1, written[1].entry)
    assert not Catalog(tmp_path / "cat").versions("dmg")
