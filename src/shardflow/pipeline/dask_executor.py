"""``DaskExecutor``: the driver's jobs on an existing Dask cluster, without Prefect.

The per-unit and per-shard jobs (tokenize, write, check) run on the cluster's
workers; single jobs (plan, layout, finalize, publish) and the background card
run in this process. Dask's workers bound memory by their thread count
(``dask worker --nthreads``). The data root must be storage that this process
and every worker see at the same path. ``pip install 'shardflow[dask]'``.

A worker lost in the middle of a job costs a rerun, not the build: Dask runs
the job again on a worker still there, and the job, idempotent on disk,
rewrites what the lost one half wrote. Only a job that every worker running it
dies of (Dask gives up after ``distributed.scheduler.allowed-failures``) stops
the build: ``lost_worker`` turns Dask's ``KilledWorker`` into a ``WorkerLost``
naming the job (the Prefect flow uses it too).
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import ConfigError, ShardflowError
from .handle import PlanHandle
from .model import BuildPlan
from .run import InProcess, OnDone, retrying, stage_retries
from .stages import Job, Stage, stage

__all__ = ["DaskExecutor", "WorkerLost", "lost_worker"]


class WorkerLost(ShardflowError):
    """A job that Dask gave up on: every worker that ran it died while running it."""


def lost_worker(exc: BaseException, job: str) -> WorkerLost | None:
    """``exc`` as a ``WorkerLost`` naming ``job`` if it is Dask's ``KilledWorker``; None for any other error."""
    try:
        from distributed import KilledWorker
    except ImportError:
        return None
    if not isinstance(exc, KilledWorker):
        return None
    return WorkerLost(
        f"{job}: every Dask worker that ran this job died while running it, so Dask gave up on it "
        "(after distributed.scheduler.allowed-failures reruns). The workers' logs say why; most often the kernel "
        "killed them for memory: use smaller work units (--unit-mb, unit_bytes), fewer threads per worker "
        "(dask worker --nthreads) or workers with more memory. The jobs finished so far are kept: run the same "
        "build again to go on"
    )


def _run_job(name: str, handle: PlanHandle, job: Job) -> Any:
    """One job on a worker (by stage name: a ``Stage`` holds lambdas, which do not pickle)."""
    step = stage(name)
    return retrying(step, handle.plan, *job, retries=stage_retries(step))


class DaskExecutor(InProcess):
    """Runs fanned-out jobs on the Dask scheduler at ``address`` (``tcp://HOST:8786``)."""

    def __init__(self, address: str) -> None:
        try:
            from distributed import Client
        except ImportError:
            raise ConfigError("--runner dask needs distributed: pip install 'shardflow[dask]'") from None
        super().__init__()
        self.client = Client(address, set_as_default=False)

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self.client.close()

    def map(self, stage: Stage, plan: BuildPlan, jobs: Sequence[Job], on_done: OnDone) -> list[Any]:
        from distributed import as_completed

        if stage.fan_out == "one":
            results = [retrying(stage, plan, *job, retries=stage_retries(stage)) for job in jobs]
            for job, result in zip(jobs, results):
                on_done(job, result)
            return results
        handle = PlanHandle(plan)
        futures = [self.client.submit(_run_job, stage.name, handle, job, pure=False) for job in jobs]
        index = {f.key: i for i, f in enumerate(futures)}
        results: list[Any] = [None] * len(jobs)
        try:
            for future in as_completed(futures, loop=self.client.loop):
                i = index[future.key]
                try:
                    results[i] = future.result()  # the first error stops the build
                except Exception as exc:
                    lost = lost_worker(exc, stage.label(plan, jobs[i]))
                    if lost is None:
                        raise
                    raise lost from exc
                on_done(jobs[i], results[i])
        except BaseException:
            self.client.cancel(futures)
            raise
        return results
