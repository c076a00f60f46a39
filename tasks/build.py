"""Prefect tasks for the build steps; the logic lives in ``shardflow.pipeline``.

Retries: only the tasks that move bytes to or from storage that may be remote
or shared (planning, reading the inputs, writing shards, publishing, pushing)
retry, under the core's one policy (``errors.RETRY``: its count and delays) and
only on what the core calls transient (``errors.is_transient``: a flaky mount, an
object store's dropped connection). Bad input, bad config and failed validation
are deterministic and never retried; the compute and check steps (``layout``,
``validate``) have no retries at all.

Results: every task returns small JSON-able metadata (counts, a shard's
manifest entry, a path, a reference), never token arrays, and nothing is
persisted by Prefect (``persist_result=False``, no cache key to hash). Work
already done is not redone because every core step first looks for its own
output on disk (``parts/unit-N.json``, ``layout/SPLIT-K.shard.json``): a task
that runs again, after a retry, a flow-run retry or on another Dask worker,
returns the recorded result without recomputing it.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from shardflow import pipeline as core
from shardflow.pipeline.handle import PlanHandle
from shardflow.config import BuildConfig
from shardflow.errors import RETRY
from shardflow.errors import is_transient as core_is_transient


__all__ = [
    "plan_task", "STAGE_TASKS", "STAGE_BATCH_TASKS", "task_for_stage", "batch_task_for_stage", "PlanHandle", "is_transient",
    "attach_core_logs", "TAGS", "fetch_parent_task", "push_prepare_task", "push_files_task", "push_finish_task",
]

TAGS = ("shardflow",)

def is_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Prefect's ``retry_condition_fn``: the core's ``errors.is_transient`` of the task's exception."""
    exc = state.data
    return isinstance(exc, BaseException) and core_is_transient(exc)


def _api_handler(logger: logging.Logger) -> logging.Handler | None:
    from prefect.logging.handlers import APILogHandler

    return next((h for h in logger.handlers if isinstance(h, APILogHandler)), None)


def _new_api_handler() -> logging.Handler:
    from prefect.logging.handlers import APILogHandler

    handler = APILogHandler()
    handler.addFilter(_in_a_run)
    return handler


def attach_core_logs() -> None:
    """Send the core library's ``shardflow.*`` log lines (INFO and up) to the Prefect run logs.

    ``PREFECT_LOGGING_EXTRA_LOGGERS=shardflow`` attaches Prefect's API handler
    when Prefect starts, but leaves the logger at the root's WARNING level, and
    a Dask worker or a served flow-run process may not have that variable at
    all. Every task calls this first, so it holds wherever the task runs (a
    worker process keeps the setting); so does the flow. Idempotent and cheap.
    """
    logger = logging.getLogger("shardflow")
    if logger.level == logging.NOTSET or logger.level > logging.INFO:
        logger.setLevel(logging.INFO)
    if _api_handler(logger) is None:
        logger.addHandler(_new_api_handler())


def _in_a_run(record: logging.LogRecord) -> bool:
    """Core log lines outside any flow or task run (``--no-prefect``, a library user) stay local."""
    from prefect.context import FlowRunContext, TaskRunContext

    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


_COMMON: dict[str, Any] = dict(cache_policy=NO_CACHE, persist_result=False)
# NO_CACHE: results are tiny and steps are idempotent on disk already; hashing
# inputs for a cache key would only cost time. No tags on the tasks, and none reach
# their runs (the flow run's tags are set on it alone): a tagged task run asks the
# server for a concurrency slot first (flows/build.py).
_IO: dict[str, Any] = dict(_COMMON, retries=RETRY.retries, retry_delay_seconds=RETRY.delays(),
                           retry_condition_fn=is_transient)
_NO_RETRY: dict[str, Any] = dict(_COMMON, retries=0)


@task(name="plan", task_run_name="plan {config.name}", **_IO)
def plan_task(
    config: BuildConfig,
    data_root: str | None = None,
    catalog: str | None = None,
    reuse: bool | None = None,
    lock_timeout: float | None = 0,
) -> core.BuildPlan:
    attach_core_logs()
    return core.plan_build(config, data_root=data_root, catalog=catalog, reuse=reuse, lock_timeout=lock_timeout)


@task(name="fetch-parent", task_run_name="fetch the parent of {config.name}", **_IO)
def fetch_parent_task(places: Any, config: BuildConfig) -> str | None:
    """``shardflow.bucket.build.fetch_parent``: the bucket's latest version, into the scratch if it lacks it."""
    from shardflow.bucket.build import fetch_parent

    attach_core_logs()
    return fetch_parent(places, config)


@task(name="push", task_run_name="push {ref}: claim", **_IO)
def push_prepare_task(places: Any, ref: str, listed: set[str]) -> Any:
    """``shardflow.bucket.build.prepare_publish``: the claimed push (a ``PushPlan``), or None if the bucket lists it."""
    from shardflow.bucket.build import prepare_publish

    attach_core_logs()
    return prepare_publish(places, ref, listed=listed)


@task(name="push-files", task_run_name="{label}", **_IO)
def push_files_task(plan: Any, files: list[tuple[str, int, str]], label: str) -> list[str]:
    """``shardflow.bucket.push.push_files``: send some of the version's files (on a worker, from the shared scratch)."""
    from shardflow.bucket.push import push_files

    attach_core_logs()
    return push_files(plan, files)


@task(name="push-commit", task_run_name="push {plan.result.ref}: manifest and catalog entry", **_IO)
def push_finish_task(plan: Any, done: list[str]) -> dict[str, Any]:
    """``shardflow.bucket.push.finish_push``: the manifest, then the bucket catalog entry (the commit point)."""
    from shardflow.bucket.push import finish_push

    attach_core_logs()
    return dataclasses.asdict(finish_push(plan, done))


def task_for_stage(stage: core.Stage) -> Task[..., Any]:
    """The Prefect task of one core stage: same name, its retry class, one job per run.

    It takes the plan as a ``PlanHandle`` (or a plain ``BuildPlan``).
    """

    def run_stage(plan: Any, job: tuple[Any, ...], label: str) -> Any:
        attach_core_logs()
        return stage(plan.plan if isinstance(plan, PlanHandle) else plan, *job)

    run_stage.__name__ = run_stage.__qualname__ = f"{stage.name.replace('-', '_')}_task"
    run_stage.__doc__ = f"Run the core stage {stage.name!r} ({stage.run.__module__}.{stage.run.__name__}) for one job."
    options = _IO if stage.retry == "io" else _NO_RETRY
    return task(name=stage.name, task_run_name="{label}", **options)(run_stage)


def batch_task_for_stage(stage: core.Stage) -> Task[..., Any]:
    """The Prefect task of one core stage for several jobs, run in order in one task run: results in job order.

    A retry runs the batch again, and each job that finished returns its recorded result (the core
    steps are idempotent on disk), so only the unfinished ones are redone.
    """

    def run_stage_batch(plan: Any, jobs: list[tuple[Any, ...]], label: str) -> list[Any]:
        attach_core_logs()
        plan = plan.plan if isinstance(plan, PlanHandle) else plan
        return [stage(plan, *job) for job in jobs]

    run_stage_batch.__name__ = run_stage_batch.__qualname__ = f"{stage.name.replace('-', '_')}_batch_task"
    run_stage_batch.__doc__ = f"Run the core stage {stage.name!r} ({stage.run.__module__}.{stage.run.__name__}) for several jobs."
    options = _IO if stage.retry == "io" else _NO_RETRY
    return task(name=stage.name, task_run_name="{label}", **options)(run_stage_batch)


STAGE_TASKS: dict[str, Task[..., Any]] = {stage.name: task_for_stage(stage) for stage in core.STAGES}
"""One Prefect task per core stage (``shardflow.pipeline.STAGES``), by stage name."""
STAGE_BATCH_TASKS: dict[str, Task[..., Any]] = {
    stage.name: batch_task_for_stage(stage) for stage in core.STAGES if stage.fan_out != "one"
}
"""The fanned-out stages' tasks for a batch of jobs (``flows.build.batches``), by stage name."""
