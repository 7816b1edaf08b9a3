"""One pyqtgraph plot: a curve per run and series, in the run's colour.

Data arrive as numpy arrays from the MetricStore on the redraw timer; the plot
downsamples (peak) and clips to the view, so its cost does not grow with the
length of a run. (``gui/__init__`` has imported PySide6 before pyqtgraph.)

The view range is kept here rather than by pyqtgraph's auto-range: that one
refits on every new point, and each refit re-lays out the axes and repaints the
plot twice, most of a redraw's cost. Here the x range grows in 25 % steps and
the y range changes only when the data leave it or fill less than half of it,
so the axes stay still between those moments. Zooming or panning by hand hands
the range to the user; the plot's "A" button gives it back.
"""

from __future__ import annotations

import math
from collections.abc import Hashable

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import QWidget

X_HEADROOM = 0.25
X_PAD = 0.02
Y_PAD = 0.08
MIN_FILL = 0.5

Bounds = tuple[float, float, float, float]


def configure_pyqtgraph() -> None:
    """Global pyqtgraph options: white background, no antialiasing (cheap lines)."""
    pg.setConfigOptions(background="w", foreground="#202020", antialias=False)


def _pen(color: str, style: str):
    if style == "points":
        return None
    c = QColor(color)
    if style == "faint":
        c.setAlpha(70)
    pen = pg.mkPen(c, width=1)
    if style == "dash":
        pen.setStyle(Qt.PenStyle.DashLine)
    return pen


def _bounds(x: np.ndarray, y: np.ndarray) -> tuple[Bounds, float] | None:
    """(xmin, xmax, ymin, ymax) of the finite points, and the smallest positive y (for log scale)."""
    ok = np.isfinite(x) & np.isfinite(y)
    if not ok.any():
        return None
    x, y = x[ok], y[ok]
    positive = y[y > 0]
    return ((float(x.min()), float(x.max()), float(y.min()), float(y.max())),
            float(positive.min()) if positive.size else math.inf)


class MetricPlot(pg.PlotWidget):
    def __init__(self, name: str, title: str, y_label: str, legend: bool = False,
                 parent: QWidget | None = None) -> None:
        super().__init__(parent=parent)
        self.setObjectName(name)
        item = self.getPlotItem()
        item.setTitle(title, size="10pt")
        item.setLabel("left", y_label)
        item.getAxis("left").enableAutoSIPrefix(False)  # "0.003", not "3 (x0.001)"
        item.setDownsampling(auto=True, mode="peak")
        item.setClipToView(True)
        item.setMenuEnabled(True)
        self.setMinimumSize(200, 150)
        # Bottom left: where falling loss curves leave room.
        self.legend = item.addLegend(offset=(8, -8), labelTextSize="8pt") if legend else None
        self._legend_samples: dict[Hashable, pg.PlotDataItem] = {}
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

    # ------------------------------------------------------------------ curves
    def curve(self, key: Hashable, series: str) -> pg.PlotDataItem | None:
        return self._curves.get((key, series))

    def curves_of(self, key: Hashable) -> dict[str, pg.PlotDataItem]:
        return {s: c for (k, s), c in self._curves.items() if k == key}

    def set_curve(self, key: Hashable, series: str, x: np.ndarray, y: np.ndarray, *, color: str,
                  style: str = "line", legend_label: str | None = None) -> pg.PlotDataItem:
        curve = self._curves.get((key, series))
        if curve is None:
            curve = pg.PlotDataItem(pen=_pen(color, style))
            if style == "dash":
                curve.setSymbol("o")
                curve.setSymbolSize(5)
                curve.setSymbolBrush(pg.mkBrush(color))
                curve.setSymbolPen(None)
            elif style == "points":
                curve.setSymbol("x")
                curve.setSymbolSize(8)
                curve.setSymbolPen(pg.mkPen(color, width=1))
            self.getPlotItem().addItem(curve)
            self._curves[(key, series)] = curve
            self._update_visibility(key, series)
            if legend_label and self.legend is not None and key not in self._legend_samples:
                # A stand-in with the run's full pen: the curve itself may be drawn faint.
                sample = pg.PlotDataItem(pen=_pen(color, "line"))
                self._legend_samples[key] = sample
                self.legend.addItem(sample, legend_label)
        curve.setData(x, y)
        found = _bounds(np.asarray(x, dtype=float), np.asarray(y, dtype=float))
        if found is None:
            self._bounds.pop((key, series), None)
        else:
            self._bounds[(key, series)] = found
        return curve

    def set_style(self, key: Hashable, series: str, style: str, color: str) -> None:
        curve = self._curves.get((key, series))
        if curve is not None and style != "points":
            curve.setPen(_pen(color, style))

    def hide_series(self, key: Hashable, series: str, hidden: bool) -> None:
        (self._hidden_series.add if hidden else self._hidden_series.discard)((key, series))
        self._update_visibility(key, series)

    def _shown(self, key: Hashable, series: str) -> bool:
        return key not in self._hidden and (key, series) not in self._hidden_series

    def _update_visibility(self, key: Hashable, series: str) -> None:
        curve = self._curves.get((key, series))
        if curve is not None:
            curve.setVisible(self._shown(key, series))

    def set_region(self, key: Hashable, x0: float, x1: float, color: str) -> None:
        """Shade ``[x0, x1]`` for run ``key`` (its compile warm-up)."""
        region = self._regions.get(key)
        if region is None:
            fill = QColor(color)
            fill.setAlpha(40)
            region = pg.LinearRegionItem(values=(x0, x1), movable=False, brush=pg.mkBrush(fill),
                                         pen=pg.mkPen(fill))
            region.setZValue(-10)
            region.setToolTip("compile warm-up")
            self.getPlotItem().addItem(region, ignoreBounds=True)
            region.setVisible(key not in self._hidden)
            self._regions[key] = region
        else:
            region.setRegion((x0, x1))

    def region(self, key: Hashable) -> pg.LinearRegionItem | None:
        return self._regions.get(key)

    def set_run_visible(self, key: Hashable, visible: bool) -> None:
        (self._hidden.discard if visible else self._hidden.add)(key)
        for k, series in list(self._curves):
            if k == key:
                self._update_visibility(k, series)
        if key in self._regions:
            self._regions[key].setVisible(visible)
        if key in self._legend_samples:
            self._legend_samples[key].setVisible(visible)

    def set_x_label(self, text: str) -> None:
        self.getPlotItem().setLabel("bottom", text)

    def set_log_y(self, log: bool) -> None:
        self._log_y = log
        self.getPlotItem().setLogMode(y=log)
        self.refit(force=True, tight=self._tight)

    def set_grid(self, on: bool) -> None:
        """Grid lines; off by default: they cost about four times the rest of a redraw."""
        self.getPlotItem().showGrid(x=on, y=on, alpha=0.25 if on else None)

    # ------------------------------------------------------------------ view range
    def data_bounds(self) -> Bounds | None:
        """Bounds of the shown curves, in view coordinates (log10 of y on a log scale)."""
        shown = [b for (key, series), b in self._bounds.items() if self._shown(key, series)]
        if not shown:
            return None
        x0 = min(b[0][0] for b in shown)
        x1 = max(b[0][1] for b in shown)
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
        ry = _fit_y(y0, y1, None if old is None else old[2:])
        if old is not None and rx == old[:2] and ry == old[2:]:
            return
        self._range = (*rx, *ry)
        self.getPlotItem().getViewBox().setRange(xRange=rx, yRange=ry, padding=0)

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


def _fit_y(y0: float, y1: float, current: tuple[float, float] | None) -> tuple[float, float]:
    if current is not None:
        c0, c1 = current
        if c0 <= y0 and y1 <= c1 and (y1 - y0) >= MIN_FILL * (c1 - c0):
            return current
    span = y1 - y0
    pad = span * Y_PAD if span > 0 else max(abs(y0) * 0.05, 1e-6)
    return y0 - pad, y1 + pad
