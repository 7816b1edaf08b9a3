"""One pyqtgraph plot: a curve per run and series, in the run's colour.

Data arrive as numpy arrays from the MetricStore on the redraw timer; the plot
downsamples (peak) and clips to the view, so its cost does not grow with the
length of a run. (``gui/__init__`` has imported PySide6 before pyqtgraph.)

The view range is kept here rather than by pyqtgraph's auto-range: that one
refits on every new point, and each refit re-lays out the axes and repaints the
plot twice, most of a redraw's cost. Here the x range grows in 25 % steps and
the y range changes only when the data leave it or fill less than half of it,
so the axes stay still between those moments. Zooming or panning by hand hands
the range to the user; the plot's "A" button gives it back. ``min_y_span`` keeps
noise from filling the plot (a 60 KB change in memory is not a cliff), and
``outlier_series`` (compile warm-up steps) do not set the y range: points beyond
it are drawn at the edge as triangles.

Hovering over a plot reads out the point nearest the pointer (within
``HOVER_PX``) among the shown curves: its run, series, x and y, as
TensorBoard's tooltip does, with a ring on the point.

An empty plot shows a hint of what to do; the legend lives outside the plots
(``gui/widgets/run_legend.py``).
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QFontMetrics
from PySide6.QtWidgets import QLabel, QWidget

X_HEADROOM = 0.25
X_PAD = 0.02
Y_PAD = 0.08
MIN_FILL = 0.5

Bounds = tuple[float, float, float, float]


def configure_pyqtgraph() -> None:
    """Global pyqtgraph options: white background, no antialiasing (cheap lines)."""
    pg.setConfigOptions(background="w", foreground="#202020", antialias=False)


DASH_STYLES = {"solid": Qt.PenStyle.SolidLine, "dash": Qt.PenStyle.DashLine, "dot": Qt.PenStyle.DotLine,
               "dashdot": Qt.PenStyle.DashDotLine}
EDGE_SYMBOL = "t1"  # a triangle pointing up: a point above the range, drawn at its edge
MIN_PLOT_WIDTH, MIN_PLOT_HEIGHT = 150, 110
HOVER_PX = 24
"""How far from the pointer (in pixels) a point is still read out."""
SERIES_WORDS = {"train": "train", "smooth": "smoothed", "val": "validation", "warmup": "warm-up step"}
"""What the readout calls a series, where its plot has more than one (others: nothing)."""


def value_text(value: float) -> str:
    """A read-out value: four significant digits, whole numbers past ten thousand (tokens/s) without exponent."""
    return f"{value:,.0f}" if abs(value) >= 1e4 else f"{value:.4g}"


def _pen(color: str, style: str, dash: str = "solid", width: float = 1.0):
    """``style``: line, faint (the raw curve under a smoothed one), marked (line with dots), points."""
    if style == "points":
        return None
    c = QColor(color)
    if style == "faint":
        c.setAlpha(70)
    pen = pg.mkPen(c, width=width)
    pen.setStyle(DASH_STYLES.get(dash, Qt.PenStyle.SolidLine))
    return pen


def _at_edge(y: np.ndarray, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
    """Which of ``y`` lie beyond ``[lo, hi]``, and where those are drawn: just inside the edge, so the marker is
    not cut in half."""
    inset = (hi - lo) * 0.03
    beyond = (y > hi) | (y < lo)
    return beyond, np.clip(y[beyond], lo + inset, hi - inset)


def _bounds(x: np.ndarray, y: np.ndarray) -> tuple[Bounds, float] | None:
    """(xmin, xmax, ymin, ymax) of the finite points, and the smallest positive y (for log scale)."""
    ok = np.isfinite(x) & np.isfinite(y)
    if not ok.any():
        return None
    x, y = x[ok], y[ok]
    positive = y[y > 0]
    return ((float(x.min()), float(x.max()), float(y.min()), float(y.max())),
            float(positive.min()) if positive.size else math.inf)


def count_text(value: float) -> str:
    """A tick of a count axis: 20k, 1.5M, 2B past ten thousand (tokens seen), else the number."""
    for scale, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(value) >= 10 * scale or (scale > 1e3 and abs(value) >= scale):
            return f"{value / scale:.4g}{suffix}"
    return f"{value:.4g}"


RIGHT_MARGIN_PX = 14
"""Half the width of a five-digit tick label ("2,000") and a little air."""
REGION_LABEL_LEVELS = 8
"""Heights a shaded region's label takes in turn: compiled runs side by side on the step axis end their
warm-ups at the same step, and the labels of as many must not write over each other."""


class CountAxis(pg.AxisItem):
    """The x axis: ticks of tokens read 400k and 1.2M, not 400000 and 1.2e+06. With ``whole`` (optimizer
    steps), ticks fall on whole numbers only: a short run's axis has no step 1.5."""

    whole = False

    def tickStrings(self, values, scale, spacing):  # noqa: N802 (pyqtgraph's name)
        return [count_text(v * scale) for v in values]

    def tickValues(self, minVal, maxVal, size):  # noqa: N802, N803 (pyqtgraph's names)
        if not self.whole:
            return super().tickValues(minVal, maxVal, size)
        # One level of whole numbers spaced 1, 2, 5, 10, 20 … apart, as many as fit side by side with room between
        # them: pyqtgraph's minor level labelled every step of a short run, and "10 11 12 13 14" read "1011121314".
        if not (math.isfinite(minVal) and math.isfinite(maxVal)) or maxVal < minVal:
            return []
        metrics = QFontMetrics(self.style.get("tickFont") or self.font())
        for spacing in _whole_spacings():
            if (maxVal - minVal) / spacing * (TICK_GAP_PX + 1) > size:
                continue  # surely too dense: not measured label by label
            values = range(math.ceil(minVal / spacing) * spacing, math.floor(maxVal) + 1, spacing)
            widest = max((metrics.horizontalAdvance(count_text(v)) for v in values), default=0) + TICK_GAP_PX
            if len(values) <= 1 or size * spacing / max(maxVal - minVal, 1e-9) >= widest:
                return [(float(spacing), [float(v) for v in values])]
        return []  # not reached: the spacings grow without end


TICK_GAP_PX = 12
"""The least room between two tick labels of the step axis."""


def _whole_spacings():
    """1, 2, 5, 10, 20, 50, …"""
    scale = 1
    while True:
        for step in (1, 2, 5):
            yield step * scale
        scale *= 10


class ValueAxis(pg.AxisItem):
    """The y axis: on a log scale spanning less than a decade, ticks at round values (5.5, 6, 6.5, 7): pyqtgraph's
    fall on whole numbers and decades only and are written with one digit, so a loss from 5.4 to 7.6 read "6" and
    "7" and nothing else."""

    def tickValues(self, minVal, maxVal, size):  # noqa: N802, N803 (pyqtgraph's names)
        if not self.logMode or not (math.isfinite(minVal) and math.isfinite(maxVal)) or maxVal - minVal > 1:
            return super().tickValues(minVal, maxVal, size)
        self.logMode = False  # the linear ticks of the values themselves, placed at their logarithms
        try:
            levels = super().tickValues(10 ** minVal, 10 ** maxVal, size)
        finally:
            self.logMode = True
        return [(spacing, [math.log10(v) for v in values if v > 0]) for spacing, values in levels]

    def logTickStrings(self, values, scale, spacing):  # noqa: N802 (pyqtgraph's name)
        return [f"{10 ** v * scale:.3g}" for v in values]


class MetricPlot(pg.PlotWidget):
    def __init__(self, name: str, title: str, y_label: str, hint: str = "", min_y_span: float = 0.0,
                 outlier_series: tuple[str, ...] = (), parent: QWidget | None = None) -> None:
        super().__init__(parent=parent, axisItems={"bottom": CountAxis("bottom"), "left": ValueAxis("left")})
        self.setObjectName(name)
        self.setAccessibleName(f"{title} plot")  # what a screen reader says of it (its title is drawn, not a label)
        item = self.getPlotItem()
        item.setTitle(title, size="10pt")
        item.setLabel("left", y_label)
        item.getAxis("left").enableAutoSIPrefix(False)  # "0.003", not "3 (x0.001)"
        item.getAxis("bottom").enableAutoSIPrefix(False)  # its own k/M/B
        item.setDownsampling(auto=True, mode="peak")
        item.setClipToView(True)
        # The view's own menu (View All, each axis' range) stays; pyqtgraph's "Plot Options" goes: its log axes,
        # FFT, derivative, downsampling and averaging act behind this plot's own range, smoothing and "log loss",
        # which then framed a log axis with a linear range (empty plots, an axis of 1e-200 to 1e200).
        item.setMenuEnabled(False, enableViewBoxMenu=True)
        # Room right of the data area: the x axis' last label is centred on its edge, and a plot at the window's
        # right edge cut it in half.
        item.layout.setContentsMargins(1, 1, RIGHT_MARGIN_PX, 1)
        self.setMinimumSize(MIN_PLOT_WIDTH, MIN_PLOT_HEIGHT)
        # No Tab stop: the view takes no keys and draws no focus frame, so four stops between the legend and the
        # table seemed to lose the focus. A click still gives it focus (its menu, the mouse's range).
        self.setFocusPolicy(Qt.FocusPolicy.ClickFocus)
        self.title = title
        self.y_label = y_label
        self.min_y_span = min_y_span
        self.outlier_series = set(outlier_series)
        self._raw: dict[tuple[Hashable, str], tuple[np.ndarray, np.ndarray]] = {}
        self._edges: dict[tuple[Hashable, str], pg.PlotDataItem] = {}
        """Per outlier series: its points beyond the y range, at the edge."""
        self.hint = QLabel(hint, self)
        self.hint.setObjectName(f"{name}Hint")
        self.hint.setWordWrap(True)
        self.hint.setAlignment(Qt.AlignmentFlag.AlignCenter)
        self.hint.setStyleSheet("color: #707070; background: transparent;")
        self.hint.setAttribute(Qt.WidgetAttribute.WA_TransparentForMouseEvents)
        self.hint.setVisible(bool(hint))
        item.vb.sigResized.connect(self._place_hint)  # over the data area, wherever the axes leave it
        self._curves: dict[tuple[Hashable, str], pg.PlotDataItem] = {}
        self._bounds: dict[tuple[Hashable, str], tuple[Bounds, float]] = {}
        self._regions: dict[Hashable, pg.LinearRegionItem] = {}
        self._hidden: set[Hashable] = set()
        self._hidden_series: set[tuple[Hashable, str]] = set()
        self._log_y = False
        self._range: Bounds | None = None
        self._tight = True
        self.follow = True
        """The plot keeps its range around the data; False once the user zooms or pans."""
        view = item.getViewBox()
        view.disableAutoRange()
        view.sigRangeChangedManually.connect(self._on_manual_range)
        item.autoBtn.clicked.connect(self._on_auto_button)
        self._labels: dict[Hashable, str] = {}
        self._sorted: dict[tuple[Hashable, str], bool] = {}
        """Per series: its x never decreases, so the readout looks only near the pointer (found at the first
        readout after its points changed, not in every redraw)."""
        self._x_name, self._x_whole = "x", False
        self.readout = pg.TextItem(anchor=(0, 1), color="#202020", fill=pg.mkBrush(255, 255, 255, 230),
                                   border=pg.mkPen("#909090"))
        self.readout.setZValue(100)
        self.ring = pg.ScatterPlotItem(size=10, pen=pg.mkPen("#202020", width=1.5), brush=None)
        self.ring.setZValue(99)
        for mark in (self.readout, self.ring):
            mark.hide()
            item.addItem(mark, ignoreBounds=True)
        self.scene().sigMouseMoved.connect(self._on_mouse_moved)

    # ------------------------------------------------------------------ curves
    def curve(self, key: Hashable, series: str) -> pg.PlotDataItem | None:
        return self._curves.get((key, series))

    def curves_of(self, key: Hashable) -> dict[str, pg.PlotDataItem]:
        return {s: c for (k, s), c in self._curves.items() if k == key}

    def set_curve(self, key: Hashable, series: str, x: np.ndarray, y: np.ndarray, *, color: str,
                  style: str = "line", dash: str = "solid") -> pg.PlotDataItem:
        curve = self._curves.get((key, series))
        if curve is None:
            curve = pg.PlotDataItem(pen=_pen(color, style, dash, width=1.5 if style == "line" else 1.0))
            if style == "marked":
                curve.setSymbol("o")
                curve.setSymbolSize(5)
                curve.setSymbolBrush(pg.mkBrush(color))
                curve.setSymbolPen(None)
            elif style == "points":
                curve.setSymbol("x")
                curve.setSymbolSize(8)
                curve.setSymbolPen(pg.mkPen(color, width=1))
                curve.setSymbolBrush(pg.mkBrush(color))
            self.getPlotItem().addItem(curve)
            self._curves[(key, series)] = curve
            self._update_visibility(key, series)
            self.hint.setVisible(False)
        x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        if series in self.outlier_series:
            self._raw[(key, series)] = (x, y)
            self._draw_outliers(key, series)
        else:
            curve.setData(x, y)
        if style in ("line", "faint"):
            # A line of one point draws nothing: a run of a single step showed no loss and no learning rate.
            lone = int(np.isfinite(y).sum()) == 1
            if lone and curve.opts["symbol"] is None:
                curve.setSymbol("o")
                curve.setSymbolSize(5)
                curve.setSymbolBrush(pg.mkBrush(color))
                curve.setSymbolPen(None)
            elif not lone and curve.opts["symbol"] is not None:
                curve.setSymbol(None)
        self._sorted.pop((key, series), None)  # new points: looked at again by the next readout
        found = _bounds(x, y)
        if found is None:
            self._bounds.pop((key, series), None)
        else:
            self._bounds[(key, series)] = found
        return curve

    def remove_run(self, key: Hashable) -> None:
        """Forget every curve and region of run ``key``."""
        item = self.getPlotItem()
        for k, series in [c for c in self._curves if c[0] == key]:
            item.removeItem(self._curves.pop((k, series)))
            self._bounds.pop((k, series), None)
            self._raw.pop((k, series), None)
            self._hidden_series.discard((k, series))
            self._sorted.pop((k, series), None)
            edge = self._edges.pop((k, series), None)
            if edge is not None:
                item.removeItem(edge)
        region = self._regions.pop(key, None)
        if region is not None:
            item.removeItem(region)
        self._hidden.discard(key)
        self._labels.pop(key, None)
        self.hide_readout()
        self.hint.setVisible(not self._curves and bool(self.hint.text()))

    def set_run_label(self, key: Hashable, label: str) -> None:
        """What the readout calls run ``key``."""
        self._labels[key] = label

    def set_hint(self, text: str) -> None:
        """What the plot says while it has no curves."""
        self.hint.setText(text)
        self.hint.setVisible(not self._curves and bool(text))

    def set_style(self, key: Hashable, series: str, style: str, color: str, dash: str = "solid") -> None:
        curve = self._curves.get((key, series))
        if curve is not None and style != "points":
            curve.setPen(_pen(color, style, dash, width=1.5 if style == "line" else 1.0))

    def hide_series(self, key: Hashable, series: str, hidden: bool) -> None:
        (self._hidden_series.add if hidden else self._hidden_series.discard)((key, series))
        self._update_visibility(key, series)
        if hidden:
            self.hide_readout()

    def _shown(self, key: Hashable, series: str) -> bool:
        return key not in self._hidden and (key, series) not in self._hidden_series

    def _update_visibility(self, key: Hashable, series: str) -> None:
        for item in (self._curves.get((key, series)), self._edges.get((key, series))):
            if item is not None:
                item.setVisible(self._shown(key, series))

    def set_region(self, key: Hashable, x0: float, x1: float, color: str, text: str = "",
                   tooltip: str = "compile warm-up") -> None:
        """Shade ``[x0, x1]`` for run ``key`` (its compile warm-up), ``text`` written at its right edge."""
        region = self._regions.get(key)
        if region is None:
            fill = QColor(color)
            fill.setAlpha(40)
            region = pg.LinearRegionItem(values=(x0, x1), movable=False, brush=pg.mkBrush(fill),
                                         pen=pg.mkPen(fill))
            region.setZValue(-10)
            # Each run's label a little lower than the last one's: regions that end close together (compiled
            # runs on the wall-time axis) would write their labels over each other.
            height = 0.92 - 0.08 * (len(self._regions) % REGION_LABEL_LEVELS)
            region.label = pg.InfLineLabel(region.lines[1], "", position=height, anchor=(1, 0), color=color)
            self.getPlotItem().addItem(region, ignoreBounds=True)
            region.setVisible(key not in self._hidden)
            self._regions[key] = region
        else:
            region.setRegion((x0, x1))
        region.label.setFormat(text)
        region.setToolTip(tooltip)

    def region(self, key: Hashable) -> pg.LinearRegionItem | None:
        return self._regions.get(key)

    def set_run_visible(self, key: Hashable, visible: bool) -> None:
        (self._hidden.discard if visible else self._hidden.add)(key)
        if not visible:
            self.hide_readout()
        for k, series in list(self._curves):
            if k == key:
                self._update_visibility(k, series)
        if key in self._regions:
            self._regions[key].setVisible(visible)

    def run_visible(self, key: Hashable) -> bool:
        return key not in self._hidden

    def curve_visible(self, key: Hashable, series: str) -> bool:
        curve = self._curves.get((key, series))
        return curve is not None and curve.isVisible()

    def set_titles(self, title: str, y_label: str, hint: str) -> None:
        """What the plot shows: its title, its y axis, and its hint while it has no curves."""
        self.title = title
        self.y_label = y_label
        self.setAccessibleName(f"{title} plot")  # what a screen reader says of it follows what it shows
        self.hide_readout()
        item = self.getPlotItem()
        item.setTitle(title, size="10pt")
        item.setLabel("left", y_label)
        self.set_hint(hint)

    def set_x_label(self, text: str, whole: bool = False) -> None:
        """The x axis' name; ``whole``: it counts something that has no fractions (optimizer steps)."""
        self._x_name, self._x_whole = text, whole
        self.hide_readout()
        axis = self.getPlotItem().getAxis("bottom")
        axis.whole = whole
        axis.picture = None  # ticks chosen afresh
        axis.update()
        self.getPlotItem().setLabel("bottom", text)

    def set_log_y(self, log: bool) -> None:
        self._log_y = log
        self.hide_readout()
        self.getPlotItem().setLogMode(y=log)
        self.refit(force=True, tight=self._tight)

    def set_grid(self, on: bool) -> None:
        """Grid lines; off by default: they cost about four times the rest of a redraw."""
        self.getPlotItem().showGrid(x=on, y=on, alpha=0.25 if on else None)

    # ------------------------------------------------------------------ view range
    def data_bounds(self) -> Bounds | None:
        """Bounds of the shown curves, in view coordinates (log10 of y on a log scale); outlier
        series count for x only (unless nothing else is shown)."""
        everything = [(s, b) for (key, s), b in self._bounds.items() if self._shown(key, s)]
        if not everything:
            return None
        x0 = min(b[0][0] for _, b in everything)
        x1 = max(b[0][1] for _, b in everything)
        shown = [b for s, b in everything if s not in self.outlier_series] or [b for _, b in everything]
        if self._log_y:
            lo = min(b[1] for b in shown)
            hi = max(b[0][3] for b in shown)
            if not math.isfinite(lo) or hi <= 0:
                return None
            return x0, x1, math.log10(lo), math.log10(hi)
        return x0, x1, min(b[0][2] for b in shown), max(b[0][3] for b in shown)

    def refit(self, force: bool = False, tight: bool = False) -> None:
        """Move the view only where the data left it, or fill too little of it.
        ``tight``: no room to grow (nothing is training)."""
        self._tight = tight
        if not self.follow:
            return
        bounds = self.data_bounds()
        if bounds is None:
            return
        x0, x1, y0, y1 = bounds
        old = None if force else self._range
        rx = _fit_x(x0, x1, None if old is None else old[:2], X_PAD if tight else X_HEADROOM)
        ry = _fit_y(y0, y1, None if old is None else old[2:], 0.0 if self._log_y else self.min_y_span)
        if old is not None and rx == old[:2] and ry == old[2:]:
            return
        self._range = (*rx, *ry)
        self.getPlotItem().getViewBox().setRange(xRange=rx, yRange=ry, padding=0)
        for key, series in self._raw:
            self._draw_outliers(key, series)

    def _draw_outliers(self, key: Hashable, series: str) -> None:
        """Points of an outlier series inside the y range as they are; those beyond it at its edge, as
        triangles (a second curve: per-point symbols would not survive the plot's clipping to the view)."""
        x, y = self._raw[(key, series)]
        curve = self._curves[(key, series)]
        edge = self._edges.get((key, series))
        if self._range is None or self._log_y or not len(y):
            curve.setData(x, y)
            if edge is not None:
                edge.setData([], [])
            return
        beyond, at_edge = _at_edge(y, *self._range[2:])
        curve.setData(x[~beyond], y[~beyond])
        if edge is None:
            if not beyond.any():
                return
            pen = curve.opts["symbolPen"]
            edge = pg.PlotDataItem(pen=None, symbol=EDGE_SYMBOL, symbolSize=9, symbolPen=pen,
                                   symbolBrush=curve.opts["symbolBrush"])
            edge.setToolTip("warm-up steps beyond the axis, drawn at its edge")
            self.getPlotItem().addItem(edge)
            edge.setVisible(self._shown(key, series))
            self._edges[(key, series)] = edge
        edge.setData(x[beyond], at_edge)

    def data(self, key: Hashable, series: str) -> tuple[np.ndarray, np.ndarray] | None:
        """The points handed in for ``series`` (an outlier series draws some of them at the edge)."""
        if (key, series) in self._raw:
            return self._raw[(key, series)]
        curve = self._curves.get((key, series))
        return None if curve is None else (curve.xData, curve.yData)

    def edge_points(self, key: Hashable, series: str) -> tuple[np.ndarray, np.ndarray] | None:
        edge = self._edges.get((key, series))
        return None if edge is None else edge.getData()

    def outliers(self, key: Hashable, series: str) -> int:
        """How many points of ``series`` lie beyond the y range (drawn at its edge)."""
        raw = self._raw.get((key, series))
        if raw is None or self._range is None:
            return 0
        lo, hi = self._range[2:]
        return int(((raw[1] > hi) | (raw[1] < lo)).sum())

    # ------------------------------------------------------------------ readout
    def nearest(self, x: float, y: float) -> tuple[Hashable, str, float, float, float] | None:
        """The shown point drawn nearest view point (``x``, ``y``) within ``HOVER_PX`` pixels: its run, series,
        value (x, y) and drawn height (log10 of y on a log scale; an outlier beyond the range at its edge)."""
        pw, ph = self.getPlotItem().vb.viewPixelSize()
        if not (pw > 0 and ph > 0):
            return None
        reach = HOVER_PX * pw
        best, best_d2 = None, float(HOVER_PX**2)
        for (key, series) in self._curves:
            found = self.data(key, series)
            if not self._shown(key, series) or found is None or found[0] is None or not len(found[0]):
                continue
            xs, ys = np.asarray(found[0], dtype=float), np.asarray(found[1], dtype=float)
            start, stop = 0, len(xs)
            ordered = self._sorted.get((key, series))
            if ordered is None:
                ordered = self._sorted[(key, series)] = bool(len(xs) < 2 or np.all(xs[1:] >= xs[:-1]))  # NaN: False
            if ordered:  # only the points within reach along x
                start, stop = (int(i) for i in np.searchsorted(xs, [x - reach, x + reach], side="left"))
                stop = min(len(xs), stop + 1)
            xs, ys = xs[start:stop], ys[start:stop]
            if not len(xs):
                continue
            with np.errstate(divide="ignore", invalid="ignore"):
                drawn = np.where(ys > 0, np.log10(ys), np.nan) if self._log_y else ys.copy()
            if series in self.outlier_series and self._range is not None and not self._log_y:
                beyond, at_edge = _at_edge(ys, *self._range[2:])
                drawn[beyond] = at_edge
            d2 = ((xs - x) / pw) ** 2 + ((drawn - y) / ph) ** 2
            d2 = np.where(np.isfinite(d2), d2, np.inf)
            i = int(np.argmin(d2))
            if d2[i] <= best_d2:
                best, best_d2 = (key, series, float(xs[i]), float(ys[i]), float(drawn[i])), float(d2[i])
        return best

    def readout_text(self, key: Hashable, series: str, x: float, y: float) -> str:
        word = SERIES_WORDS.get(series)
        name = self._labels.get(key, str(key))
        x_text = f"{x:,.0f}" if self._x_whole else count_text(x)
        head = f"{name} ({word})" if word else name
        return f"{head}\n{self.y_label}: {value_text(y)}\n{self._x_name}: {x_text}"

    def show_readout_at(self, x: float, y: float) -> bool:
        """Read out the point nearest view point (``x``, ``y``); False (and nothing shown) where none is near."""
        found = self.nearest(x, y)
        if found is None:
            self.hide_readout()
            return False
        key, series, px, py, drawn = found
        self.readout.setText(self.readout_text(key, series, px, py))
        (x0, x1), (y0, y1) = self.getPlotItem().vb.viewRange()
        # The text on the side of the point with more room, so it stays inside the plot.
        self.readout.setAnchor((1 if px > (x0 + x1) / 2 else 0, 0 if drawn > (y0 + y1) / 2 else 1))
        self.readout.setPos(px, drawn)
        self.ring.setData([px], [drawn])
        self.readout.show()
        self.ring.show()
        return True

    def hide_readout(self) -> None:
        for mark in (self.__dict__.get("readout"), self.__dict__.get("ring")):
            if mark is not None:
                mark.hide()

    def shown_readout(self) -> str | None:
        """The readout's text while it is shown."""
        return self.readout.textItem.toPlainText() if self.readout.isVisible() else None

    def _on_mouse_moved(self, pos) -> None:
        view = self.getPlotItem().vb
        if not view.sceneBoundingRect().contains(pos):
            self.hide_readout()
            return
        point = view.mapSceneToView(pos)
        self.show_readout_at(point.x(), point.y())

    def leaveEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().leaveEvent(event)
        self.hide_readout()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._place_hint()

    def _place_hint(self, *_) -> None:
        """The hint covers the data area (the view box), never the axes: at fixed margins, a long hint ("#1 eager
        ×1 on 2 processes is setting up.") ran over the y axis' tick labels, whose width varies."""
        hint, item = self.__dict__.get("hint"), self.getPlotItem()  # pyqtgraph resizes before __init__ made them
        if hint is None or item is None:
            return
        area = self.mapFromScene(item.vb.sceneBoundingRect()).boundingRect()
        if area.width() < 40 or area.height() < 20:  # not laid out yet
            area = self.rect().adjusted(40, 30, -12, -36)
        hint.setGeometry(area.adjusted(8, 2, -8, -2) & self.rect())  # clear of the axis' ticks, inside the widget

    def _on_manual_range(self, *_) -> None:
        self.follow = False

    def _on_auto_button(self) -> None:
        self.getPlotItem().getViewBox().disableAutoRange()  # the button turned pyqtgraph's on
        self.follow = True
        self.refit(force=True, tight=self._tight)


def _fit_x(x0: float, x1: float, current: tuple[float, float] | None, headroom: float) -> tuple[float, float]:
    """x grows to the right: leave ``headroom`` so the range changes only every 25 % of growth."""
    if current is not None:
        c0, c1 = current
        if c0 <= x0 and x1 <= c1 and (x1 - x0) >= MIN_FILL * (c1 - c0):
            return current
    span = x1 - x0
    if span <= 0:
        half = max(abs(x0) * 0.05, 0.5)
        return x0 - half, x0 + half
    return x0 - span * X_PAD, x1 + span * headroom


def _fit_y(y0: float, y1: float, current: tuple[float, float] | None,
           min_span: float = 0.0) -> tuple[float, float]:
    """``min_span``: the range is never narrower (centred on the data, not below 0 for data that is not)."""
    if current is not None:
        c0, c1 = current
        if c0 <= y0 and y1 <= c1 and ((y1 - y0) >= MIN_FILL * (c1 - c0) or c1 - c0 <= min_span * 1.0001):
            return current
    span = y1 - y0
    pad = span * Y_PAD if span > 0 else max(abs(y0) * 0.05, 1e-6)
    lo, hi = y0 - pad, y1 + pad
    if hi - lo < min_span:
        middle = (y0 + y1) / 2
        lo = middle - min_span / 2
        if y0 >= 0 > lo:
            lo = 0.0
        hi = lo + min_span
    return lo, hi
