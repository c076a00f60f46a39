"""The flow draws the statistics and the dataset card beside the shard tasks, as a task run of its own.

Against the session's real Prefect server, on real Parquet inputs: the
``stats-card`` task is held at its first plot (the ``wait`` fault), and every
shard is still written and validated meanwhile, with ``--workers 1``: it
takes none of the workers' slots. Nothing is finalized before it ends; the
published version's card is as before, and the run's three artifacts list the
summary, card and progress bar in that order, as the UIs sort them (by id).
"""

from __future__ import annotations

import contextvars
import json
import threading
import time
from pathlib import Path

import pytest

from shardflow.flows.build import build_dataset
from shardflow.flows.report import ARTIFACT_ORDER, artifact_key, in_place, placed
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
    # default, ID_DESC), ui-v2 with ID_DESC. Summary, card, progress, whatever ids the server drew.
    (flow_run,) = prefect_api.flow_runs(f"build {name}")
    query = {"artifacts": {"flow_run_id": {"any_": [flow_run["id"]]}, "type": {"not_any_": ["result"]}}}
    for sort in ({}, {"sort": "ID_DESC"}):
        arts = prefect_api.request("POST", "/artifacts/filter", {**query, **sort})
        assert [a["key"] for a in arts] == [artifact_key(name, kind) for kind in ARTIFACT_ORDER], arts
    # No image artifact: the UI prints an image artifact's whole data: URL; markdown shows the picture.
    assert {a["type"] for a in arts} == {"markdown", "progress"}
    card_md = next(a for a in arts if a["key"] == artifact_key(name, "card"))["data"]
    assert card_md.count("](data:image/png;base64,") == 3  # the card's three plots, inlined


def test_an_id_in_its_kinds_band_sorts_as_artifact_order_says_whatever_ids_the_others_drew() -> None:
    """The server's SQLite column orders ids as hyphenated lowercase hex text, PostgreSQL as 16 bytes: one
    order; the bands put each kind in its place, and a kind lands in its band within the tries."""
    import random
    import uuid

    rng = random.Random(44)
    ids = [uuid.UUID(int=rng.getrandbits(128), version=4) for _ in range(3000)]

    def fresh() -> uuid.UUID | str:  # what the server gives: a new random id (as a UUID or its text)
        u = uuid.UUID(int=rng.getrandbits(128), version=4)
        return u if rng.random() < 0.5 else str(u)

    assert sorted(ids, key=str, reverse=True) == sorted(ids, key=lambda u: u.bytes, reverse=True)
    assert ARTIFACT_ORDER == ("summary", "card", "progress")
    # Every id is in exactly one kind's band, the bands in ARTIFACT_ORDER as the ids descend.
    for u in ids:
        assert sum(in_place(u, kind) for kind in ARTIFACT_ORDER) == 1
    assert in_place(uuid.UUID(int=2**128 - 1), "summary") and in_place(uuid.UUID(int=0), "progress")
    assert in_place(str(uuid.UUID(int=2**128 // 3 + 1)), "card") and in_place(uuid.UUID(int=2**128 // 3 - 1), "progress")
    # Runs whose artifacts are made in any order, each placed: the page (id descending) lists ARTIFACT_ORDER.
    tries = []
    for _ in range(300):
        made = {}
        for kind in rng.sample(ARTIFACT_ORDER, 3):
            made[kind], replaced = placed(fresh, kind)
            tries.append(len(replaced) + 1)
            assert all(not in_place(r, kind) for r in replaced)
        page = sorted(made, key=lambda k: uuid.UUID(str(made[k])).int, reverse=True)
        assert tuple(page) == ARTIFACT_ORDER
    assert 2.5 < sum(tries) / len(tries) < 3.5  # one in three each try
    # Past its tries, the last id is kept (an order is a convenience, a build never fails for it).
    never = uuid.UUID(int=0)
    assert placed(lambda: never, "summary", tries=5) == (never, [never] * 5)
