"""Work already done costs no task run, and shards reused from the parent are not read again.

Against the session's real Prefect server, on real Parquet inputs:

* an incremental build through the flow (one file added to three) reads no
  shard back: the shards it wrote were checked as they were written, the ones
  hard-linked from the parent version are the parent's own files
  (``check.parents_own``), and the published version still passes a full
  ``shardflow validate``;
* a build resumed after its work units were tokenized (a crash, a cancelled
  run) spends no task run on those units; its progress lines say they were
  found done, and its rates count only the units run (no rate over work done
  before); its summary artifact lists them one row each.
"""

from __future__ import annotations

import io
import re
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

import shardflow.pipeline.check as check_mod
from shardflow.cli.progress import ProgressDisplay, format_rate, listening
from shardflow.flows.build import build_dataset
from shardflow.pipeline import build_lock, plan_build, tokenize_unit
from shardflow.config import BuildConfig
from shardflow.manifest import read_manifest
from shardflow.validation import validate_dir

from support.prefect import PrefectServer


def _task_names(server: PrefectServer, name: str, timeout: float = 20) -> list[str]:
    """The task run names of the latest flow run ``build NAME``, once all are final."""
    deadline = time.monotonic() + timeout
    while True:
        run = server.flow_runs(f"build {name}")[0]
        tasks = server.request("POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [run["id"]]}}, "limit": 200})
        final = bool(tasks) and all(t["state"] and t["state"]["type"] == "COMPLETED" for t in tasks)
        if (final and run["state"]["type"] == "COMPLETED") or time.monotonic() > deadline:
            return sorted(t["name"] for t in tasks)
        time.sleep(0.2)


@pytest.mark.slow
def test_an_incremental_flow_build_reads_no_shard_back(
    prefect_api: PrefectServer, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        shutil.copy(corpus / f"part-{i}.parquet", src)
    name = "done-incr"
    config = BuildConfig(name=name, sources=(str(src),), shard_tokens=100_000, val_fraction=0.0)
    where = dict(data_root=str(tmp_path / "data"), catalog=str(tmp_path / "cat"))
    assert build_dataset(config=config, workers=2, **where).ref == f"{name}@v1"

    read: list[str] = []
    real = check_mod.validate_shard_entry

    def counting(directory: Path, ctx: Any, split: str, k: int, entry: Any, **kw: Any) -> list[str]:
        read.append(entry.file)
        return real(directory, ctx, split, k, entry, **kw)

    monkeypatch.setattr(check_mod, "validate_shard_entry", counting)
    shutil.copy(corpus / "part-3.parquet", src)
    assert build_dataset(config=config, workers=2, **where).ref == f"{name}@v2"

    v1 = read_manifest(tmp_path / "data" / name / "v1")
    v2 = read_manifest(tmp_path / "data" / name / "v2")
    shards = v2.splits["train"].shards
    linked = [s.file for s in shards if (tmp_path / "data" / name / "v2" / s.file).stat().st_nlink > 1]
    assert len(shards) >= 3 and len(linked) >= 2, (len(shards), linked)  # the parent's full shards were linked
    assert {s.file: s.sha256 for s in v1.splits["train"].shards if s.file in linked} == {
        s.file: s.sha256 for s in shards if s.file in linked
    }
    assert read == []  # written shards checked as they were written, linked ones the parent's own: none read back

    names = _task_names(prefect_api, name)
    assert not [n for n in names if n.startswith(f"validate {name} train shard ")], names  # no such stage
    assert len([n for n in names if n.startswith(f"write {name} train shard ")]) == len(shards)
    validate_dir(tmp_path / "data" / name / "v2", checksums=True)  # raises on any problem


@pytest.mark.slow
def test_a_resumed_flow_build_spends_no_task_run_on_units_already_tokenized(
    prefect_api: PrefectServer, corpus: Path, tmp_path: Path
) -> None:
    name = "done-resume"
    config = BuildConfig(name=name, sources=(str(corpus),), shard_tokens=200_000)
    where = dict(data_root=str(tmp_path / "data"), catalog=str(tmp_path / "cat"))
    # An earlier run tokenized units 0 and 2, then stopped (its staging directory stays).
    plan = plan_build(config, **where)
    with build_lock(plan) as locked:
        before = tokenize_unit(locked, 0).tokens + tokenize_unit(locked, 2).tokens
    events, out = [], io.StringIO()
    # What `shardflow build` prints on a pipe (every event, no throttling), and the events themselves.
    with ProgressDisplay("plain", stream=out, interval=0) as display, listening(display), listening(events.append):
        assert build_dataset(config=config, workers=2, **where).ref == f"{name}@v1"
    names = _task_names(prefect_api, name)
    tokenized = [n for n in names if n.startswith(f"tokenize {name} unit ")]
    assert [n.split(" unit ")[1][:3] for n in tokenized] == ["2/4", "4/4"], names
    validate_dir(tmp_path / "data" / name / "v1", checksums=True)

    # Found done, not speed: the two units are named as found done, and the rate counts the two units run only,
    # over the time since they started.
    total = read_manifest(tmp_path / "data" / name / "v1").totals["tokens"]
    tok = [e for e in events if e.phase == "tokenize"]
    last = tok[-1]
    assert (last.done, last.total, last.found, last.found_tokens, last.tokens) == (4, 4, 2, before, total)
    assert last.tokens_per_second == pytest.approx((total - before) / last.elapsed) and last.elapsed > 0
    assert all(e.ran == 0 and e.tokens_per_second == 0 for e in tok if e.done <= 2)  # nothing run: no rate
    lines = [line for line in out.getvalue().splitlines() if ": tokenize " in line]
    assert lines[-1] == (f"shardflow: {name}: tokenize 4/4 work units (100%), 2 found done and 2 run here: "
                         f"{total - before:,} tokens at {format_rate(last.tokens_per_second)}"), lines
    assert any(line.endswith("(50%), 2 found done, ETA ?") for line in lines), lines
    # The summary: the units found done one row each, and the tokenize rate over the units run.
    summary = prefect_api.request("GET", f"/artifacts/{name}-summary/latest")["data"]
    assert re.search(rf"^\| tokenize-unit \| tokenize {name} unit 1/4 part-0\.parquet\S* \| [\d,]+ \|$", summary, re.M)
    assert re.search(rf"^\| tokenize-unit \| tokenize {name} unit 3/4 part-2\.parquet\S* \| [\d,]+ \|$", summary, re.M)
    row = re.search(r"^\| tokenize \(2 of 4 work units; 2 found done\) \| ([\d.]+) s \| ([\d,]+) tokens/s \|$",
                    summary, re.M)
    assert row, summary
    seconds, rate = float(row[1]), int(row[2].replace(",", ""))  # (seconds to 0.1 s)
    assert (total - before) / (seconds + 0.05) <= rate <= (total - before) / max(seconds - 0.05, 0.01)
    assert f"{total - before:,} tokens were tokenized in this run" in summary
