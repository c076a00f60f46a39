"""The plot helper (``shardflow.plot_helper``): a child process draws the card's plots, the same bytes as in-process.

Real builds of the sample corpus give the statistics; the helper is a real
child process, killed for real.
"""

from __future__ import annotations

import logging
import os
import shutil
import time
import signal
from pathlib import Path

import pytest

from core_support import SAMPLE
from shardflow import card
from shardflow.manifest import read_manifest
from shardflow.plot_helper import HELPER_ENV, PlotHelper
from shardflow.stats import STATS_NAME

pytest.importorskip("matplotlib")


@pytest.fixture(scope="module")
def two_versions(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """v1 of the sample, and v2 with a second input (so its card compares against v1: parent.png)."""
    from core_support import make_builder, write_parquet

    base = tmp_path_factory.mktemp("plot-helper")
    extra = write_parquet(base / "extra.parquet", ["another document " * 40, "and one more"])
    make = make_builder(base)
    make(SAMPLE, name="p", shard_tokens=50_000)
    v2 = make((SAMPLE, extra), name="p", shard_tokens=50_000)
    return v2.directory.parent / "v1", v2.directory


@pytest.fixture
def helper():
    started = PlotHelper.start()
    assert started is not None
    yield started
    started.stop()


def _fresh(version: Path, into: Path) -> Path:
    """A directory holding only the version's stats.json: where a card is drawn."""
    into.mkdir()
    shutil.copy(version / STATS_NAME, into / STATS_NAME)
    return into


def _pngs(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted((directory / card.CARD_DIR).glob("*.png"))}


@pytest.mark.slow
def test_the_helper_draws_the_same_bytes_as_this_process(helper, two_versions, tmp_path):
    v1, v2 = two_versions
    manifest = read_manifest(v2)
    here = _fresh(v2, tmp_path / "here")
    there = _fresh(v2, tmp_path / "there")
    drawn_here = card.draw_plots_here(here, manifest, parent=v1, parent_ref="p@v1")
    drawn_there = helper.draw(there, manifest, parent=v1, parent_ref="p@v1")
    assert drawn_there == drawn_here == dict.fromkeys(card.PLOTS, True)
    assert _pngs(there) == _pngs(here) and len(_pngs(here)) == 4
    # Through draw_plots, as the card stage calls it: the helper, again the same bytes (a second request).
    card.use_plot_helper(helper)
    try:
        again = _fresh(v2, tmp_path / "again")
        assert card.draw_plots(again, manifest, parent=v1, parent_ref="p@v1") == drawn_here
    finally:
        card.use_plot_helper(None)
    assert _pngs(again) == _pngs(here)


def test_a_dead_helper_leaves_the_drawing_to_this_process(helper, two_versions, tmp_path, caplog):
    v1, _ = two_versions
    os.kill(helper._process.pid, signal.SIGKILL)
    helper._process.wait(timeout=10)
    card.use_plot_helper(helper)
    try:
        with caplog.at_level(logging.INFO, logger="shardflow.card"):
            drawn = card.draw_plots(_fresh(v1, tmp_path / "d"), read_manifest(v1))
    finally:
        card.use_plot_helper(None)
    assert drawn == {"lengths.png": True, "tokens_by_source.png": True, "shard_fill.png": True}
    assert len(_pngs(tmp_path / "d")) == 3
    assert "the plot helper is gone" in caplog.text
    assert helper.draw(tmp_path / "d", read_manifest(v1), parent=None, parent_ref=None) is None  # and stays gone


def test_an_error_while_drawing_is_the_builds_error(helper, two_versions, tmp_path):
    v1, _ = two_versions
    empty = tmp_path / "no-stats"
    empty.mkdir()
    with pytest.raises(RuntimeError, match=r"FileNotFoundError: .*stats\.json"):
        helper.draw(empty, read_manifest(v1), parent=None, parent_ref=None)
    # The helper survives its request's error and draws the next one.
    assert helper.draw(_fresh(v1, tmp_path / "ok"), read_manifest(v1), parent=None, parent_ref=None)["lengths.png"]


def test_ctrl_c_is_left_to_the_build(helper, two_versions, tmp_path):
    """The terminal sends SIGINT to its foreground process group: the helper is in a session of its own."""
    v1, _ = two_versions
    assert os.getsid(helper._process.pid) == helper._process.pid != os.getsid(0)
    assert os.getpgid(helper._process.pid) != os.getpgid(0)
    assert helper.draw(_fresh(v1, tmp_path / "d"), read_manifest(v1), parent=None, parent_ref=None)["shard_fill.png"]


@pytest.mark.slow
def test_a_script_calling_main_without_a_main_guard_builds_once(tmp_path):
    """The helper is ``python -m shardflow.plot_helper``: it never imports the caller's ``__main__`` again."""
    import subprocess
    import sys

    script = tmp_path / "build_it.py"
    script.write_text(
        "from shardflow.flows.cli import main\n"
        f"print('building', flush=True)\n"
        f"main(['build', {str(SAMPLE)!r}, '--name', 'once', '--data-root', 'd', '--catalog', 'c', '--no-prefect', '--progress', 'none'])\n"
    )
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.count("building") == 1 and "published once@v1" in out.stdout
    assert sorted(p.name for p in (tmp_path / "d" / "once" / "v1" / "card").glob("*.png")) == [
        "lengths.png", "shard_fill.png", "tokens_by_source.png"]


def test_stop_ends_the_process_even_mid_import():
    started = PlotHelper.start()
    assert started is not None
    started.stop()  # at once: it is still importing matplotlib
    assert started._process.poll() is not None


@pytest.mark.parametrize("env", [HELPER_ENV, card.CARD_ENV, "SHARDFLOW_STATS"])
def test_no_helper_when_turned_off_or_nothing_to_draw(env, monkeypatch):
    monkeypatch.setenv(env, "0")
    assert PlotHelper.start() is None


def test_the_command_lines_context_starts_registers_and_ends_the_helper():
    from shardflow.flows.cli import plot_helper

    with plot_helper():
        helper = card._helper
        assert card.plots_drawn_elsewhere() and helper._process.poll() is None
    assert not card.plots_drawn_elsewhere() and helper._process.poll() is not None  # ended with the command
    with plot_helper(enabled=False):  # beside a temporary server starting: drawn in this process
        assert not card.plots_drawn_elsewhere()


def test_stop_is_not_held_up_by_a_drawing_in_flight(helper):
    """A task thread waiting for its card's reply holds the helper's lock: stop() ends the helper all the same."""
    import threading

    def waiting_for_a_reply() -> None:
        with helper._lock:
            try:
                while True:
                    helper._replies.recv()  # "ready", then nothing until the helper ends
            except (EOFError, OSError):
                pass

    waiter = threading.Thread(target=waiting_for_a_reply, daemon=True)
    waiter.start()
    stopper = threading.Thread(target=helper.stop, daemon=True)
    stopper.start()
    stopper.join(timeout=30)
    waiter.join(timeout=30)
    assert not stopper.is_alive() and not waiter.is_alive() and helper._process.poll() is not None


def test_a_request_that_does_not_pickle_is_drawn_here_and_the_helper_stays(helper, two_versions, tmp_path, caplog):
    v1, _ = two_versions
    odd = read_manifest(v1).replace(extra={**read_manifest(v1).extra, "unpicklable": lambda: None})
    with caplog.at_level(logging.INFO, logger="shardflow.card"):
        assert helper.draw(_fresh(v1, tmp_path / "a"), odd, parent=None, parent_ref=None) is None
    assert "cannot take this card" in caplog.text
    assert helper.draw(_fresh(v1, tmp_path / "b"), read_manifest(v1), parent=None, parent_ref=None)["lengths.png"]


@pytest.mark.slow
def test_the_helper_ends_when_the_build_is_killed(tmp_path):
    """No orphan: a build killed mid-run (SIGKILL, no finally) takes its helper with it (Linux's parent-death signal)."""
    import subprocess
    import sys

    code = (
        "import os, signal, sys, time\nfrom shardflow.plot_helper import PlotHelper\n"
        "import subprocess\n"
        "h = PlotHelper.start()\n"
        # Another process holds the request pipe open, as a helper busy drawing would not read it:
        # the helper sees no end of its input, and only the parent-death signal ends it.
        "keeper = subprocess.Popen(['sleep', '60'], pass_fds=(h._requests.fileno(),), start_new_session=True,\n"
        "                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print(h._process.pid, keeper.pid, flush=True)\ntime.sleep(2)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    )
    # Only its first line is read: the helper, whose own output goes where the build's does, keeps the pipe open.
    build = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    pid, keeper = (int(x) for x in build.stdout.readline().split())
    build.wait(timeout=60)
    build.stdout.close()
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.1)
        os.kill(pid, signal.SIGKILL)
        pytest.fail(f"the helper {pid} outlived its build by 20 s")
    finally:
        os.kill(keeper, signal.SIGKILL)


def test_no_helper_under_fault_injection(monkeypatch):
    monkeypatch.setenv("SHARDFLOW_FAULT", "sleep0.01:plan")
    assert PlotHelper.start() is None
