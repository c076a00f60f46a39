"""Deployments the Prefect way: the repository's ``prefect.yaml``, deployed with ``prefect deploy`` to a
loopback server, run by a process work pool's ``prefect worker start``.

The end-to-end test deploys the real file from the repository root (Prefect's project layout), with only its
paths (``data_root``, ``catalog``) moved to a temporary directory, asks the server for the run that the
file's cron schedule made due (a backfill of that schedule: a run scheduled in the past is due now), starts
the installed-package deployment by hand, and lets one ``--run-once`` worker run both.
"""

from __future__ import annotations

import datetime
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from support.paths import PYTHON, REPO
from support.prefect import PrefectServer
from support.processes import stop_group

PREFECT_YAML = REPO / "prefect.yaml"
POOL = "shardflow"


def _load() -> dict[str, Any]:
    return yaml.safe_load(PREFECT_YAML.read_text())


def _deployments() -> dict[str, dict[str, Any]]:
    return {d["name"]: d for d in _load()["deployments"]}


def test_prefect_yaml_declares_the_sample_build_from_the_repository_and_from_the_package() -> None:
    from shardflow.config import BuildConfig

    deployments = _deployments()
    assert set(deployments) == {"sample", "sample-installed"}
    for dep in deployments.values():
        config = BuildConfig.from_dict(dep["parameters"]["config"])
        assert (config.name, config.sources, config.shard_tokens) == ("sample", ("tests/assets/sample.parquet",), 50000)
        assert all((REPO / s).is_file() for s in config.sources)  # relative to the pull step's directory
        assert dep["work_pool"]["name"] == POOL
    # The repository's entrypoint is a file of the project; the installed one a module path (no colon).
    path, func = deployments["sample"]["entrypoint"].split(":")
    assert (REPO / path).is_file() and func == "build_dataset"
    assert deployments["sample-installed"]["entrypoint"] == "shardflow.flows.build.build_dataset"
    (schedule,) = deployments["sample"]["schedules"]
    assert schedule["cron"] == "0 2 * * *" and schedule["timezone"] == "UTC"
    assert "schedules" not in deployments["sample-installed"]  # one nightly build of the sample, not two


@pytest.mark.slow
def test_prefect_makes_the_deployment_parameters_a_build_config() -> None:
    """What Prefect does with a flow run's parameters before the flow runs: the flow's annotations decide."""
    from shardflow.config import BuildConfig
    from shardflow.flows.build import build_dataset

    for dep in _deployments().values():
        params = build_dataset.validate_parameters(dep["parameters"])
        assert isinstance(params["config"], BuildConfig)
        assert params["config"] == BuildConfig.from_dict(dep["parameters"]["config"])
        assert (params["data_root"], params["catalog"], params["workers"]) == ("data", "manifests", 2)


def _prefect(args: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> str:
    res = subprocess.run([PYTHON, "-m", "prefect", *args], env=env, cwd=cwd, capture_output=True, text=True,
                         timeout=timeout, check=False)
    assert res.returncode == 0, f"prefect {' '.join(args)} exited {res.returncode}:\n{res.stdout[-3000:]}\n{res.stderr[-3000:]}"
    return res.stdout


@pytest.mark.slow
def test_prefect_deploy_then_a_process_worker_runs_the_scheduled_build(
    prefect_api: PrefectServer, tmp_path: Path
) -> None:
    prefect_server = prefect_api  # (this process's client reads the artifacts from it too)
    # The real file, with its output paths moved here: nothing else is changed.
    doc = _load()
    roots: dict[str, Path] = {}
    for dep in doc["deployments"]:
        roots[dep["name"]] = tmp_path / dep["name"]
        dep["parameters"] = {**dep["parameters"], "data_root": str(roots[dep["name"]] / "data"),
                             "catalog": str(roots[dep["name"]] / "manifests")}
    prefect_file = tmp_path / "prefect.yaml"
    prefect_file.write_text(yaml.safe_dump(doc, sort_keys=False))

    env = {**prefect_server.env, "DO_NOT_TRACK": "1"}
    _prefect(["work-pool", "create", POOL, "--type", "process"], env, REPO)
    # From the repository root, as Prefect's project layout expects: the build step records it, the pull step
    # returns to it, and flows/build.py is found from it.
    _prefect(["--no-prompt", "deploy", "--all", "--prefect-file", str(prefect_file)], env, REPO, timeout=180)

    dep = prefect_server.request("GET", "/deployments/name/build-dataset/sample")
    assert dep["pull_steps"] == [{"prefect.deployments.steps.set_working_directory": {"directory": str(REPO)}}]
    assert dep["parameters"]["data_root"] == str(roots["sample"] / "data")
    assert dep["work_pool_name"] == POOL and dep["entrypoint"] == "flows/build.py:build_dataset"
    (schedule,) = dep["schedules"]
    assert schedule["schedule"]["cron"] == "0 2 * * *" and schedule["active"] is True

    # The schedule's latest occurrence, a run scheduled in the past: due now, as a missed nightly run is.
    now = datetime.datetime.now(datetime.timezone.utc)
    prefect_server.request("POST", f"/deployments/{dep['id']}/schedule", {
        "start_time": (now - datetime.timedelta(days=1)).isoformat(), "end_time": now.isoformat(),
        "min_runs": 1, "max_runs": 1,
    })
    (scheduled,) = prefect_server.request("POST", "/flow_runs/filter", {
        "deployments": {"id": {"any_": [dep["id"]]}},
        "flow_runs": {"expected_start_time": {"before_": now.isoformat()}},
    })
    assert scheduled["auto_scheduled"] is True and scheduled["state"]["type"] == "SCHEDULED"
    assert scheduled["expected_start_time"].endswith("T02:00:00Z")
    # The installed package's deployment, started by hand.
    out = _prefect(["deployment", "run", "build-dataset/sample-installed"], env, tmp_path)
    by_hand = re.search(r"UUID: ([0-9a-f-]{36})", out).group(1)  # type: ignore[union-attr]

    log = tmp_path / "worker.log"
    with open(log, "wb") as sink:
        worker = subprocess.Popen(
            [PYTHON, "-m", "prefect", "worker", "start", "--pool", POOL, "--run-once"],
            cwd=tmp_path, env=env, stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
        )
    try:
        try:
            worker.wait(timeout=300)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker did not finish its runs in 300 s:\n{log.read_text()[-3000:]}")
        assert worker.returncode == 0, log.read_text()[-3000:]
        text = log.read_text()
        assert "Traceback" not in text and "| ERROR" not in text, text[-3000:]  # a successful build says no error
        for name, run_id in (("sample", scheduled["id"]), ("sample-installed", by_hand)):
            run = prefect_server.wait_flow_run(run_id, timeout=60)
            assert run["state"]["type"] == "COMPLETED", f"{name}: {run['state']}\n{log.read_text()[-3000:]}"
            assert run["name"] == "build sample"
            assert "dataset:sample" in run["tags"]
            _assert_published(roots[name], run_id)
    finally:
        if worker.poll() is None:
            stop_group(worker)


def _assert_published(root: Path, flow_run_id: str) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    from shardflow.catalog import Catalog

    catalog = Catalog(root / "manifests")
    assert catalog.latest("sample") == "v1"
    assert (catalog.resolve("sample@v1") / "metadata.yaml").is_file()
    assert catalog.resolve("sample@v1").is_relative_to(root / "data")
    with get_client(sync_client=True) as client:
        arts = client.read_artifacts(artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run_id])))
    assert {a.key for a in arts} >= {"sample-summary", "sample-card"}
