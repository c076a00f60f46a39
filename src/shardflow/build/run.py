"""Running the whole pipeline in this process: ``build()``, and the retry rule every runner shares.

``run_stages`` walks ``STAGES`` in order and hands each stage's jobs to a
runner callback; ``build()`` is that walk on a thread pool. The Prefect flow
walks the same table with Prefect tasks (``flows/build.py``).
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence, TypeVar

from ..catalog import Catalog
from ..config import BuildConfig
from ..errors import ConfigError, is_transient
from .model import BuildPlan, BuildResult, UnitResult
from .plan import plan_build
from .stages import STAGES, Job, Stage
from .staging import build_lock

__all__ = ["build", "retrying", "run_stages", "STEP_RETRIES", "RETRY_DELAY"]

log = logging.getLogger("shardflow.build")

# Transient I/O errors: how often a stage of retry class "io" is retried, and the pause before retry n (seconds).
STEP_RETRIES = 2
RETRY_DELAY = 1.0

_T = TypeVar("_T")


def retrying(step: Callable[..., _T], *args: Any, retries: int | None = None, **kwargs: Any) -> _T:
    """Run a build step, retrying it up to ``retries`` (``STEP_RETRIES``) times on a transient I/O error.

    Steps are idempotent, so a retry redoes only what did not finish. Bad input
    and configuration errors (``ShardflowError``), and I/O errors that need a
    person (a full disk, a missing path, permissions), are raised at once: see
    ``errors.is_transient``.
    """
    retries = STEP_RETRIES if retries is None else retries
    for attempt in range(retries + 1):
        try:
            return step(*args, **kwargs)
        except Exception as exc:  # OSErrors, and an object store's connection errors (not OSErrors)
            if attempt >= retries or not is_transient(exc):
                raise
            name = getattr(step, "name", None) or getattr(step, "__name__", step)
            log.warning("%s: transient I/O error (%s); retry %d of %d", name, exc, attempt + 1, retries)
            time.sleep(RETRY_DELAY * (attempt + 1))
    raise AssertionError("unreachable")


def run_stages(
    plan: Any,
    run_jobs: Callable[[Stage, Sequence[Job]], list[Any]],
    start_jobs: Callable[[Stage, Sequence[Job]], Callable[[], list[Any]]] | None = None,
) -> dict[str, list[Any]]:
    """Run every stage of ``STAGES`` that applies to ``plan``, in order; results by stage name.

    ``run_jobs(stage, jobs)`` runs one stage's jobs (in parallel where it can)
    and returns their results in job order; the next stage starts after it returns.
    ``start_jobs(stage, jobs)`` starts a background stage's jobs (``Stage.joins``) and
    returns the call that waits for their results; without it they run in place, by ``run_jobs``.
    """
    done: dict[str, list[Any]] = {}
    waiting: dict[str, tuple[Stage, Callable[[], list[Any]]]] = {}
    try:
        for stage in STAGES:
            for name, (bg, wait) in list(waiting.items()):
                if bg.joins == stage.name:
                    del waiting[name]
                    done[name] = wait()
            if not stage.when(plan):
                continue
            jobs = stage.jobs(plan, done)
            if stage.joins is not None and start_jobs is not None:
                waiting[stage.name] = (stage, start_jobs(stage, jobs))
            else:
                done[stage.name] = run_jobs(stage, jobs)
    finally:
        # A stage failed before the join: the background job is still waited for (its error, if any,
        # is not the one to report), so nothing writes into the staging directory after this returns.
        for _, wait in waiting.values():
            try:
                wait()
            except Exception:
                log.debug("a background stage failed too", exc_info=True)
    return done


def build(
    config: BuildConfig,
    *,
    data_root: str | os.PathLike[str] | None = None,
    catalog: str | os.PathLike[str] | None = None,
    workers: int = 1,
    on_unit: Callable[[UnitResult], None] | None = None,
    on_plan: Callable[[BuildPlan], None] | None = None,
    lock_timeout: float | None = 0,
    reuse: bool | None = None,
) -> BuildResult:
    """Run the whole pipeline in this process, ``workers`` threads wide (no Prefect needed).

    Holds the build's ``build_lock`` throughout: a second run of the same build
    fails at once with a clear message (``lock_timeout`` seconds: waits, and
    then reports the version the other run published). Transient I/O errors
    are retried per job of the stages that move bytes (``retrying``).
    ``on_plan`` is called once with the plan (a progress display learns the
    number of units), ``on_unit`` with each tokenized unit's result.
    """
    if workers < 1:
        raise ConfigError(f"workers must be at least 1, not {workers}")
    plan = retrying(plan_build, config, data_root=data_root, catalog=catalog, reuse=reuse, lock_timeout=lock_timeout)
    cat = Catalog(plan.catalog)
    if on_plan is not None:
        on_plan(plan)
    if plan.existing:
        return BuildResult(ref=plan.existing, manifest_path=str(cat.resolve(plan.existing) / "metadata.yaml"), created=False)
    with build_lock(plan, timeout=lock_timeout) as plan:
        if plan.existing:
            return BuildResult(ref=plan.existing, manifest_path=str(cat.resolve(plan.existing) / "metadata.yaml"), created=False)
        pool = ThreadPoolExecutor(max_workers=workers)
        # Background stages (Stage.joins) run on a thread of their own, not a worker's.
        beside = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardflow-beside")

        def run_jobs(stage: Stage, jobs: Sequence[Job]) -> list[Any]:
            retries = None if stage.retry == "io" else 0

            def call(job: Job) -> Any:
                return retrying(stage, plan, *job, retries=retries)

            if stage.fan_out == "one":
                return [call(job) for job in jobs]
            results = []
            for result in pool.map(call, jobs):
                if on_unit is not None and stage.fan_out == "units":
                    on_unit(result)
                results.append(result)
            return results

        def start_jobs(stage: Stage, jobs: Sequence[Job]) -> Callable[[], list[Any]]:
            futures = [beside.submit(retrying, stage, plan, *job, retries=0 if stage.retry == "never" else None)
                       for job in jobs]
            return lambda: [f.result() for f in futures]

        try:
            done = run_stages(plan, run_jobs, start_jobs)
        finally:
            # On the first error, queued work is dropped (what finished is kept for the rerun).
            pool.shutdown(wait=True, cancel_futures=True)
            beside.shutdown(wait=True, cancel_futures=True)
    ref = done["publish"][0]
    return BuildResult(ref=ref, manifest_path=str(cat.resolve(ref) / "metadata.yaml"), created=True)
