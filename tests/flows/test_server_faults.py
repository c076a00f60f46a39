"""The server a build runs on, when it fails (issue 41): slow to start, gone mid-build, or left by a killed build.

* A temporary server that has not answered within its startup timeout never fails the build: the build ends in
  its own process, the same bytes, and says so in one line.
* A server that stops answering mid-build ends the build within a minute, in one line, no traceback; a rerun
  gives the bytes of a clean build.
* A build killed with its whole process group (``kill -9``) leaves no process: its temporary server watches it.

Each build is a real ``python -m shardflow build``; every process it starts carries a mark of its own in its
environment (``support.processes.MARK_ENV``), which is how the tests find what is left.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from support.builds import files_of
from support.cli import run_main
from support.paths import SAMPLE, SHARDFLOW
from support.prefect import prefect_server
from support.processes import MARK_ENV, describe, kill_all, processes_marked

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")]


def _env(tmp_path: Path, **values: str) -> tuple[dict[str, str], str]:
    """A build's environment without Prefect's or shardflow's settings, its processes marked: (env, mark)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "SHARDFLOW_"))}
    mark = f"{os.environ.get(MARK_ENV, 'tests')}/build-{uuid.uuid4().hex[:8]}"
    env.update({MARK_ENV: mark}, PREFECT_HOME=str(tmp_path / "home"), SHARDFLOW_REUSE_LOCAL_SERVER="0", CI="true",
               PYTHONUNBUFFERED="1", **values)
    return env, mark


def _build_args(root: Path, *more: str) -> list[str]:
    return [*SHARDFLOW, "build", str(SAMPLE), "--name", "s", "--data-root", str(root / "data"),
            "--catalog", str(root / "cat"), *more]


def _gone_within(mark: str, seconds: float) -> list[int]:
    """Wait until no process carries ``mark``, ``seconds`` at most; those left (killed, so none outlives the test)."""
    deadline = time.monotonic() + seconds
    while processes_marked(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = processes_marked(mark)
    described = [describe(pid) for pid in left]
    kill_all(left)
    return described


def _reference(tmp_path: Path) -> dict[str, bytes]:
    """The sample's version from a clean ``--no-prefect`` build (in this process)."""
    ref = tmp_path / "reference"
    run = run_main("build", SAMPLE, "--name", "s", "--no-prefect", "--data-root", ref / "data", "--catalog", ref / "cat")
    assert run.status == 0, run.err
    return files_of(ref / "data" / "s" / "v1")


def _lines(text: str) -> list[str]:
    """What a build says in its own name (``shardflow: ...``), progress lines (``shardflow: s: ...``) left out."""
    return [line for line in text.splitlines() if line.startswith("shardflow: ") and not line.startswith("shardflow: s: ")]


def test_a_temporary_server_slow_to_start_never_fails_the_build(tmp_path: Path) -> None:
    """The server never answers (it sleeps before it starts, through a ``sitecustomize`` of its own); with a 5 s
    startup timeout the build validates and publishes in its own process, says so in one line, exits 0, publishes
    the bytes of a clean build, and leaves no server behind."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "import sys, time\nif 'shardflow.flows.server_app:app' in sys.argv:\n    time.sleep(600)\n")
    env, mark = _env(tmp_path, PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="5",
                     PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]))
    started = time.monotonic()
    proc = subprocess.run(_build_args(tmp_path), env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == ["published s@v1", str(tmp_path / "data" / "s" / "v1" / "metadata.yaml")]
    said = _lines(proc.stderr)
    assert len(said) == 1 and "did not answer" in said[0] and "without Prefect" in said[0], proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "error" not in proc.stderr.lower()
    assert time.monotonic() - started < 240
    assert _gone_within(mark, 10) == []  # the silent server was stopped
    assert files_of(tmp_path / "data" / "s" / "v1") == _reference(tmp_path)


def test_a_server_gone_mid_build_ends_it_within_a_minute_and_a_rerun_gives_the_same_bytes(tmp_path: Path) -> None:
    """``PREFECT_API_URL`` names a server this test starts; the build waits at its layout (a fault) while the
    server is killed, then goes on, slowed at validation so that it cannot publish in time. It ends within 60 s of
    the kill: one line naming the server, non-zero, no traceback, nothing of Prefect's complaints; a rerun
    (``--no-prefect``, as the line says) publishes the bytes of a clean build."""
    release = tmp_path / "release"
    (tmp_path / "server").mkdir()
    with prefect_server(tmp_path / "server") as server:
        env, mark = _env(tmp_path, PREFECT_API_URL=server.api_url, SHARDFLOW_FAULT="wait:layout,sleep40:validate",
                         SHARDFLOW_FAULT_RELEASE=str(release))
        build = subprocess.Popen(_build_args(tmp_path), env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, start_new_session=True)
        try:
            deadline = time.monotonic() + 180
            while not list(tmp_path.glob("release.reached-*")):
                assert build.poll() is None and time.monotonic() < deadline, build.communicate()[1][-3000:]
                time.sleep(0.1)
            os.killpg(server.process.pid, signal.SIGKILL)  # the server, mid-build
            killed = time.monotonic()
            release.touch()
            out, err = build.communicate(timeout=120)
            took = time.monotonic() - killed
        finally:
            if build.poll() is None:
                os.killpg(build.pid, signal.SIGKILL)
                build.wait()
    assert took < 60, (took, err[-3000:])
    assert build.returncode != 0 and out == "", (build.returncode, out, err[-3000:])
    said = _lines(err)
    port = server.url.rsplit(":", 1)[1]
    assert said == [f"shardflow: error: the Prefect server at http://127.0.0.1:{port} stopped answering; the build is "
                    "resumable: rerun it, or pass --no-prefect"], err[-3000:]
    assert not re.search(r"Traceback|httpx|ERROR|WARNING", err), err[-3000:]
    assert not (tmp_path / "data" / "s" / "v1").exists()
    assert _gone_within(mark, 10) == []

    rerun = subprocess.run(_build_args(tmp_path, "--no-prefect"), env=_env(tmp_path)[0], cwd=tmp_path,
                           capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0 and rerun.stdout.startswith("published s@v1"), rerun.stderr[-3000:]
    assert files_of(tmp_path / "data" / "s" / "v1") == _reference(tmp_path)


def test_a_build_killed_with_its_whole_process_group_leaves_no_process(tmp_path: Path) -> None:
    """``kill -9`` of the build's process group (the build and its server's watcher) while its temporary server
    answers: the server, in a session of its own, stops itself; 10 s later no process of that build is left."""
    env, mark = _env(tmp_path, SHARDFLOW_FAULT="wait:layout", SHARDFLOW_FAULT_RELEASE=str(tmp_path / "never"))
    build = subprocess.Popen(_build_args(tmp_path), env=env, cwd=tmp_path, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        from shardflow.flows.server import running_server

        deadline = time.monotonic() + 180
        url = None
        while url is None or not running_server(url):  # held at its layout, while its server starts and answers
            assert build.poll() is None and time.monotonic() < deadline, build.communicate()[1][-3000:]
            servers = [pid for pid in processes_marked(mark) if "server_app" in describe(pid)]
            ports = [re.search(r"--port (\d+)", describe(pid)) for pid in servers]
            url = next((f"http://127.0.0.1:{p.group(1)}/api" for p in ports if p), None)
            time.sleep(0.2)
        os.killpg(build.pid, signal.SIGKILL)
        build.wait()
        assert _gone_within(mark, 10) == []
        assert not running_server(url)
    finally:
        if build.poll() is None:
            os.killpg(build.pid, signal.SIGKILL)
            build.wait()
        kill_all(processes_marked(mark))


WATCHED = '''
import http.server, sys, threading, time
from shardflow.flows import server
from shardflow.flows.server import ServerGone, ServerWatch

server.GONE_AFTER, server.POLL_EVERY, server.EXIT_GRACE = 1.5, 0.2, 2.0  # seconds, not the build's minute


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"true")

    def log_message(self, *args):
        pass


def up():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}/api"


httpd, url = up()
started = time.monotonic()
try:
    with ServerWatch(url, dedicated=False):
        time.sleep(1)  # answering: nothing happens
        httpd.shutdown(); httpd.server_close()
        time.sleep(60)
except ServerGone as exc:
    print(f"interrupted after {time.monotonic() - started:.1f} s: {exc}", flush=True)

httpd, url = up()
with ServerWatch(url, dedicated=True):  # a deployment's run: its process ends with the build
    httpd.shutdown(); httpd.server_close()
    while True:  # a run that does not end when interrupted (Prefect retrying its calls)
        try:
            time.sleep(60)
        except ServerGone:
            pass
'''


def test_a_watched_flow_is_interrupted_and_a_process_that_ends_with_its_build_exits(tmp_path: Path) -> None:
    """The watch on its own, its delays shortened: a server that stops answering interrupts the watched block
    (``ServerGone``, in the main thread); in a process that ends with its build (a deployment's run), a run that
    still does not end is ended: one line, status 2, as ``kill -9`` would leave its staging."""
    proc = subprocess.run([sys.executable, "-c", WATCHED], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr[-3000:])
    assert re.fullmatch(r"interrupted after \d+\.\d s: the Prefect server at http://127\.0\.0\.1:\d+ stopped answering; "
                        r"the build is resumable: rerun it, or pass --no-prefect\n", proc.stdout), proc.stdout
    assert re.fullmatch(r"shardflow: error: the Prefect server at http://127\.0\.0\.1:\d+ stopped answering; the build "
                        r"is resumable: rerun it, or pass --no-prefect\n", proc.stderr), proc.stderr[-3000:]
