"""The ``build_dataset`` Prefect flow on Prefect's temporary test server: the bytes of a ``--no-prefect`` build.

The flow's other tests (a real server, Dask, the UI, the command line) are in
the slow tier; this keeps ``shardflow.flows.build`` and its task tags in the
fast one: the smallest real corpus, two work units, one flow run. It takes
about 15-20 s, nearly all of it starting Prefect's temporary server (once per
session), and is deliberately not marked slow: without it the fast tier would
not run the flow module at all (flows/build.py 22%).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from support.builds import files_of
from support.corpus import TINY_TEXTS, write_parquet
from support.paths import SAMPLE


@pytest.mark.slow
def test_the_flow_publishes_the_bytes_of_a_build_without_prefect(prefect_harness, small_vocab, tmp_path, monkeypatch):
    from shardflow.pipeline import build
    from shardflow.config import BuildConfig
    from shardflow.flows.build import build_dataset

    monkeypatch.setenv("PREFECT_LOGGING_EXTRA_LOGGERS", "shardflow")
    sources = tuple(str(write_parquet(tmp_path / f"part{i}.parquet", TINY_TEXTS[i:] + TINY_TEXTS[:i])) for i in range(2))
    config = BuildConfig(name="tinyflow", sources=sources, tokenizer=str(small_vocab), boundary="eos")
    plain = build(config, data_root=tmp_path / "plain" / "data", catalog=tmp_path / "plain" / "cat")
    result = build_dataset(config=config, workers=2, data_root=str(tmp_path / "flow" / "data"), catalog=str(tmp_path / "flow" / "cat"))
    # The flow returns the driver's BuildResult: the reference, the manifest's path, and whether it is new.
    ref = result.ref
    assert (ref, result.created) == ("tinyflow@v1", True)
    assert result.manifest_path == str(tmp_path / "flow" / "data" / "tinyflow" / "v1" / "metadata.yaml")
    assert files_of(tmp_path / "flow" / "data" / "tinyflow" / "v1") == files_of(Path(plain.manifest_path).parent)
    # Built again, the flow finds the identical version and publishes nothing.
    again = build_dataset(config=config, workers=2, data_root=str(tmp_path / "flow" / "data"), catalog=str(tmp_path / "flow" / "cat"))
    assert (again.ref, again.created) == (ref, False)
    assert sorted(p.name for p in (tmp_path / "flow" / "data" / "tinyflow").iterdir() if p.name.startswith("v")) == ["v1"]


@pytest.mark.slow
def test_past_max_task_runs_a_task_run_takes_several_jobs_and_a_failed_batch_is_retried(
    prefect_harness, tmp_path, monkeypatch
):
    """``flows.build.batches``: a stage of more jobs than ``MAX_TASK_RUNS`` (and ``workers``) runs them in batches,
    one task run each, with the bytes of a build without Prefect; a batch that fails on a transient I/O error is
    retried as a task run (its run count shows it) and redoes only its unfinished jobs."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from shardflow.pipeline import build
    from shardflow.config import BuildConfig
    from shardflow.flows import build as flows_build
    from shardflow.tasks import build as tasks_build

    monkeypatch.setattr(flows_build, "MAX_TASK_RUNS", 2)
    # Retried at once (not after errors.RETRY.delays()); EIO on the first unit's commit only: a transient error.
    for name, t in tasks_build.STAGE_BATCH_TASKS.items():
        monkeypatch.setitem(tasks_build.STAGE_BATCH_TASKS, name, t.with_options(retry_delay_seconds=0))
    config = BuildConfig(name="batched", sources=(str(SAMPLE),), shard_tokens=50_000, unit_bytes=1)
    plain = build(config, data_root=tmp_path / "plain" / "data", catalog=tmp_path / "plain" / "cat")
    monkeypatch.setenv("SHARDFLOW_FAULT", "eio:tokenize-tokens:1")
    state = flows_build.build_dataset(config=config, workers=1, data_root=str(tmp_path / "flow" / "data"),
                                      catalog=str(tmp_path / "flow" / "cat"), return_state=True)
    assert state.result().ref == "batched@v1"
    assert files_of(tmp_path / "flow" / "data" / "batched" / "v1") == files_of(Path(plain.manifest_path).parent)

    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    tokenize = sorted((r for r in runs if r.task_key.startswith("tokenize_unit_batch_task")), key=lambda r: r.name)
    # 4 units (one per row group of the sample at unit_bytes=1) in 2 task runs of 2, named after their first job.
    assert [r.name.endswith("(+1 more)") for r in tokenize] == [True, True], [r.name for r in runs]
    assert all(r.state.is_completed() for r in tokenize)
    assert sorted(r.run_count for r in tokenize) == [1, 2]  # the batch that met the error ran again
    per_job = [r for r in runs if r.task_key.startswith(("tokenize_unit_task", "write_shard_task"))]
    assert per_job == [], [r.name for r in per_job]  # every fanned-out stage of more than 2 jobs was batched
