"""The ``build_dataset`` Prefect flow: the core driver with Prefect as its executor, and what the UI shows.

The flow is ``shardflow.pipeline.drive`` with a ``PrefectExecutor``: every stage
job is a task run (``tasks/build.py``), so a rerun after a crash resumes where
the last run stopped, as every core step is idempotent on disk. At most
``workers`` task runs are in flight (a sliding window), which bounds memory by
``workers x batch size`` whatever the corpus size and whichever task runner
executes them.

Where the work units run (``runner``):

* ``threads`` (default): a pool of ``workers`` threads in the flow's process,
  with up to twice as many tasks submitted, so the next ones wait ready.
* ``dask``: an existing Dask cluster (``address="tcp://HOST:8786"``), through
  prefect-dask's ``DaskTaskRunner`` (``pip install 'shardflow[dask]'``). The
  per-unit and per-shard tasks run on the workers; plan, layout, validate,
  publish and the card run in the flow's process. The workers report their task
  runs to the Prefect API, so it must be a real server they can reach
  (``PREFECT_API_URL=http://HOST:4200/api``), not the temporary one, and
  ``data_root`` must be storage that the flow process and every worker see at
  the same path (a shared mount); for a build to a bucket, ``scratch`` must.

What the UI shows for a run is described in ``flows.report``: a summary (first
on the run's page), the dataset card and a progress artifact, keyed per
dataset; the flow run is named ``build <dataset>`` and tagged ``shardflow``
and ``dataset:<name>``; its task runs carry no tags (a tagged task run asks the
server for a concurrency slot first) and are named after their work unit or
shard; the core library's log lines go to the run logs.
"""

# (no "from __future__ import annotations": Prefect builds the flow's parameter model from real annotations)

import logging
import time
from typing import Any, Callable, Iterable, Sequence
from urllib.parse import urlparse

from prefect import flow, get_run_logger
from prefect.futures import PrefectFuture, as_completed
from prefect.task_runners import ThreadPoolTaskRunner

from shardflow.pipeline import BuildRequest, Stage, run_request
from shardflow.pipeline.dask_executor import check_workers_see
from shardflow.pipeline.handle import PlanHandle
from shardflow.pipeline.model import BuildPlan, BuildResult
from shardflow.pipeline.stages import Job
from shardflow.catalog import Catalog, default_data_root
from shardflow.config import BuildConfig
from shardflow.errors import ConfigError
from shardflow.manifest import read_manifest

from shardflow.cli.progress import BuildProgress, Progress, emit
from shardflow.flows.report import FOUND_ROWS, artifact_key, card_markdown, placed, summary_description, summary_markdown
from shardflow.flows.server import watch_server
from shardflow.tasks.build import (
    STAGE_BATCH_TASKS, STAGE_TASKS, TAGS, attach_core_logs, fetch_parent_task, plan_task, push_files_task, push_finish_task, push_prepare_task,
)

__all__ = [
    "build_dataset", "PrefectExecutor", "run_windowed", "make_task_runner", "dataset_tag", "require_real_api",
    "batches", "MAX_TASK_RUNS",
]

log = logging.getLogger("shardflow.flows")

MAX_TASK_RUNS = 500
"""Task runs of one fanned-out stage, at most, unless ``workers`` is more (then one per slot).

Each task run costs the flow's process and the server serial API work (creating
it, its states, its logs; per task run, measured by ``bench/bench_orchestration.py``:
docs/PERFORMANCE.md, docs/SCALE.md). At 10 TB (35 k units, 35 k shards, each
validated) one task run per job would be about 10^5 task runs of it, one after
another; past this many jobs, a task run runs several in order, and the
orchestration no longer grows with the corpus (docs/SCALE.md)."""


def batches(jobs: Sequence[Job], in_flight: int, most: int = MAX_TASK_RUNS) -> list[list[Job]]:
    """``jobs`` in consecutive groups of equal size (the last may be smaller): at most ``max(most, in_flight)``
    groups; one job per group while there are no more jobs than that."""
    size = max(1, -(-len(jobs) // max(1, most, in_flight)))
    return [list(jobs[i : i + size]) for i in range(0, len(jobs), size)]


def dataset_tag(name: str) -> str:
    return f"dataset:{name}"


def run_windowed(
    submit: Callable[[Any], PrefectFuture[Any]],
    items: Iterable[Any],
    *,
    workers: int,
    on_done: Callable[[Any, Any], None] | None = None,
    on_error: Callable[[Any, PrefectFuture[Any], Exception], Exception | None] | None = None,
) -> list[Any]:
    """Submit ``items`` keeping at most ``workers`` in flight; results in item order.

    ``on_error(item, future, exc)`` may give the exception to raise instead of a failed item's own.
    """
    pending: dict[PrefectFuture[Any], int] = {}
    items = list(items)
    results: list[Any] = [None] * len(items)
    nxt = 0
    while nxt < len(items) or pending:
        while nxt < len(items) and len(pending) < workers:
            pending[submit(items[nxt])] = nxt
            nxt += 1
        fut = next(as_completed(list(pending)))
        i = pending.pop(fut)
        try:
            results[i] = fut.result()  # re-raises the task's exception: the flow fails on the first error
        except Exception as exc:
            replacement = on_error(items[i], fut, exc) if on_error is not None else None
            if replacement is None:
                raise
            raise replacement from exc
        if on_done is not None:
            on_done(items[i], results[i])
    return results


class PrefectExecutor:
    """The driver's jobs as Prefect task runs: fanned-out stages on ``task_runner``, ``in_flight`` at a time.

    Single jobs run as task runs in the flow's thread; a background stage (the
    card) goes to the flow's own task runner, so it runs beside the shard
    tasks without taking one of their slots, and shows as a task run too.
    """

    shares_filesystem = True
    """Its task runs (prefect-dask's too) see the flow's scratch: a build to a bucket is built there, then pushed."""

    def __init__(self, task_runner: Any, in_flight: int) -> None:
        self.task_runner, self.in_flight = task_runner, in_flight

    def plan(self, config: BuildConfig, **where: Any) -> BuildPlan:
        return plan_task(config, **where)

    def map(self, stage: Stage, plan: BuildPlan, jobs: Sequence[Job], on_done: Callable[[Job, Any], None]) -> list[Any]:
        task, handle = STAGE_TASKS[stage.name], PlanHandle(plan)
        params = [dict(plan=handle, job=job, label=stage.label(plan, job)) for job in jobs]
        if stage.fan_out == "one":
            results = [task(**p) for p in params]
            for job, result in zip(jobs, results):
                on_done(job, result)
            return results
        groups = batches(jobs, self.in_flight, MAX_TASK_RUNS)
        if len(groups) == len(jobs):
            return run_windowed(lambda p: self.task_runner.submit(task, parameters=p), params, workers=self.in_flight,
                                on_done=lambda p, result: on_done(p["job"], result), on_error=_lost_worker)
        # Many jobs: a task run per group, so the API work (and the UI's list) does not grow with the corpus.
        batch_task = STAGE_BATCH_TASKS[stage.name]
        params = [dict(plan=handle, jobs=group, label=f"{stage.label(plan, group[0])} (+{len(group) - 1} more)")
                  for group in groups]

        def done(p: dict[str, Any], results: list[Any]) -> None:
            for job, result in zip(p["jobs"], results):
                on_done(job, result)

        ran = run_windowed(lambda p: self.task_runner.submit(batch_task, parameters=p), params,
                           workers=self.in_flight, on_done=done, on_error=_lost_worker)
        return [result for results in ran for result in results]

    def start(self, stage: Stage, plan: BuildPlan, jobs: Sequence[Job]) -> Callable[[], list[Any]]:
        task, handle = STAGE_TASKS[stage.name], PlanHandle(plan)
        futures = [task.submit(plan=handle, job=job, label=stage.label(plan, job)) for job in jobs]
        return lambda: [f.result() for f in futures]

    def fetch_parent(self, places: Any, config: BuildConfig) -> str | None:
        return fetch_parent_task(places=places, config=config)

    def push(self, request: BuildRequest, ref: str, listed: set[str]) -> None:
        """The version built in the scratch, to the bucket: claimed in the flow's process, its files sent by at
        most ``in_flight`` task runs (under Dask, by the workers, from the shared scratch), then the manifest and
        the bucket catalog entry."""
        plan = push_prepare_task(places=request.places, ref=ref, listed=listed)
        if plan is None:
            return
        groups = batches(list(plan.files), self.in_flight, most=self.in_flight)
        params = [dict(plan=plan, files=g, label=f"push {ref}: {g[0][0]}" + (f" (+{len(g) - 1} more)" if len(g) > 1 else ""))
                  for g in groups]
        done = run_windowed(lambda p: self.task_runner.submit(push_files_task, parameters=p), params,
                            workers=self.in_flight, on_error=_lost_worker)
        pushed = push_finish_task(plan=plan, done=[how for hows in done for how in hows])
        get_run_logger().info("%s: pushed to %s: %d file(s) sent (%d bytes), %d copied in the bucket, %d there already",
                              ref, pushed["url"], pushed["uploaded"], pushed["uploaded_bytes"], pushed["copied"],
                              pushed["skipped"])


def _lost_worker(params: dict[str, Any], future: PrefectFuture[Any], exc: Exception) -> Exception | None:
    """A job that Dask gave up on, its workers dead: a clear error, and its task run marked Crashed.

    No worker is left to end that task run, which the UI would show running forever. Any other error: None.
    """
    from shardflow.pipeline.dask_executor import lost_worker

    error = lost_worker(exc, params["label"])
    if error is None:
        return None
    from prefect.client.orchestration import get_client
    from prefect.states import Crashed

    try:
        with get_client(sync_client=True) as client:
            client.set_task_run_state(future.task_run_id, Crashed(message=str(error)), force=True)
    except Exception:  # the task run's state is a convenience; the error returned is what matters
        log.debug("could not mark the task run %s crashed", future.task_run_id, exc_info=True)
    return error


def require_real_api(runner: str, address: str | None) -> None:
    """Dask workers report task runs to the API: refuse the temporary server, warn about localhost."""
    from prefect.settings import get_current_settings

    url = str(get_current_settings().api.url or "")
    if not url:
        raise ConfigError(
            f"--runner {runner} needs a Prefect server that the Dask workers can reach, not the temporary one: "
            "start one with 'prefect server start' and set PREFECT_API_URL=http://HOST:4200/api "
            "(in this shell and on the workers)"
        )
    api_host = urlparse(url).hostname or ""
    dask_host = urlparse(address if address and "://" in address else f"tcp://{address}").hostname or ""
    local = {"127.0.0.1", "localhost", "::1", "0.0.0.0"}
    if api_host in local and dask_host and dask_host not in local:
        log.warning(
            "PREFECT_API_URL is %s, but the Dask scheduler %s is on another host: its workers cannot reach a "
            "localhost API. Set PREFECT_API_URL to an address the workers can reach",
            url,
            address,
        )


def make_task_runner(request: BuildRequest) -> tuple[Any, int]:
    """The task runner for the fanned-out jobs, and how many task runs to keep in flight on it."""
    if request.runner == "threads":
        # A pool of exactly `workers` threads bounds memory; twice as many tasks in flight keep
        # the next ones queued and ready, so no thread waits for the flow to submit after a result.
        return ThreadPoolTaskRunner(max_workers=request.workers), 2 * request.workers
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError:
        raise ConfigError("--runner dask needs prefect-dask and distributed: pip install 'shardflow[dask]'") from None
    require_real_api(request.runner, request.address)
    return DaskTaskRunner(address=request.address), request.workers


def _tag_flow_run(wanted: list[str]) -> None:
    """Add the dataset's tags to this flow run (a deployment's run is created without them); best effort."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    ctx = FlowRunContext.get()
    if ctx is None or ctx.flow_run is None:
        return
    have = list(ctx.flow_run.tags or [])
    missing = [t for t in wanted if t not in have]
    if not missing:
        return
    try:
        get_client(sync_client=True).update_flow_run(ctx.flow_run.id, tags=have + missing)
    except Exception:  # tags are a convenience; never fail a build for them
        log.debug("could not tag the flow run", exc_info=True)


class RunProgress(BuildProgress):
    """The driver's events as the run's progress artifact, progress lines (to in-process listeners), failure summary.

    Run the build on ``watching(executor)``: the jobs found done (with a temporary server, those the command ran
    while it started; a resumed run's) are kept for the summary, one row each, and count in no rate.
    """

    # Shares of the bar: tokenizing is most of the work, shards most of the rest.
    SHARES = {"tokenize-unit": (0.0, 85.0), "write-shard": (85.0, 12.0)}

    def __init__(self, name: str) -> None:
        super().__init__(name, emit)
        self.artifact_id: Any = None
        self.found_rows: list[tuple[str, str, int | None]] = []
        """``(step, job, tokens)`` of the first ``report.FOUND_ROWS`` jobs found done."""
        self.found_jobs = 0
        self._last = 0.0
        self._update(0.0, f"{name}: planning", force=True)

    def _update(self, percent: float, description: str, *, force: bool = False) -> None:
        """The UI's progress bar: at most one request a second, and each phase's end."""
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        now = time.monotonic()
        if not force and now - self._last < 1.0:
            return
        self._last = now
        try:
            if self.artifact_id is None:
                self.artifact_id = _create_placed(lambda: create_progress_artifact(
                    min(100.0, percent), key=artifact_key(self.name, "progress"), description=description), "progress")
            else:
                update_progress_artifact(self.artifact_id, progress=min(100.0, percent), description=description)
        except Exception:  # a progress bar is a convenience; never fail a build for it
            log.debug("could not update the progress artifact", exc_info=True)

    def planned(self, plan: BuildPlan) -> None:
        super().planned(plan)
        if not plan.existing:
            get_run_logger().info("%s: %d input file(s), %d work unit(s)", self.name, len(plan.inputs), len(plan.units))

    def stage_started(self, stage: Stage, plan: BuildPlan, jobs: Sequence[Job]) -> None:
        super().stage_started(stage, plan, jobs)
        if stage.name == "validate":
            self._update(97.0, f"{self.name}: validating and publishing", force=True)

    def job_found(self, stage: Stage, plan: BuildPlan, job: Job, result: Any) -> None:
        self.found_jobs += 1
        if len(self.found_rows) < FOUND_ROWS:
            tokens = getattr(result, "tokens", None)
            self.found_rows.append((stage.name, stage.label(plan, job), tokens if isinstance(tokens, int) else None))

    def step(self, stage: str) -> None:
        super().step(stage)
        done, total, tokens = self.counts[stage], self.totals[stage], self.tokens[stage]
        found = self.found.get(stage, 0)
        start, share = self.SHARES[stage]
        also = f" ({found} found done)" if found else ""
        if stage == "tokenize-unit":
            # The rate over the units run in this run: the ones found done took none of its time.
            elapsed, ran = time.monotonic() - self.began[stage], self.ran_tokens(stage)
            rate = f", {ran / elapsed:,.0f} tokens/s" if elapsed > 0 and done > found else ""
            text = f"{self.name}: {done}/{total} work units tokenized{also}, {tokens:,} tokens{rate}"
        else:
            text = f"{self.name}: {done}/{total} shards written{also}"
        self._update(start + share * (done / total if total else 1.0), text, force=done >= total)

    def stage_failed(self, stage: Stage, plan: BuildPlan, error: BaseException) -> None:
        if stage.fan_out != "one":
            return  # the failed task run says why
        from prefect.artifacts import create_markdown_artifact

        try:
            _create_placed(lambda: create_markdown_artifact(
                f"# Build summary: {self.name}\n\n**FAILED** in step `{stage.name}`: {error}\n\nNothing was published.\n",
                key=artifact_key(self.name, "summary"),
                description=f"{self.name}: failed in {stage.name}: {str(error)[:200]}",
            ), "summary")
        except Exception:
            log.debug("could not record the failure summary", exc_info=True)

    def finished(self, ref: str, *, created: bool, runner: str) -> None:
        """The run's end: the last progress, and the artifacts of the version."""
        tokens = self.tokens.get("tokenize-unit", 0)
        stats: dict[str, Any] = {}
        if created and self.plan is not None:
            ran = self.counts.get("tokenize-unit", 0) - self.found.get("tokenize-unit", 0)
            stats = dict(
                seconds=time.monotonic() - self.started,
                tokenize_seconds=self.seconds.get("tokenize-unit", 0.0) if ran else None,
                units=len(self.plan.units),
                units_found=self.found.get("tokenize-unit", 0),
                runner=runner,
                input_bytes=sum(self.plan.inputs[i].size for i in {u.input for u in self.plan.units}),  # tokenized
                tokenized_tokens=self.ran_tokens("tokenize-unit"),
                found=self.found_rows,
                found_jobs=self.found_jobs,
            )
        emit(Progress(dataset=self.name, phase="done", done=1, total=1, tokens=tokens,
                      elapsed=time.monotonic() - self.started, ref=ref))
        self._update(100.0, f"{self.name}: done, {ref}", force=True)
        assert self.plan is not None
        _publish_artifacts(name=self.name, ref=ref, catalog=self.plan.catalog, created=created, stats=stats)


def _publish_artifacts(*, name: str, ref: str, catalog: str, created: bool, stats: dict[str, Any]) -> None:
    """The run's end-of-run artifacts: the dataset card, then the summary, each in its place on the run's page."""
    from prefect.artifacts import create_markdown_artifact

    directory = Catalog(catalog).resolve(ref)
    manifest = read_manifest(directory)
    manifest_path = directory / "metadata.yaml"
    card = card_markdown(directory)
    if card is not None:
        _create_placed(lambda: create_markdown_artifact(card, key=artifact_key(name, "card"),
                                                        description=f"Dataset card of {ref}"), "card")
    summary = summary_markdown(manifest, manifest_path=manifest_path, created=created, catalog=catalog, **stats)
    _create_placed(lambda: create_markdown_artifact(summary, key=artifact_key(name, "summary"),
                                                    description=summary_description(manifest, created=created)),
                   "summary")


def _create_placed(create: Callable[[], Any], kind: str) -> Any:
    """Create an artifact of ``kind`` (``create()`` returns its id) in its place on the run's page; its id.

    Prefect's UIs list a run's artifacts by id, newest id first, and ids are random: it is made again until
    its id falls in its kind's band (``flows.report.placed``), and the ones it replaced are deleted.
    """
    made, replaced = placed(create, kind)
    if replaced:
        from prefect.client.orchestration import get_client

        try:
            with get_client(sync_client=True) as client:
                for artifact_id in replaced:
                    client.delete_artifact(artifact_id)
        except Exception:  # their order is a convenience; never fail a build for it
            log.debug("could not delete the replaced artifacts %s", replaced, exc_info=True)
    return made


@flow(
    name="build-dataset",
    flow_run_name="build {config.name}",
    task_runner=ThreadPoolTaskRunner(max_workers=8),
    persist_result=False,
)
def build_dataset(
    config: BuildConfig,
    workers: int = 2,
    data_root: str | None = None,
    catalog: str | None = None,
    runner: str = "threads",
    address: str | None = None,
    scratch: str | None = None,
) -> BuildResult:
    """Build ``config`` into a published version; returns its ``BuildResult`` (``ref``, ``manifest_path``, ``created``).

    ``runner="dask"`` with ``address="tcp://HOST:PORT"`` runs the work units on
    an existing Dask cluster; sources may be local paths, ``file://`` URLs, or
    fsspec URLs (``s3://...``), which are read in place: planned from their listing, read by the workers.
    ``data_root`` and ``catalog`` may both be ``s3://`` URLs in one bucket: the build runs in ``scratch`` (a
    mirror of the bucket) and the last task runs push the version (``shardflow.bucket.build``).
    """
    request = BuildRequest(config=config, workers=workers, data_root=data_root, catalog=catalog, runner=runner,
                           address=address, scratch=scratch)
    task_runner, in_flight = make_task_runner(request)
    if request.runner == "dask" and request.address:
        # The flow's task runs on Dask build in a directory every worker must see (a bucket's scratch mirror too).
        check_workers_see(request.address, default_data_root(request.local[0]).absolute(), hint=(
            "the Prefect flow's task runs on Dask need a --data-root (or, for a bucket, a --scratch) that every worker "
            "mounts at the same path. Without one, build to a bucket with --no-prefect --runner dask"
            if request.places is not None else None))
    progress = RunProgress(config.name)
    _tag_flow_run([*TAGS, dataset_tag(config.name)])
    attach_core_logs()
    # Task runs carry no tags: Prefect asks the server for a concurrency slot before every tagged task run,
    # a round trip that stalled work units on a busy server (docs/PERFORMANCE.md).
    # watch_server: a server that stops answering ends the run in one line, within a minute (flows/server.py).
    with watch_server(), task_runner as started:
        # Watched: the jobs found done (with a temporary server, the ones run while it started) are told apart.
        result = run_request(request, progress.watching(PrefectExecutor(started, in_flight)), progress)
        if not result.created:
            get_run_logger().info("%s: nothing to do, identical to the published %s", config.name, result.ref)
        progress.finished(result.ref, created=result.created,
                          runner=runner if address is None else f"{runner} ({address})")
    if result.created:
        get_run_logger().info("%s: published %s", config.name, result.ref)
    return result
