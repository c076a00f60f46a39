"""The dataset card's plots read well from one document up, show the statistics' numbers, and draw without matplotlib.

The plots are checked by their description (``card_plots.figures``: the laid-out axes, bars, ticks
and legend that ``card_draw`` turns into pixels) and, where drawing could go wrong, by the decoded
PNG: its size, and the colour of a bar and of the legend where they belong. Builds are real: one
document of Tiny Shakespeare in a JSON Lines file, then a second file, and the sample Parquet file.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from support.builds import make_builder
from shardflow.card import redraw_card
from shardflow.card_draw import COLORS, Axes, Figure, integer_ticks, log_ticks
from shardflow.card_plots import figures, makers
from shardflow.catalog import Catalog
from shardflow.cli.commands import main
from shardflow.diff import input_changes
from shardflow.manifest import read_manifest
from shardflow.stats import LENGTH_EDGES, pairs_to_hist
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


def _stats(directory: Path) -> dict[str, Any]:
    return json.loads((directory / "stats.json").read_text())


def _pinfo(built: Any) -> tuple[dict[str, Any] | None, str]:
    """What the card compares with: the parent's statistics and the inputs' changes (None: no parent)."""
    m = read_manifest(built.directory)
    if not m.parent:
        return None, ""
    parent = Catalog(built.catalog).resolve(m.parent)
    return {"stats": _stats(parent), "changes": input_changes(read_manifest(parent), m)}, m.parent


def _figures(built: Any) -> dict[str, Any]:
    """The card's figures for a version, by PNG name, laid out (limits and ticks) but not drawn."""
    pinfo, ref = _pinfo(built)
    return {name: lay() for name, lay in figures(_stats(built.directory), pinfo, ref).items()}


def _ticks(axis: Any) -> list[float]:
    return [v for v, _ in axis.major]


def _labels(axis: Any) -> list[str]:
    return [label for _, label in axis.major + axis.minor if label]


def _assert_whole(values: list[float], what: str) -> None:
    assert values, f"{what}: no ticks"
    assert all(float(v).is_integer() for v in values), f"{what}: ticks {values}"


def _rgb(color: str) -> tuple[int, int, int]:
    return tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))  # type: ignore[return-value]


def test_ticks_are_placed_as_matplotlib_placed_them():
    # What the card's PNGs showed when matplotlib drew them (MaxNLocator(integer=True), LogLocator).
    assert integer_ticks(0, 1.97e6) == [i * 200_000 for i in range(10)]
    assert integer_ticks(0, 1.23e6) == [i * 150_000 for i in range(9)]
    assert integer_ticks(-0.5, 0.5) == [0] and integer_ticks(0, 1.05) == [0, 1]
    assert integer_ticks(-795, 795) == list(range(-600, 601, 200))
    assert log_ticks(14, 35_000) == ([100, 1000, 10_000], [v * 10.0 ** k for k in (1, 2, 3, 4) for v in range(2, 10)
                                                            if 14 <= v * 10.0 ** k <= 35_000])
    assert log_ticks(1, 1e12, numticks=5)[0] == [1, 1e3, 1e6, 1e9, 1e12]  # a decade in three: no minor ticks
    assert log_ticks(1, 1e12, numticks=5)[1] == []
    # A log axis with no decade, no 2 or 5 in view (one bin of lengths) still has labelled ticks.
    ax = Axes()
    ax.x.log = True
    ax.stairs([1], [420, 480], COLORS[0], fill=True)
    Figure(7, 3.6, [ax])
    labelled = [(v, label) for v, label in ax.x.major + ax.x.minor if label]
    assert len(labelled) >= 2 and all(ax.x.lo <= v <= ax.x.hi and label == f"{v:g}" for v, label in labelled), labelled


def test_one_document_one_shard_whole_ticks_and_a_singular_legend(tiny):
    figs = _figures(tiny["one"])
    fill = figs["shard_fill.png"].axes[0]
    assert _ticks(fill.x) == [0.0]  # was -0.4 ... 0.4
    _assert_whole(_ticks(fill.y), "shard_fill y")
    assert [e.label for e in fill.legend] == ["train (1 shard)"]  # was "1 shards"
    # The bar is on the scale (not 0.00001% of the shard size).
    (bar,) = fill.rects
    assert bar.y1 == read_manifest(tiny["one"].directory).totals["tokens"] >= 0.5 * fill.y.hi
    assert "is off this scale" in fill.x.label and "100,000,000" in fill.x.label

    lengths = figs["lengths.png"].axes[0]
    assert [e.label for e in lengths.legend] == ["train (1 document)"]
    # No tick for a fraction of a document on the log count axis (was 0.1).
    labels = _labels(lengths.y)
    assert labels and all(float(label.replace("k", "e3")).is_integer() for label in labels)
    assert lengths.y.lo > 0.5

    _assert_whole(_ticks(figs["tokens_by_source.png"].axes[0].x), "tokens_by_source x")


def test_the_plots_show_the_statistics_numbers(sample):
    stats = _stats(sample.directory)
    figs = _figures(sample)
    # Every document in a histogram bin of its split, each bin where the statistics put it.
    lengths = figs["lengths.png"].axes[0]
    (split, s), = stats["splits"].items()
    hist = pairs_to_hist(s["histogram"])
    edges = np.append(LENGTH_EDGES, LENGTH_EDGES[-1] * 2)
    drawn = {int(np.searchsorted(edges, r.x0)): r.y1 for r in lengths.rects}  # bin index: documents
    nz = np.flatnonzero(hist)
    assert drawn == {i: int(hist[i]) for i in range(nz[0], nz[-1] + 1)}
    assert sum(drawn.values()) == s["documents"]
    # Tokens per input, largest first; tokens per shard as the layout recorded them.
    sources = figs["tokens_by_source.png"].axes[0]
    assert [(name, r.x1) for (_, name), r in zip(sources.y.names, sources.rects)] == \
        [(i["relname"], i["tokens"]) for i in stats["inputs"]]
    fill = figs["shard_fill.png"].axes[0]
    assert [r.y1 for r in fill.rects] == s["shards"] == [sum(x.tokens for x in read_manifest(sample.directory).splits[split].shards)]


def test_the_parent_plot_counts_whole_documents(tiny):
    left, right = _figures(tiny["two"])["parent.png"].axes
    _assert_whole(_ticks(left.x), "parent documents added/removed")  # was 0, 0.2, ... 1.0
    assert [(name, r.x1) for (_, name), r in zip(left.y.names, left.rects)] == [("b.jsonl", 1)]  # one document added
    assert [(e.label, e.dashed) for e in right.legend] == [("this version", False), ("tiny@v1", True)]
    labels = _labels(right.y)
    assert labels and all(float(label).is_integer() for label in labels)


def test_a_png_is_its_figure_drawn_bars_in_place_and_the_legend_above_the_axes(tiny):
    stats = _stats(tiny["one"].directory)
    fig = figures(stats, None, "")["shard_fill.png"]()
    png = makers(stats, None, "")["shard_fill.png"]()
    image = Image.open(io.BytesIO(png))
    assert (image.format, image.size, image.info["dpi"]) == ("PNG", (700, 320), pytest.approx((100, 100), abs=0.01))
    rgb = np.asarray(image.convert("RGB"))
    ax = fig.axes[0]
    (bar,) = ax.rects
    x, y = ax.to_pixels(0, bar.y1 / 2)
    assert tuple(rgb[round(y), round(x)]) == _rgb(COLORS[0])  # the bar, where its data puts it
    x, y = ax.to_pixels(0, (bar.y1 + ax.y.hi) / 2)
    assert tuple(rgb[round(y), round(x)]) == (255, 255, 255)  # nothing above it
    left, top, right, bottom = (round(v) for v in ax.box)
    above = rgb[:top - 1, left:right].reshape(-1, 3)
    assert (above == _rgb(COLORS[0])).all(axis=1).sum() > 100  # the legend's patch, over no bar
    assert (rgb[top + 2 : bottom - 2, left + 2 : right - 2] == 0).all(axis=2).sum() == 0  # no text inside the axes


def test_full_shards_are_drawn_against_the_shard_size():
    # Several full shards: the axis goes to the shard size (the dashed line), ticks on whole shards, "N shards".
    stats = {"shard_tokens": 1000, "splits": {"train": {"shards": [1000, 1000, 1000, 400]}, "val": {"shards": [300]}}}
    ax = figures(stats, None, "")["shard_fill.png"]().axes[0]
    assert (ax.y.lo, ax.y.hi) == (0, 1100)
    assert _ticks(ax.x) == [0, 1, 2, 3, 4]
    assert [e.label for e in ax.legend] == ["train (4 shards)", "val (1 shard)"]
    assert [(line.ys, line.dashed, line.across) for line in ax.lines] == [((1000,), True, "y")]
    assert "dashed: the shard size, 1,000 tokens" in ax.x.label


def test_the_card_is_drawn_without_importing_matplotlib(tiny, tmp_path):
    # matplotlib's import and drawing were a second of every build's stats-card stage; nothing imports it now.
    built = tiny["two"]
    for name in ("stats.json",):
        shutil.copy(built.directory / name, tmp_path / name)
    code = (
        "import sys\n"
        "from shardflow.card import write_card; from shardflow.manifest import read_manifest\n"
        f"write_card({str(tmp_path)!r}, read_manifest({str(built.directory)!r}), parent={str(built.directory.parent / 'v1')!r})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'matplotlib'))\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert res.stdout == "[]\n"
    pngs = {p.name: p.read_bytes() for p in (tmp_path / "card").glob("*.png")}
    assert pngs == {p.name: p.read_bytes() for p in (built.directory / "card").glob("*.png")}  # as the build drew them
    assert Image.open(tmp_path / "card" / "parent.png").size == (1100, 380)


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
