"""The build driver: plan, skip what is published, lock, and walk ``STAGES`` on an executor.

``drive(config, executor)`` is the one place that sequences a build::

    plan  ->  published already?  ->  build_lock  ->  published meanwhile?  ->  each stage of STAGES

Each stage's jobs whose output is committed already (a resumed run, shards an
incremental build linked from its parent) are answered by ``Stage.done``
without running; the rest go to the *executor*, which only runs them: in
threads here (``ThreadExecutor``, what ``build()`` uses), on a Dask cluster
(``dask_executor.DaskExecutor``), or as Prefect task runs (``flows/build.py``).
What the driver sees on the way goes to an ``Events`` object (progress
displays, the Prefect UI's artifacts).
"""

from __future__ import annotations

import logging
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, ContextManager, Protocol, Sequence, TypeVar

from ..catalog import Catalog
from ..config import BuildConfig
from ..errors import RETRY, CatalogError, is_transient
from .model import BuildPlan, BuildResult, UnitResult
from .plan import plan_build
from .request import BuildRequest
from .stages import STAGES, Job, Stage
from .staging import build_lock

__all__ = ["build", "drive", "run_request", "retrying", "run_stages", "Executor", "Events", "ThreadExecutor"]

log = logging.getLogger("shardflow.pipeline")

_T = TypeVar("_T")
OnDone = Callable[[Job, Any], None]


def retrying(step: Callable[..., _T], *args: Any, retries: int | None = None, **kwargs: Any) -> _T:
    """Run a build step, retrying it up to ``retries`` (``errors.RETRY``'s) times on a transient I/O error.

    Steps are idempotent, so a retry redoes only what did not finish. Bad input
    and configuration errors (``ShardflowError``), and I/O errors that need a
    person (a full disk, a missing path, permissions), are raised at once: see
    ``errors.is_transient``.
    """
    retries = RETRY.retries if retries is None else retries
    for attempt in range(retries + 1):
        try:
            return step(*args, **kwargs)
        except Exception as exc:  # OSErrors, and an object store's connection errors (not OSErrors)
            if attempt >= retries or not is_transient(exc):
                raise
            name = getattr(step, "name", None) or getattr(step, "__name__", step)
            log.warning("%s: transient I/O error (%s); retry %d of %d", name, exc, attempt + 1, retries)
            time.sleep(RETRY.delays()[attempt])
    raise AssertionError("unreachable")


def stage_retries(stage: Stage) -> int | None:
    """``retrying``'s count for one job of ``stage``: the default for I/O stages, none for the rest."""
    return None if stage.retry == "io" else 0


class Executor(Protocol):
    """Runs jobs for the driver; knows nothing of the build's sequence."""

    def plan(self, config: BuildConfig, **where: Any) -> BuildPlan:
        """``plan_build(config, **where)``, retried on transient I/O errors."""

    def map(self, stage: Stage, plan: BuildPlan, jobs: Sequence[Job], on_done: OnDone) -> list[Any]:
        """Run ``stage(plan, *job)`` for every job, in parallel where it can; results in job order.

        Calls ``on_done(job, result)`` as each finishes, and raises the first error.
        """

    def start(self, stage: Stage, plan: BuildPlan, jobs: Sequence[Job]) -> Callable[[], list[Any]]:
        """Start a background stage's jobs beside the next stages; returns the call that waits for their results."""

    def fetch_parent(self, places: Any, config: BuildConfig) -> str | None:
        """A build to a bucket: ``bucket.build.fetch_parent``, retried on transient errors."""

    def push(self, request: BuildRequest, ref: str, listed: set[str]) -> None:
        """A build to a bucket: send the version built in the scratch (``bucket.build.publish_to_bucket``)."""

    shares_filesystem: bool
    """Whether the jobs run where this process's files are (False: a build to a bucket sends from the workers)."""


class Events:
    """What the driver reports as a build goes; each method is a no-op here, for subclasses to fill."""

    def planned(self, plan: BuildPlan) -> None:
        """The plan (``plan.existing`` set: nothing to do)."""

    def stage_started(self, stage: Stage, plan: BuildPlan, jobs: Sequence[Job]) -> None:
        """``stage`` begins with these jobs (some may be done already)."""

    def job_done(self, stage: Stage, plan: BuildPlan, job: Job, result: Any) -> None:
        """One job of ``stage`` finished, or was found committed already."""

    def stage_failed(self, stage: Stage, plan: BuildPlan, error: BaseException) -> None:
        """``stage`` raised ``error``; the build stops (what finished is kept for a rerun)."""


def run_stages(
    plan: Any,
    run_jobs: Callable[[Stage, Sequence[Job]], list[Any]],
    start_jobs: Callable[[Stage, Sequence[Job]], Callable[[], list[Any]]] | None = None,
) -> dict[str, list[Any]]:
    """Run every stage of ``STAGES`` that applies to ``plan``, in order; results by stage name.

    ``run_jobs(stage, jobs)`` runs one stage's jobs and returns their results in
    job order; the next stage starts after it returns. ``start_jobs(stage, jobs)``
    starts a background stage's jobs (``Stage.joins``) and returns the call that
    waits for their results; without it they run in place, by ``run_jobs``.
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


def drive(
    config: BuildConfig,
    executor: Executor,
    *,
    data_root: str | os.PathLike[str] | None = None,
    catalog: str | os.PathLike[str] | None = None,
    lock_timeout: float | None = 0,
    reuse: bool | None = None,
    events: Events | None = None,
    lock: Callable[..., ContextManager[BuildPlan]] = build_lock,
    finish: Callable[[str], None] | None = None,
) -> BuildResult:
    """Build ``config`` into a published version, running its jobs on ``executor``.

    Holds the build's ``lock`` (``build_lock``; a build to a bucket's also holds the bucket's lease of the build
    key: ``bucket/driving.py``) from after planning to the end: a second
    run of the same build fails at once with a clear message (``lock_timeout``
    seconds: waits, and then reports the version the other run published). ``finish(ref)`` runs last, still
    under the lock, after a publish (a build to a bucket's push).
    """
    events = events or Events()
    plan = executor.plan(config, data_root=data_root, catalog=catalog, reuse=reuse, lock_timeout=lock_timeout)
    if not plan.existing:
        with lock(plan, timeout=lock_timeout) as plan:
            if not plan.existing:  # nobody published it while this run waited for the lock
                events.planned(plan)
                done = run_stages(plan, *_stage_runners(plan, executor, events))
                if finish is not None:
                    finish(done["publish"][0])
                return _result(plan, done["publish"][0], created=True)
    events.planned(plan)
    return _result(plan, plan.existing, created=False)


def run_request(request: BuildRequest, executor: Executor, events: Events | None = None) -> BuildResult:
    """Run ``request`` on ``executor``: ``drive``, and for a build to a bucket, its catalog synced first (once,
    here, in the process that runs the build), its parent fetched, and the version pushed after."""
    places = request.places
    if places is None:
        return drive(request.config, executor, data_root=request.data_root, catalog=request.catalog, events=events)
    from ..bucket.build import sync_catalog
    from ..bucket.driving import bucket_lock, listed_versions

    listed = sync_catalog(places, request.config.name)
    # A bucket's parent this scratch lacks is fetched (reused, not tokenized again); without one, nothing to reuse.
    reuse = None if executor.fetch_parent(places, request.config) else False
    data_root, catalog = request.local
    # Workers that share no filesystem with this process send the version's files to the bucket themselves.
    sends = not executor.shares_filesystem
    lock = bucket_lock(places, sends=sends)

    def push(ref: str) -> None:  # under the build key's lease: a second build of it waits for this push
        if ref.partition("@")[2] not in listed_versions(places, request.config.name):
            executor.push(request, ref, listed)

    result = drive(request.config, executor, data_root=data_root, catalog=catalog, reuse=reuse, events=events,
                   lock=lock, finish=None if sends else push)
    if not sends:
        push(result.ref)  # a version built here earlier whose push was interrupted (a no-op after the one above)
    return BuildResult(ref=result.ref, manifest_path=f"{places.version_url(result.ref)}/metadata.yaml",
                       created=result.ref.partition("@")[2] not in listed)


def _result(plan: BuildPlan, ref: str, *, created: bool) -> BuildResult:
    try:
        manifest_path = str(Catalog(plan.catalog).resolve(ref) / "metadata.yaml")
    except CatalogError:
        manifest_path = ""  # published on a bucket only (its workers sent it, or another build): run_request says where
    return BuildResult(ref=ref, manifest_path=manifest_path, created=created)


def _stage_runners(plan: BuildPlan, executor: Executor, events: Events) -> tuple[Callable[..., Any], Callable[..., Any]]:
    """``run_stages``'s two callbacks: committed jobs answered by ``Stage.done``, the rest run by ``executor``."""

    def committed(stage: Stage, jobs: Sequence[Job]) -> tuple[list[Any], list[int]]:
        events.stage_started(stage, plan, jobs)
        results = [stage.done(plan, *job) if stage.done else None for job in jobs]
        for job, result in zip(jobs, results):
            if result is not None:
                events.job_done(stage, plan, job, result)
        return results, [i for i, result in enumerate(results) if result is None]

    def run_jobs(stage: Stage, jobs: Sequence[Job]) -> list[Any]:
        results, todo = committed(stage, jobs)
        try:
            ran = executor.map(stage, plan, [jobs[i] for i in todo],
                               lambda job, result: events.job_done(stage, plan, job, result))
        except Exception as exc:
            events.stage_failed(stage, plan, exc)
            raise
        for i, result in zip(todo, ran):
            results[i] = result
        return results

    def start_jobs(stage: Stage, jobs: Sequence[Job]) -> Callable[[], list[Any]]:
        results, todo = committed(stage, jobs)
        wait = executor.start(stage, plan, [jobs[i] for i in todo])

        def joined() -> list[Any]:
            try:
                ran = wait()
            except Exception as exc:
                events.stage_failed(stage, plan, exc)
                raise
            for i, result in zip(todo, ran):
                results[i] = result
                events.job_done(stage, plan, jobs[i], result)
            return results

        return joined

    return run_jobs, start_jobs


class InProcess:
    """What every executor here does in this process: planning, and background stages on a thread of their own."""

    shares_filesystem = True
    """Whether its jobs see this process's files (False: a build to a bucket sends its files from the workers)."""

    def __init__(self) -> None:
        self.beside = ThreadPoolExecutor(max_workers=1, thread_name_prefix="shardflow-beside")

    def __enter__(self) -> Any:
        return self

    def plan(self, config: BuildConfig, **where: Any) -> BuildPlan:
        return retrying(plan_build, config, **where)

    def fetch_parent(self, places: Any, config: BuildConfig) -> str | None:
        from ..bucket.build import fetch_parent

        return retrying(fetch_parent, places, config)

    def push(self, request: BuildRequest, ref: str, listed: set[str]) -> None:
        from ..bucket.build import publish_to_bucket

        publish_to_bucket(request.places, ref, listed=listed, workers=request.workers)

    def start(self, stage: Stage, plan: BuildPlan, jobs: Sequence[Job]) -> Callable[[], list[Any]]:
        futures = [self.beside.submit(retrying, stage, plan, *job, retries=stage_retries(stage)) for job in jobs]
        return lambda: [f.result() for f in futures]

    def __exit__(self, *exc: Any) -> None:
        self.beside.shutdown(wait=True, cancel_futures=True)


class ThreadExecutor(InProcess):
    """Runs a stage's jobs on ``workers`` threads of this process; background stages on a thread of their own.

    A pool of exactly ``workers`` threads bounds memory by ``workers x batch size``.
    Use it as a context manager: on exit, queued jobs are dropped (after an
    error: what finished is kept for the rerun) and running ones waited for.
    """

    def __init__(self, workers: int) -> None:
        super().__init__()
        self.pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="shardflow-worker")

    def __exit__(self, *exc: Any) -> None:
        self.pool.shutdown(wait=True, cancel_futures=True)
        super().__exit__(*exc)

    def map(self, stage: Stage, plan: BuildPlan, jobs: Sequence[Job], on_done: OnDone) -> list[Any]:
        def call(job: Job) -> Any:
            return retrying(stage, plan, *job, retries=stage_retries(stage))

        results = []
        for job, result in zip(jobs, map(call, jobs) if stage.fan_out == "one" else self.pool.map(call, jobs)):
            on_done(job, result)
            results.append(result)
        return results


class _UnitCallbacks(Events):
    def __init__(self, on_plan: Callable[[BuildPlan], None] | None, on_unit: Callable[[UnitResult], None] | None):
        self.on_plan, self.on_unit = on_plan, on_unit

    def planned(self, plan: BuildPlan) -> None:
        if self.on_plan is not None:
            self.on_plan(plan)

    def job_done(self, stage: Stage, plan: BuildPlan, job: Job, result: Any) -> None:
        if self.on_unit is not None and stage.fan_out == "units":
            self.on_unit(result)


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
    events: Events | None = None,
) -> BuildResult:
    """Run the whole pipeline in this process, ``workers`` threads wide (no Prefect needed): ``drive`` on threads.

    ``on_plan`` is called once with the plan (a progress display learns the
    number of units), ``on_unit`` with each tokenized unit's result; ``events``
    sees everything (and replaces both). A ``data_root`` and ``catalog`` on a
    bucket build in a scratch mirror and push the version (``run_request``).
    """
    request = BuildRequest(config=config, workers=workers, data_root=_text(data_root), catalog=_text(catalog))
    if config.embed is not None:  # its jobs run here: what would stop them is refused before the tokens
        from ..embed.embedder import check_available

        check_available(config.embed)
    events = events or _UnitCallbacks(on_plan, on_unit)
    with ThreadExecutor(workers) as executor:
        if request.places is not None:
            return run_request(request, executor, events)
        return drive(config, executor, data_root=data_root, catalog=catalog, lock_timeout=lock_timeout, reuse=reuse,
                     events=events)


def _text(path: str | os.PathLike[str] | None) -> str | None:
    return None if path is None else os.fspath(path)
