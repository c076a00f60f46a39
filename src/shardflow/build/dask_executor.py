"""``DaskExecutor``: the driver's jobs on an existing Dask cluster, without Prefect.

The per-unit and per-shard jobs (tokenize, write, check) run on the cluster's
workers; single jobs (plan, layout, finalize, publish) and the background card
run in this process. Dask's workers bound memory by their thread count
(``dask worker --nthreads``). The data root must be storage that this process
and every worker see at the same path. ``pip install 'shardflow[dask]'``.
"""

from __future__ import annotations

from typing import Any, Sequence

from ..errors import ConfigError
from .handle import PlanHandle
from .model import BuildPlan
from .run import InProcess, OnDone, retrying, stage_retries
from .stages import Job, Stage, stage

__all__ = ["DaskExecutor"]


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
                results[i] = future.result()  # the first error stops the build
                on_done(jobs[i], results[i])
        except BaseException:
            self.client.cancel(futures)
            raise
        return results
