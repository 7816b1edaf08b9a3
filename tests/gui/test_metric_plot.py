"""The plot keeps its view still while new points fit, and leaves a hand-set view alone."""

from __future__ import annotations

import numpy as np
from PySide6.QtCore import QEvent
from PySide6.QtWidgets import QApplication

from gui.widgets.metric_plot import MetricPlot


def _view(plot):
    return tuple(float(v) for pair in plot.getPlotItem().getViewBox().viewRange() for v in pair)


def test_range_grows_in_steps_and_respects_a_manual_zoom(qtbot):
    plot = MetricPlot("testPlot", "test", "loss")
    qtbot.addWidget(plot)
    x = np.arange(1.0, 101.0)
    plot.set_curve(1, "train", x, 10.0 - x / 20, color="#1f77b4")
    plot.refit(tight=False)
    x0, x1, y0, y1 = _view(plot)
    assert x0 < 1 and x1 >= 100 + 0.2 * 99  # room to grow on the right
    assert y0 < 5.0 and y1 > 9.95

    more = np.arange(1.0, 111.0)
    plot.set_curve(1, "train", more, 10.0 - np.minimum(more, 100) / 20, color="#1f77b4")
    plot.refit(tight=False)
    assert _view(plot) == (x0, x1, y0, y1)  # the new points fit: the view stays still

    far = np.arange(1.0, 201.0)
    plot.set_curve(1, "train", far, 10.0 - far / 20, color="#1f77b4")
    plot.refit(tight=False)
    assert _view(plot)[1] >= 200

    plot.refit(force=True, tight=True)
    assert _view(plot)[1] < 210  # nothing grows any more: no headroom

    plot.getPlotItem().getViewBox().sigRangeChangedManually.emit([True, True])
    assert not plot.follow
    before = _view(plot)
    plot.set_curve(1, "train", np.arange(1.0, 401.0), np.zeros(400), color="#1f77b4")
    plot.refit(force=True)
    assert _view(plot) == before  # the user's zoom is kept
    plot.getPlotItem().autoBtn.clicked.emit(plot.getPlotItem().autoBtn)
    assert plot.follow and _view(plot)[1] >= 400


def test_hidden_runs_leave_the_range(qtbot):
    plot = MetricPlot("testPlot", "test", "loss")
    qtbot.addWidget(plot)
    plot.set_curve(1, "train", np.arange(10.0), np.ones(10), color="#1f77b4")
    plot.set_curve(2, "train", np.arange(10.0), np.full(10, 100.0), color="#d62728")
    plot.refit(force=True, tight=True)
    assert _view(plot)[3] > 100
    plot.set_run_visible(2, False)
    plot.refit(force=True, tight=True)
    assert _view(plot)[3] < 2


def test_outliers_go_to_the_edge_even_when_the_view_clips_points(qtbot):
    """Warm-up points partly outside the x view (a zoom, or another axis): no per-point mismatch."""
    plot = MetricPlot("testPlot", "test", "tokens/s", outlier_series=("warmup",))
    qtbot.addWidget(plot)
    plot.set_curve(1, "steady", np.arange(4.0, 40.0), np.linspace(800.0, 1200.0, 36), color="#1f77b4")
    plot.set_curve(1, "warmup", np.array([1.0, 2.0, 3.0]), np.array([20.0, 5000.0, 900.0]), color="#1f77b4",
                   style="points")
    plot.refit(force=True, tight=True)
    plot.getPlotItem().getViewBox().setRange(xRange=(2.5, 40), padding=0)  # the user zooms past two of them
    plot.set_curve(1, "warmup", np.array([1.0, 2.0, 3.0]), np.array([20.0, 5000.0, 900.0]), color="#1f77b4",
                   style="points")
    plot.refit(force=True, tight=True)
    assert plot.outliers(1, "warmup") == 2
    x, y = plot.edge_points(1, "warmup")
    lo, hi = plot.getPlotItem().getViewBox().viewRange()[1]
    assert list(x) == [1.0, 2.0] and all(lo <= v <= hi for v in y)


def test_the_x_axis_reads_token_counts_as_k_m_and_b(qtbot):
    from gui.widgets.metric_plot import MetricPlot, count_text

    assert [count_text(v) for v in (0, 12.5, 9999, 20_000, 150_000, 1.2e6, 2e9)] == \
        ["0", "12.5", "9999", "20k", "150k", "1.2M", "2B"]
    plot = MetricPlot("tokensPlot", "Loss", "loss")
    qtbot.addWidget(plot)
    axis = plot.getPlotItem().getAxis("bottom")
    assert axis.tickStrings([200_000, 400_000], 1.0, 200_000) == ["200k", "400k"]


def test_compile_labels_of_runs_stand_at_different_heights(qtbot):
    from gui.widgets.metric_plot import MetricPlot

    plot = MetricPlot("throughputPlot", "Throughput", "tokens/s")
    qtbot.addWidget(plot)
    keys = range(1, 9)  # eight compiled runs side by side (five of them wrote over each other's label)
    for key in keys:
        plot.set_region(key, 0.0, 10.0 + key * 0.1, "#ff0000", f"compile {key}.0 s")
    heights = [plot.region(key).label.orthoPos for key in keys]
    assert len(set(heights)) == len(keys)  # regions that end together keep their labels apart
    assert all(0.0 < h < 1.0 for h in heights)  # and inside the view


def test_an_axis_of_optimizer_steps_has_ticks_on_whole_steps_only(qtbot):
    """A run of three steps showed ticks at 1.5 and 2.5; tokens and seconds keep their fractions."""
    plot = MetricPlot("p", "Loss", "loss")
    qtbot.addWidget(plot)
    axis = plot.getPlotItem().getAxis("bottom")
    plot.set_x_label("wall time (s)")
    ticks = [v for _, values in axis.tickValues(0.8, 3.2, 600) for v in values]
    assert any(not float(v).is_integer() for v in ticks)  # what the step axis must not show
    plot.set_x_label("optimizer step", whole=True)
    for low, high in ((0.8, 3.2), (0.2, 0.9), (0.0, 5000.0)):
        ticks = [v for _, values in axis.tickValues(low, high, 600) for v in values]
        assert all(float(v).is_integer() for v in ticks), (low, high, ticks)
    assert [v for _, values in axis.tickValues(0.8, 3.2, 600) for v in values] != []


def test_the_step_axis_labels_leave_room_between_them(qtbot):
    """At 1024 × 640 a plot's step axis labelled every step: "10 11 12 13 14" read "1011121314"."""
    from PySide6.QtGui import QFontMetrics

    from gui.widgets.metric_plot import TICK_GAP_PX

    plot = MetricPlot("p", "Loss", "loss")
    qtbot.addWidget(plot)
    plot.set_x_label("optimizer step", whole=True)
    axis = plot.getPlotItem().getAxis("bottom")
    width = QFontMetrics(axis.font()).horizontalAdvance("14")
    for size in (240, 600, 2000):
        ((spacing, values),) = axis.tickValues(0.5, 14.5, size)
        assert values and all(float(v).is_integer() for v in values)
        assert size / 14 * spacing >= width + TICK_GAP_PX, (size, spacing)  # pixels between two labels
    assert axis.tickValues(0.5, 14.5, 240)[0][0] in (2.0, 5.0)
    assert axis.tickValues(0.5, 14.5, 2000)[0][0] == 1.0  # room for every step: each is labelled
    ((spacing, values),) = axis.tickValues(0, 1_000_000, 600)
    assert spacing >= 100_000 and len(values) <= 11


def test_a_log_loss_axis_within_a_decade_has_round_values(qtbot):
    """A loss from 5.4 to 7.6 on a log scale read "6" and "7" and nothing else (pyqtgraph writes one digit)."""
    import math

    plot = MetricPlot("p", "Loss", "loss")
    qtbot.addWidget(plot)
    plot.set_log_y(True)
    axis = plot.getPlotItem().getAxis("left")
    values = [v for _, level in axis.tickValues(math.log10(5.4), math.log10(7.6), 300) for v in level]
    shown = axis.tickStrings(values, 1.0, 0.5)
    assert len(shown) >= 4 and "6.5" in shown and "5.5" in shown, shown
    plot.set_log_y(False)
    assert axis.tickStrings([6.5], 1.0, 0.5) == ["6.5"]


def test_a_curve_of_one_point_shows_it_and_a_longer_one_is_a_plain_line(qtbot):
    """A run of a single step drew no loss and no learning rate: a line needs two points."""
    plot = MetricPlot("lossPlot", "Loss", "loss")
    qtbot.addWidget(plot)
    curve = plot.set_curve(1, "train", np.array([1.0]), np.array([2.5]), color="#1f77b4")
    assert curve.opts["symbol"] == "o"
    plot.set_curve(1, "train", np.array([1.0, 2.0]), np.array([2.5, 2.4]), color="#1f77b4")
    assert curve.opts["symbol"] is None


def test_the_hint_covers_the_data_area_never_the_axis(qtbot):
    """At fixed margins a long hint ran over the y axis' tick labels, whose width varies with the numbers."""
    plot = MetricPlot("lossPlot", "Loss", "loss", hint="#1 eager ×1 on 2 processes is setting up. Its curves "
                                                        "begin with its first optimizer step.")
    qtbot.addWidget(plot)
    plot.resize(420, 260)
    plot.show()
    qtbot.waitExposed(plot)

    def on_screen(graphics) -> object:
        return plot.mapFromScene(graphics.sceneBoundingRect()).boundingRect()

    item = plot.getPlotItem()
    qtbot.waitUntil(lambda: on_screen(item.vb).contains(plot.hint.geometry()))
    assert plot.hint.geometry().left() >= on_screen(item.getAxis("left")).right()  # past the ticks drawn into it
    assert plot.rect().contains(plot.hint.geometry())


def test_the_x_axis_last_label_has_room_right_of_the_data_area(qtbot):
    """Its last tick label is centred on the data area's right edge: a plot at the window's right edge cut it."""
    from gui.widgets.metric_plot import RIGHT_MARGIN_PX

    plot = MetricPlot("lrPlot", "Learning rate", "lr")
    qtbot.addWidget(plot)
    plot.resize(420, 260)
    plot.show()
    qtbot.waitExposed(plot)
    plot.set_curve(1, "lr", np.arange(1.0, 31.0), np.full(30, 1e-3), color="#1f77b4")
    view = plot.mapFromScene(plot.getPlotItem().vb.sceneBoundingRect()).boundingRect()
    label = plot.fontMetrics().horizontalAdvance("30")
    room = plot.width() - (view.right() + 1)  # QRect.right() is its last pixel
    assert room >= label / 2 + 2 and room >= RIGHT_MARGIN_PX - 2


def _hover(plot, x: float, y: float) -> None:
    """The pointer moves over view point (x, y) of the plot, as its scene reports it (QTest's pointer lands
    some pixels off on the offscreen platform, which draws no window frame but counts one)."""
    from PySide6.QtCore import QPointF

    plot.scene().sigMouseMoved.emit(plot.getPlotItem().vb.mapViewToScene(QPointF(x, y)))


def _shown_plot(qtbot, **kwargs) -> MetricPlot:
    plot = MetricPlot("lossPlot", "Loss", "loss", **kwargs)
    qtbot.addWidget(plot)
    plot.resize(420, 260)
    plot.show()
    qtbot.waitExposed(plot)
    plot.set_x_label("optimizer step", whole=True)
    return plot


def test_hovering_reads_out_the_nearest_shown_point_of_its_run(qtbot):
    plot = _shown_plot(qtbot)
    steps = np.arange(1.0, 101.0)
    plot.set_run_label(1, "#1 eager ×1")
    plot.set_run_label(2, "#2 default ×4")
    plot.set_curve(1, "train", steps, 5.0 - steps / 50, color="#1f77b4")
    plot.set_curve(2, "train", steps, 9.0 - steps / 50, color="#d62728")
    plot.set_curve(2, "val", np.array([50.0]), np.array([7.25]), color="#d62728", style="marked")
    plot.refit(force=True, tight=True)

    _hover(plot, 40.0, 5.0 - 40 / 50)  # on run 1's step 40 (to the pixel)
    assert plot.shown_readout() == "#1 eager ×1 (train)\nloss: 4.2\noptimizer step: 40"
    assert list(plot.ring.getData()[0]) == [40.0]

    _hover(plot, 50.0, 7.26)
    assert plot.shown_readout().startswith("#2 default ×4 (validation)\nloss: 7.25")

    _hover(plot, 60.0, 5.8)  # halfway between the two curves: nothing within reach
    assert plot.shown_readout() is None
    _hover(plot, 40.0, 4.2)
    QApplication.sendEvent(plot, QEvent(QEvent.Type.Leave))  # the pointer leaves the plot
    assert plot.shown_readout() is None

    plot.set_run_visible(2, False)  # a hidden run is never read out
    assert plot.nearest(50.0, 7.25) is None
    assert plot.nearest(20.0, 4.6)[0] == 1


def test_the_readout_gives_real_values_on_a_log_axis_and_at_the_edge(qtbot):
    plot = _shown_plot(qtbot, outlier_series=("warmup",))
    plot.set_curve(1, "train", np.arange(1.0, 11.0), np.geomspace(100.0, 1.0, 10), color="#1f77b4")
    plot.set_log_y(True)
    plot.refit(force=True, tight=True)
    key, series, x, y, drawn = plot.nearest(1.0, 2.0)  # log10(100): the view's coordinates
    assert (key, series, x, y) == (1, "train", 1.0, 100.0) and drawn == 2.0

    edge = _shown_plot(qtbot, outlier_series=("warmup",))
    edge.set_curve(1, "steady", np.arange(4.0, 21.0), np.full(17, 4000.0), color="#1f77b4")
    edge.set_curve(1, "warmup", np.arange(1.0, 4.0), np.array([15_320.0, 4100.0, 3990.0]), color="#1f77b4",
                   style="points")
    edge.refit(force=True, tight=True)
    top = edge.getPlotItem().vb.viewRange()[1][1]
    assert edge.show_readout_at(1.0, top)  # the triangle drawn at the top edge reads its own value
    assert edge.shown_readout() == "1 (warm-up step)\nloss: 15,320\noptimizer step: 1"


def test_the_readout_goes_when_the_pointer_leaves_or_the_run_goes(qtbot):
    plot = _shown_plot(qtbot)
    plot.set_curve(1, "train", np.arange(1.0, 11.0), np.arange(1.0, 11.0), color="#1f77b4")
    plot.refit(force=True, tight=True)
    assert plot.show_readout_at(5.0, 5.0)
    plot.remove_run(1)
    assert plot.shown_readout() is None and plot.nearest(5.0, 5.0) is None


def test_the_right_click_menu_offers_the_view_not_pyqtgraphs_transforms(qtbot):
    """Plot Options ▸ Transforms ▸ Log Y turned the axis to log behind the plot's own range: after the next run the
    loss plot was empty, the throughput axis ran from 1e-200 to 1e200."""
    plot = MetricPlot("lossPlot", "Loss", "loss")
    qtbot.addWidget(plot)
    item = plot.getPlotItem()
    assert not item.getContextMenus(None)  # no "Plot Options" (log axes, FFT, dy/dx, downsampling, averaging)
    assert item.vb.menuEnabled()  # View All and each axis' range stay
