"""The test suite leaves no process behind, however it ends (issue 41): ``support.processes``'s session check.

A tiny pytest session, with the suite's hooks (as ``tests/conftest.py`` takes them) and xdist as the suite runs
it, starts a server as a session fixture and leaks another process on purpose, then ends, or is interrupted:
Ctrl-C at a terminal (SIGINT to its process group) or SIGTERM to pytest alone. Every way, its check names and
kills what was left (the run fails), and no process it started is running after.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from support.paths import TESTS
from support.processes import MARK_ENV, processes_marked

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")

CONFTEST = '''
import os, subprocess, sys
import pytest
from support.processes import pytest_configure, pytest_sessionfinish, pytest_unconfigure, stop_group

SLEEPER = [sys.executable, "-c", "import time; time.sleep(600)"]


@pytest.fixture(scope="session")
def server():
    process = subprocess.Popen(SLEEPER, start_new_session=True)  # a server: its own session, as the suite's are
    try:
        yield process
    finally:
        stop_group(process)
'''

TEST = '''
import os, pathlib, subprocess, time
from conftest import SLEEPER


def test_interrupted_while_a_server_is_up(server):
    leaked = subprocess.Popen(SLEEPER, start_new_session=True)  # never stopped: the check must find it
    pathlib.Path(os.environ["INNER_READY"]).write_text(f"{server.pid} {leaked.pid}")
    if not os.environ.get("INNER_ENDS"):
        time.sleep(45)  # interrupted long before, unless a loaded machine's controller waits for its worker first
'''


def _session(tmp_path: Path, how: str) -> tuple[int, str, list[int], str]:
    """Run the tiny session until its server is up, then interrupt it ``how`` (or let it end); its exit status,
    its output, its two processes, its mark."""
    tmp_path.mkdir()
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "conftest.py").write_text(CONFTEST)
    (tmp_path / "test_inner.py").write_text(TEST)
    ready = tmp_path / "ready"
    mark = f"{os.environ[MARK_ENV]}/probe-{uuid.uuid4().hex[:8]}"
    outer = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_XDIST_", "PYTEST_CURRENT_TEST"))}
    env = {**outer, MARK_ENV: mark, "INNER_READY": str(ready), "PYTEST_SHARDFLOW_GRACE": "1",
           "INNER_ENDS": "1" if how == "end" else "",
           "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    inner = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                              "-n", "1", "test_inner.py"], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists() or not ready.read_text():
            assert inner.poll() is None and time.monotonic() < deadline, inner.communicate()[0][-3000:]
            time.sleep(0.1)
        pids = [int(p) for p in ready.read_text().split()]
        assert how == "end" or all(Path(f"/proc/{pid}").exists() for pid in pids)
        if how == "ctrl-c":
            os.killpg(inner.pid, signal.SIGINT)  # the terminal's Ctrl-C: pytest and its worker
        elif how == "sigterm":
            os.kill(inner.pid, signal.SIGTERM)  # pytest alone
        output, _ = inner.communicate(timeout=180)  # a loaded machine: xdist's teardown, the check's grace
    finally:
        if inner.poll() is None:
            os.killpg(inner.pid, signal.SIGKILL)
            inner.wait()
    return inner.returncode, output, pids, mark


@pytest.mark.slow
def test_a_session_ended_or_interrupted_leaves_no_process_it_started(tmp_path: Path) -> None:
    for how in ("end", "ctrl-c", "sigterm"):
        status, output, (server, leaked), mark = _session(tmp_path / how, how)
        if how == "end":  # the test passed; the run fails for what it left
            assert status == 1 and "1 passed" in output, (status, output[-3000:])
        else:  # interrupted; or, seen under CI load (both ways), the worker's test ran out before the interrupt took
            assert status in (1, 2) and ("KeyboardInterrupt" in output or "1 passed" in output), (status, output[-3000:])
        # The check named and killed what was left: the leaked process (and, where the worker was killed before
        # its teardown, the server).
        assert "still running" in output and f"{leaked}:" in output, output[-3000:]
        left = processes_marked(mark)
        assert left == [], (how, left, output[-3000:])
        assert not Path(f"/proc/{server}").exists() or Path(f"/proc/{server}/stat").read_text().split(")")[1].split()[0] == "Z"
