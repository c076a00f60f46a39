"""The plot helper (``shardflow.plot_helper``): a child process draws the card's plots, the same bytes as in-process.

Real builds of the sample corpus give the statistics; the helper is a real
child process, killed for real.
"""

from __future__ import annotations

import logging
import os
import shutil
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


def test_a_script_calling_main_without_a_main_guard_builds_once(tmp_path):
    """The helper is ``python -m shardflow.plot_helper``: it never imports the caller's ``__main__`` again."""
    import subprocess
    import sys

    script = tmp_path / "build_it.py"
    script.write_text(
        "from flows.cli import main\n"
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
    from flows.startup import plot_helper

    with plot_helper():
        helper = card._helper
        assert card.plots_drawn_elsewhere() and helper._process.poll() is None
    assert not card.plots_drawn_elsewhere() and helper._process.poll() is not None  # ended with the command
    with plot_helper(enabled=False):  # beside a temporary server starting: drawn in this process
        assert not card.plots_drawn_elsewhere()
