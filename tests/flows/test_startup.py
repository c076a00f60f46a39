"""``shardflow build`` with no ``PREFECT_API_URL`` (flows/startup.py): the temporary server launched
before Prefect is imported and stopped after, a running local server reused, and when neither applies."""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

import pytest

from shardflow.flows import startup
from shardflow.config import BuildConfig

from ops_support import SAMPLE, PrefectServer, free_port, run_cli


def _no_prefect_env(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    for key in [k for k in os.environ if k.startswith("PREFECT_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("PREFECT_HOME", str(home))


def test_the_guess_follows_the_environment_the_profile_and_settings_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _no_prefect_env(monkeypatch, tmp_path / "home")
    monkeypatch.chdir(tmp_path)
    assert startup._guess_before_import()  # no profiles file: Prefect's "ephemeral" profile

    (tmp_path / "home").mkdir()
    profiles = tmp_path / "home" / "profiles.toml"
    profiles.write_text('active = "mine"\n[profiles.mine]\nPREFECT_API_URL = "http://10.0.0.1:4200/api"\n'
                        '[profiles.other]\nPREFECT_LOGGING_LEVEL = "DEBUG"\n')
    assert not startup._guess_before_import()  # the active profile names a server
    monkeypatch.setenv("PREFECT_PROFILE", "other")
    assert startup._guess_before_import()

    (tmp_path / "prefect.toml").write_text('[api]\nurl = "http://10.0.0.1:4200/api"\n')
    assert not startup._guess_before_import()  # a settings file here: Prefect decides
    (tmp_path / "prefect.toml").unlink()

    monkeypatch.setenv("PREFECT_API_URL", "http://10.0.0.1:4200/api")
    assert not startup._guess_before_import()


def test_once_prefect_is_imported_its_settings_decide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    _no_prefect_env(monkeypatch, tmp_path / "home")
    monkeypatch.chdir(tmp_path)
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        assert not startup._would_use_temporary_server()
        assert startup.start_early() is None  # nothing launched for a caller with a server configured
    with temporary_settings(restore_defaults={PREFECT_API_URL}, updates={"server.ephemeral.enabled": True}):
        assert startup._would_use_temporary_server()
    with temporary_settings(restore_defaults={PREFECT_API_URL}, updates={"server.ephemeral.enabled": False}):
        assert not startup._would_use_temporary_server()  # Prefect would refuse to run: leave that to it


@pytest.mark.slow
def test_running_server_answers_only_for_a_prefect_server(prefect_server: PrefectServer) -> None:
    assert startup.running_server(prefect_server.api_url)
    assert not startup.running_server(f"http://127.0.0.1:{free_port()}/api")  # nothing listens
    assert not startup.running_server(f"{prefect_server.url}/nothing-here")  # something else answers


@pytest.mark.slow
def test_the_early_temporary_server_runs_the_build_and_is_gone_after(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "home"), SHARDFLOW_REUSE_LOCAL_SERVER="0", CI="true")
    res = run_cli(["build", str(SAMPLE), "--name", "early"], env, tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    both = res.stdout + res.stderr
    port = int(re.search(r"Starting temporary server on http://127\.0\.0\.1:(\d+)", both).group(1))
    assert "Stopping temporary server" in both
    assert "ERROR" not in both and "Traceback" not in both, both[-3000:]
    assert res.stdout.strip().splitlines()[-1] == str(tmp_path / "data" / "early" / "v1" / "metadata.yaml")
    # The server ended with the command: nothing listens on its port any more.
    with socket.socket() as s:
        assert s.connect_ex(("127.0.0.1", port)) != 0
    # Its database (in PREFECT_HOME, as Prefect's own temporary server's) holds the run.
    assert (tmp_path / "home" / "prefect.db").exists()
    # The next build's server finds the block types registered by this one, and skips registering them.
    with pytest.MonkeyPatch.context() as mp:
        _no_prefect_env(mp, tmp_path / "home")
        assert startup._blocks_already_registered()
    again = run_cli(["build", str(SAMPLE), "--name", "early2"], env, tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "ERROR" not in again.stdout + again.stderr and "Traceback" not in again.stdout + again.stderr


def test_block_types_are_registered_only_where_the_database_has_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sqlite3

    _no_prefect_env(monkeypatch, tmp_path / "home")
    assert not startup._blocks_already_registered()  # no database yet: Prefect creates it and registers them
    (tmp_path / "home").mkdir()
    db = sqlite3.connect(tmp_path / "home" / "prefect.db")
    db.execute("CREATE TABLE block_type (id TEXT)")
    db.commit()
    assert not startup._blocks_already_registered()  # created, none registered yet
    db.execute("INSERT INTO block_type VALUES ('x')")
    db.commit()
    db.close()
    assert startup._blocks_already_registered()
    monkeypatch.setenv("PREFECT_API_DATABASE_CONNECTION_URL", "postgresql+asyncpg://elsewhere/prefect")
    assert not startup._blocks_already_registered()  # another database: left to Prefect
    monkeypatch.delenv("PREFECT_API_DATABASE_CONNECTION_URL")
    (tmp_path / "home" / "profiles.toml").write_text(
        'active = "pg"\n[profiles.pg]\nPREFECT_SERVER_DATABASE_CONNECTION_URL = "postgresql+asyncpg://x/y"\n')
    assert not startup._blocks_already_registered()


@pytest.mark.slow
def test_a_server_already_running_at_the_default_address_is_used(
    prefect_server: PrefectServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from shardflow.flows.build import build_dataset

    _no_prefect_env(monkeypatch, tmp_path / "home")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(startup, "LOCAL_SERVER", prefect_server.api_url)

    def no_server():  # this process as the command line sees it with no PREFECT_API_URL
        return temporary_settings(restore_defaults={PREFECT_API_URL}, updates={"server.ephemeral.enabled": True})

    with no_server():
        early = startup.start_early()
    assert early is not None and early.process is None and early.url == prefect_server.api_url

    monkeypatch.setenv(startup.REUSE_ENV, "0")  # ... unless turned off: then a temporary server is launched
    with no_server():
        other = startup.start_early()
    assert other is not None and other.process is not None
    other.stop(quiet=True)
    assert other.process is None

    with no_server(), early.serve() as used:
        assert used
        ref = build_dataset(config=BuildConfig(name="reused", sources=(str(SAMPLE),)), workers=2,
                            data_root=str(tmp_path / "data"), catalog=str(tmp_path / "cat"))
    assert ref == "reused@v1"
    runs = prefect_server.flow_runs("build reused")
    assert len(runs) == 1  # the run is on the running server, where its UI shows it


def test_a_wrong_guess_only_stops_the_extra_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Prefect's own settings decide: with a server configured there, the early one is stopped unused."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    _no_prefect_env(monkeypatch, tmp_path / "home")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(startup.REUSE_ENV, "0")
    with temporary_settings(restore_defaults={PREFECT_API_URL}, updates={"server.ephemeral.enabled": True}):
        early = startup.start_early()
    assert early is not None and early.process is not None
    process = early.process
    with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
        with early.serve() as used:
            assert not used
    assert early.process is None and process.poll() is not None


def test_the_server_is_launched_before_parsing_only_for_a_build_that_runs_its_flow_here(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``main`` launches it from the words alone, before the parser's imports (numpy, the targets)."""
    from shardflow.flows import cli

    launched: list[bool] = []
    monkeypatch.setattr(startup, "start_early", lambda: launched.append(True) or "server")
    build = ["build", "corpus/", "--name", "x"]
    assert cli._start_server_first(build) == "server"
    assert cli._start_server_first([*build, "--runner", "threads"]) == "server"
    for words in ([*build, "--no-prefect"], [*build, "--runner", "dask", "--address", "tcp://h:8786"],
                  [*build, "--runner=dask"], ["build", "--help"], ["serve", "--schedules", "s.yaml"],
                  ["validate", "x@v1"], []):
        assert cli._start_server_first(words) is None, words
    assert len(launched) == 2


def _processes_with(home: Path) -> list[int]:
    """Processes whose environment names this PREFECT_HOME (the temporary server's, while it runs)."""
    needle = f"PREFECT_HOME={home}".encode()
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if needle in (proc / "environ").read_bytes().split(b"\0"):
                    found.append(int(proc.name))
            except OSError:
                pass
    return found


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="reads /proc")
@pytest.mark.parametrize("bad", [["--workers", "0"], ["--progress", "sideways"], ["--format", "zip"]])
def test_an_invalid_option_stops_the_server_launched_before_it_was_read(tmp_path: Path, bad: list[str]) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    home = tmp_path / "home"
    env.update(PREFECT_HOME=str(home), SHARDFLOW_REUSE_LOCAL_SERVER="0", CI="true")
    res = run_cli(["build", str(SAMPLE), "--name", "bad", *bad], env, tmp_path)
    assert res.returncode == 2, res.stderr[-3000:]
    assert "Traceback" not in res.stderr
    assert re.search(r"--workers must be at least 1|invalid choice: 'sideways'|zip", res.stderr), res.stderr[-2000:]
    assert _processes_with(home) == []  # the server launched first is stopped with the command
    assert not (tmp_path / "data").exists()  # nothing written


@pytest.mark.slow
def test_the_flow_waits_for_the_command_lines_warm_up_right_before_planning(
    prefect_api: PrefectServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The command line creates the flow run while its warm-up still hashes the inputs; the flow's
    plan task starts only after it (so the tokenizer is loaded and the inputs hashed once)."""
    from shardflow.flows.build import build_dataset

    config = BuildConfig(name="warmed", sources=(str(SAMPLE),))
    events: list[str] = []
    warming = startup.warm_up(config, str(tmp_path / "data"))
    real_wait = warming.wait

    def wait() -> None:
        events.append("wait")
        real_wait()

    monkeypatch.setattr(warming, "wait", wait)
    import shardflow.tasks.build as task_module

    real_plan = task_module.core.plan_build

    def plan(*args, **kwargs):
        events.append("plan")
        return real_plan(*args, **kwargs)

    monkeypatch.setattr(task_module.core, "plan_build", plan)  # what the plan task calls
    ref = build_dataset(config=config, workers=2, data_root=str(tmp_path / "data"), catalog=str(tmp_path / "cat"))
    assert ref == "warmed@v1"
    assert events == ["wait", "plan"]
    assert startup._pending is None  # consumed: a later flow run in this process does not wait on it
    startup.wait_for_warm_up()  # nothing pending: returns at once


def test_a_flow_already_waiting_for_the_warm_up_gets_no_head_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where hashing the inputs outlasts Prefect's start-up, the flow plans and tokenizes at once itself."""
    import threading

    import shardflow.sources as sources

    gate = threading.Event()
    real = sources.fingerprint_inputs

    def slow(*args, **kwargs):
        gate.wait(30)
        return real(*args, **kwargs)

    monkeypatch.setattr(sources, "fingerprint_inputs", slow)
    config = BuildConfig(name="waiting", sources=(str(SAMPLE),), unit_bytes=20_000)
    warming = startup.warm_up(config, str(tmp_path / "data"), catalog=str(tmp_path / "cat"), workers=2)
    flow = threading.Thread(target=startup.wait_for_warm_up)
    flow.start()
    while not warming._flow_waiting:
        flow.join(0.001)
    gate.set()
    flow.join(30)
    warming.join()
    assert warming.head_start is None
    warming.close()

    # Not waiting yet: the head start begins.
    warming = startup.warm_up(config, str(tmp_path / "data"), catalog=str(tmp_path / "cat"), workers=2)
    try:
        warming.join()
        assert warming.head_start is not None
    finally:
        warming.close()
    startup.wait_for_warm_up()
