"""The dashboard window: settings and controls on the left, live plots, run table and log on the right.

Data flow: the ``Controller`` brings every event of the live run (and its own
replies) to ``_on_controller_event`` in this thread; opened run folders are
followed by polling their ``metrics.jsonl``. Both go through ``_apply``, which
updates the run's record and the numpy buffers only. A timer redraws plots,
progress and table at 10 Hz.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from PySide6.QtCore import QSettings, Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import QFileDialog, QMainWindow, QScrollArea, QSplitter, QTabWidget, QVBoxLayout, QWidget

from core.config import RunConfig
from core.device import available_devices
from core.errors import SpeedboardError
from core.events import (
    CheckpointSaved,
    CompileFinished,
    CompileStarted,
    Event,
    RunFailed,
    RunFinished,
    RunStarted,
    SampleGenerated,
    StepMetrics,
    ValidationDone,
    WarningRaised,
)
from core.launch import prepare_launch
from core.runs import EventTail, default_out_dir, is_run_dir
from gui import dialogs
from gui.controller import CheckpointSummary, Controller, JobFailed, RunJobEnded, TrainingPaused, TrainingResumed
from gui.metric_store import MetricStore
from gui.process_run import ProcessRun
from gui.run_record import RunRecord
from gui.widgets.config_panel import ConfigPanel, presets_with
from gui.widgets.log_view import LogView
from gui.widgets.plot_panel import PlotPanel
from gui.widgets.run_controls import RunControls
from gui.widgets.run_table import RunTable
from gui.widgets.sample_view import SampleView
from gui.widgets.status_bar import StatusBar

ORGANIZATION = "Speedboard"
APPLICATION = "Speedboard"
REFRESH_HZ = 10
PLOTS_PER_TICK = 2  # of four: each plot follows at 5 Hz, and no tick holds the GUI thread long
# Plots skip ticks while the GUI thread uses more than this share of a core, so on a machine
# whose cores also train (a CPU run) the window takes little from training; at least 1 redraw/s.
GUI_CPU_BUDGET = 0.04
MAX_PLOT_GAP_S = 1.0
TAIL_INTERVAL_MS = 500
SPLITTERS = ("main_splitter", "left_splitter", "right_splitter")
# Files that stand for their folder when picked in the Load dialog.
_FOLDER_FILES = ("config.json", "model.safetensors", "pytorch_model.bin", "tokenizer.json", "trainer_state.pt",
                 "metrics.jsonl", "model.safetensors.index.json", "pytorch_model.bin.index.json")
LOAD_FILTER = ("Checkpoints (config.json model.safetensors pytorch_model.bin metrics.jsonl *.pt *.pth *.bin "
               "*.ckpt *.safetensors);;All files (*)")


def checkpoint_target(picked: str) -> str:
    """What a file picked in the Load dialog means: its folder (checkpoint, Hugging Face or run) or itself."""
    path = Path(picked)
    if path.is_dir():
        return str(path)
    if path.name in _FOLDER_FILES and (path.parent / "config.json").is_file() or path.name == "metrics.jsonl":
        return str(path.parent)
    return str(path)


def save_target_problem(path: str) -> str | None:
    """Why a checkpoint folder cannot be written at ``path`` (checked before asking the torch thread)."""
    target = Path(path).expanduser()
    if target.exists() and not target.is_dir():
        return f"{target} is a file; a checkpoint is a folder, so choose a new name."
    if target.is_dir() and any(target.iterdir()) and not (target / "config.json").is_file():
        return f"{target} is a folder with other files in it; choose a new name."
    if not target.parent.is_dir():
        return f"the folder {target.parent} does not exist."
    if not os.access(target.parent, os.W_OK):
        return f"there is no permission to write in {target.parent}."
    return None


def _describe(info: CheckpointSummary) -> str:
    kind = {"speedboard": "Speedboard checkpoint", "huggingface": "Hugging Face model",
            "state_dict": "state dict"}.get(info.kind, info.kind)
    params = info.num_parameters
    size = f"{params / 1e6:.2f}M" if params >= 1e5 else f"{params / 1e3:.1f}k"
    at = f", step {info.step}" if info.step else ""
    return f"{Path(info.path).name} ({kind}, {size} parameters{at})"


class MainWindow(QMainWindow):
    def __init__(self, *, settings: QSettings | None = None, extra_presets: dict[str, RunConfig] | None = None,
                 out_dir: str | None = None, parent: QWidget | None = None) -> None:
        """``extra_presets`` adds named base configs to the preset list; ``out_dir`` overrides where runs go."""
        super().__init__(parent)
        self.setWindowTitle("Speedboard")
        self.settings = settings if settings is not None else QSettings(ORGANIZATION, APPLICATION)
        self.out_dir = out_dir
        self.store = MetricStore()
        self.controller = Controller(self)
        self.records: list[RunRecord] = []
        self._by_run_id: dict[str, RunRecord] = {}
        self._active: RunRecord | None = None
        self._tails: dict[int, EventTail] = {}
        self._dirty: set[int] = set()
        self._has_model = False
        self._pending_save: str | None = None
        self._continue_after_stop = False
        self._close_when_idle = False
        self._stopping = False
        self._process: ProcessRun | None = None  # a multi-process (torchrun) run, followed through its folder

        self.config_panel = ConfigPanel(presets_with(extra_presets), available_devices())
        self.controls = RunControls()
        self.plots = PlotPanel(self.store)
        self.table = RunTable()
        self.log = LogView()
        self.sample = SampleView()
        self.status = StatusBar()
        self._build_layout()
        self._build_menus()
        self._connect()
        self._restore_settings()

        self._refresh_timer = QTimer(self)
        self._refresh_timer.setInterval(1000 // REFRESH_HZ)
        self._refresh_timer.timeout.connect(self._on_tick)
        self._tick_clock = (time.perf_counter(), time.thread_time())
        self._gui_cpu_share = 0.0
        self._last_plot_refresh = 0.0
        self._refresh_timer.start()
        self._tail_timer = QTimer(self)
        self._tail_timer.setInterval(TAIL_INTERVAL_MS)
        self._tail_timer.timeout.connect(self._poll_tails)
        self._tail_timer.start()
        self._update_controls()

    # ------------------------------------------------------------------ construction
    def _build_layout(self) -> None:
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.config_panel)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        scroll.setMinimumWidth(self.config_panel.minimumSizeHint().width()
                               + scroll.verticalScrollBar().sizeHint().width() + 4)
        settings = QWidget()
        settings_layout = QVBoxLayout(settings)
        settings_layout.setContentsMargins(0, 0, 0, 0)
        settings_layout.addWidget(scroll, 1)
        settings_layout.addWidget(self.controls)
        self.tabs = QTabWidget()
        self.tabs.addTab(self.log, "Log")
        self.tabs.addTab(self.sample, "Sample")
        # Left: what to run and what it said; right: what it measured.
        self.left_splitter = QSplitter(Qt.Orientation.Vertical)
        self.left_splitter.addWidget(settings)
        self.left_splitter.addWidget(self.tabs)
        self.left_splitter.setStretchFactor(0, 3)
        self.left_splitter.setStretchFactor(1, 1)
        self.left_splitter.setContentsMargins(6, 6, 0, 6)
        self.right_splitter = QSplitter(Qt.Orientation.Vertical)
        self.right_splitter.addWidget(self.plots)
        self.right_splitter.addWidget(self.table)
        self.right_splitter.setStretchFactor(0, 3)
        self.right_splitter.setStretchFactor(1, 1)
        self.main_splitter = QSplitter(Qt.Orientation.Horizontal)
        self.main_splitter.addWidget(self.left_splitter)
        self.main_splitter.addWidget(self.right_splitter)
        self.main_splitter.setStretchFactor(1, 1)
        self.setCentralWidget(self.main_splitter)
        self.setStatusBar(self.status)
        self.resize(1500, 950)
        self.main_splitter.setSizes([400, 1100])
        self.right_splitter.setSizes([680, 240])
        self.left_splitter.setSizes([700, 220])

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        actions = (
            ("Open run folder…", QKeySequence.StandardKey.Open, self.open_run_folder),
            ("Save model…", QKeySequence.StandardKey.Save, self._save),
            ("Load weights…", "Ctrl+L", self._load),
            (None, None, None),
            ("Quit", QKeySequence.StandardKey.Quit, self.close),
        )
        for text, shortcut, slot in actions:
            if text is None:
                file_menu.addSeparator()
                continue
            action = QAction(text, self)
            action.setShortcut(QKeySequence(shortcut))
            action.triggered.connect(slot)
            file_menu.addAction(action)
        run_menu = self.menuBar().addMenu("&Run")
        for text, shortcut, slot in (("Start", "Ctrl+Return", self._start), ("Stop", "Ctrl+.", self._stop)):
            action = QAction(text, self)
            action.setShortcut(QKeySequence(shortcut))
            action.triggered.connect(slot)
            run_menu.addAction(action)

    def _connect(self) -> None:
        self.controller.event.connect(self._on_controller_event)
        self.config_panel.changed.connect(self._update_controls)
        self.controls.start_clicked.connect(self._start)
        self.controls.pause_clicked.connect(self._pause)
        self.controls.resume_clicked.connect(self._resume)
        self.controls.stop_clicked.connect(self._stop)
        self.controls.continue_clicked.connect(self._continue)
        self.controls.save_clicked.connect(self._save)
        self.controls.load_clicked.connect(self._load)
        self.table.selection_changed.connect(self.plots.set_visible_runs)
        self.table.selection_changed.connect(lambda _: self._update_controls())

    # ------------------------------------------------------------------ settings
    def _restore_settings(self) -> None:
        s = self.settings
        self.config_panel.restore_state(s)
        self.plots.restore_state(s)
        geometry = s.value("window/geometry")
        if geometry is not None:
            self.restoreGeometry(geometry)
        for name in SPLITTERS:
            state = s.value(f"window/{name}")
            if state is not None:
                getattr(self, name).restoreState(state)

    def save_settings(self) -> None:
        s = self.settings
        self.config_panel.save_state(s)
        self.plots.save_state(s)
        s.setValue("window/geometry", self.saveGeometry())
        for name in SPLITTERS:
            s.setValue(f"window/{name}", getattr(self, name).saveState())
        s.sync()

    def _last_dir(self) -> str:
        folder = self.settings.value("paths/last_dir")
        return folder if isinstance(folder, str) and Path(folder).is_dir() else str(Path.home())

    def _remember_dir(self, path: str) -> None:
        folder = Path(path).expanduser()
        self.settings.setValue("paths/last_dir", str(folder if folder.is_dir() else folder.parent))

    # ------------------------------------------------------------------ records
    def record(self, key: int) -> RunRecord:
        return next(r for r in self.records if r.key == key)

    def record_for_run(self, run_id: str) -> RunRecord | None:
        return self._by_run_id.get(run_id)

    def _new_record(self, config: dict, origin: str, folder: str | None = None,
                    parent: RunRecord | None = None) -> RunRecord:
        record = RunRecord(key=len(self.records) + 1, number=len(self.records) + 1, config=config,
                           origin=origin, folder=folder)
        if origin == "folder":
            record.state = "following"
        if parent is not None:
            record.parent_id, record.parent_number = parent.run_id, parent.number
        self.records.append(record)
        self.table.add_record(record)
        self.plots.add_run(record.key, record.color, record.label)
        return record

    def _apply(self, record: RunRecord, event: Event) -> None:
        """One core event of ``record``'s run: update its record and buffers (plots redraw on the timer)."""
        if isinstance(event, RunStarted):
            self._by_run_id[event.run_id] = record
            parent = self._by_run_id.get(event.parent) if event.parent else None
            if parent is not None:
                record.parent_number = parent.number
        changed = record.apply(event)
        self.store.add(record.key, event)
        if changed:
            self.table.update_record(record)
            self._update_controls()
        else:
            self._dirty.add(record.key)
        self._describe_event(record, event)

    def _describe_event(self, record: RunRecord, event: Event) -> None:
        label = record.label
        if isinstance(event, RunStarted):
            self.plots.add_run(record.key, record.color, label)  # its label may now name the parent
            where = f" from step {event.start_step}" if event.start_step else ""
            self.log.add(f"{label}: started{where} on {event.device} ({event.precision}, "
                         f"{event.num_parameters / 1e6:.2f}M parameters, {event.tokens_per_step:,} tokens/step) "
                         f"→ {event.run_dir}")
        elif isinstance(event, CompileStarted):
            self.log.add(f"{label}: compiling ({event.mode}, {event.scope}) during the first steps …")
        elif isinstance(event, CompileFinished):
            if event.fallback:
                self.log.add(f"{label}: torch.compile failed, the run continues eagerly", "warning")
            else:
                self.log.add(f"{label}: compile warm-up took {event.seconds:.1f} s over {event.warmup_steps} steps")
        elif isinstance(event, ValidationDone):
            self.log.add(f"{label}: validation loss {event.loss:.4f} at step {event.step}")
        elif isinstance(event, SampleGenerated):
            self.sample.show_sample(label, event.step, event.text)
        elif isinstance(event, WarningRaised):
            self.log.add(f"{label}: {event.message}", "warning")
        elif isinstance(event, CheckpointSaved):
            self.log.add(f"{label}: checkpoint saved at step {event.step} → {event.path}")
            if self._pending_save is not None and Path(event.path) == Path(self._pending_save):
                self._pending_save = None
                self.status.showMessage(f"Model saved to {event.path}", 10_000)
        elif isinstance(event, RunFinished):
            tps = f"{event.median_tokens_per_s:,.0f} tokens/s" if event.median_tokens_per_s else "no steady steps"
            self.log.add(f"{label}: {'stopped' if event.stopped else 'finished'} at step {event.step}, "
                         f"loss {event.final_loss if event.final_loss is not None else float('nan'):.4f}, "
                         f"median {tps}")
        elif isinstance(event, RunFailed):
            self.log.add(f"{label}: failed: {event.message}", "error")
            self.status.showMessage(f"{label} failed: {event.message}", 15_000)
            self.tabs.setCurrentWidget(self.log)

    # ------------------------------------------------------------------ events from the torch thread
    def _on_controller_event(self, event: object) -> None:
        if isinstance(event, Event):
            record = self._by_run_id.get(event.run_id) or self._active
            if record is not None:
                self._apply(record, event)
        elif isinstance(event, RunJobEnded):
            self._on_run_job_ended(event)
        elif isinstance(event, TrainingPaused):
            if self._active is not None and self._active.active:
                self._active.state = "paused"
                self.table.update_record(self._active)
                self.log.add(f"{self._active.label}: paused at step {self._active.step}")
        elif isinstance(event, TrainingResumed):
            if self._active is not None and self._active.state == "paused":
                self._active.state = "training"
                self.table.update_record(self._active)
                self.log.add(f"{self._active.label}: resumed")
        elif isinstance(event, JobFailed):
            self._on_job_failed(event)
        elif isinstance(event, CheckpointSummary):
            self._on_checkpoint_summary(event)
        if not isinstance(event, StepMetrics):  # per-step work stays in the buffers
            self._update_controls()

    def _on_run_job_ended(self, event: RunJobEnded) -> None:
        record, self._active = self._active, None
        self._has_model = event.has_model
        self._stopping = False
        if record is not None:
            self.table.update_record(record)
        self._after_run(record)

    def _after_run(self, record: RunRecord | None) -> None:
        """What waits for a run's end, in the thread or in torchrun processes: closing, or Continue."""
        if self._close_when_idle:
            QTimer.singleShot(0, self.close)
            return
        if self._continue_after_stop:
            self._continue_after_stop = False
            if record is not None and record.checkpoint:
                self._continue_from(record)
            else:
                dialogs.show_error(self, "Cannot continue", "The run ended without a final checkpoint, so there "
                                                            "is nothing to continue from.")
        if not self._running:
            self.status.show_idle("idle")

    def _on_job_failed(self, event: JobFailed) -> None:
        if event.job == "save":
            self._pending_save = None
            self.log.add(f"save failed: {event.message}", "error")
            dialogs.show_error(self, "Save failed", f"The model was not saved:\n{event.message}")
        elif event.job == "inspect":
            self.log.add(f"load failed: {event.message}", "error")
            dialogs.show_error(self, "Cannot load", f"Could not load {Path(event.path).name or event.path}:\n"
                                                    f"{event.message}")
        else:
            self.log.add(f"{event.job} failed: {event.message}", "error")

    def _on_checkpoint_summary(self, info: CheckpointSummary) -> None:
        description = _describe(info)
        mode = "init"
        if info.resumable:
            mode = dialogs.ask_load_mode(self, description)
            if mode is None:
                self.log.add(f"load of {info.path} cancelled")
                return
        if mode == "resume" and info.run_config:
            try:
                self.config_panel.set_from_config(RunConfig.from_dict(info.run_config))
            except (SpeedboardError, TypeError, ValueError):
                pass  # an older or foreign config: the panel keeps its settings
        self.config_panel.set_start_from(info.path, mode, description, info.model_config)
        what = "resumes it exactly" if mode == "resume" else "starts from its weights"
        self.log.add(f"loaded {description}: the next run {what}")
        self.status.showMessage(f"Loaded {description}", 10_000)

    # ------------------------------------------------------------------ commands
    def _start(self) -> None:
        if self._running:
            return
        cfg = self.config_panel.config
        if cfg is None:
            dialogs.show_error(self, "Invalid settings", self.config_panel.error)
            return
        self._launch(cfg)
        if cfg.init_from or cfg.resume:
            self.config_panel.clear_start_from()  # a loaded checkpoint feeds one run

    @property
    def _running(self) -> bool:
        """A run is training: on the torch thread, or in torchrun processes."""
        return self.controller.running or self._process is not None

    def _launch(self, cfg: RunConfig, parent: RunRecord | None = None) -> None:
        if self.out_dir:
            cfg = cfg.replace(out_dir=self.out_dir)
        if self.config_panel.nproc > 1:
            self._launch_processes(cfg, self.config_panel.nproc, parent)
            return
        record = self._new_record(cfg.to_dict(), "live", parent=parent)
        self._active = record
        self._stopping = False
        self.controller.start_run(cfg)
        self.log.add(f"{record.label}: starting …")
        self.status.show_idle(f"{record.label}: starting")
        self._update_controls()

    def _launch_processes(self, cfg: RunConfig, nproc: int, parent: RunRecord | None) -> None:
        """Start the run through torchrun in a QProcess and follow its run folder live."""
        try:
            spec = prepare_launch(cfg, nproc)
        except SpeedboardError as exc:
            dialogs.show_error(self, "Cannot start", str(exc))
            return
        record = self._new_record(cfg.to_dict(), "live", folder=str(spec.run_dir), parent=parent)
        self._active = record
        self._stopping = False
        self._process = ProcessRun(spec, self)
        self._process.event.connect(lambda event, r=record: self._apply(r, event))
        self._process.ended.connect(self._on_process_ended)
        self._process.start()
        self.log.add(f"{record.label}: starting {nproc} processes through torchrun …")
        self.status.show_idle(f"{record.label}: starting {nproc} processes")
        self._update_controls()

    def _on_process_ended(self, code: int, message: str) -> None:
        record, self._active = self._active, None
        process, self._process = self._process, None
        self._stopping = False
        if process is not None:
            process.deleteLater()
        if record is not None and not record.ended:
            # No final event in the folder (bad settings, or a crash before rank 0 wrote one).
            reason = message or f"the training processes exited with code {code}"
            self._apply(record, RunFailed(record.run_id or process.spec.run_id, 0.0, reason))
        self._after_run(record)
        self._update_controls()

    def _pause(self) -> None:
        self.controller.pause()
        self.status.showMessage("Pausing after the current optimizer step …", 5_000)
        self._update_controls()

    def _resume(self) -> None:
        self.controller.resume()
        self._update_controls()

    def _stop(self) -> None:
        if not self._running:
            return
        self._stopping = True
        if self._process is not None:
            self._process.stop()  # every rank stops after the same step; rank 0 saves
        else:
            self.controller.stop()
        self.status.showMessage("Stopping at the next optimizer step (a final checkpoint is saved) …", 10_000)
        self._update_controls()

    def _continue_source(self) -> RunRecord | None:
        """The selected run if exactly one is selected and can be continued, else the latest that can."""
        candidates = [r for r in self.records if r.ended and r.checkpoint]
        selected = [r for r in candidates if r.key in self.table.selected_keys()]
        if len(selected) == 1:
            return selected[0]
        return candidates[-1] if candidates else None

    def _continue(self) -> None:
        if self._running:
            if self.config_panel.config is None:
                dialogs.show_error(self, "Invalid settings", self.config_panel.error)
                return
            self._continue_after_stop = True
            self._stop()
            self.status.showMessage("Stopping; the run then continues with these settings …", 10_000)
            return
        source = self._continue_source()
        if source is None:
            dialogs.show_error(self, "Nothing to continue", "Finish or stop a run first: Continue starts from "
                                                            "its final checkpoint.")
            return
        self._continue_from(source)

    def _continue_from(self, parent: RunRecord) -> None:
        """A new run from ``parent``'s final checkpoint (weights, optimizer, schedule) with these train settings."""
        settings = self.config_panel.config
        if settings is None:
            dialogs.show_error(self, "Invalid settings", self.config_panel.error)
            return
        try:
            base = RunConfig.from_dict(parent.config)
            cfg = base.replace(train=settings.train, resume=parent.checkpoint, init_from=None,
                               parent=parent.run_id, out_dir=settings.out_dir, name=None)
        except (SpeedboardError, TypeError, ValueError) as exc:
            dialogs.show_error(self, "Cannot continue", str(exc))
            return
        self._launch(cfg, parent=parent)

    def _save(self) -> None:
        if self._process is not None:
            dialogs.show_error(self, "Save from the run folder",
                               "A multi-process run saves its checkpoints into its run folder (a final one when "
                               "it ends or is stopped); load one of those.")
            return
        if not (self.controller.running or self._has_model):
            dialogs.show_error(self, "Nothing to save", "There is no model yet: start a run first.")
            return
        if self._pending_save is not None:
            dialogs.show_error(self, "Save in progress", f"The model is being saved to {self._pending_save}.")
            return
        last = self._active or next((r for r in reversed(self.records) if r.origin == "live"), None)
        name = f"{last.run_id}-step{last.step}" if last is not None and last.run_id else "speedboard-checkpoint"
        path, _ = QFileDialog.getSaveFileName(self, "Save the model as a checkpoint folder",
                                              str(Path(self._last_dir()) / name), "Checkpoint folder (*)")
        if not path:
            return
        problem = save_target_problem(path)
        if problem:
            dialogs.show_error(self, "Cannot save there", problem)
            return
        self._remember_dir(path)
        self._pending_save = str(Path(path).expanduser())
        running = self.controller.running
        self.controller.save(self._pending_save)
        self.status.showMessage("Saving at the next optimizer step …" if running else "Saving …", 10_000)

    def _load(self) -> None:
        if self._running:
            dialogs.show_error(self, "Cannot load during a run",
                               "Weights cannot be loaded while a run is training. Stop the run (or wait until it "
                               "ends), then load; the next run starts from the loaded weights.")
            return
        if self.controller.inspecting:
            return
        path, _ = QFileDialog.getOpenFileName(
            self, "Load weights: a .pt/.pth/.bin/.safetensors file, or config.json in a checkpoint folder",
            self._last_dir(), LOAD_FILTER)
        if not path:
            return
        self._remember_dir(path)
        self.controller.inspect(checkpoint_target(path))
        self.status.showMessage(f"Reading {path} …", 5_000)
        self._update_controls()

    def open_run_folder(self, folder: str | None = None) -> RunRecord | None:
        """Show a run folder's curves (the headless CLI or a torchrun job may still be writing it)."""
        if not folder:
            start = str(default_out_dir()) if default_out_dir().is_dir() else self._last_dir()
            folder = QFileDialog.getExistingDirectory(self, "Open a run folder", start)
        if not folder:
            return None
        if not is_run_dir(folder):
            dialogs.show_error(self, "Not a run folder", f"{folder} has no metrics.jsonl: choose a folder that a "
                                                         f"Speedboard run wrote.")
            return None
        self._remember_dir(str(Path(folder).parent))
        tail = EventTail(folder)
        events = tail.poll()
        started = next((e for e in events if isinstance(e, RunStarted)), None)
        if started is not None and started.run_id in self._by_run_id:
            existing = self._by_run_id[started.run_id]
            self.status.showMessage(f"{existing.label} is already shown", 5_000)
            return existing
        record = self._new_record(dict(started.config) if started else {}, "folder", folder=folder)
        for event in events:
            self._apply(record, event)
        if not record.ended:
            self._tails[record.key] = tail
        self.log.add(f"{record.label}: opened {folder}")
        self.plots.refresh()
        return record

    def _poll_tails(self) -> None:
        for key, tail in list(self._tails.items()):
            record = self.record(key)
            for event in tail.poll():
                self._apply(record, event)
            if record.ended:
                del self._tails[key]

    # ------------------------------------------------------------------ periodic refresh
    def _on_tick(self) -> None:
        live = self._running or bool(self._tails)
        if live != self.plots.live:
            self.plots.live = live
            if not live:
                self.plots.fit_tight()  # nothing grows any more: no headroom on the right
        # CPU time of this thread since the last tick, painting included: a running share.
        now, cpu = time.perf_counter(), time.thread_time()
        wall0, cpu0 = self._tick_clock
        self._tick_clock = (now, cpu)
        if now > wall0:
            self._gui_cpu_share = 0.7 * self._gui_cpu_share + 0.3 * (cpu - cpu0) / (now - wall0)
        if self._gui_cpu_share <= GUI_CPU_BUDGET or now - self._last_plot_refresh >= MAX_PLOT_GAP_S:
            self.plots.refresh(budget=PLOTS_PER_TICK)
            self._last_plot_refresh = now
        for key in self._dirty:
            self.table.update_record(self.record(key))
        self._dirty.clear()
        active = self._active
        if active is not None and active.run_id:
            step_time = self.store.recent_step_time(active.key)
            eta = (active.total_steps - active.step) * step_time if step_time and active.total_steps else None
            self.status.show_run(label=active.label, state=active.state, step=active.step,
                                 start_step=active.start_step, total_steps=active.total_steps, eta_s=eta,
                                 device=active.device, mem_gib=active.mem_gib)

    def _update_controls(self) -> None:
        running = self._running
        valid = self.config_panel.config is not None
        can_continue = valid and (running or self._continue_source() is not None)
        self.controls.set_state(running=running, paused=self.controller.paused, can_start=valid,
                                can_continue=can_continue, can_save=running or self._has_model,
                                stopping=self._stopping)
        if self._process is not None:
            self.controls.pause.setEnabled(False)  # torchrun ranks are stopped, not paused

    # ------------------------------------------------------------------ closing
    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt's name)
        if self._running:
            event.ignore()
            if self._close_when_idle:
                self.status.showMessage("Still stopping: the window closes after the current optimizer step …")
                return
            if not dialogs.confirm_stop_and_close(self):
                return
            self._close_when_idle = True
            self._continue_after_stop = False
            self._stop()
            self.status.showMessage("Stopping: the window closes after the current optimizer step …")
            return
        self.save_settings()
        self._refresh_timer.stop()
        self._tail_timer.stop()
        self.controller.shutdown()  # the torch thread ends before the window goes
        event.accept()
