"""The dataset card's plots read well from one document up, and ``shardflow card REF`` redraws a card.

The plots are checked by their properties, not their pixels: the figures the
card draws are caught before they become PNGs, drawn, and their tick
locations and labels read (whole numbers where the counts are whole, legends
outside the axes, "1 shard" and "2 shards"). Builds are real: one document
of Tiny Shakespeare in a JSON Lines file, then a second file, and the sample
Parquet file.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
from pathlib import Path
from typing import Any

import pytest

import shardflow.card as card_module
import shardflow.card_plots as card_plots
from support.builds import make_builder
from shardflow.card import redraw_card
from shardflow.cli.commands import main
from shardflow.manifest import read_manifest
from shardflow.validation import validate_dir

REPO = Path(__file__).resolve().parent.parent
SHAKESPEARE = Path("/work/shared/corpora/tinyshakespeare.txt")


def _lines(n: int) -> list[str]:
    if not SHAKESPEARE.exists():
        pytest.skip(f"{SHAKESPEARE} is not available")
    return [line for line in SHAKESPEARE.read_text(encoding="utf-8").splitlines() if line.strip()][:n]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """``one``: a version of one document; ``two``: the next version, one document more (a parent comparison)."""
    base = tmp_path_factory.mktemp("tiny")
    src = base / "src"
    src.mkdir()
    first, second = _lines(2)
    (src / "a.jsonl").write_text(json.dumps({"text": first}) + "\n")
    make = make_builder(base)
    one = make([str(src)], name="tiny")
    (src / "b.jsonl").write_text(json.dumps({"text": second}) + "\n")
    two = make([str(src)], name="tiny")
    return {"one": one, "two": two, "first": src / "a.jsonl"}


@pytest.fixture(scope="module")
def sample(tmp_path_factory: pytest.TempPathFactory) -> Any:
    return make_builder(tmp_path_factory.mktemp("sample"))([str(REPO / "tests" / "assets" / "sample.parquet")], name="sample")


def _figures(directory: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The card's figures for a version, by PNG name, drawn (ticks placed) but not saved."""
    caught: list[Any] = []

    def keep(fig: Any) -> bytes:
        fig.canvas.draw()
        caught.append(fig)
        return b""

    monkeypatch.setattr(card_plots, "_png", keep)
    m = read_manifest(directory)
    parent = directory.parent / m.parent.split("@")[1] if m.parent else None
    tmp = directory.parent / f".figures-{directory.name}"
    tmp.mkdir(exist_ok=True)
    shutil.copy(directory / "stats.json", tmp)
    try:
        drawn = card_module.draw_plots(tmp, m, parent=parent, parent_ref=m.parent)
    finally:
        shutil.rmtree(tmp)
    return dict(zip([name for name, ok in drawn.items() if ok], caught))


def _ticks_in_view(axis: Any) -> list[float]:
    lo, hi = sorted(axis.get_view_interval())
    return [t for t in axis.get_majorticklocs() if lo - 1e-9 <= t <= hi + 1e-9]


def _visible_labels(axis: Any) -> list[str]:
    """The labels of the ticks (major and minor) in the axis's view."""
    lo, hi = sorted(axis.get_view_interval())
    ticks = axis.get_major_ticks() + axis.get_minor_ticks()
    return [t.label1.get_text() for t in ticks if lo - 1e-9 <= t.get_loc() <= hi + 1e-9 and t.label1.get_text()]


def _assert_whole(values: list[float], what: str) -> None:
    assert values, f"{what}: no ticks"
    assert all(float(v).is_integer() for v in values), f"{what}: ticks {values}"


def test_one_document_one_shard_whole_ticks_and_a_singular_legend(tiny, monkeypatch):
    figs = _figures(tiny["one"].directory, monkeypatch)
    fill = figs["shard_fill.png"].axes[0]
    _assert_whole(_ticks_in_view(fill.xaxis), "shard_fill x")  # was -0.4 ... 0.4
    assert _ticks_in_view(fill.xaxis) == [0.0]
    _assert_whole(_ticks_in_view(fill.yaxis), "shard_fill y")
    legend = fill.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == ["train (1 shard)"]  # was "1 shards"
    # The bar is on the scale (not 0.00001% of the shard size) and the legend is above the axes, over no bar.
    (bar,) = fill.patches
    assert bar.get_height() >= 0.5 * fill.get_ylim()[1]
    assert legend.get_window_extent().y0 >= fill.get_window_extent().y1 - 1
    assert "is off this scale" in fill.get_xlabel() and "100,000,000" in fill.get_xlabel()

    lengths = figs["lengths.png"].axes[0]
    assert [t.get_text() for t in lengths.get_legend().get_texts()] == ["train (1 document)"]
    # No tick for a fraction of a document on the log count axis (was 0.1).
    for label in _visible_labels(lengths.yaxis):
        assert float(label.replace("k", "e3")).is_integer(), label
    assert lengths.get_ylim()[0] > 0.5

    sources = figs["tokens_by_source.png"].axes[0]
    _assert_whole(_ticks_in_view(sources.xaxis), "tokens_by_source x")


def test_the_parent_plot_counts_whole_documents(tiny, monkeypatch):
    figs = _figures(tiny["two"].directory, monkeypatch)
    left, right = figs["parent.png"].axes
    _assert_whole(_ticks_in_view(left.xaxis), "parent documents added/removed")  # was 0, 0.2, ... 1.0
    assert [t.get_text() for t in right.get_legend().get_texts()] == ["this version", "tiny@v1"]
    assert right.get_legend().get_window_extent().y0 >= right.get_window_extent().y1 - 1
    for label in _visible_labels(right.yaxis):
        assert float(label).is_integer(), label


def test_the_sample_shard_fill_is_readable(sample, monkeypatch):
    fill = _figures(sample.directory, monkeypatch)["shard_fill.png"].axes[0]
    assert _ticks_in_view(fill.xaxis) == [0.0]
    (bar,) = fill.patches
    m = read_manifest(sample.directory)
    assert bar.get_height() == m.totals["tokens"]
    assert bar.get_height() >= 0.5 * fill.get_ylim()[1]
    assert [t.get_text() for t in fill.get_legend().get_texts()] == ["train (1 shard)"]


def test_full_shards_are_drawn_against_the_shard_size(tmp_path, monkeypatch):
    # Several full shards: the axis goes to the shard size (the dashed line), ticks on whole shards, "N shards".
    stats = {"shard_tokens": 1000, "splits": {"train": {"shards": [1000, 1000, 1000, 400]}, "val": {"shards": [300]}}}
    caught: list[Any] = []
    monkeypatch.setattr(card_plots, "_png", lambda fig: (fig.canvas.draw(), caught.append(fig), b"")[-1])
    card_plots._plot_fill(stats)
    ax = caught[0].axes[0]
    assert ax.get_ylim() == (0, 1100)
    assert _ticks_in_view(ax.xaxis) == [0, 1, 2, 3, 4]
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["train (4 shards)", "val (1 shard)"]
    assert "dashed: the shard size, 1,000 tokens" in ax.get_xlabel()


def _cli(*args: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return code, out.getvalue(), err.getvalue()


def test_card_command_redraws_a_card_and_the_version_stays_valid(tiny, tmp_path):
    built = tiny["two"]
    card_dir = built.directory / "card"
    before = {p.name: p.read_bytes() for p in card_dir.iterdir()}
    shutil.rmtree(card_dir)  # a version built without matplotlib has only the text; here, nothing at all
    code, out, err = _cli("card", built.ref, "--catalog", str(built.catalog))
    assert (code, err) == (0, "")
    assert out.splitlines() == [
        f"drew the card of {built.ref}: 4 plots (lengths.png, tokens_by_source.png, shard_fill.png, parent.png)",
        str(card_dir / "README.md"),
    ]
    # The same card as the build drew (titled with the version's reference), and the version is still valid.
    assert {p.name: p.read_bytes() for p in card_dir.iterdir()} == before
    validate_dir(built.directory, published=True, catalog=built.catalog)
    assert not list(card_dir.glob(".*"))  # no temporary file left


def test_card_command_refuses_a_version_without_statistics_and_a_damaged_one(tiny, tmp_path):
    bare = make_builder(tmp_path)([str(tiny["first"])], name="bare", stats=False)
    code, out, err = _cli("card", bare.ref, "--catalog", str(bare.catalog))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "has no statistics (stats.json)" in err and "built with --no-stats" in err
    assert not (bare.directory / "card").exists()

    copy = tmp_path / "copy"
    shutil.copytree(tiny["one"].directory, copy)
    (copy / "stats.json").write_text((copy / "stats.json").read_text().replace('"documents"', '"documents" ', 1))
    before = (copy / "card" / "README.md").read_bytes()
    with pytest.raises(Exception, match=r"statistics do not match the manifest, so no card was drawn"):
        redraw_card(copy)
    assert (copy / "card" / "README.md").read_bytes() == before  # nothing replaced


def test_card_command_without_matplotlib_names_the_extra_and_writes_nothing(tiny, tmp_path):
    import subprocess
    import sys

    built = tiny["one"]
    before = {p.name: p.read_bytes() for p in (built.directory / "card").iterdir()}
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"  # as if it were not installed
        "from shardflow.cli.commands import main\n"
        f"sys.exit(main(['card', {built.ref!r}, '--catalog', {str(built.catalog)!r}]))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert (res.returncode, res.stdout) == (2, "")
    assert res.stderr == "shardflow: error: the card's plots need matplotlib: pip install 'shardflow[pipeline]'\n"
    assert {p.name: p.read_bytes() for p in (built.directory / "card").iterdir()} == before
