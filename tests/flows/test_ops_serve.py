"""``shardflow serve``: one dataset's cron-scheduled deployment registered on a real server, a run started by
hand with ``prefect deployment run`` executed by the serving process, and the deployment run again from another
working directory (its module entrypoint and absolute places, the way any process that runs it finds them)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from support.paths import PYTHON, SHARDFLOW
from support.prefect import PrefectServer


@pytest.mark.slow
def test_serve_registers_a_cron_deployment_and_runs_a_manual_run(
    prefect_api: PrefectServer, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefect_server = prefect_api  # (this process runs the deployment too, from another directory)
    parts = sorted(corpus.glob("*.parquet"))
    (tmp_path / "corpus").mkdir()  # a relative source, made absolute; its last file comes later
    for part in parts[:-1]:
        (tmp_path / "corpus" / part.name).symlink_to(part)
    env = {k: v for k, v in prefect_server.env.items() if k not in ("SHARDFLOW_DATA_ROOT", "SHARDFLOW_CATALOG")}
    env = {**env, "PREFECT_RUNNER_POLL_FREQUENCY": "1", "CI": "true"}
    log = tmp_path / "serve.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [*SHARDFLOW, "serve", "corpus/", "--name", "nightly-ops", "--cron", "0 2 * * *", "--timezone", "UTC",
             "--shard-tokens", "300000", "--val-fraction", "0.1", "--data-root", "out/data"],  # the catalog: ./manifests
            # faulthandler: a SIGABRT (below) prints every thread's stack, should it not stop on SIGINT.
            cwd=tmp_path, env={**env, "PYTHONFAULTHANDLER": "1"}, stdout=out, stderr=subprocess.STDOUT,
            start_new_session=True,
            # A shell's background job (`.ci/run &`) starts with SIGINT ignored, and children inherit that:
            # Python then never raises KeyboardInterrupt, so serve would not stop. Ctrl-C's default, as a user has it.
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                dep = prefect_server.request("GET", "/deployments/name/build-dataset/nightly-ops")
                break
            except Exception:
                assert proc.poll() is None, log.read_text()[-3000:]
                assert time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.5)
        (schedule,) = dep["schedules"]
        assert schedule["schedule"]["cron"] == "0 2 * * *" and schedule["schedule"]["timezone"] == "UTC"
        assert schedule["active"] is True
        assert set(dep["tags"]) == {"shardflow", "dataset:nightly-ops"}
        params = dep["parameters"]
        assert params["config"]["name"] == "nightly-ops" and params["config"]["shard_tokens"] == 300000
        assert params["config"]["sources"] == [str(tmp_path / "corpus")]
        assert params["data_root"] == str(tmp_path / "out" / "data")
        assert params["catalog"] == str(tmp_path / "manifests")  # the default, resolved where serve started
        assert dep["entrypoint"] == "shardflow.flows.build.build_dataset"  # the installed module, not a path

        # Started by hand, the way docs/OPERATIONS.md says.
        res = subprocess.run(
            [PYTHON, "-m", "prefect", "deployment", "run", "build-dataset/nightly-ops"],
            env=env, capture_output=True, text=True, timeout=60,
        )
        assert res.returncode == 0, res.stdout + res.stderr
        flow_run_id = re.search(r"UUID: ([0-9a-f-]{36})", res.stdout).group(1)  # type: ignore[union-attr]
        run = prefect_server.wait_flow_run(flow_run_id, timeout=120)
        assert run["state"]["type"] == "COMPLETED", log.read_text()[-3000:]
        assert run["name"] == "build nightly-ops"
        assert {"shardflow", "dataset:nightly-ops"} <= set(run["tags"])
        assert (tmp_path / "out" / "data" / "nightly-ops" / "v1" / "metadata.yaml").exists()
        arts = prefect_server.request("POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [flow_run_id]}}})
        assert {a["key"] for a in arts} >= {"nightly-ops-summary", "nightly-ops-card"}
        tasks = prefect_server.request("POST", "/task_runs/filter",
                                       {"flow_runs": {"id": {"any_": [flow_run_id]}}, "limit": 200})
        assert {t["name"] for t in tasks} >= {"plan nightly-ops", "publish nightly-ops"}

        # The deployment as registered, run from another directory (as a worker or another machine's process
        # would): its entrypoint imports from anywhere, and it publishes into the same data root and catalog.
        from prefect.flows import load_flow_from_entrypoint

        from shardflow.catalog import Catalog

        (tmp_path / "elsewhere").mkdir()
        monkeypatch.chdir(tmp_path / "elsewhere")
        (tmp_path / "corpus" / parts[-1].name).symlink_to(parts[-1])
        flow = load_flow_from_entrypoint(dep["entrypoint"])
        result = flow(**flow.validate_parameters(dep["parameters"]))
        assert (result.ref, result.created) == ("nightly-ops@v2", True)
        assert result.manifest_path == str(tmp_path / "out" / "data" / "nightly-ops" / "v2" / "metadata.yaml")
        assert [v.version for v in Catalog(tmp_path / "manifests").versions("nightly-ops")] == ["v1", "v2"]
        assert list((tmp_path / "elsewhere").iterdir()) == []
    finally:
        os.killpg(proc.pid, signal.SIGINT)
        try:
            # Generous: on a loaded machine (CI's 2 cores) Prefect's shutdown, which pauses the schedule
            # through the API, took longer than 30 s once.
            proc.wait(timeout=90)
            interrupted = True
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGABRT)  # its stacks into the log, to say what it waited for
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            interrupted = False
    assert interrupted, "shardflow serve did not stop within 90 s of SIGINT:\n" + log.read_text()[-12000:]
    # On shutdown the served deployment's schedule is paused (Prefect's serve default).
    dep = prefect_server.request("GET", "/deployments/name/build-dataset/nightly-ops")
    assert dep["paused"] is True or dep["schedules"][0]["active"] is False, log.read_text()[-3000:]
