"""The stats-card stage: statistics and the card's plots drawn beside the shard jobs, crash-safe, finalize's check.

Real builds of the bundled sample (split into four Parquet files) with a small
``.tiktoken`` vocabulary; kills are real SIGKILLs of a ``shardflow build``
subprocess at the ``card-plot`` fault point.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest
from support.builds import fault_options, versions
from support.cli import build_cli, killed
from support.corpus import small_vocab, split_sample

from shardflow.pipeline import STAGES, build, build_lock, finalize, plan_build, publish, run_stages
from shardflow.pipeline.card_stage import card_done
from shardflow.pipeline.staging import Staging
from shardflow.config import BuildConfig
from shardflow.faults import RELEASE_ENV, reset
from shardflow.manifest import read_manifest

NAME = "cards"
PNGS = ["lengths.png", "shard_fill.png", "tokens_by_source.png"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    base = tmp_path_factory.mktemp("card-corpus")
    return split_sample(base / "src"), fault_options(small_vocab(base))


@pytest.fixture(scope="module")
def reference(corpus, tmp_path_factory) -> Path:
    """An uninterrupted build's version directory."""
    src, options = corpus
    root = tmp_path_factory.mktemp("card-ref")
    proc = build_cli(src, root, NAME, options)
    assert proc.returncode == 0, proc.stderr
    return root / "data" / NAME / "v1"


def _card_files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((directory / "card").iterdir())}


def _config(src: Path, options: dict, **extra) -> BuildConfig:
    return BuildConfig(name=NAME, sources=(str(src),), **options, **extra)


def _run_until_finalize(plan) -> dict:
    """Every stage before ``validate``, in place (no background runner), on this thread."""
    done: dict = {}
    for s in STAGES:
        if s.name == "validate":
            return done
        if s.when(plan):
            done[s.name] = [s(plan, *job) for job in s.jobs(plan, done)]
    raise AssertionError("no validate stage")


@pytest.mark.slow
def test_the_card_is_drawn_while_the_shards_are_written_and_without_a_worker_slot(corpus, reference, tmp_path, monkeypatch):
    """One worker; the card's drawing blocked at its first plot: every shard is still written and validated."""
    src, options = corpus
    release = tmp_path / "release"
    monkeypatch.setenv("SHARDFLOW_FAULT", "wait:card-plot")
    monkeypatch.setenv(RELEASE_ENV, str(release))
    reset()
    result: dict = {}
    config = _config(src, options)
    worker = threading.Thread(
        target=lambda: result.update(r=build(config, data_root=tmp_path / "data", catalog=tmp_path / "cat", workers=1))
    )
    worker.start()
    try:
        deadline = time.monotonic() + 60
        while not list(tmp_path.glob("release.reached-*")) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert list(tmp_path.glob("release.reached-*")), "the card's first plot was never reached"
        staging = Staging(next(p for p in (tmp_path / "data" / NAME / ".staging").iterdir() if p.is_dir()))
        layout = json.loads(staging.layout_file.read_text())
        nshards = sum(s["shards"] for s in layout["splits"].values())
        # The one worker slot is free: the shards get written and checked while the card waits.
        while len(list(staging.layout_dir.glob("*.valid.json"))) < nshards and time.monotonic() < deadline:
            time.sleep(0.02)
        assert len(list(staging.layout_dir.glob("*.valid.json"))) == nshards
        assert (staging.out / "stats.json").is_file()  # merged before the plots, from the layout
        time.sleep(0.2)
        # ... and nothing is finalized or published before the card is complete.
        assert not staging.card_file.exists() and not (staging.out / "metadata.yaml").exists()
        assert versions(tmp_path, NAME) == [] and worker.is_alive()
    finally:
        release.touch()
        worker.join(60)
    assert result["r"].ref == f"{NAME}@v1"
    directory = Path(result["r"].manifest_path).parent
    # The same statistics and card as the reference build's (2 workers, no waiting): the same bytes.
    assert _card_files(directory) == _card_files(reference)
    for name in ("stats.json", "stats.vocab.npy"):
        assert (directory / name).read_bytes() == (reference / name).read_bytes()


@pytest.mark.slow
def test_a_build_killed_while_drawing_the_card_resumes_to_the_same_card(corpus, reference, tmp_path):
    src, options = corpus
    proc = build_cli(src, tmp_path, NAME, options, fault="card-plot:2")
    assert killed(proc), proc.stderr[-2000:]
    staging = Staging(next(p for p in (tmp_path / "data" / NAME / ".staging").iterdir() if p.is_dir()))
    # Killed after the second plot: no marker, nothing finalized or published.
    assert sorted(p.name for p in (staging.out / "card").glob("*.png")) == ["lengths.png", "tokens_by_source.png"]
    assert not staging.card_file.exists() and not (staging.out / "metadata.yaml").exists()
    assert versions(tmp_path, NAME) == []
    again = build_cli(src, tmp_path, NAME, options)
    assert again.returncode == 0, again.stderr
    directory = tmp_path / "data" / NAME / "v1"
    assert sorted(_card_files(directory)) == ["README.md", *PNGS]
    assert _card_files(directory) == _card_files(reference)


@pytest.mark.slow
def test_finalize_redraws_a_card_that_is_incomplete_or_damaged(corpus, reference, tmp_path):
    src, options = corpus
    plan = plan_build(_config(src, options), data_root=tmp_path / "data", catalog=tmp_path / "cat")
    with build_lock(plan) as plan:
        done = _run_until_finalize(plan)
        card = done["stats-card"][0]
        assert sorted(card.plots) == PNGS and card_done(plan) == card
        out = Staging(plan.staging).out
        (out / "card" / "shard_fill.png").unlink()  # a plot lost
        (out / "card" / "lengths.png").write_bytes(b"\x89PNG\r\n\x1a\n half-written")  # a plot damaged
        assert card_done(plan) is None
        manifest = finalize(plan)
        assert manifest.extra["stats"] == card.stats
        assert card_done(plan) == card  # drawn again, to the same bytes
        assert publish(plan) == f"{NAME}@v1"
    assert _card_files(tmp_path / "data" / NAME / "v1") == _card_files(reference)


@pytest.mark.slow
def test_a_card_recorded_under_other_settings_is_drawn_again(corpus, tmp_path):
    """The stage's record says the card was not wanted (as a staging directory of other settings would):
    it is not taken as done, and finalize draws the card."""
    import json

    src, options = corpus
    plan = plan_build(_config(src, options), data_root=tmp_path / "data", catalog=tmp_path / "cat")
    with build_lock(plan) as plan:
        done = _run_until_finalize(plan)
        assert sorted(done["stats-card"][0].plots) == PNGS
        marker = Staging(plan.staging).card_file
        record = json.loads(marker.read_text())
        marker.write_text(json.dumps({**record, "card": False}))
        assert card_done(plan) is None
        finalize(plan)
        assert publish(plan) == f"{NAME}@v1"
    card = tmp_path / "data" / NAME / "v1" / "card"
    assert sorted(p.name for p in card.iterdir()) == ["README.md", *PNGS]
    text = (card / "README.md").read_text()
    assert text.startswith(f"# Dataset card: {NAME}@v1\n") and all(f"]({png})" in text for png in PNGS)


@pytest.mark.slow
def test_an_incremental_card_is_drawn_from_the_final_statistics_with_the_parent(corpus, tmp_path):
    src, options = corpus
    first = tmp_path / "first"
    first.mkdir()
    for p in sorted(src.glob("*.parquet"))[:3]:
        (first / p.name).write_bytes(p.read_bytes())
    where = dict(data_root=tmp_path / "data", catalog=tmp_path / "cat")
    assert build(_config(first, options), **where, workers=2).ref == f"{NAME}@v1"
    last = sorted(src.glob("*.parquet"))[3]
    (first / last.name).write_bytes(last.read_bytes())
    plan = plan_build(_config(first, options), **where)
    assert plan.parent == f"{NAME}@v1" and plan.reuse is not None
    with build_lock(plan) as plan:
        done = _run_until_finalize(plan)
        card = done["stats-card"][0]
        assert sorted(card.plots) == sorted([*PNGS, "parent.png"]) and all(card.plots.values())
        manifest = finalize(plan)
        # The statistics the stage merged after the layout are the version's: the manifest names them.
        assert manifest.extra["stats"] == card.stats
        assert publish(plan) == f"{NAME}@v2"
    v2 = tmp_path / "data" / NAME / "v2"
    text = (v2 / "card" / "README.md").read_text()
    assert f"## Against the parent, {NAME}@v1" in text and f"| {last.name} | added |" in text and "](parent.png)" in text
    stats = json.loads((v2 / "stats.json").read_text())
    m2 = read_manifest(v2)
    assert stats["totals"]["documents"] == m2.totals["documents"] == 61
    assert [s for s in stats["splits"]["train"]["shards"]] == [s.tokens for s in m2.splits["train"].shards]
    # The same statistics as a full build of the four files.
    full = build(_config(first, options), data_root=tmp_path / "full", catalog=tmp_path / "cat-full", workers=1)
    full_dir = Path(full.manifest_path).parent
    for name in ("stats.json", "stats.vocab.npy"):
        assert (v2 / name).read_bytes() == (full_dir / name).read_bytes(), name


@pytest.mark.slow
def test_with_a_background_runner_the_stage_starts_after_the_layout_and_is_joined_before_validate(corpus, tmp_path):
    src, options = corpus
    plan = plan_build(_config(src, options), data_root=tmp_path / "data", catalog=tmp_path / "cat")
    events: list[str] = []

    def run_jobs(s, jobs):
        events.append(s.name)
        return [s(plan, *job) for job in jobs]

    def start_jobs(s, jobs):
        events.append(f"start {s.name}")

        def wait():
            events.append(f"join {s.name}")
            return [s(plan, *job) for job in jobs]

        return wait

    with build_lock(plan) as plan:
        done = run_stages(plan, run_jobs, start_jobs)
    assert done["publish"] == [f"{NAME}@v1"]
    assert events == ["tokenize-unit", "layout", "start stats-card", "write-shard", "join stats-card", "validate",
                      "publish"]
