"""The dataset card's plots: each PNG drawn in memory from ``stats.json`` (and the parent's), no file written.

``card.py`` writes them into ``card/`` and links them from ``card/README.md``:

    lengths.png           the document-length histogram per split (log-log)
    tokens_by_source.png  tokens by --stats-column value, else by input
    shard_fill.png        tokens per shard against the shard size
    parent.png            documents added/removed per input, and the length distributions overlaid

Drawn on an Agg canvas (no pyplot, no display: any thread may draw) and saved
without a timestamp or the matplotlib version, so the same statistics give the
same bytes. matplotlib is imported only when a plot is drawn: ``plot_available``
says whether it can be.
"""

from __future__ import annotations

import io
from typing import Any, Callable

import numpy as np

from .stats import LENGTH_EDGES, pairs_to_hist

__all__ = ["TOP", "plot_available", "sources", "makers"]

TOP = 15
"""Bars in a plot, and rows in the card's tables, before the rest are summed or left out."""
_DPI = 100


def plot_available() -> bool:
    """Whether matplotlib can be imported (the plots need it; the card is text only without)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(width: float, height: float, *, cols: int = 1, labels: list[str] | None = None, bottom: float = 0.6,
            top: float = 0.35, gap: float = 0.0) -> tuple[Any, Any]:
    """A figure and its axes, without pyplot: no global state, so a card can be drawn on any thread.

    The margins are fixed, in inches (tick labels, axis labels, title): matplotlib's
    ``layout="constrained"`` measures every text several times per draw, a large
    share of the card's drawing time (docs/PERFORMANCE.md). ``labels``: the first axes' y tick labels (a bar chart's
    names), measured once, so the left margin fits the widest; ``gap``: inches
    between two axes side by side.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), dpi=_DPI)
    canvas = FigureCanvasAgg(fig)  # the Agg canvas: PNGs, no display
    left = 0.85  # numeric tick labels and the axis label
    if labels:
        from matplotlib import rcParams
        from matplotlib.font_manager import FontProperties

        renderer = canvas.get_renderer()
        font = FontProperties(size=rcParams["ytick.labelsize"])
        widest = max(renderer.get_text_width_height_descent(label, font, ismath=False)[0] for label in labels)
        left = 0.2 + widest / _DPI
    right = 0.25
    axes_width = (width - left - right - gap) / cols
    fig.subplots_adjust(left=left / width, right=1 - right / width, bottom=bottom / height, top=1 - top / height,
                        wspace=gap / axes_width)
    return fig, fig.subplots(1, cols)


def _count_format() -> Any:
    """Axis labels as 250k, 1.5M, 2G rather than matplotlib's offset exponent (1e7)."""
    from matplotlib.ticker import FuncFormatter

    def label(v: float, _pos: Any) -> str:
        for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
            if abs(v) >= div:
                return f"{v / div:g}{unit}"
        return f"{v:g}"

    return FuncFormatter(label)


def _log_axes(ax: Any) -> None:
    """Both axes logarithmic, labelled 100, 1k, 10k: plain text, not the default 10^k, whose
    mathtext parsing was a fifth of the card's drawing time. As matplotlib's own, an axis that
    spans little more than a decade also labels its minor ticks at 2 and 5 (a tiny version's counts)."""
    import math

    from matplotlib.ticker import Formatter

    major = _count_format()

    class MinorCounts(Formatter):  # type: ignore[misc]
        def __call__(self, x: float, pos: Any = None) -> str:
            lo, hi = sorted(self.axis.get_view_interval()) if self.axis is not None else (0.0, 0.0)
            if x <= 0 or lo <= 0 or hi / lo > 30:
                return ""
            lead = round(x / 10 ** math.floor(math.log10(x) + 1e-9))
            return major(x, pos) if lead in (2, 5) else ""

    for axis, scale in ((ax.xaxis, ax.set_xscale), (ax.yaxis, ax.set_yscale)):
        scale("log")
        axis.set_major_formatter(major)
        axis.set_minor_formatter(MinorCounts())


# Titles sit at the top of their axes, where matplotlib puts them anyway (no ticks or labels above):
# naming the place skips its automatic placement, which measures every tick label of the axes again
# at each draw (a share of the card's drawing time: docs/PERFORMANCE.md), and leaves the PNGs' bytes as they were.
_TITLE_Y = 1.0
# The bottom of a log axis of document counts: below 1 (a bin of one document shows), above 0.5 (no tick at 0.1 or 0.5 of a document).
_FEWEST = 0.7


def _png(fig: Any) -> bytes:
    buf = io.BytesIO()
    # No "Software" tag (it names the matplotlib version) and no date: the same statistics, the same bytes.
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    return buf.getvalue()


def _plot_lengths(stats: dict[str, Any]) -> bytes:
    fig, ax = _figure(7, 3.6)
    edges = np.append(LENGTH_EDGES, LENGTH_EDGES[-1] * 2).astype(float)
    for split, s in stats["splits"].items():
        hist = pairs_to_hist(s["histogram"])
        nz = np.flatnonzero(hist)
        if not len(nz):
            continue
        lo, hi = int(nz[0]), int(nz[-1]) + 1
        ax.stairs(hist[lo:hi], edges[lo : hi + 1], fill=split == "train", alpha=0.55 if split == "train" else 1.0,
                  label=f"{split} ({_plural(s['documents'], 'document')})")
    _log_axes(ax)
    ax.set_ylim(bottom=_FEWEST)
    ax.set_xlabel("document length (tokens, boundary included)")
    ax.set_ylabel("documents per bin (4 bins per octave)")
    ax.set_title("Document lengths", y=_TITLE_Y, loc="left")
    _legend_above(ax, len(stats["splits"]))
    ax.grid(True, which="major", alpha=0.3)
    return _png(fig)


def sources(stats: dict[str, Any]) -> tuple[str, list[tuple[str, int, int]]]:
    """``(what, [(label, tokens, documents)])``: by the stats column when there is one, else by input."""
    if stats.get("by_column"):
        col = stats["by_column"]
        return f"--stats-column {col['column']}", [(v["value"], v["tokens"], v["documents"]) for v in col["values"]]
    rows = sorted(((i["relname"], i["tokens"], i["documents"]) for i in stats["inputs"]), key=lambda r: (-r[1], r[0]))
    return "input", rows


def _plot_sources(stats: dict[str, Any]) -> bytes:
    what, rows = sources(stats)
    if len(rows) > TOP:
        rows = rows[: TOP - 1] + [("(the other %d)" % (len(rows) - TOP + 1), sum(r[1] for r in rows[TOP - 1 :]), 0)]
    labels = [r[0] if len(r[0]) <= 40 else "..." + r[0][-37:] for r in rows]
    fig, ax = _figure(7, 0.9 + 0.32 * max(1, len(rows)), labels=labels, bottom=0.5, top=0.3)
    ax.barh(range(len(rows)), [r[1] for r in rows], color="#4878d0")
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    _integer_ticks(ax.xaxis)  # whole tokens, however few
    ax.set_xlabel("tokens")
    ax.set_title(f"Tokens by {what}", y=_TITLE_Y)
    ax.grid(True, axis="x", alpha=0.3)
    return _png(fig)


def _plural(n: int, word: str) -> str:
    """``1 shard``, ``2 shards``, ``1,234 documents``."""
    return f"{n:,} {word}{'s' * (n != 1)}"


def _legend_above(ax: Any, columns: int) -> None:
    """The legend above the axes, right of the title (placed left): it covers no bar, however low."""
    ax.legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncols=max(1, columns), frameon=False, borderaxespad=0.1)


def _integer_ticks(axis: Any) -> None:
    """Ticks at whole numbers only (shards, documents), formatted as counts: never -0.25 or 0.5 of a shard."""
    from matplotlib.ticker import MaxNLocator

    axis.set_major_locator(MaxNLocator(integer=True, min_n_ticks=1))
    axis.set_major_formatter(_count_format())


def _plot_fill(stats: dict[str, Any]) -> bytes:
    fig, ax = _figure(7, 3.2)
    cap = stats["shard_tokens"]
    x = 0
    splits = [(split, np.array(s["shards"], dtype=float)) for split, s in stats["splits"].items()]
    for i, (split, sizes) in enumerate(splits):
        label, color = f"{split} ({_plural(len(sizes), 'shard')})", f"C{i}"
        if len(sizes) > 200:  # thousands of bars: one outline per split, drawn at once
            ax.stairs(sizes, np.arange(x, x + len(sizes) + 1) - 0.5, fill=True, color=color, label=label)
        else:
            ax.bar(np.arange(x, x + len(sizes)), sizes, color=color, label=label)
        x += len(sizes)
    biggest = max((float(sizes.max()) for _, sizes in splits if len(sizes)), default=0.0)
    if biggest >= cap / 4:  # the shard size on the scale: how full each shard is
        ax.axhline(cap, color="gray", linestyle="--", linewidth=1)
        ax.set_ylim(0, cap * 1.1)
        size = f"dashed: the shard size, {cap:,} tokens"
    else:  # a few small shards: to their own scale, or they would be invisible under the shard size
        ax.set_ylim(0, max(1.0, biggest) * 1.15)
        size = f"the shard size, {cap:,} tokens, is off this scale"
    ax.set_xlim(-0.5, max(1, x) - 0.5)
    _integer_ticks(ax.xaxis)
    _integer_ticks(ax.yaxis)
    ax.set_xlabel(f"shard (in manifest order; {size})")
    ax.set_ylabel("tokens")
    ax.set_title("Tokens per shard", y=_TITLE_Y, loc="left")
    _legend_above(ax, len(splits))
    return _png(fig)


def _plot_parent(stats: dict[str, Any], parent_stats: dict[str, Any] | None, changes: list[Any], parent_ref: str) -> bytes:
    moved = [c for c in changes if c.documents_delta] or changes
    moved = moved[:TOP]
    labels = [c.relname if len(c.relname) <= 28 else "..." + c.relname[-25:] for c in moved]
    fig, (left, right) = _figure(11, 3.8, cols=2, labels=labels, gap=0.8)
    deltas = [c.documents_delta for c in moved]
    left.barh(range(len(moved)), deltas, color=["#6acc64" if d >= 0 else "#d65f5f" for d in deltas])
    left.set_yticks(range(len(moved)), labels)
    left.invert_yaxis()
    left.axvline(0, color="gray", linewidth=1)
    _integer_ticks(left.xaxis)  # whole documents
    left.set_xlabel("documents added (+) / removed (-)")
    left.set_title(f"Against {parent_ref}, per input", y=_TITLE_Y)
    edges = np.append(LENGTH_EDGES, LENGTH_EDGES[-1] * 2).astype(float)
    for label, st, style in (("this version", stats, "-"), (parent_ref, parent_stats, "--")):
        if st is None:
            continue
        hist = sum((pairs_to_hist(s["histogram"]) for s in st["splits"].values()), start=pairs_to_hist([]))
        nz = np.flatnonzero(hist)
        if len(nz):
            lo, hi = int(nz[0]), int(nz[-1]) + 1
            right.stairs(hist[lo:hi], edges[lo : hi + 1], linestyle=style, linewidth=1.6, label=label)
    _log_axes(right)
    right.set_ylim(bottom=_FEWEST)
    right.set_xlabel("document length (tokens)")
    right.set_title("Length distributions", y=_TITLE_Y, loc="left")
    _legend_above(right, 2)
    return _png(fig)


def makers(stats: dict[str, Any], pinfo: dict[str, Any] | None, parent_ref: str) -> dict[str, Callable[[], bytes]]:
    """Each plot the card has (``parent.png`` only with a parent), by PNG name: a function that draws it."""
    drawers: dict[str, Callable[[], bytes]] = {
        "lengths.png": lambda: _plot_lengths(stats),
        "tokens_by_source.png": lambda: _plot_sources(stats),
        "shard_fill.png": lambda: _plot_fill(stats),
    }
    if pinfo is not None:
        drawers["parent.png"] = lambda: _plot_parent(stats, pinfo["stats"], pinfo["changes"], parent_ref)
    return drawers
