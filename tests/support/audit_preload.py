"""A ``dask worker --preload`` module that logs the paths the worker process touches (``sys.addaudithook``).

Loaded by the isolated cluster's workers (tests/support/isolated.py) by file path. ``dask_setup``, which
distributed calls in the worker process (the nanny's child: ``--preload`` is handed by the nanny to the worker
process it starts, ``--preload-nanny`` would be the nanny's), installs an audit hook that appends one JSON line
``[event, path]`` per file-system event (:data:`EVENTS`) to ``$SHARDFLOW_TEST_AUDIT/audit-<name>-<pid>.log``,
``<name>`` being ``$SHARDFLOW_TEST_WORKER`` (the worker's name) and ``<pid>`` the worker process's: a worker
process its nanny restarts writes a new file. Its first line is ``["dask_setup", <worker address>]``. Each line is
one ``os.write`` to an ``O_APPEND`` descriptor opened before the hook is installed: no buffering to lose if the
process is killed, no interleaving between threads, and no audit event of its own.

The audit event is raised before the operation, so a failed attempt (an ``open`` of a path that is not there)
is logged too. Paths under the interpreter (``sys.prefix``, ``sys.base_prefix``: the standard library and
site-packages), ``/proc``, ``/sys``, ``/dev``, and the directories in ``$SHARDFLOW_TEST_AUDIT_SKIP``
(``os.pathsep``-separated: the harness passes shardflow's own package) are not logged: imports and psutil's
polling would drown what a test looks for. Without ``$SHARDFLOW_TEST_AUDIT`` the module does nothing.
"""

from __future__ import annotations

import json
import os
import sys
import sysconfig
from typing import Any

AUDIT_ENV = "SHARDFLOW_TEST_AUDIT"
"""The directory the logs go to (it must be visible to the worker: not under a hidden path)."""
NAME_ENV = "SHARDFLOW_TEST_WORKER"
"""The worker's name, for the log's file name."""
SKIP_ENV = "SHARDFLOW_TEST_AUDIT_SKIP"
"""More directories whose paths are not logged (``os.pathsep``-separated)."""

# The audit events logged, and which of their arguments are paths (CPython's audit events table).
EVENTS: dict[str, tuple[int, ...]] = {
    "open": (0,),
    "os.listdir": (0,),
    "os.scandir": (0,),
    "os.mkdir": (0,),
    "os.remove": (0,),
    "os.rmdir": (0,),
    "os.rename": (0, 1),
    "os.chdir": (0,),
}


def _skipped_prefixes() -> tuple[str, ...]:
    dirs = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix, "/proc", "/sys", "/dev"}
    dirs |= {sysconfig.get_path(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")}
    dirs |= set(filter(None, os.environ.get(SKIP_ENV, "").split(os.pathsep)))
    both = {os.path.realpath(d) for d in dirs if d} | {d for d in dirs if d}
    # With a trailing separator, so "/usr/lib" does not skip "/usr/lib2"; str.startswith takes the tuple at once.
    return tuple(d.rstrip(os.sep) + os.sep for d in both)


def install(directory: str, name: str) -> int:
    """Install the hook; returns the descriptor of its log (``audit-<name>-<pid>.log`` in ``directory``)."""
    fd = os.open(os.path.join(directory, f"audit-{name}-{os.getpid()}.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                 0o644)
    skip = _skipped_prefixes()
    cwd = os.getcwd

    def record(event: str, args: tuple[Any, ...]) -> None:
        # Called for every audit event of the process, in whatever thread raised it: the dict lookup first, and
        # never an exception (one raised here would fail the operation being audited).
        where = EVENTS.get(event)
        if where is None:
            return
        try:
            for i in where:
                target = args[i]
                if isinstance(target, int) or target is None:  # a file descriptor
                    continue
                target = os.fsdecode(os.fspath(target))
                if not os.path.isabs(target):  # relative to the cwd (dir_fd arguments are not followed)
                    target = os.path.join(cwd(), target)
                if target.startswith(skip):
                    continue
                os.write(fd, (json.dumps([event, target]) + "\n").encode())
        except Exception:
            pass

    sys.addaudithook(record)
    return fd


_FD: int | None = None  # this process's log, once the hook is installed


def dask_setup(worker: Any) -> None:
    """Called by distributed in the worker process once the preload is loaded: install the hook (once per process),
    and mark the log as a ``Worker``'s.

    Not at import: ``dask worker``'s command line imports the ``--preload`` modules itself (to parse their
    options), in the nanny's process, which is not to be audited; ``dask_setup`` is called for the ``Worker`` only,
    in its own process (the nanny's child, or the command's own process with ``--no-nanny``).
    """
    global _FD
    if _FD is None and os.environ.get(AUDIT_ENV):
        _FD = install(os.environ[AUDIT_ENV], os.environ.get(NAME_ENV, "worker"))
    if _FD is not None:
        os.write(_FD, (json.dumps(["dask_setup", str(worker.address)]) + "\n").encode())
