"""Task runs carry the dataset's tags only where a tag concurrency limit names one (``flows/task_tags.py``).

Against the session's real Prefect server: with no limit, the flow run is
tagged and its task runs are not (so Prefect asks the server for no slot per
task run); with a ``tag:dataset:<name>`` limit, every task run carries the
tags and the limit holds them; with no server to ask, the tags are kept.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from shardflow.flows.build import build_dataset
from shardflow.flows.task_tags import limited_tags
from shardflow.config import BuildConfig

from ops_support import PrefectServer, free_port


def _runs(server: PrefectServer, name: str, timeout: float = 20) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The flow run ``build NAME`` and its task runs, once every task run reached a final state."""
    deadline = time.monotonic() + timeout
    while True:
        run = server.flow_runs(f"build {name}")[0]
        tasks = server.request("POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [run["id"]]}}, "limit": 200})
        final = bool(tasks) and all(t["state"] and t["state"]["type"] == "COMPLETED" for t in tasks)
        if final or time.monotonic() > deadline:
            return run, tasks
        time.sleep(0.2)


@pytest.mark.slow
def test_task_runs_are_tagged_only_when_a_tag_concurrency_limit_exists(
    prefect_api: PrefectServer, corpus: Path, tmp_path: Path
) -> None:
    server = prefect_api
    root = dict(data_root=str(tmp_path / "data"), catalog=str(tmp_path / "cat"))

    free = "tags-free"
    assert build_dataset(config=BuildConfig(name=free, sources=(str(corpus),)), workers=2, **root) == f"{free}@v1"
    run, tasks = _runs(server, free)
    assert {"shardflow", f"dataset:{free}"} <= set(run["tags"])
    assert len(tasks) >= 8 and all(t["state"]["type"] == "COMPLETED" for t in tasks)
    assert [t["tags"] for t in tasks if t["tags"]] == []

    limited = "tags-limited"
    limit = server.request("POST", "/v2/concurrency_limits/", {"name": f"tag:dataset:{limited}", "limit": 1})
    try:
        assert limited_tags(["shardflow", f"dataset:{limited}", f"dataset:{free}"]) == [f"dataset:{limited}"]
        ref = build_dataset(config=BuildConfig(name=limited, sources=(str(corpus),)), workers=2, **root)
        assert ref == f"{limited}@v1"
        run, tasks = _runs(server, limited)
        assert len(tasks) >= 8
        for t in tasks:
            assert {"shardflow", f"dataset:{limited}"} <= set(t["tags"]), t["name"]
            assert t["state"]["type"] == "COMPLETED", t["name"]
        # The limit of 1 held the work units to one at a time: no two tokenize runs overlapped.
        spans = sorted((t["start_time"], t["end_time"]) for t in tasks if t["name"].startswith("tokenize "))
        assert len(spans) == 4
        assert all(prev[1] <= nxt[0] for prev, nxt in zip(spans, spans[1:])), spans
    finally:
        server.request("DELETE", f"/v2/concurrency_limits/{limit['id']}")


@pytest.mark.slow
def test_with_no_server_to_ask_the_tags_are_kept(tmp_path: Path) -> None:
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: f"http://127.0.0.1:{free_port()}/api"}):
        assert limited_tags(["shardflow"]) is None
