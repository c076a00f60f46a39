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
they were written). The lock is held from the head start's plan to
:meth:`HeadStart.close`, and lent meanwhile to the build of the same plan in
this process (``staging.LENT_LOCKS``): one process runs one build, as before.
Work a head start did for a build that never claimed it (the orchestrator
failed first) is committed unit by unit, so a rerun resumes from it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from concurrent.futures import Future
from typing import Any

from ..catalog import Catalog, default_data_root
from ..config import BuildConfig
from .model import BuildPlan, UnitResult
from .plan import plan_build
from .staging import LENT_LOCKS, build_lock
from .tokenize import EARLY_UNITS, tokenize_unit_now

__all__ = ["HeadStart", "HEAD_START_ENV", "head_start_owns", "planned_by_head_start"]

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
    first units are being tokenized.
    """
    root = str(default_data_root(data_root))
    cat = str(Catalog(catalog).path)
    for early in list(EARLY_UNITS.values()):
        plan = early.plan
        if plan.config == config and plan.data_root == root and plan.catalog == cat:
            return plan
    return None


class _HoldBack(logging.Filter):
    """Holds back the log records of a head start's threads, per unit, for the task that claims the unit."""

    def __init__(self) -> None:
        super().__init__()
        self.unit_of_thread: dict[int, int] = {}
        self.records: dict[int, list[logging.LogRecord]] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        unit = self.unit_of_thread.get(threading.get_ident())
        if unit is None:
            return True
        with self._lock:
            self.records.setdefault(unit, []).append(record)
        return False

    def take(self, unit: int) -> list[logging.LogRecord]:
        with self._lock:
            return self.records.pop(unit, [])


class HeadStart:
    """Work units of one plan tokenized ahead of its orchestrator; see the module's docstring."""

    def __init__(self, plan: BuildPlan, *, workers: int, held: contextlib.ExitStack) -> None:
        self.plan = plan
        self._held = held
        self._futures: dict[int, Future[UnitResult]] = {}
        self._next = 0
        self._stopped = False
        self._mutex = threading.Lock()
        self._hold_back = _HoldBack()
        # Every logger of the library a unit may log through; a filter sees only its own logger's records.
        self._loggers = [logging.getLogger(n) for n in list(logging.Logger.manager.loggerDict) if n.startswith("shardflow")]
        for lg in self._loggers:
            lg.addFilter(self._hold_back)
        # Its INFO lines (a unit tokenized) must exist to be handed over, as they would in a flow run.
        root = logging.getLogger("shardflow")
        self._level = None if root.isEnabledFor(logging.INFO) else root.level
        if self._level is not None:
            root.setLevel(logging.INFO)
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
        held = contextlib.ExitStack()
        try:
            plan = plan_build(config, data_root=data_root, catalog=catalog, lock_timeout=0)
            if plan.existing:
                return None
            plan = held.enter_context(build_lock(plan, timeout=0))
            if plan.existing or not plan.units:
                held.close()
                return None
        except Exception:
            held.close()
            log.debug("no head start", exc_info=True)
            return None
        LENT_LOCKS.add(plan.staging)
        held.callback(LENT_LOCKS.discard, plan.staging)
        return cls(plan, workers=max(1, workers), held=held)

    def _take(self) -> tuple[int, Future[UnitResult]] | None:
        with self._mutex:
            if self._stopped or self._next >= len(self.plan.units):
                return None
            unit, self._next = self._next, self._next + 1
            fut: Future[UnitResult] = Future()
            self._futures[unit] = fut
            return unit, fut

    def _work(self) -> None:
        me = threading.get_ident()
        while (taken := self._take()) is not None:
            unit, fut = taken
            self._hold_back.unit_of_thread[me] = unit
            try:
                fut.set_result(tokenize_unit_now(self.plan, unit))
            except BaseException as exc:  # handed to the task that claims the unit
                fut.set_exception(exc)
            finally:
                self._hold_back.unit_of_thread.pop(me, None)

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
            for record in self._hold_back.take(unit):
                logging.getLogger(record.name).handle(record)

    def owns(self, unit: int) -> bool:
        """Whether this head start took ``unit`` and it is not claimed yet."""
        with self._mutex:
            return unit in self._futures

    @property
    def started(self) -> int:
        """How many units it took."""
        return self._next

    def close(self) -> None:
        """Take no more units, wait for the running ones, stop holding back logs, release the lock."""
        with self._mutex:
            self._stopped = True
        for t in self._threads:
            t.join()
        if EARLY_UNITS.get(self.plan.staging) is self:
            del EARLY_UNITS[self.plan.staging]
        for lg in self._loggers:
            lg.removeFilter(self._hold_back)
        if self._level is not None:
            logging.getLogger("shardflow").setLevel(self._level)
        for unit in list(self._hold_back.records):  # units no task claimed: their lines go out as they are
            for record in self._hold_back.take(unit):
                logging.getLogger(record.name).handle(record)
        self._held.close()

    def __enter__(self) -> HeadStart:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
