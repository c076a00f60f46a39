"""Writing and checking N shards reads O(N) records: each write-shard job (which checks its shard as it is
written, ``pipeline/check.py``) a constant number, whatever N, and finalize O(N).

Records are the stages' JSON files in the staging directory (``parts/unit-N.json``,
``layout/SPLIT-K.shard.json``, ``layout.json``, ...). They are counted as they are
opened for reading, with an audit hook on the ``open`` event (``sys.addaudithook``),
during real builds of the sample corpus cut into 4 and into 16 train shards: a job
that assembled the whole staged manifest (every unit's and every shard's record)
would read more records at 16 shards than at 4, and N such jobs N² in all.

Also here: with one token as BOS and EOS (placement ``both``), a shard that ends
with a document's BOS is told from one that ends with an EOS by the next shard's
first token, which is read from that shard, not from another one.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support.paths import SAMPLE

from shardflow.pipeline import build, build_lock, plan_build, run_stages
from shardflow.config import BuildConfig
from shardflow.manifest import read_manifest
from shardflow.validation import validate_dir

_recording: list[tuple[str, list[str]]] = []  # (directory, paths opened under it) of the counts in progress
_hooked: list[bool] = []


def _audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open" or not _recording:
        return
    path, mode = args[0], args[1]
    if not isinstance(path, (str, bytes, os.PathLike)) or not isinstance(mode, str) or not mode.startswith("r"):
        return  # a file descriptor, os.open, or a write
    name = os.path.abspath(os.fsdecode(path))
    for root, seen in _recording:
        if name.startswith(root):
            seen.append(name)


@contextmanager
def opened(directory: Path | str) -> Iterator[list[str]]:
    """The files under ``directory`` opened for reading inside the block (this process, any thread)."""
    if not _hooked:  # an audit hook cannot be removed: one for the session, idle outside these blocks
        sys.addaudithook(_audit)
        _hooked.append(True)
    seen: list[str] = []
    entry = (os.path.abspath(directory) + os.sep, seen)
    _recording.append(entry)
    try:
        yield seen
    finally:
        _recording.remove(entry)


def _records(paths: list[str]) -> list[str]:
    return [p for p in paths if p.endswith(".json")]


# Train tokens of tests/assets/sample.parquet with cl100k, no val split, per placement.
_TRAIN_TOKENS = {"eos": 148_378, "both": 148_439}


def _build_counting(tmp_path: Path, shards: int, boundary: str) -> dict[str, Any]:
    """Build the sample corpus into ``shards`` train shards, counting the records each stage's jobs read."""
    shard_tokens = math.ceil(_TRAIN_TOKENS[boundary] / shards)
    config = BuildConfig(name="cost", sources=(str(SAMPLE),), boundary=boundary, shard_tokens=shard_tokens, stats=False)
    plan = plan_build(config, data_root=tmp_path / "data", catalog=tmp_path / "cat")
    per_job: list[int] = []
    finalize_reads: list[str] = []

    def run_jobs(stage: Any, jobs: Any) -> list[Any]:
        if stage.name == "write-shard":
            results = []
            for job in jobs:
                with opened(plan.staging) as seen:  # as the driver runs a job: its done check, then the job
                    results.append(stage.done(plan, *job) or stage(plan, *job))
                per_job.append(len(_records(seen)))
            return results
        if stage.name == "validate":
            with opened(plan.staging) as seen:
                results = [stage(plan, *job) for job in jobs]
            finalize_reads.extend(_records(seen))
            return results
        return [stage(plan, *job) for job in jobs]

    with build_lock(plan) as plan:
        done = run_stages(plan, run_jobs)
    assert done["publish"] == ["cost@v1"]
    version = tmp_path / "data" / "cost" / "v1"
    with opened(version) as seen:
        report = validate_dir(version, checksums=True)
    return {
        "shards": len(done["write-shard"]),
        "per_job": per_job,
        "finalize": len(finalize_reads),
        "published": seen,
        "report": report,
    }


@pytest.mark.slow
@pytest.mark.parametrize("boundary", ["eos", "both"])
def test_each_write_shard_job_reads_a_constant_number_of_records(tmp_path, boundary):
    small = _build_counting(tmp_path / "small", 4, boundary)
    large = _build_counting(tmp_path / "large", 16, boundary)
    # Shards of whole documents: about 4 and 16 (a shard is cut before the document that would pass the bound).
    n_small, n_large = small["shards"], large["shards"]
    assert 4 <= n_small <= 6 and 16 <= n_large <= 20
    assert len(small["per_job"]) == n_small and len(large["per_job"]) == n_large
    # Per job: its own record (done check and run), its unit's record and the layout; no neighbour's
    # (whole documents: each shard's boundaries are checked on their own, as it is written).
    assert max(large["per_job"]) == max(small["per_job"]) <= 5, (small["per_job"], large["per_job"])
    assert sum(large["per_job"]) <= n_large * max(small["per_job"])  # O(N) in all
    # finalize reads each shard's records once or twice: at most 3 more reads per added shard (not N² growth).
    extra = n_large - n_small
    assert large["finalize"] - small["finalize"] <= 3 * extra, (small["finalize"], large["finalize"])
    # Validating the published version: the manifest once, and a constant number of files per shard.
    for counted in (small, large):
        assert counted["report"].shards == counted["shards"]
        assert sum(p.endswith("metadata.yaml") for p in counted["published"]) == 1
    growth = len(large["published"]) - len(small["published"])
    assert 0 < growth <= 10 * extra, (len(small["published"]), len(large["published"]))


def test_a_shard_ending_with_a_bos_that_is_also_the_eos_validates(tmp_path, tiny_parquet):
    """<|endoftext|> as BOS and EOS: E 64 293 E | E 564 E | E 791 842 13 E, at most 5 tokens a shard.

    Whole documents: one a shard (4 + 3 > 5), each ending with E, which closes its
    document (the next shard begins with its own E): no neighbour is read to tell.
    """
    config = BuildConfig(name="edge", sources=(str(tiny_parquet),), boundary="both", shard_tokens=5, stats=False)
    result = build(config, data_root=tmp_path / "data", catalog=tmp_path / "cat", workers=1)
    version = Path(result.manifest_path).parent
    assert len(read_manifest(version).splits["train"].shards) == 3
    report = validate_dir(version, checksums=True)
    assert (report.shards, report.tokens, report.documents) == (3, 12, 3)
