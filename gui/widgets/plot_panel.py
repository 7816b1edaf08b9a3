"""The four live plots (loss, learning rate, throughput, memory) and their options.

``refresh()`` is called by the window's timer (10–20 Hz), never per event: it
redraws only the runs whose buffers changed since the last call.

Each run is visible or hidden, one notion for every plot: the legend's ticks and
the run table's selection (``set_visible_runs``) both change it, and
``visibility_changed`` tells the window. Runs are told apart by colour and dash.
"""

from __future__ import annotations

from collections.abc import Hashable

from PySide6.QtCore import QSettings, Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QSizePolicy,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from core.event_text import counted
from gui.metric_store import MetricStore, moving_average
from gui.stored_settings import stored_flag, stored_number, stored_text
from gui.widgets.metric_plot import MetricPlot, configure_pyqtgraph
from gui.widgets.run_legend import RunLegend

X_AXIS_TEXT = {"step": "optimizer step", "tokens": "tokens seen", "time": "wall time (s)"}
MAX_SMOOTHING = 100
MIN_MEMORY_SPAN_GIB = 0.1
"""The memory plot never spans less: a change of a few megabytes is not a cliff."""
EMPTY_HINT = ("No runs yet.\nChoose settings on the left and press Start,\n"
              "or open run folders (File ▸ Open run folders…).")
NO_STEPS_HINT = ("No optimizer step recorded yet:\nthe runs in the table ended before their first step.\n"
                 "Press Start for a new one.")
LR_HINT = "The schedule: warm-up, then cosine decay."
WAITING_PHASES = {"starting": "setting up", "compiling": "compiling its model", "stopping": "stopping"}


class PlotPanel(QWidget):
    visibility_changed = Signal(object)
    """The set of hidden run keys, after the legend or the table's selection changed it."""

    def __init__(self, store: MetricStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        configure_pyqtgraph()
        self.store = store
        self._runs: dict[Hashable, tuple[str, str, str]] = {}  # key -> (colour, dash, legend label)
        self._hidden: set[Hashable] = set()
        self._drawn: dict[tuple[str, Hashable], int] = {}  # (plot, run) -> store version drawn
        self._counts: dict[tuple, int] = {}
        self._next = 0
        self.live = False
        """Some run is growing: keep room on the right of the x range."""

        self.x_axis_combo = QComboBox()
        self.x_axis_combo.setObjectName("xAxisCombo")
        # A combo box's accessible name is its current value on Linux (AT-SPI): what it is for comes from the
        # label whose buddy it is ("labelled by"), here the "x:" beside it, named in full for a screen reader.
        self.x_axis_label = QLabel("x:")
        self.x_axis_label.setAccessibleName("x axis")
        self.x_axis_label.setBuddy(self.x_axis_combo)
        for value, text in X_AXIS_TEXT.items():
            self.x_axis_combo.addItem(text, value)
        self.smoothing = QSlider(Qt.Orientation.Horizontal)
        self.smoothing.setObjectName("smoothingSlider")
        self.smoothing.setAccessibleName("Smoothing")
        self.smoothing.setRange(0, MAX_SMOOTHING)
        self.smoothing.setMinimumWidth(50)
        self.smoothing.setMaximumWidth(140)
        self.smoothing.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        self.smoothing_label = QLabel()
        self.smoothing_label.setMinimumWidth(52)
        self.log_scale = QCheckBox("log loss")
        self.log_scale.setToolTip("The loss on a logarithmic y axis")
        self.log_scale.setObjectName("logScaleCheck")
        self.grid = QCheckBox("grid")
        self.grid.setObjectName("gridCheck")
        self.grad_norm = QCheckBox("grad norm")
        self.grad_norm.setObjectName("gradNormCheck")
        self.grad_norm.setToolTip("The upper right plot shows the gradient norm of every optimizer step (before "
                                  "clipping) instead of the learning rate")

        self.legend = RunLegend()
        self.loss = MetricPlot("lossPlot", "Loss (train; validation: dots)", "loss", hint=EMPTY_HINT)
        self.lr = MetricPlot("lrPlot", "Learning rate", "lr", hint=LR_HINT)
        self.throughput = MetricPlot("throughputPlot", "Throughput (×: warm-up steps)", "tokens/s",
                                     hint="Tokens per second of every optimizer step.", outlier_series=("warmup",))
        self.throughput.setToolTip("The y axis fits the steps after warm-up; warm-up steps beyond it are drawn "
                                   "at its edge as triangles. Shaded: the compile warm-up, labelled with the "
                                   "same compile seconds as the run table and the log.")
        # Between steps, not the peak: the table's Train GiB (the peak within the steps, activations and all)
        # is higher, and read as a disagreement without a word on the plot.
        self.memory = MetricPlot("memoryPlot", "Training memory (between steps)", "GiB",
                                 min_y_span=MIN_MEMORY_SPAN_GIB, hint="Memory the training itself holds.")
        self.memory.setToolTip("Memory above what the process held before the model existed, read after each "
                               "step: CUDA allocated, or the resident set on CPU. The run table's Train GiB is the "
                               "peak within the steps (activations and gradients included), so it reads higher. "
                               f"The axis spans at least {MIN_MEMORY_SPAN_GIB} GiB.")

        options = QHBoxLayout()
        options.setContentsMargins(4, 0, 4, 0)
        options.setSpacing(4)
        self.options = options
        """The options row (the window adds its own buttons at its start)."""
        options.addWidget(self.x_axis_label)
        options.addWidget(self.x_axis_combo)
        options.addSpacing(4)
        options.addWidget(QLabel("smooth:"))
        options.addWidget(self.smoothing, 1)
        options.addWidget(self.smoothing_label)
        options.addSpacing(4)
        options.addWidget(self.log_scale)
        options.addWidget(self.grid)
        options.addWidget(self.grad_norm)
        options.addStretch(1)
        grid = QGridLayout()
        grid.setSpacing(4)
        grid.addWidget(self.loss, 0, 0)
        grid.addWidget(self.lr, 0, 1)
        grid.addWidget(self.throughput, 1, 0)
        grid.addWidget(self.memory, 1, 1)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(options)
        layout.addWidget(self.legend)
        layout.addLayout(grid, 1)
        self.legend.toggled.connect(self.set_run_visible)

        self.x_axis_combo.currentIndexChanged.connect(self._on_x_axis)
        self.smoothing.valueChanged.connect(self._on_smoothing)
        self.log_scale.toggled.connect(self.loss.set_log_y)
        self.grid.toggled.connect(self._on_grid)
        self.grad_norm.toggled.connect(self._on_grad_norm)
        self._on_x_axis()
        self._on_smoothing()

    @property
    def plots(self) -> tuple[MetricPlot, ...]:
        return (self.loss, self.lr, self.throughput, self.memory)

    @property
    def x_axis(self) -> str:
        return self.x_axis_combo.currentData()

    def set_x_axis(self, axis: str) -> None:
        index = self.x_axis_combo.findData(axis)
        if index >= 0:
            self.x_axis_combo.setCurrentIndex(index)

    def show_waiting(self, label: str | None, phase: str = "", preparing: bool = False,
                     listed: bool = False, stepped: bool = False) -> None:
        """While the run in focus has no step yet (setting up, preparing data, a compile warm-up of a minute on a
        CPU), the empty loss plot says so instead of "No runs yet … press Start"; ``label`` None: the hint, which
        with runs ``listed`` in the table (all of them ended before a step) says that, not "No runs yet", and
        nothing where a run has ``stepped`` (its curve is drawn at the next redraw: it said the runs had ended
        before their first step until then)."""
        if label is None:
            self.loss.set_hint("" if stepped else NO_STEPS_HINT if listed else EMPTY_HINT)
            return
        doing = "preparing its data" if preparing else WAITING_PHASES.get(phase, phase)
        self.loss.set_hint(f"{label} is {doing}.\nIts curves begin with its first optimizer step.")

    # ------------------------------------------------------------------ runs
    def add_run(self, key: Hashable, color: str, label: str, dash: str = "solid") -> None:
        """A run to draw, or a run's new label (it is redrawn); the same mark and label again change nothing."""
        if self._runs.get(key) == (color, dash, label):
            return
        self._runs[key] = (color, dash, label)
        self.legend.set_run(key, color, dash, label, visible=key not in self._hidden)
        for plot in self.plots:
            plot.set_run_label(key, label)
            self._drawn.pop((plot.objectName(), key), None)

    def remove_run(self, key: Hashable) -> None:
        """Forget run ``key``: its curves, legend entry and visibility."""
        self._runs.pop(key, None)
        self._hidden.discard(key)
        self.legend.remove_run(key)
        for plot in self.plots:
            plot.remove_run(key)
            self._drawn.pop((plot.objectName(), key), None)
        self._counts = {tag: n for tag, n in self._counts.items() if tag[1] != key}

    @property
    def hidden_runs(self) -> set[Hashable]:
        return set(self._hidden)

    def run_visible(self, key: Hashable) -> bool:
        return key not in self._hidden

    def set_run_visible(self, key: Hashable, visible: bool) -> None:
        """Show or hide one run in every plot and the legend."""
        self._apply_visibility({k for k in self._hidden if k != key} | (set() if visible else {key}))

    def set_visible_runs(self, keys: set[Hashable] | None) -> None:
        """Show only ``keys`` (None: every run): the table's selection."""
        self._apply_visibility(set() if keys is None else {k for k in self._runs if k not in keys})

    def _apply_visibility(self, hidden: set[Hashable]) -> None:
        changed = hidden != self._hidden
        self._hidden = hidden
        for key in self._runs:
            visible = key not in hidden
            self.legend.set_visible(key, visible)
            for plot in self.plots:
                plot.set_run_visible(key, visible)
        for plot in self.plots:
            plot.refit(force=True, tight=not self.live)
        if changed:
            self.visibility_changed.emit(set(hidden))

    # ------------------------------------------------------------------ drawing
    def refresh(self, force: bool = False, budget: int | None = None) -> None:
        """Redraw what changed. ``budget`` caps how many plots one call redraws (the stalest
        first), so a timer tick stays short; None redraws every plot that needs it."""
        plots = self.plots
        order = [plots[(self._next + i) % len(plots)] for i in range(len(plots))]
        drawn = 0
        for plot in order:
            if budget is not None and drawn >= budget:
                break
            changed = False
            for key, (color, dash, _label) in self._runs.items():
                if key not in self.store:
                    continue
                version = self.store.run(key).version
                tag = (plot.objectName(), key)
                if force or self._drawn.get(tag) != version:
                    self._draw(plot, key, color, dash, force)
                    self._drawn[tag] = version
                    changed = True
            if changed or force:
                plot.refit(force=force, tight=not self.live)
                drawn += 1
                self._next = (plots.index(plot) + 1) % len(plots)

    def fit_tight(self) -> None:
        """Fit every plot to its data with no room to grow (called when training stops)."""
        self.refresh()
        for plot in self.plots:
            plot.refit(force=True, tight=True)

    def _set(self, plot: MetricPlot, key: Hashable, series: str, xy: tuple, force: bool, **style) -> None:
        """Hand a series to the plot unless it has the same number of points as last time
        (warm-up points and validation change rarely; every other series grows each step)."""
        tag = (plot.objectName(), key, series, self.x_axis)
        if not force and self._counts.get(tag) == len(xy[0]) and series in ("warmup", "val"):
            return
        self._counts[tag] = len(xy[0])
        plot.set_curve(key, series, *xy, **style)

    def _draw(self, plot: MetricPlot, key: Hashable, color: str, dash: str, force: bool) -> None:
        store, x = self.store, self.x_axis
        run = store.run(key)
        if len(run.steps) == 0 and len(run.val) == 0:
            return
        if plot is self.loss:
            window = self.smoothing.value()
            style = "faint" if window > 1 else "line"
            xs, loss = store.series(key, "train/loss", x)
            self._set(plot, key, "train", (xs, loss), force, color=color, style=style, dash=dash)
            if force:
                plot.set_style(key, "train", style, color, dash)
            if window > 1:
                self._set(plot, key, "smooth", (xs, moving_average(loss, window)), force, color=color, dash=dash)
            plot.hide_series(key, "smooth", window <= 1)
            if len(run.val):
                self._set(plot, key, "val", store.series(key, "val/loss", x), force, color=color, style="marked",
                          dash=dash)
        elif plot is self.lr:
            metric = "train/grad_norm" if self.grad_norm.isChecked() else "train/lr"
            self._set(plot, key, "lr", store.series(key, metric, x), force, color=color, dash=dash)
        elif plot is self.throughput:
            self._set(plot, key, "steady", store.series(key, "perf/tokens_per_s", x, warmup=False), force,
                      color=color, dash=dash)
            wx, wy = store.series(key, "perf/tokens_per_s", x, warmup=True)
            self._set(plot, key, "warmup", (wx, wy), force, color=color, style="points")
            if run.compiled and len(wx):
                self._mark_compile(key, run, float(wx.max()), color)
        elif plot is self.memory:
            self._set(plot, key, "mem", store.series(key, "mem/gib", x), force, color=color, dash=dash)

    def _mark_compile(self, key: Hashable, run, x1: float, color: str) -> None:
        """Shade the compile warm-up, labelled with the run's one compile figure (the table's and the log's)."""
        x0 = run.start[self.x_axis]
        seconds = run.compile_seconds
        steps = len(run.steps["warmup"][run.steps["warmup"] == 1.0])
        if seconds is None:
            text = "compiling"
            tip = f"Compile warm-up: {steps} step(s) so far; the compile time is known after a few steady steps."
        else:
            text = f"compile {seconds:.1f} s"
            tip = (f"Compile warm-up over {counted(steps, 'step')}: {seconds:.1f} s of compiling, i.e. their wall time "
                   f"minus the same steps at steady speed (the median of the first steady steps). The run "
                   f"table's Compile s and the log show this figure.")
        self.throughput.set_region(key, x0, x1, color, text, tip)

    # ------------------------------------------------------------------ options
    def _on_x_axis(self) -> None:
        for plot in self.plots:
            plot.set_x_label(X_AXIS_TEXT[self.x_axis], whole=self.x_axis == "step")
            plot.follow = True  # a new axis: the old zoom means nothing on it
        self.refresh(force=True)

    def _on_grad_norm(self, on: bool) -> None:
        """The learning rate's plot shows the gradient norm instead (TensorBoard's grad-norm scalar)."""
        if on:
            self.lr.set_titles("Gradient norm (before clipping)", "grad norm",  # "‖g‖" drew as blocks, rotated
                               "The gradient's norm at every optimizer step, before clipping.")
        else:
            self.lr.set_titles("Learning rate", "lr", LR_HINT)
        self.lr.follow = True  # another quantity: the old y range means nothing
        self.refresh(force=True)

    def _on_grid(self, on: bool) -> None:
        for plot in self.plots:
            plot.set_grid(on)

    def _on_smoothing(self) -> None:
        value = self.smoothing.value()
        self.smoothing_label.setText(f"{value} steps" if value > 1 else "off")
        self.refresh(force=True)

    def save_state(self, settings: QSettings) -> None:
        settings.setValue("plots/x_axis", self.x_axis)
        settings.setValue("plots/smoothing", self.smoothing.value())
        settings.setValue("plots/log_scale", self.log_scale.isChecked())
        settings.setValue("plots/grid", self.grid.isChecked())
        settings.setValue("plots/grad_norm", self.grad_norm.isChecked())

    def restore_state(self, settings: QSettings) -> None:
        axis = stored_text(settings, "plots/x_axis")
        if axis in X_AXIS_TEXT:
            self.set_x_axis(axis)
        smoothing = stored_number(settings, "plots/smoothing", self.smoothing.minimum(), self.smoothing.maximum(),
                                  whole=True)
        if smoothing is not None:
            self.smoothing.setValue(int(smoothing))
        self.log_scale.setChecked(stored_flag(settings, "plots/log_scale", False))
        self.grid.setChecked(stored_flag(settings, "plots/grid", False))
        self.grad_norm.setChecked(stored_flag(settings, "plots/grad_norm", False))
