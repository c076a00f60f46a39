"""The ``build_dataset`` flow against a real Prefect server: what a run records (artifacts, names,
tags, logs), progress events, retries, and that finished work units are not recomputed."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import shardflow.pipeline as core
from shardflow.flows.build import build_dataset
from shardflow.cli.progress import listening
from shardflow.config import BuildConfig
from shardflow.errors import ConfigError
from shardflow.manifest import read_manifest

from support.paths import SAMPLE
from support.prefect import PrefectServer


def _flow_run(server: PrefectServer, name: str, timeout: float = 15) -> dict[str, Any]:
    """The flow run named ``name``, once its final state reached the server.

    Prefect reports states in the background, so right after the flow returns
    the server may still show RUNNING; wait (bounded) rather than read once.
    """
    deadline = time.monotonic() + timeout
    while True:
        runs = server.flow_runs(name)
        assert runs, f"no flow run named {name!r}"
        if runs[0]["state"]["type"] not in ("PENDING", "RUNNING") or time.monotonic() > deadline:
            return runs[0]
        time.sleep(0.2)


def _task_runs(server: PrefectServer, flow_run_id: str, timeout: float = 30, want: set[str] = frozenset()) -> list[dict[str, Any]]:
    """The flow run's task runs, once each has a final state (states arrive in the background).

    A task run recorded before its first state report has no state yet (None). ``want``: names
    that must be there too (a loaded server records some task runs seconds after the others).
    """
    deadline = time.monotonic() + timeout
    while True:
        tasks = server.request("POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200})
        # Task runs reach the server through events: none yet is not "all final" (a loaded machine lags).
        final = bool(tasks) and all(t["state"] and t["state"]["type"] not in ("PENDING", "RUNNING") for t in tasks)
        final = final and want <= {t["name"] for t in tasks}
        if final or time.monotonic() > deadline:
            return tasks
        time.sleep(0.2)


def _artifacts(server: PrefectServer, flow_run_id: str) -> dict[str, dict[str, Any]]:
    arts = server.request("POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}})
    return {a["key"]: a for a in arts}


def _logs(server: PrefectServer, flow_run_id: str, want: str, timeout: float = 15) -> list[dict[str, Any]]:
    """The run's logs, once one from logger ``want`` arrived (logs are shipped in the background)."""
    from prefect.logging.handlers import APILogWorker

    APILogWorker.drain_all(timeout=10)
    deadline = time.monotonic() + timeout
    while True:
        logs = server.request("POST", "/logs/filter", {"logs": {"flow_run_id": {"any_": [flow_run_id]}}, "limit": 200})
        if any(entry["name"] == want for entry in logs) or time.monotonic() > deadline:
            return logs
        time.sleep(0.3)


@pytest.mark.slow
def test_a_build_run_records_progress_summary_card_names_tags_and_core_logs(
    prefect_api: PrefectServer, corpus: Path, tmp_path: Path
) -> None:
    server = prefect_api
    name = "ops_flow.demo"  # '_' and '.' are slugged into the artifact keys
    config = BuildConfig(name=name, sources=(str(corpus),), shard_tokens=200_000, val_fraction=0.1)
    events = []
    with listening(events.append):
        ref = build_dataset(config=config, workers=2, data_root=str(tmp_path / "data"), catalog=str(tmp_path / "cat")).ref
    assert ref == f"{name}@v1"
    version = tmp_path / "data" / name / "v1"
    m = read_manifest(version)

    run = _flow_run(server, f"build {name}")
    assert run["state"]["type"] == "COMPLETED"
    assert {"shardflow", f"dataset:{name}"} <= set(run["tags"])

    # Task runs say what they are, and carry no tags (each tagged task run asks the server for a concurrency slot).
    n_train, n_val = len(m.splits["train"].shards), len(m.splits["val"].shards)
    writes = {f"write {name} train shard {k}" for k in range(n_train)} | {f"write {name} val shard {k}" for k in range(n_val)}
    tasks = _task_runs(server, run["id"], want=writes | {f"plan {name}", f"layout {name}", f"validate {name}", f"publish {name}"})
    names = {t["name"] for t in tasks}
    units = [f"tokenize {name} unit {i + 1}/4 part-{i}.parquet[0:" for i in range(4)]
    for prefix in units:
        assert any(n.startswith(prefix) for n in names), (prefix, sorted(names))
    assert {f"write {name} train shard {k}" for k in range(n_train)} <= names
    assert {f"write {name} val shard {k}" for k in range(n_val)} <= names
    assert {f"plan {name}", f"layout {name}", f"validate {name}", f"publish {name}"} <= names
    for t in tasks:
        assert t["tags"] == [], t["name"]
        assert t["state"]["type"] == "COMPLETED"

    # The artifacts, keyed per dataset: three (the summary, the card, the progress bar).
    arts = _artifacts(server, run["id"])
    assert set(arts) == {f"ops-flow-demo-{k}" for k in ("summary", "card", "progress")}
    assert arts["ops-flow-demo-progress"]["type"] == "progress" and arts["ops-flow-demo-progress"]["data"] == 100.0
    summary = arts["ops-flow-demo-summary"]
    assert summary["type"] == "markdown"
    shards = [s for e in m.splits.values() for s in e.shards]
    # Where to read it (the path and the commands, not a file:// link the UI cannot open) and every shard's checksum.
    for needle in (ref, str(version / "metadata.yaml"), "passed", "cl100k_base", m.dtype, "nanogpt", "tokens/s",
                   f"{m.totals['tokens']:,}", f"`{(version / 'metadata.yaml').resolve()}`",
                   f"shardflow validate {ref} --catalog", *(f"| `{s.file}` |" for s in shards), *(s.sha256 for s in shards)):
        assert needle in summary["data"], needle
    assert "file://" not in summary["data"] and ref in summary["description"]
    # The card's plots: the PNGs of card/, byte for byte, inlined as data: URLs in the card's markdown (the UI
    # prints an image artifact's URL, and draws a markdown image).
    import base64
    import re

    card = arts["ops-flow-demo-card"]
    assert card["type"] == "markdown" and "# Dataset card: " in card["data"]
    inlined = re.findall(r"\]\(data:image/png;base64,([A-Za-z0-9+/=]+)\)", card["data"])
    assert [base64.b64decode(e) for e in inlined] == [
        (version / "card" / png).read_bytes() for png in ("lengths.png", "tokens_by_source.png", "shard_fill.png")]

    # The core library's log lines are in the run logs.
    logs = _logs(server, run["id"], "shardflow.pipeline")
    core_lines = [entry["message"] for entry in logs if entry["name"] == "shardflow.pipeline"]
    assert any("unit 0 of part-0.parquet" in line for line in core_lines), core_lines
    assert any(f"published {ref}" in line for line in core_lines), core_lines

    # In-process listeners (the CLI's progress bar) saw every unit and shard finish.
    tok = [e for e in events if e.phase == "tokenize"]
    assert [e.done for e in tok] == [0, 1, 2, 3, 4] and {e.total for e in tok} == {4}
    assert tok[-1].tokens == m.totals["tokens"]
    wr = [e for e in events if e.phase == "write"]
    assert wr[-1].done == wr[-1].total == m.totals["shards"] and wr[-1].tokens == m.totals["tokens"]
    assert events[-1].phase == "done" and events[-1].ref == ref

    # Same inputs again: no new version, and the summary says so; a changed option: v2.
    # Each run adds a version of the same keys, so the Artifacts page lists the dataset's builds.
    assert build_dataset(config=config, data_root=str(tmp_path / "data"), catalog=str(tmp_path / "cat")).ref == ref
    latest = server.request("GET", "/artifacts/ops-flow-demo-summary/latest")
    assert "No new version" in latest["data"] and ref in latest["data"]
    ref2 = build_dataset(config=config.replace(seed=1), data_root=str(tmp_path / "data"), catalog=str(tmp_path / "cat")).ref
    assert ref2 == f"{name}@v2"
    versions = server.request("POST", "/artifacts/filter", {"artifacts": {"key": {"any_": ["ops-flow-demo-summary"]}}})
    assert len(versions) == 3
    latest = server.request("GET", "/artifacts/ops-flow-demo-summary/latest")
    assert ref2 in latest["data"] and f"parent `{ref}`" in latest["data"]


@pytest.mark.slow
def test_finished_units_are_not_recomputed_after_task_and_flow_retries(
    prefect_api: PrefectServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = prefect_api
    import dataclasses

    import shardflow.pipeline.tokenize as tokenize_mod
    import shardflow.tasks.build as tb

    tokenized: Counter[int] = Counter()
    real_iter = tokenize_mod.iter_text_batches

    def counting_iter(inp: Any, unit: Any, **kw: Any) -> Any:
        tokenized[unit.index] += 1
        return real_iter(inp, unit, **kw)

    shard_attempts: Counter[tuple[str, int]] = Counter()
    real_write = core.write_shard

    def flaky_write(staging: Any, split: str, k: int) -> Any:
        shard_attempts[(split, k)] += 1
        if (split, k) == ("train", 1) and shard_attempts[(split, k)] == 1:
            raise OSError("simulated flaky mount")  # transient: the task retries
        return real_write(staging, split, k)

    layout_attempts = []
    real_layout = core.make_layout

    def failing_layout_once(staging: Any) -> Any:
        layout_attempts.append(1)
        if len(layout_attempts) == 1:
            raise ConfigError("simulated failure after tokenizing")  # not retried by the task: the flow retries
        return real_layout(staging)

    def patched_task(name: str, run: Any) -> Any:
        return tb.task_for_stage(dataclasses.replace(core.stage(name), run=run))

    monkeypatch.setattr(tokenize_mod, "iter_text_batches", counting_iter)
    monkeypatch.setitem(tb.STAGE_TASKS, "write-shard", patched_task("write-shard", flaky_write).with_options(retry_delay_seconds=0))
    monkeypatch.setitem(tb.STAGE_TASKS, "layout", patched_task("layout", failing_layout_once))

    config = BuildConfig(name="ops-retry", sources=(str(SAMPLE),), shard_tokens=50_000, unit_bytes=1)
    flow = build_dataset.with_options(retries=1, retry_delay_seconds=0)
    ref = flow(config=config, workers=2, data_root=str(tmp_path / "data"), catalog=str(tmp_path / "cat")).ref
    assert ref == "ops-retry@v1"

    assert len(layout_attempts) == 2  # the flow run was retried once ...
    assert sorted(tokenized) == [0, 1, 2, 3] and set(tokenized.values()) == {1}  # ... but no unit was redone
    assert shard_attempts[("train", 1)] >= 2  # the flaky shard was retried by its task

    run = _flow_run(server, "build ops-retry")
    assert run["state"]["type"] == "COMPLETED" and run["run_count"] == 2
    tasks = _task_runs(server, run["id"])
    flaky = [t for t in tasks if t["name"] == "write ops-retry train shard 1"]
    assert flaky and flaky[0]["run_count"] == 2 and flaky[0]["state"]["type"] == "COMPLETED"
    # Tasks return small metadata and Prefect persists none of it.
    for t in tasks:
        assert t["state"]["data"] is None, t["name"]


@pytest.mark.slow
def test_a_nightly_rebuild_of_a_grown_directory_tokenizes_only_the_new_file(
    prefect_api: PrefectServer, corpus: Path, tmp_path: Path
) -> None:
    import shutil

    src = tmp_path / "src"
    src.mkdir()
    for i in range(3):
        shutil.copy(corpus / f"part-{i}.parquet", src)
    config = BuildConfig(name="ops-nightly", sources=(str(src),), shard_tokens=200_000)
    where = dict(data_root=str(tmp_path / "data"), catalog=str(tmp_path / "cat"))
    assert build_dataset(config=config, **where).ref == "ops-nightly@v1"
    assert build_dataset(config=config, **where).ref == "ops-nightly@v1"  # nothing changed: nothing new
    shutil.copy(corpus / "part-3.parquet", src)
    events = []
    with listening(events.append):
        assert build_dataset(config=config, **where).ref == "ops-nightly@v2"
    tok = [e for e in events if e.phase == "tokenize"]
    assert tok[-1].total == 1 and tok[-1].done == 1  # only the new file's unit
    m = read_manifest(tmp_path / "data" / "ops-nightly" / "v2")
    assert m.parent == "ops-nightly@v1" and len(m.inputs) == 4
    latest = prefect_api.request("GET", "/artifacts/ops-nightly-summary/latest")
    assert f"{tok[-1].tokens:,} tokens were tokenized in this run; the other " in latest["data"]
    assert "came from `ops-nightly@v1`, unchanged" in latest["data"], latest["data"]
