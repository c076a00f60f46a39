"""The server ``shardflow build`` runs its flow on (flows/server.py): a temporary one that fails is one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

SAMPLE = Path(__file__).resolve().parents[1] / "assets" / "sample.parquet"


def _env(tmp_path: Path, **values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "SHARDFLOW_"))}
    env.update(PREFECT_HOME=str(tmp_path / "home"), SHARDFLOW_REUSE_LOCAL_SERVER="0", CI="true", **values)
    return env


@pytest.mark.slow
def test_a_temporary_server_that_fails_to_start_is_reported_at_once_with_its_own_error(tmp_path: Path) -> None:
    """Its database cannot be opened: the server's own error, in one line, as soon as it exits (not after the
    startup timeout), and nothing is published."""
    env = _env(tmp_path, PREFECT_SERVER_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{tmp_path}/no/such/dir/x.db",
               PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="600")
    proc = subprocess.run(
        [sys.executable, "-m", "shardflow", "build", str(SAMPLE), "--name", "s", "--data-root",
         str(tmp_path / "data"), "--catalog", str(tmp_path / "cat")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300,
    )
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("shardflow: error:")]
    assert len(errors) == 1, proc.stderr[-2000:]
    assert "temporary server exited while starting" in errors[0] and "unable to open database file" in errors[0]
    assert "Traceback" not in proc.stderr and proc.stdout == ""
    from shardflow.catalog import Catalog

    assert Catalog(tmp_path / "cat").datasets() == [] and not (tmp_path / "data" / "s" / "v1").exists()


def test_a_configured_server_is_left_to_prefect_and_a_closed_port_is_not_a_server(monkeypatch) -> None:
    from shardflow.flows import server

    assert server.running_server("http://127.0.0.1:9/api") is False
    monkeypatch.setenv("PREFECT_API_URL", "http://127.0.0.1:9/api")
    if "prefect.settings" in sys.modules:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: "http://127.0.0.1:9/api"}):
            assert server.start_server() is None
    else:
        assert server.start_server() is None


class _Server:
    """The one thing ``build_until_answered`` asks of a server: whether it answers yet."""

    def __init__(self, answers_after: int) -> None:
        self.calls, self.answers_after = 0, answers_after

    def answering(self) -> bool:
        self.calls += 1
        return self.calls > self.answers_after


@pytest.mark.parametrize("answers_after", [0, 10_000])
def test_the_build_started_while_the_server_starts_is_resumed_to_the_same_bytes(tmp_path: Path, answers_after: int):
    """Units tokenized before the server answers are committed and kept; the lock is released; the rest of
    the build (here the core's own) gives the bytes of a build that never waited."""
    from shardflow import BuildConfig
    from shardflow.pipeline import BuildRequest, build, plan_build
    from shardflow.pipeline.tokenize import unit_done
    from shardflow.flows.server import build_until_answered

    config = BuildConfig(name="early", sources=(str(SAMPLE),), unit_bytes=20_000, shard_tokens=40_000)
    where = dict(data_root=str(tmp_path / "data"), catalog=str(tmp_path / "cat"))
    build_until_answered(_Server(answers_after), BuildRequest(config=config, workers=2, **where))
    plan = plan_build(config, **where)
    done = [unit_done(plan, u) is not None for u in range(len(plan.units))]
    assert len(done) == 4 and done == [answers_after > 0] * 4  # all of them, or none if it answered at once
    assert not (tmp_path / "data" / "early" / "v1").exists()  # nothing published before the flow
    result = build(config, workers=2, **where)  # the lock was released
    reference = build(config, workers=1, data_root=str(tmp_path / "ref"), catalog=str(tmp_path / "refcat"))
    ours, theirs = Path(result.manifest_path).parent, Path(reference.manifest_path).parent
    shards = sorted(p.relative_to(ours) for p in ours.rglob("*.bin"))
    assert shards and all((ours / p).read_bytes() == (theirs / p).read_bytes() for p in shards)
