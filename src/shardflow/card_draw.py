"""The dataset card's figures: described as data, then drawn into a PNG with Pillow, without matplotlib.

The card's plots (``card_plots.py``) are bars, histogram steps (filled or outlined) and straight
rules on linear or log axes, with a title, axis labels, tick labels and a legend: axis-aligned
rectangles and text. So they are described here as plain data (an ``Axes``: its ``Axis`` pair,
``Rect`` and ``Line`` artists, ``Entry`` legend rows), whose ticks and limits are computed by
matplotlib's rules, and drawn by a small rasterizer on Pillow, in a few milliseconds a plot:
matplotlib's import and drawing cost 0.8-1.0 s in the process that drew the card
(docs/PERFORMANCE.md). Tests read the description (ticks, labels, legend, limits), not pixels.

The look is matplotlib's defaults, which the card used: its own DejaVu Sans file (found without
importing matplotlib), font sizes, colours, line widths, tick lengths and pads, margins in inches
at 100 dpi; limits with 5% margins (none past a bar's base), whole-number ticks as
``MaxNLocator(integer=True)`` places them, decades on log axes with unlabelled minor ticks.
Rectangles are snapped to whole pixels (matplotlib snaps bars too); text is antialiased.
The same figure gives the same bytes (Pillow writes no date).
"""

from __future__ import annotations

import functools
import importlib.util
import io
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

__all__ = ["DPI", "COLORS", "Axis", "Rect", "Line", "Entry", "Axes", "Figure", "font_file", "count_label",
           "integer_ticks", "log_ticks"]

DPI = 100
_PT = DPI / 72  # pixels per point
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf")
"""matplotlib's default colour cycle: ``C0``, ``C1``, ..."""
_FONT_PT, _TITLE_PT = 10.0, 12.0  # tick labels, axis labels and legend ("medium"); titles ("large")
_SPINE_PT, _MAJOR_LEN_PT, _MINOR_LEN_PT, _MINOR_W_PT = 0.8, 3.5, 2.0, 0.6
_TICK_PAD_PT, _LABEL_PAD_PT, _TITLE_PAD_PT = 3.5, 4.0, 6.0
_GRID = ("#b0b0b0", 0.3, 0.8)  # colour, alpha, width in points
_DASH = (3.7, 1.6)  # "--": on and off, in multiples of the line's width (points)
_STEPS = (1, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10)  # MaxNLocator's steps; at most 10 intervals
_MARGIN = 0.05


def font_file() -> Path | None:
    """matplotlib's DejaVu Sans, the card's font, found without importing matplotlib (None: not installed)."""
    try:
        spec = importlib.util.find_spec("matplotlib")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "mpl-data" / "fonts" / "ttf" / "DejaVuSans.ttf"
    return path if path.is_file() else None


def _font(points: float) -> Any:
    """The card's font at ``points``, one object per thread (a FreeType face is not to be shared between threads)."""
    return _thread_font(points, threading.get_ident())


@functools.lru_cache(maxsize=64)
def _thread_font(points: float, _thread: int) -> Any:
    from PIL import ImageFont

    path = font_file()
    if path is None:
        raise RuntimeError("matplotlib's DejaVu Sans font is not installed")
    # The basic layout: the same glyph positions whether or not Pillow was built with libraqm.
    return ImageFont.truetype(str(path), points * _PT, layout_engine=ImageFont.Layout.BASIC)


def text_width(text: str, points: float = _FONT_PT) -> float:
    """A label's width in pixels (the margin that fits a bar chart's names)."""
    return float(_font(points).getlength(text))


def count_label(v: float) -> str:
    """250k, 1.5M, 2G rather than an offset exponent (1e7)."""
    for div, unit in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= div:
            return f"{v / div:g}{unit}"
    return f"{v:g}"


def integer_ticks(lo: float, hi: float, nbins: int = 10) -> list[float]:
    """Whole-number ticks in ``[lo, hi]``, as matplotlib's ``MaxNLocator(integer=True, min_n_ticks=1)``."""
    span = hi - lo
    if span <= 0:
        return [float(round(lo))] if abs(lo - round(lo)) < 1e-9 else []
    scale = 10.0 ** math.floor(math.log10(span / nbins))
    steps = [s * scale * m for m in (0.1, 1, 10) for s in _STEPS]
    steps = sorted({s for s in steps if s < 1 or abs(s - round(s)) < 1e-3})
    step = next(s for s in steps if s >= span / nbins * (1 - 1e-9))
    step = max(1.0, step)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + k * step for k in range(int((hi - first) / step + 1e-9) + 1)]


def log_ticks(lo: float, hi: float, numticks: int = 9) -> tuple[list[float], list[float]]:
    """``(major, minor)`` ticks of a log axis in ``[lo, hi]``: the decades (every ``stride``-th where there
    are many, as ``LogLocator``), and 2..9 times each decade where every decade is a major tick."""
    a, b = math.log10(lo), math.log10(hi)
    first, last = math.ceil(a - 1e-9), math.floor(b + 1e-9)
    stride = max(1, math.ceil((last - first) / max(1, numticks - 1)))
    major = [10.0 ** k for k in range(first - first % stride, last + 1, stride) if k >= first]
    minor = [] if stride > 1 else [m * 10.0 ** k for k in range(first - 1, last + 1) for m in range(2, 10)
                                   if lo <= m * 10.0 ** k <= hi]
    return major, minor


@dataclass
class Axis:
    """One axis: its scale, limits (``lo``/``hi`` where given, else from the data), ticks and label."""

    log: bool = False
    lo: float | None = None
    hi: float | None = None
    label: str = ""
    inverted: bool = False
    grid: bool = False
    names: list[tuple[float, str]] | None = None
    """A bar chart's category axis: ticks at these places, with these names."""
    major: list[tuple[float, str]] = field(default_factory=list)
    """Set by ``Axes.finish``: each major tick in view and its label (so are ``minor``)."""
    minor: list[tuple[float, str]] = field(default_factory=list)
    _data: list[float] = field(default_factory=list)
    _sticky: set[float] = field(default_factory=set)

    def extend(self, *values: float, sticky: float | None = None) -> None:
        self._data.extend(v for v in values if math.isfinite(v) and (v > 0 or not self.log))
        if sticky is not None:
            self._sticky.add(sticky)

    @property
    def view(self) -> tuple[float, float]:
        assert self.lo is not None and self.hi is not None, "Axes.finish() first"
        return self.lo, self.hi

    def _autoscale(self) -> None:
        data = self._data or [1.0 if self.log else 0.0]
        dlo, dhi = min(data), max(data)
        if self.log:
            a, b = math.log10(dlo), math.log10(dhi)
            if a == b:
                a, b = a - 1, b + 1
            pad = (b - a) * _MARGIN
            lo, hi = 10 ** (a - pad), 10 ** (b + pad)
        else:
            if dlo == dhi:
                dlo, dhi = (dlo, dlo + 1) if dlo in self._sticky else (dlo - 0.5, dhi + 0.5)
            pad = (dhi - dlo) * _MARGIN
            lo = dlo if dlo in self._sticky else dlo - pad
            hi = dhi if dhi in self._sticky else dhi + pad
        self.lo = lo if self.lo is None else self.lo
        self.hi = hi if self.hi is None else self.hi

    def _ticks(self, length_pt: float, per_label_pt: float) -> None:
        lo, hi = self.view
        if self.names is not None:
            self.major = [(v, s) for v, s in self.names if lo <= v <= hi]
            return
        if not self.log:
            self.major = [(v, count_label(v)) for v in integer_ticks(lo, hi)]
            return
        numticks = max(2, min(9, int(length_pt // per_label_pt)))
        major, minor = log_ticks(lo, hi, numticks)
        self.major = [(v, count_label(v)) for v in major]
        # As matplotlib's own: an axis that spans little more than a decade labels 2 and 5 too.
        few = hi / lo <= 30
        self.minor = [(v, count_label(v) if few and round(v / 10 ** math.floor(math.log10(v) + 1e-9)) in (2, 5) else "")
                      for v in minor]
        if not any(label for _, label in self.major + self.minor):  # no decade, no 2 or 5 in view: plain ticks, as matplotlib
            self.minor = [(v, count_label(v)) for v in integer_ticks(lo, hi) if v > 0]

    def fraction(self, v: float) -> float:
        """Where ``v`` is along the axis, 0 at ``lo`` and 1 at ``hi`` (outside: beyond; log of v <= 0: -inf)."""
        lo, hi = self.view
        if self.log:
            if v <= 0:
                return -math.inf
            f = (math.log10(v) - math.log10(lo)) / (math.log10(hi) - math.log10(lo))
        else:
            f = (v - lo) / (hi - lo)
        return 1 - f if self.inverted else f


@dataclass(frozen=True)
class Rect:
    """A filled rectangle in data coordinates (a bar, a histogram bin)."""

    x0: float
    x1: float
    y0: float
    y1: float
    color: str
    alpha: float = 1.0


@dataclass(frozen=True)
class Line:
    """A polyline of horizontal and vertical segments in data coordinates (a histogram's outline, a rule);
    ``across``: a rule at ``xs[0]`` ("x") or ``ys[0]`` ("y") across the whole axes."""

    xs: tuple[float, ...]
    ys: tuple[float, ...]
    color: str
    width: float = 1.0
    dashed: bool = False
    across: str | None = None


@dataclass(frozen=True)
class Entry:
    """A legend row: a filled patch, or a line (``line``) as the artist it names."""

    label: str
    color: str
    alpha: float = 1.0
    line: bool = False
    dashed: bool = False
    width: float = 1.0


@dataclass
class Axes:
    x: Axis = field(default_factory=Axis)
    y: Axis = field(default_factory=Axis)
    rects: list[Rect] = field(default_factory=list)
    lines: list[Line] = field(default_factory=list)
    title: str = ""
    title_left: bool = False
    legend: list[Entry] = field(default_factory=list)
    box: tuple[float, float, float, float] = (0.0, 0.0, 1.0, 1.0)
    """Set by ``Figure``: left, top, right, bottom in pixels."""

    def bars(self, at: Sequence[float], sizes: Sequence[float], colors: Sequence[str] | str, *, horizontal: bool = False,
             thickness: float = 0.8, alpha: float = 1.0) -> None:
        """Bars from 0 (``bar``/``barh``), ``thickness`` wide, centred on ``at``."""
        colors = [colors] * len(at) if isinstance(colors, str) else list(colors)
        for c, v, color in zip(at, sizes, colors):
            a, b = c - thickness / 2, c + thickness / 2
            rect = Rect(0, v, a, b, color, alpha) if horizontal else Rect(a, b, 0, v, color, alpha)
            self.add(rect, sticky_zero="x" if horizontal else "y")

    def stairs(self, values: Sequence[float], edges: Sequence[float], color: str, *, fill: bool, alpha: float = 1.0,
               width: float = 1.0, dashed: bool = False) -> None:
        """A histogram (``stairs``) from a base of 0: filled bins, or its outline down to the base at both ends
        (``width`` in points: a patch's default, 1)."""
        if fill:
            for v, a, b in zip(values, edges[:-1], edges[1:]):
                self.add(Rect(a, b, 0, v, color, alpha), sticky_zero="y")
            return
        xs = [edges[0]] + [e for e in edges[1:-1] for _ in (0, 1)] + [edges[-1]]
        ys = [v for v in values for _ in (0, 1)]
        self.lines.append(Line((edges[0], *xs, edges[-1]), (0, *ys, 0), color, width, dashed))
        self.x.extend(edges[0], edges[-1])
        self.y.extend(*values, sticky=0.0)

    def add(self, rect: Rect, *, sticky_zero: str | None = None) -> None:
        self.rects.append(rect)
        self.x.extend(rect.x0, rect.x1, sticky=0.0 if sticky_zero == "x" else None)
        self.y.extend(rect.y0, rect.y1, sticky=0.0 if sticky_zero == "y" else None)

    def rule(self, value: float, *, across: str, color: str = "gray", width: float = 1.0, dashed: bool = False) -> None:
        """``axhline`` (``across="y"``: at height ``value``) or ``axvline`` (``"x"``)."""
        self.lines.append(Line((value,), (value,), color, width, dashed, across=across))

    def finish(self) -> None:
        """Limits from the data where not set, then the ticks, for the axes' size in pixels."""
        left, top, right, bottom = self.box
        for axis, length_px, per_label in ((self.x, right - left, 3), (self.y, bottom - top, 2)):
            axis._autoscale()
            axis._ticks(length_px / _PT, _FONT_PT * per_label)

    def to_pixels(self, x: float, y: float) -> tuple[float, float]:
        left, top, right, bottom = self.box
        return left + self.x.fraction(x) * (right - left), bottom - self.y.fraction(y) * (bottom - top)


@dataclass
class Figure:
    """A figure ``width`` × ``height`` inches, its axes side by side between fixed margins (inches)."""

    width: float
    height: float
    axes: list[Axes]
    left: float = 0.85
    right: float = 0.25
    bottom: float = 0.6
    top: float = 0.35
    gap: float = 0.0

    def __post_init__(self) -> None:
        w, h = self.width * DPI, self.height * DPI
        each = (w - (self.left + self.right + self.gap * (len(self.axes) - 1)) * DPI) / len(self.axes)
        for i, ax in enumerate(self.axes):
            x0 = self.left * DPI + i * (each + self.gap * DPI)
            ax.box = (x0, self.top * DPI, x0 + each, h - self.bottom * DPI)
            ax.finish()

    @property
    def size(self) -> tuple[int, int]:
        return round(self.width * DPI), round(self.height * DPI)

    def png(self) -> bytes:
        from PIL import Image

        image = Image.new("RGB", self.size, "white")
        for ax in self.axes:
            _Painter(image).axes(ax)
        buf = io.BytesIO()
        image.save(buf, format="PNG", dpi=(DPI, DPI))
        return buf.getvalue()


def _rgba(color: str, alpha: float = 1.0) -> tuple[int, int, int, int]:
    from PIL import ImageColor

    r, g, b = ImageColor.getrgb(color)[:3]
    return r, g, b, round(255 * alpha)


class _Painter:
    """Draws one ``Axes`` onto an image, in matplotlib's order: patches, grid, lines, spines, ticks, text."""

    def __init__(self, image: Any) -> None:
        from PIL import ImageDraw

        self.image = image
        self.draw = ImageDraw.Draw(image, "RGBA")  # colours with an alpha are blended

    def rect(self, x0: float, y0: float, x1: float, y1: float, fill: tuple[int, int, int, int],
             clip: tuple[float, float, float, float] | None = None) -> None:
        (x0, x1), (y0, y1) = sorted((x0, x1)), sorted((y0, y1))
        if clip is not None:
            x0, x1, y0, y1 = max(x0, clip[0]), min(x1, clip[2]), max(y0, clip[1]), min(y1, clip[3])
        if x1 <= x0 or y1 <= y0:
            return
        a, b, c, d = (math.floor(v + 0.5) for v in (x0, x1, y0, y1))  # halves up: a line 1 px wide stays 1 px
        self.draw.rectangle((a, c, max(a, b - 1), max(c, d - 1)), fill=fill)  # at least one pixel

    def segments(self, points: list[tuple[float, float]], width: float, fill: tuple[int, int, int, int], dashed: bool,
                 clip: tuple[float, float, float, float] | None = None) -> None:
        """Horizontal and vertical segments ``width`` points wide, joined square; dashed as matplotlib's "--"."""
        w = max(1.0, round(width * _PT))
        on, off = (_DASH[0] * width * _PT, _DASH[1] * width * _PT) if dashed else (math.inf, 0.0)
        phase = 0.0  # along the pattern
        for (xa, ya), (xb, yb) in zip(points, points[1:]):
            length = abs(xb - xa) + abs(yb - ya)
            if not math.isfinite(length) or length == 0:
                continue
            pos = 0.0
            while pos < length:
                drawing = phase < on
                run = min(length - pos, (on - phase) if drawing else (on + off - phase))
                if drawing:
                    s, e = pos / length, (pos + run) / length
                    xs, xe = xa + (xb - xa) * s, xa + (xb - xa) * e
                    ys, ye = ya + (yb - ya) * s, ya + (yb - ya) * e
                    self.rect(min(xs, xe) - w / 2, min(ys, ye) - w / 2, max(xs, xe) + w / 2, max(ys, ye) + w / 2, fill, clip)
                pos += run
                phase = (phase + run) % (on + off) if dashed else 0.0

    def text(self, xy: tuple[float, float], text: str, points: float = _FONT_PT, anchor: str = "la",
             rotate: bool = False) -> tuple[float, float, float, float]:
        """Black text anchored at ``xy`` (Pillow's anchors); ``rotate``: turned 90° anticlockwise, ``xy`` its
        right middle. Its box."""
        from PIL import Image, ImageDraw

        font = _font(points)
        if not rotate:
            self.draw.text(xy, text, fill="black", font=font, anchor=anchor)
            return self.draw.textbbox(xy, text, font=font, anchor=anchor)
        x0, y0, x1, y1 = font.getbbox(text, anchor="ls")
        ascent, descent = font.getmetrics()
        mask = Image.new("L", (max(1, int(x1 - x0) + 2), ascent + descent))
        ImageDraw.Draw(mask).text((-x0 + 1, ascent), text, fill=255, font=font, anchor="ls")
        mask = mask.transpose(Image.Transpose.ROTATE_90)
        left, top = round(xy[0] - mask.width), round(xy[1] - mask.height / 2)
        self.image.paste((0, 0, 0), (left, top, left + mask.width, top + mask.height), mask)
        return left, top, left + mask.width, top + mask.height

    def axes(self, ax: Axes) -> None:
        left, top, right, bottom = box = ax.box
        px = ax.to_pixels
        for r in ax.rects:
            (x0, y0), (x1, y1) = px(r.x0, r.y0), px(r.x1, r.y1)
            self.rect(x0, y1, x1, y0, _rgba(r.color, r.alpha), box)
        color, alpha, gw = _GRID
        for axis, across in ((ax.x, "x"), (ax.y, "y")):
            if axis.grid:
                for v, _ in axis.major:
                    self._rule(ax, v, across, gw, _rgba(color, alpha), False)
        for line in ax.lines:
            if line.across:
                self._rule(ax, line.xs[0] if line.across == "x" else line.ys[0], line.across, line.width,
                           _rgba(line.color), line.dashed)
            else:
                pts = [px(x, y) for x, y in zip(line.xs, line.ys)]
                pts = [(x, y if math.isfinite(y) else bottom + 10) for x, y in pts]  # log of 0: below the axes
                self.segments(pts, line.width, _rgba(line.color), line.dashed, box)
        black = _rgba("black")
        sw = max(1, round(_SPINE_PT * _PT))
        for x0, y0, x1, y1 in ((left, top, right, top), (left, bottom, right, bottom), (left, top, left, bottom),
                               (right, top, right, bottom)):
            self.rect(x0 - sw / 2, y0 - sw / 2, x1 + sw / 2, y1 + sw / 2, black)
        xlabels_end = self._xticks(ax, bottom)
        ylabels_start = self._yticks(ax, left)
        if ax.x.label:
            self.text(((left + right) / 2, xlabels_end + _LABEL_PAD_PT * _PT), ax.x.label, anchor="ma")
        if ax.y.label:
            self.text((ylabels_start - _LABEL_PAD_PT * _PT, (top + bottom) / 2), ax.y.label, rotate=True)
        if ax.title:
            at = (left, "ls") if ax.title_left else ((left + right) / 2, "ms")
            self.text((at[0], top - _TITLE_PAD_PT * _PT), ax.title, _TITLE_PT, anchor=at[1])
        self._legend(ax)

    def _rule(self, ax: Axes, v: float, across: str, width: float, fill: tuple[int, int, int, int], dashed: bool) -> None:
        left, top, right, bottom = ax.box
        if across == "x":
            x = ax.to_pixels(v, 1.0 if ax.y.log else 0.0)[0]
            self.segments([(x, top), (x, bottom)], width, fill, dashed, ax.box)
        else:
            y = ax.to_pixels(1.0 if ax.x.log else 0.0, v)[1]
            self.segments([(left, y), (right, y)], width, fill, dashed, ax.box)

    def _xticks(self, ax: Axes, bottom: float) -> float:
        """The x axis's ticks and labels; the bottom of its labels."""
        end = bottom + _MAJOR_LEN_PT * _PT
        for ticks, length, width in ((ax.x.minor, _MINOR_LEN_PT, _MINOR_W_PT), (ax.x.major, _MAJOR_LEN_PT, _SPINE_PT)):
            for v, label in ticks:
                x = ax.to_pixels(v, 1.0 if ax.y.log else 0.0)[0]
                self.segments([(x, bottom), (x, bottom + length * _PT)], width, _rgba("black"), False)
                if label:
                    box = self.text((x, bottom + (length + _TICK_PAD_PT) * _PT), label, anchor="ma")
                    end = max(end, box[3])
        return end

    def _yticks(self, ax: Axes, left: float) -> float:
        """The y axis's ticks and labels; the left of its labels."""
        start = left - _MAJOR_LEN_PT * _PT
        for ticks, length, width in ((ax.y.minor, _MINOR_LEN_PT, _MINOR_W_PT), (ax.y.major, _MAJOR_LEN_PT, _SPINE_PT)):
            for v, label in ticks:
                y = ax.to_pixels(1.0 if ax.x.log else 0.0, v)[1]
                self.segments([(left - length * _PT, y), (left, y)], width, _rgba("black"), False)
                if label:
                    box = self.text((left - (length + _TICK_PAD_PT) * _PT, y), label, anchor="rm")
                    start = min(start, box[0])
        return start

    def _legend(self, ax: Axes) -> None:
        """One row above the axes' right end, without a frame (matplotlib's ``loc="lower right"``,
        ``bbox_to_anchor=(1, 1)``, ``borderaxespad=0.1``): it covers no bar, however high."""
        if not ax.legend:
            return
        em = _FONT_PT * _PT
        font = _font(_FONT_PT)
        handle, handle_h, pad, spacing = 2.0 * em, 0.7 * em, 0.8 * em, 2.0 * em
        widths = [handle + pad + font.getlength(e.label) for e in ax.legend]
        ascent, descent = font.getmetrics()
        mid = ax.box[1] - (0.1 + 0.4) * em - (ascent + descent) / 2
        x = ax.box[2] - 0.4 * em - 0.1 * em - sum(widths) - spacing * (len(widths) - 1)
        for entry, width in zip(ax.legend, widths):
            if entry.line:
                self.segments([(x, mid), (x + handle, mid)], entry.width, _rgba(entry.color, entry.alpha), entry.dashed)
            else:
                self.rect(x, mid - handle_h / 2, x + handle, mid + handle_h / 2, _rgba(entry.color, entry.alpha))
            self.text((x + handle + pad, mid), entry.label, anchor="lm")
            x += width + spacing
