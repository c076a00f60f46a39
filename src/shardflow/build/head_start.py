"""A head start: a build's first work units tokenized before the orchestrator that runs it is ready.

An orchestrated build (the Prefect flow) spends its first seconds on its own
start-up: importing Prefect, creating the flow run on the server, waiting for
a temporary server to answer. The core knows the build's plan long before, so
:meth:`HeadStart.begin` plans it, takes its lock, and tokenizes work units in
order on ``workers`` threads meanwhile. The build's own ``tokenize_unit`` calls
(its tasks) then *claim* those units: a finished unit's result comes back at
once, a running one is waited for, a failed one raises its error (once: a
retry tokenizes it again). The first claim stops the head start from taking
new units, so from then on the orchestrator runs the rest as it always did, and
at most ``workers`` units are ever tokenized at once (memory stays bounded by
workers x batch).

What the orchestrator records does not change: every unit still has its task
run, and the log lines of a head-start unit are held back and handed to the
task that claims it, so they appear in that task run's logs (with the time
they were written); the planning's lines go to the plan task that takes its
plan (:func:`planned_by_head_start`). Units committed already (a resumed
build) are not taken: the orchestrator skips them as before. The
orchestrator's first question (:meth:`HeadStart.owns`, :meth:`HeadStart.claim`)
stops new units, so its answer is final. The lock is held from the head start's plan to
:meth:`HeadStart.close`, and lent meanwhile to the build of the same plan in
this process (``staging.LENT_LOCKS``): one process runs one build, as before.
Work a head start did for a build that never claimed it (the orchestrator
failed first) is committed unit by unit, so a rerun resumes from it; its
held-back lines are dropped rather than logged outside any run.

Not counted against a Prefect concurrency limit on the build's tags: the
units run before any task exists.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from concurrent.futures import Future
from typing import Any, Iterator

from ..catalog import Catalog, default_data_root
from ..config import BuildConfig
from .model import BuildPlan, UnitResult
from .plan import plan_build
from .staging import LENT_LOCKS, build_lock
from .tokenize import EARLY_UNITS, tokenize_unit_now, unit_done

__all__ = ["HeadStart", "HEAD_START_ENV", "head_start_owns", "head_start_began", "planned_by_head_start"]

HEAD_START_ENV = "SHARDFLOW_HEAD_START"
"""Set to 0 to turn head starts off (the flow then tokenizes every unit in its own tasks)."""

log = logging.getLogger("shardflow.build")


def head_start_owns(plan: BuildPlan, unit: int) -> bool:
    """Whether a head start in this process took ``plan``'s unit ``unit`` for the build to claim.

    An orchestrator that skips committed units (no task for them) asks this
    first: a head start's unit is the build's own work and keeps its task.
    """
    early = EARLY_UNITS.get(plan.staging)
    return early is not None and bool(early.owns(unit))


def planned_by_head_start(
    config: BuildConfig, data_root: str | os.PathLike[str] | None = None, catalog: str | os.PathLike[str] | None = None
) -> BuildPlan | None:
    """The plan of the head start running in this process for this very build, else None.

    It was made moments ago, and the head start has held the build's lock
    since: the build's own planning would find the same plan. The flow's plan
    task takes it rather than planning the build a second time while its
    first units are being tokenized; the planning's log lines (a parent not
    reused, an orphan adopted) are logged again there, in the plan task's run.
    """
    root = str(default_data_root(data_root))
    cat = str(Catalog(catalog).path)
    for early in list(EARLY_UNITS.values()):
        plan = early.plan
        if plan.config == config and plan.data_root == root and plan.catalog == cat:
            early.hand_over(_PLANNING)
            return plan
    return None


def head_start_began(plan: BuildPlan) -> float | None:
    """When (``time.monotonic()``) the head start for ``plan`` in this process began planning, else None.

    A build's reported durations (tokenizing, the whole build) start there.
    """
    early = EARLY_UNITS.get(plan.staging)
    return None if early is None else float(early.began)


_PLANNING = -1
"""The held-back records of the head start's planning (units are 0 and up)."""


class _HoldBack(logging.Filter):
    """Holds back the log records of a head start's threads, per unit, for the task that claims the unit.

    Installed on every logger of the library that exists (a filter sees only the
    records of its own logger), with the library's level at INFO meanwhile, so
    that the lines a unit logs in a flow run exist to be handed over.
    """

    def __init__(self) -> None:
        super().__init__()
        self.unit_of_thread: dict[int, int] = {}
        self.records: dict[int, list[logging.LogRecord]] = {}
        self._lock = threading.Lock()
        self._loggers = [logging.getLogger(n) for n in list(logging.Logger.manager.loggerDict) if n.startswith("shardflow")]
        for lg in self._loggers:
            lg.addFilter(self)
        top = logging.getLogger("shardflow")
        self._level = None if top.isEnabledFor(logging.INFO) else top.level
        if self._level is not None:
            top.setLevel(logging.INFO)

    def remove(self) -> None:
        """Stop holding records back; the ones not handed over are dropped (see :meth:`HeadStart.close`)."""
        for lg in self._loggers:
            lg.removeFilter(self)
        if self._level is not None:
            logging.getLogger("shardflow").setLevel(self._level)
        with self._lock:
            self.records.clear()

    def filter(self, record: logging.LogRecord) -> bool:
        unit = self.unit_of_thread.get(threading.get_ident())
        if unit is None:
            return True
        with self._lock:
            self.records.setdefault(unit, []).append(record)
        return False

    @contextlib.contextmanager
    def holding(self, unit: int) -> Iterator[None]:
        """Hold back this thread's records as ``unit``'s."""
        me = threading.get_ident()
        self.unit_of_thread[me] = unit
        try:
            yield
        finally:
            self.unit_of_thread.pop(me, None)

    def hand_over(self, unit: int) -> None:
        """Log ``unit``'s records again, in this thread (a claiming task's run context)."""
        with self._lock:
            records = self.records.pop(unit, [])
        for record in records:
            logging.getLogger(record.name).handle(record)


class HeadStart:
    """Work units of one plan tokenized ahead of its orchestrator; see the module's docstring."""

    def __init__(
        self, plan: BuildPlan, *, workers: int, held: contextlib.ExitStack, hold_back: _HoldBack, began: float
    ) -> None:
        self.plan = plan
        self.began = began
        self._held = held
        self._hold_back = hold_back
        self._futures: dict[int, Future[UnitResult]] = {}
        self._next = 0
        self._taken = 0
        self._stopped = False
        self._mutex = threading.Lock()
        self._threads = [
            threading.Thread(target=self._work, name=f"shardflow-head-start-{i}", daemon=True) for i in range(workers)
        ]
        EARLY_UNITS[plan.staging] = self
        for t in self._threads:
            t.start()

    @classmethod
    def begin(
        cls,
        config: BuildConfig,
        *,
        data_root: str | os.PathLike[str] | None = None,
        catalog: str | os.PathLike[str] | None = None,
        workers: int = 1,
    ) -> HeadStart | None:
        """Plan ``config``, take its lock and start tokenizing; None where there is nothing to start.

        Nothing to start: head starts turned off (``SHARDFLOW_HEAD_START=0``),
        a build published already, another process holding the lock, or a plan
        that fails (bad input, a bad option: the build reports it when it plans).
        """
        if os.environ.get(HEAD_START_ENV, "1").strip() in ("0", "false", "no"):
            return None
        began = time.monotonic()
        held = contextlib.ExitStack()
        hold_back = _HoldBack()
        try:
            with hold_back.holding(_PLANNING):  # the plan task logs them, when it takes this plan
                plan = plan_build(config, data_root=data_root, catalog=catalog, lock_timeout=0)
                if not plan.existing:
                    plan = held.enter_context(build_lock(plan, timeout=0))
            if plan.existing or not plan.units:
                raise _NothingToDo
            LENT_LOCKS.add(plan.staging)
            held.callback(LENT_LOCKS.discard, plan.staging)
            return cls(plan, workers=max(1, workers), held=held, hold_back=hold_back, began=began)
        except Exception as exc:  # the build plans again, and reports what failed here with its own message
            hold_back.remove()
            held.close()
            if not isinstance(exc, _NothingToDo):
                log.debug("no head start", exc_info=True)
            return None

    def _take(self) -> tuple[int, Future[UnitResult]] | None:
        with self._mutex:
            # Units committed already (a resumed build) are the orchestrator's to skip: not taken.
            while not self._stopped and self._next < len(self.plan.units) and unit_done(self.plan, self._next):
                self._next += 1
            if self._stopped or self._next >= len(self.plan.units):
                return None
            unit, self._next = self._next, self._next + 1
            fut: Future[UnitResult] = Future()
            self._futures[unit] = fut
            self._taken += 1
            return unit, fut

    def _work(self) -> None:
        while (taken := self._take()) is not None:
            unit, fut = taken
            with self._hold_back.holding(unit):
                try:
                    fut.set_result(tokenize_unit_now(self.plan, unit))
                except BaseException as exc:  # handed to the task that claims the unit
                    fut.set_exception(exc)

    def claim(self, unit: int) -> UnitResult | None:
        """Unit ``unit``'s result if this head start took it (waiting for it), else None; stops new units.

        Its held-back log lines are logged again here, in the claiming task's
        context. A unit is claimed once: a retry after its error tokenizes it again.
        """
        with self._mutex:
            self._stopped = True
            fut = self._futures.pop(unit, None)
        if fut is None:
            return None
        try:
            return fut.result()
        finally:
            self._hold_back.hand_over(unit)

    def owns(self, unit: int) -> bool:
        """Whether this head start took ``unit``, not claimed yet; stops new units (the orchestrator is here).

        Stopping first makes the answer final: a unit it does not own now, it never takes.
        """
        with self._mutex:
            self._stopped = True
            return unit in self._futures

    def hand_over(self, unit: int) -> None:
        """Log the held-back records of ``unit`` (or of the planning) again, in this thread."""
        self._hold_back.hand_over(unit)

    @property
    def started(self) -> int:
        """How many units it took."""
        return self._taken

    def close(self) -> None:
        """Take no more units, wait for the running ones, release the lock.

        The log lines of units no task claimed (the flow failed first) are
        dropped: those units are committed, and the rerun that resumes from
        them reports them.
        """
        with self._mutex:
            self._stopped = True
        try:
            for t in self._threads:
                t.join()
        finally:
            if EARLY_UNITS.get(self.plan.staging) is self:
                del EARLY_UNITS[self.plan.staging]
            try:
                self._hold_back.remove()
            finally:
                self._held.close()

    def __enter__(self) -> HeadStart:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _NothingToDo(Exception):
    """A plan published already, or with no units: no head start."""
