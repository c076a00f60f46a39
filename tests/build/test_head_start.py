"""A build's head start (build/head_start.py): units tokenized before the orchestrator asks, claimed once,
with the build's lock held and lent, its log lines handed to the claimant, and the same bytes in the end."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import pytest
from core_support import SAMPLE, files_of, write_parquet

from shardflow.build import build, plan_build, tokenize_unit
from shardflow.build.head_start import HEAD_START_ENV, HeadStart, head_start_owns, planned_by_head_start
from shardflow.build.staging import LENT_LOCKS, Staging, build_lock
from shardflow.build.tokenize import EARLY_UNITS, unit_done
from shardflow.catalog import file_lock
from shardflow.config import BuildConfig
from shardflow.errors import CatalogError, InputError


def _config(tmp_path: Path, **options) -> BuildConfig:
    return BuildConfig(name="hs", sources=(str(SAMPLE),), unit_bytes=20_000, **options)


def _roots(tmp_path: Path) -> dict:
    return dict(data_root=tmp_path / "data", catalog=tmp_path / "catalog")


@pytest.mark.slow
def test_a_head_start_and_its_build_give_the_bytes_of_a_build_without_one(tmp_path: Path) -> None:
    config = _config(tmp_path)
    plain = build(config, workers=2, **_roots(tmp_path / "plain"))
    with HeadStart.begin(config, workers=2, **_roots(tmp_path / "early")) as early:
        assert early is not None and len(early.plan.units) == 4  # one per row group
        result = build(config, workers=2, **_roots(tmp_path / "early"))  # claims what the head start took
        assert early.started >= 1
    assert result.ref == plain.ref == "hs@v1"
    assert files_of(Path(result.manifest_path).parent) == files_of(Path(plain.manifest_path).parent)


def _gate(monkeypatch: pytest.MonkeyPatch) -> threading.Event:
    """Hold the head start's units at their start until the returned event is set."""
    import shardflow.build.head_start as head_start_module

    gate = threading.Event()
    real = head_start_module.tokenize_unit_now

    def gated(plan, unit):
        gate.wait(30)
        return real(plan, unit)

    monkeypatch.setattr(head_start_module, "tokenize_unit_now", gated)
    return gate


def _wait_started(early: HeadStart, n: int) -> None:
    deadline = time.monotonic() + 30
    while early.started < n and time.monotonic() < deadline:
        time.sleep(0.001)
    assert early.started >= n


def test_the_first_claim_stops_new_units_and_a_unit_is_claimed_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gate = _gate(monkeypatch)
    config = _config(tmp_path)
    early = HeadStart.begin(config, workers=1, **_roots(tmp_path))
    assert early is not None
    try:
        total = len(early.plan.units)
        _wait_started(early, 1)
        claiming = threading.Timer(0.2, gate.set)  # unit 0 is still running when it is claimed
        claiming.start()
        first = early.claim(0)
        assert first is not None and first.unit == 0
        assert early.claim(0) is None  # once: the caller tokenizes it itself after that
    finally:
        gate.set()
        early.close()
    assert early.started == 1 < total  # the unit in flight when the claim came, nothing after
    staged = Staging(early.plan.staging)
    done = [u for u in range(total) if unit_done(early.plan, u) is not None]
    assert done == [0]  # what it took is committed (a rerun resumes from it), nothing else
    assert not list(staged.parts.glob(".*.tmp-*"))
    assert tokenize_unit(early.plan, 0) == first  # the same result, from disk


def test_the_lock_is_held_from_the_plan_to_close_and_lent_to_this_process(tmp_path: Path) -> None:
    config = _config(tmp_path)
    early = HeadStart.begin(config, workers=1, **_roots(tmp_path))
    assert early is not None
    lock_file = Staging(early.plan.staging).lock_file
    try:
        with pytest.raises(CatalogError, match="is locked by another process"):  # another process's view
            with file_lock(lock_file, timeout=0):
                pass
        with build_lock(plan_build(config, **_roots(tmp_path))) as plan:  # this process's build plans and locks
            assert plan.staging == early.plan.staging and not plan.existing
        # The flow's plan task takes the head start's plan for this very build, and only for it.
        assert planned_by_head_start(config, **_roots(tmp_path)) is early.plan
        assert planned_by_head_start(_config(tmp_path, seed=1), **_roots(tmp_path)) is None
        assert planned_by_head_start(config, **_roots(tmp_path / "elsewhere")) is None
    finally:
        early.close()
    assert planned_by_head_start(config, **_roots(tmp_path)) is None
    assert early.plan.staging not in LENT_LOCKS and early.plan.staging not in EARLY_UNITS
    with file_lock(lock_file, timeout=0):
        pass


def test_another_holder_of_the_lock_means_no_head_start(tmp_path: Path) -> None:
    config = _config(tmp_path)
    plan = plan_build(config, **_roots(tmp_path))
    with file_lock(Staging(plan.staging).lock_file, timeout=0):
        assert HeadStart.begin(config, workers=1, **_roots(tmp_path)) is None
    assert plan.staging not in LENT_LOCKS


def test_nothing_to_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = _config(tmp_path)
    assert HeadStart.begin(BuildConfig(name="x", sources=(str(tmp_path / "missing.parquet"),)), **_roots(tmp_path)) is None
    build(config, **_roots(tmp_path))
    assert HeadStart.begin(config, **_roots(tmp_path)) is None  # published already
    monkeypatch.setenv(HEAD_START_ENV, "0")
    assert HeadStart.begin(_config(tmp_path, seed=1), **_roots(tmp_path)) is None


def test_a_failed_unit_raises_in_its_claimant_once_then_the_build_tokenizes_it_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shardflow.build.tokenize as tokenize_module

    src = tmp_path / "bad.jsonl"
    src.write_text('{"text": "fine"}\n' * 50 + "{not json\n")
    config = BuildConfig(name="bad", sources=(str(src),))
    early = HeadStart.begin(config, workers=1, **_roots(tmp_path))
    assert early is not None
    calls: list[int] = []
    real = tokenize_module.tokenize_unit_now

    def counted(plan, unit):
        calls.append(unit)
        return real(plan, unit)

    monkeypatch.setattr(tokenize_module, "tokenize_unit_now", counted)  # the build's own calls, not the head start's
    try:
        assert len(early.plan.units) == 1
        with pytest.raises(InputError, match=r"bad\.jsonl line 51"):
            tokenize_unit(early.plan, 0)
        assert calls == []  # the head start's error, raised in its claimant
        with pytest.raises(InputError, match=r"bad\.jsonl line 51"):
            tokenize_unit(early.plan, 0)
        assert calls == [0]  # claimed once: a retry tokenizes it itself
    finally:
        early.close()


def test_a_resumed_build_s_committed_units_are_not_taken(tmp_path: Path) -> None:
    config = _config(tmp_path)
    plan = plan_build(config, **_roots(tmp_path))
    with build_lock(plan) as locked:
        for unit in (0, 1):
            tokenize_unit(locked, unit)
    with HeadStart.begin(config, workers=2, **_roots(tmp_path)) as early:
        assert early is not None
        _wait_started(early, 2)
        # The orchestrator skips units 0 and 1 (no task run): they are not the head start's.
        assert not head_start_owns(early.plan, 0) and not head_start_owns(early.plan, 1)
        assert head_start_owns(early.plan, 2) and head_start_owns(early.plan, 3)
        assert early.started == 2


def test_the_orchestrator_s_first_question_stops_new_units(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``owns`` is asked before the flow decides which units get task runs: from then on the answer
    is final (a unit not owned then is never taken, so it cannot be done without a task run)."""
    gate = _gate(monkeypatch)
    config = _config(tmp_path)
    with HeadStart.begin(config, workers=1, **_roots(tmp_path)) as early:
        assert early is not None
        _wait_started(early, 1)
        assert not head_start_owns(early.plan, 3)
        gate.set()
        assert early.claim(0) is not None
    assert early.started == 1  # unit 0, in flight when asked; nothing after
    assert unit_done(early.plan, 1) is None


def test_the_planning_s_log_lines_go_to_the_plan_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import shardflow.build.head_start as head_start_module

    real = head_start_module.plan_build

    def plan_build_logging(*args, **kwargs):
        logging.getLogger("shardflow.build").info("a line of the planning")
        return real(*args, **kwargs)

    monkeypatch.setattr(head_start_module, "plan_build", plan_build_logging)
    seen: list[str] = []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append(record.getMessage())

    logger = logging.getLogger("shardflow")
    handler = Seen(level=logging.INFO)
    logger.addHandler(handler)
    try:
        config = _config(tmp_path)
        with HeadStart.begin(config, workers=1, **_roots(tmp_path)) as early:
            assert early is not None
            assert "a line of the planning" not in seen  # held back
            assert planned_by_head_start(config, **_roots(tmp_path)) is early.plan
            assert seen.count("a line of the planning") == 1
            planned_by_head_start(config, **_roots(tmp_path))
            assert seen.count("a line of the planning") == 1  # handed over once
    finally:
        logger.removeHandler(handler)


def test_its_log_lines_go_to_the_claiming_thread(tmp_path: Path) -> None:
    seen: list[tuple[str, str]] = []

    class Seen(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            seen.append((threading.current_thread().name, record.getMessage()))

    handler = Seen(level=logging.INFO)
    logger = logging.getLogger("shardflow")
    logger.addHandler(handler)
    try:
        config = _config(tmp_path)
        early = HeadStart.begin(config, workers=1, **_roots(tmp_path))
        assert early is not None
        _wait_started(early, 1)  # its thread takes unit 0 first
        assert head_start_owns(early.plan, 0)
        result = tokenize_unit(early.plan, 0)
        assert not head_start_owns(early.plan, 0)
        mine = [m for t, m in seen if "tokenized unit 0 " in m]
        assert mine and all(t == threading.current_thread().name for t, m in seen if "tokenized unit 0 " in m)
        assert len(mine) == 1 and f"{result.tokens} tokens" in mine[0]
        early.close()
        # Units no one claimed (the flow failed first): their lines are dropped, never logged outside a run.
        for unit in range(1, early.started):
            assert not any(f"tokenized unit {unit} " in m for _, m in seen)
        assert not any(t.startswith("shardflow-head-start") for t, _ in seen)
        assert logging.getLogger("shardflow").filters == []
    finally:
        logger.removeHandler(handler)
