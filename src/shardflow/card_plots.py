"""The dataset card's plots: each PNG drawn in memory from ``stats.json`` (and the parent's), no file written.

``card.py`` writes them into ``card/`` and links them from ``card/README.md``:

    lengths.png           the document-length histogram per split (log-log)
    tokens_by_source.png  tokens by --stats-column value, else by input
    shard_fill.png        tokens per shard against the shard size
    parent.png            documents added/removed per input, and the length distributions overlaid

Each plot is a ``card_draw.Figure`` (its axes, bars, lines, ticks and legend as data: ``figures``),
drawn into a PNG by ``card_draw`` with Pillow in a few milliseconds, in matplotlib's default look
and its DejaVu Sans font, without importing matplotlib (its import and drawing were most of the
stats-card stage: docs/PERFORMANCE.md). The same statistics give the same bytes; any thread may
draw. ``plot_available`` says whether the plots can be drawn.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from .card_draw import COLORS, DPI, Axes, Axis, Entry, Figure, font_file, text_width
from .stats import LENGTH_EDGES, pairs_to_hist

__all__ = ["TOP", "plot_available", "sources", "figures", "makers"]

TOP = 15
"""Bars in a plot, and rows in the card's tables, before the rest are summed or left out."""
# The bottom of a log axis of document counts: below 1 (a bin of one document shows), above 0.5 (no tick at 0.1 or 0.5 of a document).
_FEWEST = 0.7


def plot_available() -> bool:
    """Whether the plots can be drawn: Pillow with FreeType, and matplotlib's DejaVu Sans (both come with
    matplotlib, part of ``shardflow[pipeline]``; without it the card is text only)."""
    if font_file() is None:
        return False
    try:
        from PIL import features
    except ImportError:
        return False
    return bool(features.check_module("freetype2"))


def _margin(labels: list[str]) -> float:
    """The left margin, in inches, that fits a bar chart's names (numbers and an axis label without)."""
    return 0.2 + max(text_width(label) for label in labels) / DPI if labels else 0.85


def _plot_lengths(stats: dict[str, Any]) -> Figure:
    ax = Axes(x=Axis(log=True, grid=True, label="document length (tokens, boundary included)"),
              y=Axis(log=True, grid=True, lo=_FEWEST, label="documents per bin (4 bins per octave)"),
              title="Document lengths", title_left=True)
    edges = np.append(LENGTH_EDGES, LENGTH_EDGES[-1] * 2).astype(float)
    for split, s in stats["splits"].items():
        hist = pairs_to_hist(s["histogram"])
        nz = np.flatnonzero(hist)
        if not len(nz):
            continue
        lo, hi = int(nz[0]), int(nz[-1]) + 1
        color, fill = COLORS[len(ax.legend) % len(COLORS)], split == "train"
        alpha = 0.55 if fill else 1.0
        ax.stairs(hist[lo:hi].tolist(), edges[lo : hi + 1].tolist(), color, fill=fill, alpha=alpha)
        ax.legend.append(Entry(f"{split} ({_plural(s['documents'], 'document')})", color, alpha, line=not fill))
    return Figure(7, 3.6, [ax])


def sources(stats: dict[str, Any]) -> tuple[str, list[tuple[str, int, int]]]:
    """``(what, [(label, tokens, documents)])``: by the stats column when there is one, else by input."""
    if stats.get("by_column"):
        col = stats["by_column"]
        return f"--stats-column {col['column']}", [(v["value"], v["tokens"], v["documents"]) for v in col["values"]]
    rows = sorted(((i["relname"], i["tokens"], i["documents"]) for i in stats["inputs"]), key=lambda r: (-r[1], r[0]))
    return "input", rows


def _plot_sources(stats: dict[str, Any]) -> Figure:
    what, rows = sources(stats)
    if len(rows) > TOP:
        rows = rows[: TOP - 1] + [("(the other %d)" % (len(rows) - TOP + 1), sum(r[1] for r in rows[TOP - 1 :]), 0)]
    labels = [r[0] if len(r[0]) <= 40 else "..." + r[0][-37:] for r in rows]
    ax = Axes(x=Axis(grid=True, label="tokens"), y=Axis(inverted=True, names=list(enumerate(labels))),
              title=f"Tokens by {what}")
    ax.bars(range(len(rows)), [r[1] for r in rows], "#4878d0", horizontal=True)
    return Figure(7, 0.9 + 0.32 * max(1, len(rows)), [ax], left=_margin(labels), bottom=0.5, top=0.3)


def _plural(n: int, word: str) -> str:
    """``1 shard``, ``2 shards``, ``1,234 documents``."""
    return f"{n:,} {word}{'s' * (n != 1)}"


def _plot_fill(stats: dict[str, Any]) -> Figure:
    ax = Axes(title="Tokens per shard", title_left=True)
    cap = stats["shard_tokens"]
    x = 0
    splits = [(split, np.array(s["shards"], dtype=float)) for split, s in stats["splits"].items()]
    for i, (split, sizes) in enumerate(splits):
        color = COLORS[i % len(COLORS)]
        if len(sizes) > 200:  # thousands of bars: one filled outline per split
            ax.stairs(sizes.tolist(), (np.arange(x, x + len(sizes) + 1) - 0.5).tolist(), color, fill=True)
        else:
            ax.bars(np.arange(x, x + len(sizes)).tolist(), sizes.tolist(), color)
        ax.legend.append(Entry(f"{split} ({_plural(len(sizes), 'shard')})", color))
        x += len(sizes)
    biggest = max((float(sizes.max()) for _, sizes in splits if len(sizes)), default=0.0)
    if biggest >= cap / 4:  # the shard size on the scale: how full each shard is
        ax.rule(cap, across="y", dashed=True)
        ax.y.lo, ax.y.hi = 0, cap * 1.1
        size = f"dashed: the shard size, {cap:,} tokens"
    else:  # a few small shards: to their own scale, or they would be invisible under the shard size
        ax.y.lo, ax.y.hi = 0, max(1.0, biggest) * 1.15
        size = f"the shard size, {cap:,} tokens, is off this scale"
    ax.x.lo, ax.x.hi = -0.5, max(1, x) - 0.5
    ax.x.label = f"shard (in manifest order; {size})"
    ax.y.label = "tokens"
    return Figure(7, 3.2, [ax])


def _plot_parent(stats: dict[str, Any], parent_stats: dict[str, Any] | None, changes: list[Any], parent_ref: str) -> Figure:
    moved = [c for c in changes if c.documents_delta] or changes
    moved = moved[:TOP]
    labels = [c.relname if len(c.relname) <= 28 else "..." + c.relname[-25:] for c in moved]
    deltas = [c.documents_delta for c in moved]
    left = Axes(x=Axis(label="documents added (+) / removed (-)"), y=Axis(inverted=True, names=list(enumerate(labels))),
                title=f"Against {parent_ref}, per input")
    left.bars(range(len(moved)), deltas, ["#6acc64" if d >= 0 else "#d65f5f" for d in deltas], horizontal=True)
    left.rule(0, across="x")
    right = Axes(x=Axis(log=True, label="document length (tokens)"), y=Axis(log=True, lo=_FEWEST),
                 title="Length distributions", title_left=True)
    edges = np.append(LENGTH_EDGES, LENGTH_EDGES[-1] * 2).astype(float)
    for i, (label, st, dashed) in enumerate((("this version", stats, False), (parent_ref, parent_stats, True))):
        if st is None:
            continue
        hist = sum((pairs_to_hist(s["histogram"]) for s in st["splits"].values()), start=pairs_to_hist([]))
        nz = np.flatnonzero(hist)
        if len(nz):
            lo, hi = int(nz[0]), int(nz[-1]) + 1
            right.stairs(hist[lo:hi].tolist(), edges[lo : hi + 1].tolist(), COLORS[i], fill=False, width=1.6, dashed=dashed)
            right.legend.append(Entry(label, COLORS[i], line=True, dashed=dashed, width=1.6))
    return Figure(11, 3.8, [left, right], left=_margin(labels), gap=0.8)


def figures(stats: dict[str, Any], pinfo: dict[str, Any] | None, parent_ref: str) -> dict[str, Callable[[], Figure]]:
    """Each plot the card has (``parent.png`` only with a parent), by PNG name: a function that lays it out."""
    plots: dict[str, Callable[[], Figure]] = {
        "lengths.png": lambda: _plot_lengths(stats),
        "tokens_by_source.png": lambda: _plot_sources(stats),
        "shard_fill.png": lambda: _plot_fill(stats),
    }
    if pinfo is not None:
        plots["parent.png"] = lambda: _plot_parent(stats, pinfo["stats"], pinfo["changes"], parent_ref)
    return plots


def makers(stats: dict[str, Any], pinfo: dict[str, Any] | None, parent_ref: str) -> dict[str, Callable[[], bytes]]:
    """Each plot the card has (``parent.png`` only with a parent), by PNG name: a function that draws it."""
    return {name: (lambda lay=lay: lay().png()) for name, lay in figures(stats, pinfo, parent_ref).items()}
