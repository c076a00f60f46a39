"""``DaskExecutor``: the driver's jobs on an existing Dask cluster, without Prefect.

The per-unit and per-shard jobs (tokenize, write: each shard checked as it is written) run on the
cluster's workers; single jobs (plan, layout, finalize, publish) and the background card
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

import json
import logging
import os
import time
from concurrent.futures import CancelledError
from typing import Any, Callable, Iterator, Sequence

from ..bucket.fs import is_remote
from ..errors import ConfigError, ShardflowError
from .layout import read_layout
from .model import BuildPlan
from .run import InProcess, OnDone, retrying, stage_retries
from .stages import Job, Stage, stage
from .staging import Staging

__all__ = ["DaskExecutor", "WorkerLost", "lost_worker", "refuse_blind_workers", "check_workers_see", "quiet_reschedules"]


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


def _run_job(name: str, plan: BuildPlan, job: Job) -> Any:
    """One job on a worker (by stage name: a ``Stage`` holds lambdas, which do not pickle)."""
    step = stage(name)
    return retrying(step, plan, *job, retries=stage_retries(step))


def _run_sent(name: str, sends: Any, plan: BuildPlan, job: Job) -> tuple[Any, str]:
    """One job of a build that sends its files from the workers (``bucket/remote_jobs.py``), and where it ran."""
    from distributed import get_worker

    from ..bucket import remote_jobs

    step = remote_jobs.tokenize_job if name == "tokenize-unit" else remote_jobs.write_job
    return retrying(step, sends, plan, *job), get_worker().address


def refuse_blind_workers(client: Any, path: str, *, hint: str | None = None) -> None:
    """One line naming the first Dask worker (of ``client``'s cluster) that cannot see the directory ``path``."""
    seen = client.run(os.path.isdir, path)
    blind = sorted(addr for addr, ok in seen.items() if not ok)
    if blind:
        raise ConfigError(
            f"{path}: the Dask worker {blind[0]}{f' (and {len(blind) - 1} more)' if len(blind) > 1 else ''} cannot see "
            "this path; " + (hint or "a build on Dask with a local --data-root needs storage every worker mounts at the "
                             "same path. Without one, build to a bucket: --data-root s3://BUCKET/data --catalog "
                             "s3://BUCKET/catalog --no-prefect")
        )


def check_workers_see(address: str, path: str | os.PathLike[str], *, hint: str | None = None) -> None:
    """``refuse_blind_workers`` on the cluster at ``address``, for ``path`` (made here first)."""
    from distributed import Client

    os.makedirs(path, exist_ok=True)
    with Client(address, set_as_default=False) as client:
        refuse_blind_workers(client, os.fspath(path), hint=hint)


class QuietReschedules(logging.Filter):
    """Drops Dask's client notice "Couldn't gather N keys, rescheduling ...": a worker holding a job's result
    died, and Dask runs the job again. A build that cannot go on says so in a line of its own (the worker's
    loss, or no worker left); the notice, printed before it, made two lines of one error."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("Couldn't gather")


def quiet_reschedules() -> None:
    """Install ``QuietReschedules`` on the ``distributed.client`` logger, once per process."""
    logger = logging.getLogger("distributed.client")
    if not any(isinstance(f, QuietReschedules) for f in logger.filters):
        logger.addFilter(QuietReschedules())


NO_WORKERS_ENV = "SHARDFLOW_DASK_NO_WORKERS_S"
"""How long a build waits on a cluster that has no worker at all before it stops (seconds; default 120)."""


class DaskExecutor(InProcess):
    """Runs fanned-out jobs on the Dask scheduler at ``address`` (``tcp://HOST:8786``).

    The plan goes to each worker once (``Client.scatter``), by value: a job never opens a path of this
    machine to learn it. A local data root must be one every worker sees at the same path (checked
    before the first job: one line naming the worker and the path); a build to a bucket needs no shared
    path at all: its workers send their files to the bucket (``shares_filesystem`` is False).
    """

    shares_filesystem = False

    def __init__(self, address: str) -> None:
        try:
            from distributed import Client
        except ImportError:
            raise ConfigError("--runner dask needs distributed: pip install 'shardflow[dask]'") from None
        super().__init__()
        self.address = address
        quiet_reschedules()
        self.client = Client(address, set_as_default=False)
        self._plans: dict[str, tuple[BuildPlan, Any]] = {}
        self._where: dict[int, str] = {}  # work unit -> the worker whose disk holds its pieces (a build that sends)

    def __exit__(self, *exc: Any) -> None:
        super().__exit__(*exc)
        self.client.close()

    def _scattered(self, plan: BuildPlan) -> Any:
        """The plan on every worker, sent once per plan; what the workers must see checked first (see the class)."""
        known = self._plans.get(plan.staging)
        if known is not None and known[0] == plan:
            return known[1]
        if not Staging(plan.staging).sends:
            refuse_blind_workers(self.client, plan.staging)
        for folder in sorted({os.path.dirname(inp.path) for inp in plan.inputs if not is_remote(inp.path)}):
            refuse_blind_workers(self.client, folder, hint="the workers read the build's local inputs where the plan "
                                 "found them: put them on storage every worker mounts at the same path, or on the bucket")
        future = self.client.scatter(plan, broadcast=True, hash=False)
        self._plans[plan.staging] = (plan, future)
        return future

    def map(self, stage: Stage, plan: BuildPlan, jobs: Sequence[Job], on_done: OnDone) -> list[Any]:
        staging = Staging(plan.staging)
        sent = _Sent(staging, plan, self._where) if staging.sends else None
        if stage.fan_out == "one" or not jobs:
            results = [retrying(stage, plan, *job, retries=stage_retries(stage)) for job in jobs]
            for job, result in zip(jobs, results):
                on_done(job, result)
            if sent is not None and stage.name == "publish":  # the workers' job directories go with the build
                from ..bucket.remote_jobs import discard_job_dirs

                self.client.run(discard_job_dirs, sent.sends)
            return results
        if sent is not None:
            sent.before(stage)
        self._scattered(plan)  # (before any job: a path the workers can't see is one line)
        results: list[Any] = [None] * len(jobs)
        here = [i for i, job in enumerate(jobs) if sent is not None and not sent.on_workers(stage, job)]
        for i in here:  # a parent's shards (only this machine fetched the parent), and checks of what those link
            if sent is not None:
                sent.prepare_here(stage, jobs[i])
            results[i] = retrying(stage, plan, *jobs[i], retries=stage_retries(stage))
            on_done(jobs[i], results[i])
        pins: dict[Any, str] = {}  # future -> the worker it must run on

        def submit(i: int, pinned: bool) -> Any:
            plan_future = self._scattered(plan)
            if sent is None:
                return self.client.submit(_run_job, stage.name, plan_future, jobs[i], pure=False)
            worker = sent.worker_for(stage, jobs[i]) if pinned else None
            future = self.client.submit(_run_sent, stage.name, sent.sends, plan_future, jobs[i], pure=False,
                                        workers=[worker] if worker else None, allow_other_workers=False)
            if worker:
                pins[future] = worker
            return future

        futures = {submit(i, True): i for i in range(len(jobs)) if i not in set(here)}
        try:
            for i, result, error in self._completed(futures, pins, submit, lambda: self._plans.pop(plan.staging, None)):
                if error is not None:  # the first error stops the build
                    lost = lost_worker(error, stage.label(plan, jobs[i]))
                    if lost is None:
                        raise error
                    raise lost from error
                results[i] = result if sent is None else sent.taken(stage, jobs[i], result)
                on_done(jobs[i], results[i])
        except BaseException:
            self.client.cancel(list(futures))
            raise
        return results

    def _completed(self, futures: dict[Any, int], pins: dict[Any, str], submit: Callable[[int, bool], Any],
                   forget_plan: Callable[[], Any]) -> Iterator[tuple[int, Any, Exception | None]]:
        """Yield ``(job index, result, error)`` as each finishes. A job pinned to a worker that has left (``pins``) is
        submitted again to any worker. A job Dask cancelled because every copy of the plan was lost with the workers
        that held them waits for a worker, and is submitted again with the plan sent anew. A cluster without any
        worker for ``NO_WORKERS_ENV`` seconds stops the build in one line."""
        from distributed import as_completed

        limit = float(os.environ.get(NO_WORKERS_ENV) or 120)
        alone_since: float | None = None
        pending = as_completed(list(futures), loop=self.client.loop)
        lost: list[int] = []
        checked = time.monotonic()
        while futures or lost:
            done = pending.next_batch(block=False)
            for future in done:
                if future not in futures:
                    continue  # cancelled here and submitted again
                pins.pop(future, None)
                i = futures.pop(future)
                try:
                    result = future.result()
                except CancelledError:
                    lost.append(i)  # the plan it needed went with the last workers that held it
                except Exception as exc:
                    yield i, None, exc
                else:
                    yield i, result, None
            if done and not lost:
                alone_since = None
                continue
            time.sleep(0.1)
            if time.monotonic() - checked < 5 and not (lost and not futures):
                continue
            checked = time.monotonic()
            workers = set(self.client.scheduler_info(n_workers=-1).get("workers", {}))
            if not workers:
                alone_since = alone_since or time.monotonic()
                if time.monotonic() - alone_since > limit:
                    raise WorkerLost(
                        f"{self.address}: no Dask worker for {limit:.0f} s; the jobs finished so far are kept: start "
                        f"workers (dask worker {self.address}) and run the same build again")
                continue
            alone_since = None
            if lost:
                forget_plan()
            again = [(i, False) for i in lost]
            lost = []
            for future, i in list(futures.items()):
                if future in pins and pins[future] not in workers:  # its pieces went with that worker
                    del futures[future], pins[future]
                    self.client.cancel([future])
                    again.append((i, False))
            for i, pinned in again:
                future = submit(i, pinned)
                futures[future] = i
                pending.add(future)


WHERE_FILE = "workers.json"
"""In a staging directory whose workers send: which worker (address) holds each tokenized unit's pieces."""


class _Sent:
    """A stage's jobs of a build whose workers send its files to a bucket (``bucket/remote_jobs.py``): which run on
    the workers, on which one, and the records each brings back, committed here."""

    def __init__(self, staging: Staging, plan: BuildPlan, where: dict[int, str]) -> None:
        from ..bucket.remote_jobs import read_sends

        sends = read_sends(staging)
        assert sends is not None
        self.staging, self.plan, self.sends, self.where = staging, plan, sends, where
        self.layout: Any = None
        if not where:  # a driver started again on a cluster still up: its workers still hold the units' pieces
            try:
                where.update({int(u): a for u, a in json.loads((staging.root / WHERE_FILE).read_text()).items()})
            except (OSError, ValueError, AttributeError):
                pass

    def before(self, stage: Stage) -> None:
        """Only the holder of the build key's lease runs jobs; the write stage's workers read the layout shared."""
        from ..bucket.lease import check_held
        from ..bucket.remote_jobs import share_layout

        check_held(self.sends.target, self.plan.config.name, self.plan.build_key)
        if stage.name == "write-shard":
            share_layout(self.staging, self.sends)
            self.layout = read_layout(self.plan)

    def on_workers(self, stage: Stage, job: Job) -> bool:
        """Tokenize jobs, and write jobs but those that read the parent (which only this machine fetched): its
        linked shards, and a gathered split of an incremental build (its ranges of the parent's split)."""
        if stage.name == "tokenize-unit":
            return True
        if stage.name != "write-shard":
            return False
        sources = self.layout.splits[job[0]].sources
        return self.plan.reuse is None if sources is None else sources[job[1]][0] >= 0

    def prepare_here(self, stage: Stage, job: Job) -> None:
        """A gathered shard written here: the units' pieces it copies, fetched from the bucket's staging prefix."""
        if stage.name == "write-shard" and self.layout.splits[job[0]].sources is None:
            from ..bucket.remote_jobs import gathered_pieces

            gathered_pieces(self.sends, self.plan, *job)

    def worker_for(self, stage: Stage, job: Job) -> str | None:
        """The worker that holds a placed shard's piece (None: any)."""
        if stage.name != "write-shard":
            return None
        sources = self.layout.splits[job[0]].sources
        return None if sources is None else self.where.get(sources[job[1]][0])

    def taken(self, stage: Stage, job: Job, result: Any) -> Any:
        """A job's result, its records committed here first; where a unit's pieces are, remembered."""
        from ..bucket.remote_jobs import commit_records

        shipped, where = result
        commit_records(self.staging, shipped.records)
        if stage.name == "tokenize-unit":
            self.where[job[0]] = where
            commit_records(self.staging, {WHERE_FILE: json.dumps(self.where).encode()})
            return shipped.result
        return shipped.result
