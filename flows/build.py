"""The ``build_dataset`` Prefect flow: plan, tokenize units in parallel, write shards, validate, publish.

The flow only composes tasks; every step is a core function in
``shardflow.build`` that is idempotent on disk, so a rerun after a crash
resumes where the last run stopped. At most ``workers`` tasks run at once (a
sliding window), which bounds memory by ``workers x batch size`` whatever the
corpus size and whichever task runner executes them.

Where the work units run (``runner``):

* ``threads`` (default): a pool of ``workers`` threads in the flow's process,
  with up to twice as many tasks submitted, so the next ones wait ready.
* ``dask``: an existing Dask cluster (``address="tcp://HOST:8786"``), through
  prefect-dask's ``DaskTaskRunner`` (``pip install 'shardflow[dask]'``). The
  tokenize and write-shard tasks run on the workers; plan, layout, validate and
  publish run in the flow's process, and so does the stats-card task (the card),
  on the flow's own task runner beside the shard tasks. The workers report their task runs to the
  Prefect API, so it must be a real server they can reach
  (``PREFECT_API_URL=http://HOST:4200/api``), not the temporary one, and
  ``data_root`` must be storage that the flow process and every worker see at
  the same path (a shared mount).

What the UI shows for a run is described in ``flows.report``: a progress
artifact, a shard table, a markdown summary and a link to the manifest, keyed
per dataset; the flow run is named ``build <dataset>`` and tagged
``shardflow`` and ``dataset:<name>``, task runs are named after their work unit
or shard, and the core library's log lines go to the run logs.
"""

# (no "from __future__ import annotations": served runs rebuild the flow's parameter model from real annotations)

import contextlib
import logging
import time
from functools import partial
from typing import Any, Callable, Iterable, Sequence
from urllib.parse import urlparse

from prefect import Flow, get_run_logger
from prefect.futures import PrefectFuture, as_completed
from prefect.task_runners import ThreadPoolTaskRunner

from shardflow.build import Stage, build_lock, run_stages
from shardflow.build.head_start import head_start_began, head_start_owns
from shardflow.build.stages import Job
from shardflow.catalog import Catalog
from shardflow.config import BuildConfig
from shardflow.errors import ConfigError
from shardflow.manifest import read_manifest

from shardflow.flows import heartbeats, startup
from shardflow.flows.artifact_sender import LatestOnly, send_in_order
from shardflow.flows.progress import Progress, emit
from shardflow.flows.report import (
    artifact_key, card_markdown, card_plots, creation_order, manifest_markdown, shard_rows, summary_description, summary_markdown,
)
from shardflow.flows.task_tags import task_tags
from shardflow.tasks.build import STAGE_TASKS, TAGS, PlanHandle, core_logs_to_prefect, plan_task

__all__ = ["build_dataset", "BuildFlow", "run_windowed", "make_task_runner", "dataset_tag", "RUNNERS", "require_real_api"]

RUNNERS = ("threads", "dask")
log = logging.getLogger("shardflow.flows")

# Every process that can run the build flow imports this module first (the command line, serve's runs,
# the deployments' entrypoint), so the run's end never waits on the heartbeat thread (flows/heartbeats.py).
heartbeats.patch()


class BuildFlow(Flow):  # type: ignore[type-arg]
    """Prefect's ``Flow``, with the run's parameters serialized without importing FastAPI.

    Prefect serializes a flow run's parameters with FastAPI's ``jsonable_encoder``
    when it creates the run, and FastAPI's import (0.3 s) was the last thing on
    the path of every ``shardflow build`` against a running server before its
    flow run was created. The build's parameters (a ``BuildConfig`` dataclass,
    strings, numbers, None) serialize to the same JSON with pydantic's
    ``to_jsonable_python`` (tests/flows/test_flow_parameters.py compares the
    two); any other value, or one pydantic cannot encode, goes through Prefect's
    own method. (``with_options`` returns Prefect's plain ``Flow``, which
    serializes as before.)
    """

    def serialize_parameters(self, parameters: dict[str, Any]) -> dict[str, Any]:
        if not all(isinstance(v, _PLAIN_PARAMETERS) for v in parameters.values()):
            return super().serialize_parameters(parameters)
        from pydantic_core import to_jsonable_python

        try:
            return {key: to_jsonable_python(value) for key, value in parameters.items()}
        except (TypeError, ValueError, RecursionError):  # a field pydantic cannot encode (a numpy scalar)
            return super().serialize_parameters(parameters)  # Prefect's placeholders, as before


_PLAIN_PARAMETERS = (BuildConfig, str, int, float, bool, type(None))


def dataset_tag(name: str) -> str:
    return f"dataset:{name}"


def run_windowed(
    submit: Callable[[Any], PrefectFuture[Any]],
    items: Iterable[Any],
    *,
    workers: int,
    on_done: Callable[[Any, Any], None] | None = None,
) -> list[Any]:
    """Submit ``items`` keeping at most ``workers`` in flight; results in item order."""
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
        results[i] = fut.result()  # re-raises the task's exception: the flow fails on the first error
        if on_done is not None:
            on_done(items[i], results[i])
    return results


def api_url() -> str | None:
    """The Prefect API this process talks to, or None on the temporary (ephemeral) server."""
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    return str(url) if url else None


def require_real_api(runner: str, address: str | None) -> None:
    """Dask workers report task runs to the API: refuse the temporary server, warn about localhost."""
    url = api_url()
    if url is None:
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


def make_task_runner(runner: str, address: str | None) -> Any:
    """The task runner for the work units: None for the flow's own thread pool, or a DaskTaskRunner."""
    if runner not in RUNNERS:
        raise ConfigError(f"unknown runner {runner!r}; use one of {', '.join(RUNNERS)}")
    if runner == "threads":
        if address:
            raise ConfigError("--address is for --runner dask; the threads runner runs in this process")
        return None
    if not address:
        raise ConfigError("--runner dask needs --address tcp://HOST:PORT, the address of a running Dask scheduler")
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError:
        raise ConfigError(
            "--runner dask needs prefect-dask and distributed: pip install 'shardflow[dask]'"
        ) from None
    require_real_api(runner, address)
    return DaskTaskRunner(address=address)


def _tag_flow_run(wanted: list[str]) -> None:
    """Add the dataset's tags to this flow run (deployments and direct calls alike); best effort."""
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


class _RunProgress:
    """Keeps the run's progress artifact and the in-process listeners up to date."""

    # Shares of the bar: tokenizing is most of the work, shards most of the rest.
    TOKENIZE, WRITE = 85.0, 12.0

    def __init__(self, name: str) -> None:
        self.name = name
        self.artifact_id: Any = None
        self._last = 0.0
        # Made and updated from a thread of its own, the latest state only: the flow never waits on the UI's bar.
        self._sender = LatestOnly(self._send)
        self._sender.put(0.0, f"{name}: planning")

    def _send(self, percent: float, description: str) -> None:
        from prefect.artifacts import create_progress_artifact, update_progress_artifact

        if self.artifact_id is None:
            self.artifact_id = create_progress_artifact(
                percent, key=artifact_key(self.name, "progress"), description=description
            )
        else:
            update_progress_artifact(self.artifact_id, progress=percent, description=description)

    def update(self, percent: float, description: str, *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 1.0:
            return
        self._last = now
        self._sender.put(min(100.0, percent), description)

    def close(self) -> None:
        """Send the last update; the run is about to end."""
        self._sender.close()

    def step(self, phase: str, done: int, total: int, tokens: int, started: float, ref: str | None = None) -> None:
        elapsed = time.monotonic() - started
        emit(Progress(dataset=self.name, phase=phase, done=done, total=total, tokens=tokens, elapsed=elapsed, ref=ref))
        last = done >= total
        if phase == "tokenize":
            pct = self.TOKENIZE * (done / total if total else 1.0)
            rate = f", {tokens / elapsed:,.0f} tokens/s" if elapsed > 0 else ""
            self.update(pct, f"{self.name}: {done}/{total} work units tokenized, {tokens:,} tokens{rate}", force=last)
        elif phase == "write":
            pct = self.TOKENIZE + self.WRITE * (done / total if total else 1.0)
            self.update(pct, f"{self.name}: {done}/{total} shards written", force=last)
        elif phase == "finish":
            self.update(self.TOKENIZE + self.WRITE, f"{self.name}: validating and publishing", force=True)
        elif phase == "done":
            self.update(100.0, f"{self.name}: done, {ref}", force=True)


def _publish_artifacts(
    *, name: str, ref: str, catalog: str, created: bool, stats: dict[str, Any]
) -> None:
    """The run's end-of-run artifacts, created in ``report.creation_order`` (newest first, the summary leads)."""
    from prefect.artifacts import create_markdown_artifact, create_table_artifact

    directory = Catalog(catalog).resolve(ref)
    manifest = read_manifest(directory)
    manifest_path = directory / "metadata.yaml"
    calls = {
        "shards": partial(
            create_table_artifact,
            shard_rows(manifest),
            key=artifact_key(name, "shards"),
            description=f"Shards of {ref}: {manifest.totals['shards']} files, {manifest.totals['tokens']:,} tokens",
        ),
        "summary": partial(
            create_markdown_artifact,
            summary_markdown(manifest, manifest_path=manifest_path, created=created, **stats),
            key=artifact_key(name, "summary"),
            description=summary_description(manifest, created=created),
        ),
        "manifest": partial(
            create_markdown_artifact,
            manifest_markdown(manifest_path, ref, catalog),
            key=artifact_key(name, "manifest"),
            description=f"Manifest of {ref}: {manifest_path}",
        ),
    }
    for kind, text, description in card_plots(directory, ref):
        # Markdown showing the PNG, not an image artifact: the UI prints an image artifact's whole data: URL.
        calls[kind] = partial(create_markdown_artifact, text, key=artifact_key(name, kind), description=description)
    card = card_markdown(directory)
    if card is not None:
        calls["card"] = partial(create_markdown_artifact, card, key=artifact_key(name, "card"),
                                description=f"Dataset card of {ref}")
    # One after another, in a fixed order: made at once, their creation times (the UI's order) would be any.
    send_in_order([calls[kind] for kind in creation_order(list(calls))])


def _failure_summary(name: str, step: str, exc: BaseException) -> None:
    from prefect.artifacts import create_markdown_artifact

    try:
        create_markdown_artifact(
            f"# Build summary: {name}\n\n**FAILED** in step `{step}`: {exc}\n\nNothing was published.\n",
            key=artifact_key(name, "summary"),
            description=f"{name}: failed in {step}: {str(exc)[:200]}",
        )
    except Exception:
        log.debug("could not record the failure summary", exc_info=True)


@partial(
    BuildFlow,
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
) -> str:
    """Build ``config`` into a published version; returns its ``NAME@VERSION``.

    ``runner="dask"`` with ``address="tcp://HOST:PORT"`` runs the work units on
    an existing Dask cluster; sources may be local paths, ``file://`` URLs, or
    fsspec URLs (``s3://...``), which are read in place: planned from their listing, read by the workers.
    """
    with core_logs_to_prefect():
        return _build(config, workers, data_root, catalog, runner, address)


def _build(
    config: BuildConfig, workers: int, data_root: str | None, catalog: str | None, runner: str, address: str | None
) -> str:
    started = time.monotonic()
    logger = get_run_logger()
    name = config.name
    if workers < 1:
        raise ConfigError(f"workers must be at least 1, not {workers}")
    task_runner = make_task_runner(runner, address)
    in_flight = workers
    if task_runner is None:
        # A pool of exactly `workers` threads bounds memory; twice as many tasks in flight keep
        # the next ones queued and ready, so no thread waits for the flow to submit after a result.
        task_runner, in_flight = ThreadPoolTaskRunner(max_workers=workers), 2 * workers
    _tag_flow_run([*TAGS, dataset_tag(name)])
    # Task runs carry the tags only where a concurrency limit names one (a server round trip per task run).
    with task_tags(*TAGS, dataset_tag(name)), contextlib.ExitStack() as held:
        progress = _RunProgress(name)
        held.callback(progress.close)  # its last update reaches the server before the run ends
        # URL sources (s3://, gs://, file://) go to planning as they are: listed there, read in place by the workers.
        startup.wait_for_warm_up()  # the command line's tokenizer load and input fingerprints, if still running
        plan = plan_task(config, data_root, catalog)
        if plan.existing:
            logger.info("%s: nothing to do, identical to the published %s", name, plan.existing)
            progress.step("done", 1, 1, 0, started, ref=plan.existing)
            _publish_artifacts(name=name, ref=plan.existing, catalog=plan.catalog, created=False, stats={})
            return plan.existing
        # One run per build at a time, to the end of the flow: a second run of the same
        # build fails here with a clear message; it re-reads the plan under the lock.
        plan = held.enter_context(build_lock(plan))
        if plan.existing:
            logger.info("%s: published meanwhile by another run as %s", name, plan.existing)
            progress.step("done", 1, 1, 0, started, ref=plan.existing)
            _publish_artifacts(name=name, ref=plan.existing, catalog=plan.catalog, created=False, stats={})
            return plan.existing

        units = plan.units
        logger.info(
            "%s: %d input file(s), %d work unit(s), runner %s, %d in flight",
            name, len(plan.inputs), len(units), runner, workers,
        )
        handle = PlanHandle(plan)  # Prefect need not walk the plan's units at every submission
        counts = {"tokenize-unit": 0, "write-shard": 0}
        tokens = {"tokenize-unit": 0, "write-shard": 0}
        phases = {"tokenize-unit": "tokenize", "write-shard": "write"}
        seconds: dict[str, float] = {}
        first_start: dict[str, float] = {}
        with task_runner as tr:

            def run_jobs(stage: Stage, jobs: Sequence[Job]) -> list[Any]:
                task = STAGE_TASKS[stage.name]
                params = [dict(plan=handle, job=job, label=stage.label(plan, job)) for job in jobs]
                t0 = time.monotonic()
                first_start[stage.name] = t0
                try:
                    if stage.fan_out == "one":
                        if stage.name == "validate":
                            progress.step("finish", 0, 1, 0, started)
                        return [task(**p) for p in params]

                    def done(_params: Any, result: Any) -> None:
                        counts[stage.name] = counts.get(stage.name, 0) + 1
                        tokens[stage.name] = tokens.get(stage.name, 0) + int(result.tokens)
                        if stage.name in phases:  # (validate-shard jobs are not a phase of the display)
                            progress.step(phases[stage.name], counts[stage.name], len(jobs), tokens[stage.name], t0)

                    if stage.name in phases:
                        progress.step(phases[stage.name], 0, len(jobs), 0, t0)
                    # Jobs whose output is committed already (a resumed run; shards an incremental build
                    # linked from its parent) cost no task run: a few stats here instead.
                    # (A unit the command line's head start took keeps its task run: build/head_start.py.)
                    results = [
                        stage.done(plan, *job) if stage.done and not (stage.fan_out == "units" and head_start_owns(plan, *job))
                        else None
                        for job in jobs
                    ]
                    for p, result in zip(params, results):
                        if result is not None:
                            done(p, result)
                    todo = [i for i, result in enumerate(results) if result is None]
                    ran = run_windowed(
                        lambda p: tr.submit(task, parameters=p),
                        [params[i] for i in todo],
                        workers=in_flight,
                        on_done=done,
                    )
                    for i, result in zip(todo, ran):
                        results[i] = result
                    return results
                except Exception as exc:
                    if stage.fan_out == "one":
                        _failure_summary(name, stage.name, exc)
                    raise
                finally:
                    seconds[stage.name] = time.monotonic() - t0

            def start_jobs(stage: Stage, jobs: Sequence[Job]) -> Callable[[], list[Any]]:
                # A background stage (the card): submitted to the flow's own task runner, so it runs beside
                # the shard tasks without taking one of their `workers` slots, and shows as a task run.
                task = STAGE_TASKS[stage.name]
                results = [stage.done(plan, *job) if stage.done else None for job in jobs]
                futures = {
                    i: task.submit(plan=handle, job=job, label=stage.label(plan, job))
                    for i, (job, result) in enumerate(zip(jobs, results))
                    if result is None
                }

                def wait() -> list[Any]:
                    try:
                        for i, fut in futures.items():
                            results[i] = fut.result()
                    except Exception as exc:
                        _failure_summary(name, stage.name, exc)
                        raise
                    return results

                return wait

            done = run_stages(plan, run_jobs, start_jobs)
        ref = done["publish"][0]
        # The command line's head start tokenized the first units before the flow run began: the
        # durations reported count from its start, so that the rates are of the whole work.
        began = head_start_began(plan)
        tokenize_seconds = seconds["tokenize-unit"]
        if began is not None:
            tokenize_seconds += max(0.0, first_start["tokenize-unit"] - began)
            started = min(started, began)
        _publish_artifacts(
            name=name,
            ref=ref,
            catalog=plan.catalog,
            created=True,
            stats=dict(
                seconds=time.monotonic() - started,
                tokenize_seconds=tokenize_seconds,
                units=len(units),
                runner=runner if address is None else f"{runner} ({address})",
                input_bytes=sum(i.size for i in plan.inputs),
                tokenized_tokens=tokens["tokenize-unit"],
            ),
        )
        progress.step("done", 1, 1, tokens["tokenize-unit"], started, ref=ref)
        logger.info("%s: published %s", name, ref)
    return ref
