"""The dataset card: ``card/README.md`` and its plots, in every version directory that has statistics.

The card is a view of ``stats.json`` (and of the parent version's, for the
comparison), written at finalize beside the manifest, so it is published with
the version. It reads well on GitHub and in a file browser: Markdown tables
and PNGs linked by relative paths:

    card/README.md             summary, splits, top sources, vocabulary, skipped documents, vs. the parent
    card/lengths.png           the document-length histogram per split (log-log)
    card/tokens_by_source.png  tokens by --stats-column value, else by input
    card/shard_fill.png        tokens per shard against the shard size
    card/parent.png            documents added/removed per input, and the length distributions overlaid

The plots need matplotlib (part of ``pip install 'shardflow[pipeline]'``), drawn on an Agg
canvas (no pyplot, no display) and without a timestamp in the PNG, so the same statistics give
the same bytes. Without matplotlib the card is text only and says how to get
the plots. ``SHARDFLOW_CARD=0`` writes no card at all (``stats.json`` still).
"""

from __future__ import annotations

import io
import json
import logging
import os
from pathlib import Path
from typing import Any, Callable

import numpy as np

from ._io import atomic_write_bytes, atomic_write_text
from .diff import input_changes
from .errors import ShardflowError
from .faults import fault
from .manifest import Manifest, read_manifest
from .stats import LENGTH_EDGES, STATS_NAME, odd_line, pairs_to_hist

__all__ = ["CARD_DIR", "CARD_NAME", "CARD_ENV", "PLOTS", "INSTALL_HINT", "write_card", "draw_plots", "draw_plots_here", "use_plot_helper", "plots_drawn_elsewhere", "write_card_text", "card_path", "plot_available", "card_wanted", "stamp_card", "redraw_card"]

log = logging.getLogger("shardflow.card")

CARD_DIR = "card"
CARD_NAME = "README.md"
INSTALL_HINT = "pip install 'shardflow[pipeline]'"
PLOTS = ("lengths.png", "tokens_by_source.png", "shard_fill.png", "parent.png")
_TOP = 15
_DPI = 100
# Set to 0 to write no card (stats.json is still written): a build on a machine that never shows it.
CARD_ENV = "SHARDFLOW_CARD"


def card_wanted() -> bool:
    return os.environ.get(CARD_ENV, "1") != "0"


def card_path(directory: Path | str) -> Path:
    return Path(directory) / CARD_DIR / CARD_NAME


def plot_available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def _figure(width: float, height: float, *, cols: int = 1, labels: list[str] | None = None, bottom: float = 0.6,
            top: float = 0.35, gap: float = 0.0) -> tuple[Any, Any]:
    """A figure and its axes, without pyplot: no global state, so a card can be drawn on any thread.

    The margins are fixed, in inches (tick labels, axis labels, title): matplotlib's
    ``layout="constrained"`` measured every text several times per draw, half the
    card's drawing time. ``labels``: the first axes' y tick labels (a bar chart's
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
# naming the place skips its automatic placement, which measured every tick label of the axes again
# at each draw (a tenth of the card's drawing time), and leaves the PNGs' bytes as they were.
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


def _sources(stats: dict[str, Any]) -> tuple[str, list[tuple[str, int, int]]]:
    """``(what, [(label, tokens, documents)])``: by the stats column when there is one, else by input."""
    if stats.get("by_column"):
        col = stats["by_column"]
        return f"--stats-column {col['column']}", [(v["value"], v["tokens"], v["documents"]) for v in col["values"]]
    rows = sorted(((i["relname"], i["tokens"], i["documents"]) for i in stats["inputs"]), key=lambda r: (-r[1], r[0]))
    return "input", rows


def _plot_sources(stats: dict[str, Any]) -> bytes:
    what, rows = _sources(stats)
    if len(rows) > _TOP:
        rows = rows[: _TOP - 1] + [("(the other %d)" % (len(rows) - _TOP + 1), sum(r[1] for r in rows[_TOP - 1 :]), 0)]
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
    moved = moved[:_TOP]
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


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    def cell(v: Any) -> str:
        text = f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else str(v)
        return text.replace("|", "\\|").replace("\n", "\\n")

    out = ["| " + " | ".join(header) + " |", "|" + "|".join("---:" if i else "---" for i in range(len(header))) + "|"]
    out += ["| " + " | ".join(cell(v) for v in r) + " |" for r in rows]
    return out


def _markdown(manifest: Manifest, stats: dict[str, Any], plots: dict[str, bool], parent: dict[str, Any] | None) -> str:
    totals = stats["totals"]
    title = manifest.ref if manifest.version else f"{manifest.name} (build {manifest.build_key[:12]})"
    lines = [f"# Dataset card: {title}", ""]
    if manifest.description:
        lines += [manifest.description, ""]
    lines += [
        f"**{totals['documents']:,} documents, {totals['tokens']:,} tokens** from {totals['inputs']:,} input file{'s' * (totals['inputs'] != 1)}; "
        f"tokenizer `{manifest.tokenized_info.get('tokenizer')}` ({manifest.dtype}), format `{manifest.format_name}`, "
        f"boundary `{manifest.boundary_tokens.describe()}`."
        + (f" Parent version: `{manifest.parent}`." if manifest.parent else ""),
        "",
        "Generated by shardflow from `stats.json` (beside `metadata.yaml`, which records its SHA-256).",
        "",
    ]
    if not any(plots.values()):
        lines += [f"> The plots need matplotlib: `{INSTALL_HINT}`, then draw them: `shardflow card {manifest.ref if manifest.version else manifest.name + '@latest'}`.", ""]
    lines += ["## Document lengths", ""]
    if plots.get("lengths.png"):
        lines += ["![Document-length histogram per split, log scale](lengths.png)", ""]
    rows = [
        [split, s["documents"], s["tokens"], s["min_length"], f"{s['mean_length']:,.1f}", s["p50_at_most"], s["p90_at_most"],
         s["p99_at_most"], s["max_length"]]
        for split, s in stats["splits"].items()
    ]
    lines += _table(["split", "documents", "tokens", "min", "mean", "p50 <=", "p90 <=", "p99 <=", "max"], rows)
    lines += ["", "Lengths count the boundary tokens; percentiles are bounds within a quarter octave.", ""]
    what, src = _sources(stats)
    lines += [f"## Tokens by {what}", ""]
    if plots.get("tokens_by_source.png"):
        lines += [f"![Tokens by {what}](tokens_by_source.png)", ""]
    total = max(1, totals["tokens"])
    lines += _table([what.split()[-1], "tokens", "share", "documents"],
                    [[label, t, f"{100 * t / total:.1f}%", d] for label, t, d in src[:_TOP]])
    if len(src) > _TOP:
        lines += ["", f"... and {len(src) - _TOP} more (see `stats.json`)."]
    lines += ["", "## Shards", ""]
    if plots.get("shard_fill.png"):
        lines += ["![Tokens per shard against the shard size](shard_fill.png)", ""]
    for split, s in stats["splits"].items():
        n = len(s["shards"])
        lines.append(f"- {split}: {n} shard{'s' * (n != 1)} of up to {stats['shard_tokens']:,} tokens")
    voc = stats["vocabulary"]
    lines += [
        "",
        "## Vocabulary",
        "",
        f"{voc['used']:,} of {voc['size']:,} ids used ({100 * voc['share_used']:.1f}%). The most frequent:",
        "",
    ]
    lines += _table(["id", "text", "count", "share"],
                    [[str(t["id"]), f"`{t['text']!r}`", t["count"], f"{100 * t['share']:.2f}%"] for t in voc["top"][:_TOP]])
    sk = stats["documents_skipped"]
    lines += [
        "",
        "## Skipped, replaced, truncated",
        "",
        f"- skipped: {sk['null_texts']:,} null, {sk['empty_texts']:,} empty, {sk['invalid_utf8']:,} invalid UTF-8, "
        f"{sk['bad_records']:,} unreadable records",
        f"- invalid UTF-8 replaced by U+FFFD: {stats['documents_replaced']:,} documents",
        f"- truncated: {stats['documents_truncated']:,} (shardflow never truncates a document)",
        f"- anything odd: {odd_line(stats)}",
    ]
    if not stats.get("complete", True):
        lines += ["", "> Incomplete: the parent version this one reuses inputs from has no statistics."]
    if manifest.parent:
        lines += ["", f"## Against the parent, {manifest.parent}", ""]
        if parent is None:
            lines.append("The parent version is not available (or has no statistics).")
        else:
            if plots.get("parent.png"):
                lines += ["![Documents added or removed per input; length distributions overlaid](parent.png)", ""]
            changes = [c for c in parent["changes"] if c.status != "same"]
            same = len(parent["changes"]) - len(changes)
            lines += _table(["input", "status", "documents", "change"],
                            [[c.relname, c.status, c.documents_b, f"{c.documents_delta:+,}"] for c in changes[:50]])
            lines += ["", f"{same} input{'s' * (same != 1)} unchanged."]
    return "\n".join(lines) + "\n"


def _parent_info(parent: Path | None, manifest: Manifest) -> dict[str, Any] | None:
    if parent is None:
        return None
    try:
        pm = read_manifest(parent)
    except (OSError, ShardflowError):
        return None
    pstats_path = Path(parent) / STATS_NAME
    pstats = json.loads(pstats_path.read_text(encoding="utf-8")) if pstats_path.exists() else None
    return {"manifest": pm, "stats": pstats, "changes": input_changes(pm, manifest)}


def stamp_card(directory: Path | str, ref: str) -> None:
    """Put the version's reference into the card's title when it is published (the card is drawn before)."""
    path = card_path(directory)
    if not path.is_file():
        return
    first, sep, rest = path.read_text(encoding="utf-8").partition("\n")
    if first.startswith("# Dataset card: "):
        atomic_write_text(path, f"# Dataset card: {ref}{sep}{rest}")


# The helper process drawing the plots (shardflow.plot_helper), when the command line started one.
_helper: Any = None


def use_plot_helper(helper: Any) -> None:
    """Draw the plots with ``helper`` (a ``plot_helper.PlotHelper``) from now on; None: in this process."""
    global _helper
    _helper = helper


def plots_drawn_elsewhere() -> bool:
    """Whether a helper process draws the plots (so this process need not import matplotlib)."""
    return _helper is not None


def draw_plots(
    directory: Path | str, manifest: Manifest, *, parent: Path | None = None, parent_ref: str | None = None
) -> dict[str, bool]:
    """Draw the card's PNGs into ``card/`` of a directory that has ``stats.json``; which plots the card shows.

    Every PNG is written under a temporary name and renamed. Without matplotlib
    none is drawn (every value False). ``write_card_text`` then writes the
    Markdown that links them. Drawn by the plot helper when there is one (see
    ``shardflow.plot_helper``), else, or if it cannot, here.
    """
    helper = _helper
    if helper is not None:
        drawn = helper.draw(directory, manifest, parent=parent, parent_ref=parent_ref)
        if drawn is not None:
            return drawn
    return draw_plots_here(directory, manifest, parent=parent, parent_ref=parent_ref)


def _makers(stats: dict[str, Any], pinfo: dict[str, Any] | None, parent_ref: str) -> dict[str, Callable[[], bytes]]:
    """Each plot the card has (``parent.png`` only with a parent), by PNG name: a function that draws it."""
    makers: dict[str, Callable[[], bytes]] = {
        "lengths.png": lambda: _plot_lengths(stats),
        "tokens_by_source.png": lambda: _plot_sources(stats),
        "shard_fill.png": lambda: _plot_fill(stats),
    }
    if pinfo is not None:
        makers["parent.png"] = lambda: _plot_parent(stats, pinfo["stats"], pinfo["changes"], parent_ref)
    return makers


def draw_plots_here(
    directory: Path | str, manifest: Manifest, *, parent: Path | None = None, parent_ref: str | None = None
) -> dict[str, bool]:
    """:func:`draw_plots` in this process."""
    directory = Path(directory)
    stats = json.loads((directory / STATS_NAME).read_text(encoding="utf-8"))
    card_dir = directory / CARD_DIR
    card_dir.mkdir(exist_ok=True)
    makers = _makers(stats, _parent_info(parent, manifest), parent_ref or str(manifest.parent))
    plots = dict.fromkeys(makers, False)
    if plot_available():
        for name, make in makers.items():
            atomic_write_bytes(card_dir / name, make())
            plots[name] = True
            fault("card-plot", card_dir / name)
    else:
        log.info("no matplotlib: the dataset card is text only (%s)", INSTALL_HINT)
    return plots


def write_card_text(directory: Path | str, manifest: Manifest, plots: dict[str, bool], *, parent: Path | None = None) -> Path:
    """Write ``card/README.md`` (``plots``: the PNGs ``draw_plots`` drew); returns its path."""
    directory = Path(directory)
    stats = json.loads((directory / STATS_NAME).read_text(encoding="utf-8"))
    (directory / CARD_DIR).mkdir(exist_ok=True)
    path = card_path(directory)
    atomic_write_text(path, _markdown(manifest, stats, plots, _parent_info(parent, manifest)))
    return path


def redraw_card(directory: Path | str, *, catalog: Any = None) -> dict[str, bool]:
    """Draw a published version's card again (``shardflow card REF``) from its ``stats.json``; which plots it has.

    No card file is in the manifest's checksums (``stats.json`` is, checked here first): the version stays valid.
    Everything is drawn in memory first, then each file renamed into place; ``catalog`` finds the parent.
    """
    from .catalog import Catalog
    from .stats import stats_problems

    directory = Path(directory)
    manifest = read_manifest(directory)
    if "stats" not in manifest.extra or not (directory / STATS_NAME).is_file():
        raise ShardflowError(f"{directory}: {manifest.ref} has no statistics ({STATS_NAME}), so no card: it was built "
                             "with SHARDFLOW_STATS=0; build it again without that setting")
    problems = stats_problems(directory, manifest, checksums=True)
    if problems:
        raise ShardflowError(f"{directory}: its statistics do not match the manifest, so no card was drawn: {problems[0]}; "
                             f"run shardflow validate {manifest.ref}")
    if not plot_available():
        raise ShardflowError(f"the card's plots need matplotlib: {INSTALL_HINT}")
    parent = None
    if manifest.parent:
        try:
            parent = Catalog(catalog).resolve(manifest.parent)
        except (OSError, ShardflowError):  # the parent went away: the card says so, without the comparison
            parent = None
    stats = json.loads((directory / STATS_NAME).read_text(encoding="utf-8"))
    pinfo = _parent_info(parent, manifest)
    pngs = {name: make() for name, make in _makers(stats, pinfo, str(manifest.parent)).items()}  # all, before any is written
    plots = dict.fromkeys(pngs, True)
    text = _markdown(manifest, stats, plots, pinfo)
    card_dir = directory / CARD_DIR
    card_dir.mkdir(exist_ok=True)
    for name, data in pngs.items():
        atomic_write_bytes(card_dir / name, data)
    for stale in set(PLOTS) - set(pngs):
        (card_dir / stale).unlink(missing_ok=True)
    atomic_write_text(card_path(directory), text)
    return plots


def write_card(
    directory: Path | str, manifest: Manifest, *, parent: Path | None = None, parent_ref: str | None = None
) -> Path:
    """Write ``card/`` (plots and Markdown) into a version directory that has ``stats.json``; returns the card's path."""
    plots = draw_plots(directory, manifest, parent=parent, parent_ref=parent_ref)
    return write_card_text(directory, manifest, plots, parent=parent)
