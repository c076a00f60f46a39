"""The flow draws the statistics and the dataset card beside the shard tasks, as a task run of its own.

Against the session's real Prefect server, on real Parquet inputs: the
``stats-card`` task is held at its first plot (the ``wait`` fault), and every
shard is still written and validated meanwhile, with ``--workers 1``: it
takes none of the workers' slots. Nothing is finalized before it ends; the
published version's card is as before, and the run's three artifacts list the
summary first, as the UIs sort them (by id).
"""

from __future__ import annotations

import contextvars
import json
import threading
import time
from pathlib import Path

import pytest

from shardflow.flows.build import build_dataset
from shardflow.flows.report import ARTIFACT_ORDER, artifact_key, leads
from shardflow.pipeline.staging import Staging
from shardflow.catalog import Catalog
from shardflow.config import BuildConfig
from shardflow.faults import RELEASE_ENV, reset

from support.prefect import PrefectServer


def _task_runs(server: PrefectServer, name: str, timeout: float = 20) -> dict[str, dict]:
    deadline = time.monotonic() + timeout
    while True:
        run = server.flow_runs(f"build {name}")[0]
        tasks = server.request("POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [run["id"]]}}, "limit": 200})
        final = bool(tasks) and all(t["state"] and t["state"]["type"] == "COMPLETED" and t["end_time"] for t in tasks)
        if (final and run["state"]["type"] == "COMPLETED") or time.monotonic() > deadline:
            return {t["name"]: t for t in tasks}
        time.sleep(0.2)


@pytest.mark.slow
def test_the_flow_draws_the_card_beside_the_shard_tasks_in_a_task_run_of_its_own(
    prefect_api: PrefectServer, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    name = "flow-card"
    config = BuildConfig(name=name, sources=(str(corpus),), shard_tokens=100_000, val_fraction=0.1)
    where = dict(data_root=str(tmp_path / "data"), catalog=str(tmp_path / "cat"))
    release = tmp_path / "release"
    monkeypatch.setenv("SHARDFLOW_FAULT", "wait:card-plot")
    monkeypatch.setenv(RELEASE_ENV, str(release))
    reset()
    result: dict = {}
    # The flow on its own thread, in this context (the settings that point Prefect at the session's server).
    run = contextvars.copy_context().run
    worker = threading.Thread(target=run, args=(lambda: result.update(ref=build_dataset(config=config, workers=1, **where).ref),))
    worker.start()
    try:
        deadline = time.monotonic() + 90
        while not list(tmp_path.glob("release.reached-*")) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert list(tmp_path.glob("release.reached-*")), "the stats-card task never reached its first plot"
        staging = Staging(next(p for p in (tmp_path / "data" / name / ".staging").iterdir() if p.is_dir()))
        nshards = sum(s["shards"] for s in json.loads(staging.layout_file.read_text())["splits"].values())
        while len(list(staging.layout_dir.glob("*.valid.json"))) < nshards and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(list(staging.layout_dir.glob("*.valid.json"))) == nshards >= 2
        time.sleep(0.2)
        assert not staging.card_file.exists() and not (staging.out / "metadata.yaml").exists()
        assert worker.is_alive()
    finally:
        release.touch()
        worker.join(120)
    assert result["ref"] == f"{name}@v1"

    runs = _task_runs(prefect_api, name)
    card = runs[f"stats-card {name}"]
    final = runs[f"validate {name}"]
    writes = [t for n, t in runs.items() if n.startswith(f"write {name} ")]
    assert len(writes) == nshards
    # Started before the shards were written, ended before finalize started.
    assert card["start_time"] < max(t["end_time"] for t in writes)
    assert card["end_time"] <= final["start_time"]

    directory = Catalog(where["catalog"]).resolve(result["ref"])
    assert sorted(p.name for p in (directory / "card").iterdir()) == [
        "README.md", "lengths.png", "shard_fill.png", "tokens_by_source.png"]
    # The run's three artifacts as the UIs ask for them (prefect 3.9.1): the Vue UI with no sort (the server's
    # default, ID_DESC), ui-v2 with ID_DESC. The summary first, whatever ids the server drew.
    (flow_run,) = prefect_api.flow_runs(f"build {name}")
    query = {"artifacts": {"flow_run_id": {"any_": [flow_run["id"]]}, "type": {"not_any_": ["result"]}}}
    for sort in ({}, {"sort": "ID_DESC"}):
        arts = prefect_api.request("POST", "/artifacts/filter", {**query, **sort})
        assert [a["key"] for a in arts][0] == artifact_key(name, "summary"), [a["key"] for a in arts]
        assert sorted(a["key"] for a in arts) == sorted(artifact_key(name, kind) for kind in ARTIFACT_ORDER)
    # No image artifact: the UI prints an image artifact's whole data: URL; markdown shows the picture.
    assert {a["type"] for a in arts} == {"markdown", "progress"}
    card_md = next(a for a in arts if a["key"] == artifact_key(name, "card"))["data"]
    assert card_md.count("](data:image/png;base64,") == 3  # the card's three plots, inlined


def test_an_artifact_leads_when_its_id_is_the_greatest_as_the_server_orders_ids() -> None:
    """The server's SQLite column orders ids as hyphenated lowercase hex text, PostgreSQL as 16 bytes: one order."""
    import uuid

    ids = [uuid.uuid4() for _ in range(200)]
    as_text = sorted(ids, key=str, reverse=True)
    assert as_text == sorted(ids, key=lambda u: u.bytes, reverse=True)
    assert leads(as_text[0], as_text[1:]) and leads(str(as_text[0]), [str(i) for i in as_text[1:]])
    assert not leads(as_text[1], as_text[:1]) and leads(as_text[-1], [])
    assert ARTIFACT_ORDER == ("summary", "card", "progress")
