"""The processes the tests start: a free loopback port for a server, stopping a process group, and the session's
check that none is left running.

Every process a test session starts carries :data:`MARK_ENV` in its environment (set by :func:`pytest_configure`
before any is started, inherited by each child: xdist's workers, servers, builds, their own children), a value
unique to the session and prefixed by the session that started it (a worker's is its controller's
``MARK/gw0``; a pytest run inside a test's, the test session's ``MARK/...``). At the end of the session, the
controller (or a session without xdist) looks for processes still running with its mark or a mark under it, or
still its own descendants (:func:`left_running`), gives them :data:`GRACE` seconds, then kills them and fails the
run, naming them (:func:`pytest_sessionfinish`). SIGTERM interrupts the session as Ctrl-C does, so its fixtures
are torn down (the default SIGTERM kills pytest at once and leaves every server it started running).
``tests/conftest.py`` takes these hooks; Linux only (``/proc``), elsewhere they do nothing.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def stop_group(process: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 20) -> None:
    """Signal the process group that ``process`` leads (started with ``start_new_session=True``) and reap the
    leader; SIGKILL to the group if it still runs after ``timeout`` seconds."""
    try:
        os.killpg(process.pid, sig)
    except (ProcessLookupError, PermissionError):  # the group is gone (PermissionError: macOS, a zombie leader)
        pass
    try:
        process.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()


# -- the session's processes, and none left running at its end ---------------------------------------------------

MARK_ENV = "PYTEST_SHARDFLOW_SESSION"
"""The environment variable that marks a process as started by a test session (see the module's text)."""
GRACE = float(os.environ.get("PYTEST_SHARDFLOW_GRACE", "10"))
"""Seconds the processes still running at the session's end are given to exit (a server's own shutdown) before
they are killed and the run fails (``PYTEST_SHARDFLOW_GRACE``: another, for the test of this check)."""
PROC = Path("/proc")
_session_mark: list[str] = []  # this process's session's mark, once pytest_configure has set it


def _stat(pid: str) -> tuple[int, str] | None:
    """``(parent pid, state)`` of a process, or None if it is gone."""
    try:
        text = (PROC / pid / "stat").read_text()
    except OSError:
        return None
    fields = text.rpartition(")")[2].split()  # after "pid (comm)": the name may hold spaces and parentheses
    return int(fields[1]), fields[0]


def _mark_of(pid: str) -> str | None:
    try:
        environ = (PROC / pid / "environ").read_bytes()
    except OSError:
        return None
    prefix = f"{MARK_ENV}=".encode()
    for entry in environ.split(b"\0"):
        if entry.startswith(prefix):
            return entry[len(prefix):].decode(errors="replace")
    return None


def processes_marked(mark: str) -> list[int]:
    """Running processes (not zombies) whose environment carries ``mark`` or a mark under it (``mark/...``)."""
    found = []
    for entry in PROC.iterdir() if PROC.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        theirs = _mark_of(entry.name)
        stat = _stat(entry.name)
        if theirs is not None and (theirs == mark or theirs.startswith(f"{mark}/")) and stat and stat[1] != "Z":
            found.append(int(entry.name))
    return found


def left_running(mark: str) -> list[int]:
    """The processes of this session still running: marked with ``mark`` (or under it), or descendants of this one."""
    if not PROC.is_dir():
        return []
    parents: dict[int, int] = {}
    for entry in PROC.iterdir():
        stat = _stat(entry.name) if entry.name.isdigit() else None
        if stat is not None and stat[1] != "Z":
            parents[int(entry.name)] = stat[0]
    me, ours = os.getpid(), set(processes_marked(mark))
    for pid in parents:
        seen, up = set(), parents.get(pid)
        while up is not None and up not in seen and up > 1:
            if up == me:
                ours.add(pid)
                break
            seen.add(up)
            up = parents.get(up)
    ours.discard(me)
    return sorted(pid for pid in ours if pid in parents)


def describe(pid: int) -> str:
    try:
        command = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
    except OSError:
        command = "?"
    return f"{pid}: {command[:200]}"


def kill_all(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config: Any) -> None:
    """Mark this session's processes (before any is started), and take SIGTERM as Ctrl-C."""
    inherited = os.environ.get(MARK_ENV)
    worker = getattr(config, "workerinput", None)
    own = worker["workerid"] if worker is not None else uuid.uuid4().hex[:12]
    os.environ[MARK_ENV] = f"{inherited}/{own}" if inherited else own
    _session_mark[:] = [os.environ[MARK_ENV]]
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
        signal.signal(signal.SIGTERM, _interrupt)


@pytest.hookimpl(trylast=True)  # after the fixtures' teardown (runner) and xdist's workers' end (its DSession)
def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """At the end of the session (after its fixtures and xdist's workers are gone): no process of it may be left.

    Run by the controller, or a session without xdist; a worker's processes carry a mark under its controller's.
    """
    config = session.config
    if getattr(config, "workerinput", None) is not None or not _session_mark:
        return
    mark = _session_mark[0]
    deadline = time.monotonic() + GRACE
    left = left_running(mark)
    while left and time.monotonic() < deadline:
        time.sleep(0.2)
        left = left_running(mark)
    if not left:
        return
    described = [describe(pid) for pid in left]
    kill_all(left)
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    lines = [f"{len(left)} process(es) this test session started were still running {GRACE:.0f} s after its end; "
             "killed:", *(f"  {line}" for line in described)]
    if reporter is not None:
        reporter.write_line("")
        for line in lines:
            reporter.write_line(line, red=True)
    else:
        print("\n".join(lines))
    if session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED  # they left processes behind


def pytest_unconfigure(config: Any) -> None:
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is _interrupt:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
