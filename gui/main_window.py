"""The dashboard window: settings and controls on the left, live plots, run table and log on the right.

The window lays out, asks and draws. What runs do is the ``RunSession``'s
business (gui/session.py): it owns the torch thread's controller, torchrun
jobs and followed run folders, updates each run's record and the plots'
buffers, and reports through signals that the window turns into rows, log
lines and dialogs. Save and Load live in gui/checkpoint_actions.py, opening
run folders in gui/run_folders.py. A timer redraws plots, progress and table
at 10 Hz (the plots paced by gui/redraw_pacer.py).
"""

from __future__ import annotations

from PySide6.QtCore import QRect, QSettings, Qt, QTimer
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import (
    QApplication,
    QMainWindow,
    QPlainTextEdit,
    QScrollArea,
    QSplitter,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from core.config import RunConfig
from core.device import available_devices
from core.events import (
    DataPreparationProgress,
    Event,
    MicroBatchChanged,
    RunFailed,
    RunStarted,
    SampleGenerated,
)
from gui import dialogs
from gui.checkpoint_actions import CheckpointActions, RecentFolders
from gui.redraw_pacer import RedrawPacer
from gui.run_actions import RunActions, several_selected
from gui.run_folders import RunFolders, dropped_folders
from gui.run_record import RunRecord, describe
from gui.screen_fit import fit_within
from gui.session import RunSession
from gui.stored_settings import splitter_state_whole, stored_bytes
from gui.widgets.config_panel import ConfigPanel, presets_with
from gui.widgets.log_view import LogView
from gui.widgets.plot_panel import PlotPanel
from gui.widgets.run_controls import RunControls
from gui.widgets.run_table import RunTable
from gui.widgets.sample_view import SampleView
from gui.widgets.settings_toggle import SETTINGS_MIN_WIDTH, SettingsToggle
from gui.widgets.status_bar import StatusBar
from gui.widgets.tune_dialog import TuneDialog

ORGANIZATION = "Speedboard"
APPLICATION = "Speedboard"
REFRESH_HZ = 10
PLOTS_PER_TICK = 2  # of four: each plot follows at 5 Hz, and no tick holds the GUI thread long
SPLITTERS = ("main_splitter", "left_splitter", "right_splitter")
CHECKING_DATA = "the data folder is still being checked (Start waits for its check)"
NOTHING_TO_CONTINUE = ("Continue starts from a run's final checkpoint: no run here has ended with one (a run "
                       "stopped or finished in this window, or opened from its folder, has)")
NOTHING_TO_SAVE = ("No model to save: Save writes the model of a run trained in this window (a run in several "
                   "processes saves its own checkpoints, in its run folder)")
LOADING = "Waits for the weights being read (Load weights…) and the question that follows them"
TUNING = ("Waits for the speed advisor's trials (Find fastest settings…), which hold the torch thread: cancel them "
          "there, or wait for their end")
TUNING_STATE = "finding the fastest settings: trials running (Run ▸ Find fastest settings…)"
TUNE_WAITS = ("Waits for the run to end: the trials time this machine, which a run training beside them (here or "
              "in its processes) would share, and slow")
TUNE_TIP = ("Times short trials of compile settings, precisions and micro-batch × accumulation splits of these "
            "settings' effective batch, and recommends the fastest")


_STANDARD_FALLBACKS = {QKeySequence.StandardKey.Quit: "Ctrl+Q"}
"""Standard keys a platform may bind to nothing: Quit has no key under X11 without a desktop's theme (KDE,
GNOME), where File ▸ Quit listed none and Ctrl+Q did nothing."""


def _key(shortcut: str | QKeySequence.StandardKey) -> QKeySequence:
    """``shortcut`` as this platform binds it, or the usual key where it binds a standard one to nothing."""
    key = QKeySequence(shortcut)
    if key.isEmpty() and shortcut in _STANDARD_FALLBACKS:
        key = QKeySequence(_STANDARD_FALLBACKS[shortcut])
    return key


class MainWindow(QMainWindow):
    def __init__(self, *, settings: QSettings | None = None, extra_presets: dict[str, RunConfig] | None = None,
                 out_dir: str | None = None, parent: QWidget | None = None) -> None:
        """``extra_presets`` adds named base configs to the preset list; ``out_dir`` overrides where runs go."""
        super().__init__(parent)
        self.setWindowTitle("Speedboard")
        self.settings = settings if settings is not None else QSettings(ORGANIZATION, APPLICATION)
        self.session = RunSession(out_dir, self)
        self.store = self.session.store
        self.folders = RecentFolders(self.settings)
        self.geometry_restored = False  # a size and place the user left, kept by fit_on

        devices = available_devices()
        self.config_panel = ConfigPanel(presets_with(extra_presets, devices), devices)
        self.controls = RunControls()
        self.plots = PlotPanel(self.store)
        self.table = RunTable()
        self.log = LogView()
        self.sample = SampleView()
        self.status = StatusBar()
        self.checkpoints = CheckpointActions(self, self.session, self.config_panel, self.folders, self.log,
                                             self.status)
        self.run_folders = RunFolders(self, self.session, self.folders, self.plots, self.log, self.status)
        self.runs = RunActions(self, self.session, self.config_panel, self.table, self.checkpoints, self.log,
                               self.status, lambda: self._update_controls())
        self._error_seen = ""
        """The settings' error already scrolled into sight."""
        self._build_layout()
        self._build_menus()
        self._build_compact_controls()
        self._connect()
        self._restore_settings()
        self.run_folders.reopen_last_session(self.settings)
        self._accept_dropped_folders()

        self._refresh_timer = QTimer(self)
        self._refresh_timer.setInterval(1000 // REFRESH_HZ)
        self._refresh_timer.timeout.connect(self._on_tick)
        self._pacer = RedrawPacer()
        self._refresh_timer.start()
        self._update_controls()

    # ------------------------------------------------------------------ construction
    def _build_layout(self) -> None:
        scroll = QScrollArea()
        scroll.setFocusPolicy(Qt.FocusPolicy.NoFocus)  # no Tab stop of its own (it said nothing): its fields are
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.config_panel)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAsNeeded)
        scroll.setMinimumWidth(SETTINGS_MIN_WIDTH)
        self.settings_scroll = scroll
        # A field given focus from outside the column (Tab wrapping round from the run table) was left scrolled
        # out of sight: the scroll area follows only the moves it makes itself. Disconnected with the window.
        QApplication.instance().focusChanged.connect(self._follow_focus)
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
        self.main_splitter.setCollapsible(0, True)  # drag the handle to the left edge, or the button
        self.main_splitter.setCollapsible(1, False)
        self.right_splitter.setCollapsible(0, False)
        self.settings_button = SettingsToggle(self.main_splitter)
        self.plots.options.insertWidget(0, self.settings_button)
        self.setCentralWidget(self.main_splitter)
        self.setStatusBar(self.status)
        self.resize(1500, 950)
        self.main_splitter.setSizes([400, 1100])
        self.settings_button.sync()  # the column has its room now: its minimum width holds again
        self.right_splitter.setSizes([680, 240])
        self.left_splitter.setSizes([700, 220])

    def _build_compact_controls(self) -> None:
        """Start, Pause/Resume and Stop beside the settings button while the settings column (and its buttons)
        is collapsed: a run can be stopped without giving the plots' room back. They are the Run menu's
        actions, so they are enabled and named as the menu is."""
        self.compact_controls: list[QToolButton] = []
        for position, text in enumerate(("Start", "Pause", "Stop"), start=1):
            button = QToolButton()
            button.setObjectName(f"compact{text}Button")
            button.setDefaultAction(self.actions[text])
            self.plots.options.insertWidget(position, button)
            self.compact_controls.append(button)
        # Tab reaches them where they stand, before the plots' options: made last, they came after the run table.
        previous = self.plots.x_axis_combo.previousInFocusChain()
        while previous.focusPolicy() == Qt.FocusPolicy.NoFocus:  # setTabOrder ignores such a widget (a label)
            previous = previous.previousInFocusChain()
        for widget in (self.settings_button, *self.compact_controls, self.plots.x_axis_combo):
            QWidget.setTabOrder(previous, widget)
            previous = widget
        self.settings_button.shown_changed.connect(self._show_compact_controls)
        self._show_compact_controls(self.settings_shown())

    def _show_compact_controls(self, settings_shown: bool) -> None:
        for button in self.compact_controls:
            button.setVisible(not settings_shown)

    def settings_shown(self) -> bool:
        return self.settings_button.settings_shown()

    def show_settings(self, shown: bool) -> None:
        """Show or collapse the settings and log column (the plots take its room)."""
        self.settings_button.show_settings(shown)

    def _build_menus(self) -> None:
        menus = {
            "&File": (("Open run folders…", QKeySequence.StandardKey.Open, lambda: self.open_run_folders()),
                      ("Save model…", QKeySequence.StandardKey.Save, self.checkpoints.save),
                      ("Load weights…", "Ctrl+L", self._load),
                      None,
                      ("Quit", QKeySequence.StandardKey.Quit, self.close)),
            "&Run": (("Start", "Ctrl+Return", self.runs.start), ("Pause", "Ctrl+P", self.runs.pause_or_resume),
                     ("Stop", "Ctrl+.", self.runs.stop), None,
                     ("Continue with these settings", "Ctrl+Shift+Return", self.runs.continue_run)),
        }
        self.actions: dict[str, QAction] = {}
        for title, actions in menus.items():
            menu = self.menuBar().addMenu(title)
            menu.setToolTipsVisible(True)  # a greyed item says why, as its button does
            if title == "&Run":
                self._add_tune_action(menu)
            for entry in actions:
                if entry is None:
                    menu.addSeparator()
                    continue
                text, shortcut, slot = entry
                action = QAction(text, self)
                action.setShortcut(_key(shortcut))
                action.triggered.connect(slot)
                menu.addAction(action)
                self.actions[text] = action

    def _add_tune_action(self, menu) -> None:
        """Run ▸ Find fastest settings…: the speed advisor's dialog (gui/widgets/tune_dialog.py)."""
        self.tune_action = QAction("Find fastest settings…", self)
        self.tune_action.setObjectName("tuneButton")
        self.tune_action.setShortcut(QKeySequence("Ctrl+T"))
        self.tune_action.triggered.connect(self.find_fastest_settings)
        menu.addAction(self.tune_action)
        menu.addSeparator()
        self.tune_dialog: TuneDialog | None = None
        self.session.tuning_changed.connect(self._on_tuning_changed)

    def find_fastest_settings(self) -> TuneDialog:
        """Open (or raise) the speed advisor's dialog for the current settings."""
        if self.tune_dialog is None:
            self.tune_dialog = TuneDialog(self.session, self.config_panel.committed_config, self.config_panel, self)
            self.tune_dialog.applied.connect(
                lambda settings: self.status.showMessage("Applied the fastest settings found", 10_000))
            self.tune_dialog.show()
            screen = self.screen()
            if screen is not None:  # its 1100 × 700 would reach past a laptop's screen (Apply and Close below it)
                fit_within(self.tune_dialog, screen.availableGeometry())
        self.tune_dialog.show()
        self.tune_dialog.raise_()
        return self.tune_dialog

    def _connect(self) -> None:
        s = self.session
        s.record_added.connect(self._on_record_added)
        s.record_changed.connect(self._on_record_changed)
        s.event_applied.connect(self._on_event_applied)
        s.running_changed.connect(self._on_running_changed)
        for ended in (s.save_finished, s.save_failed, s.checkpoint_read, s.load_failed):
            ended.connect(self._close_after_job)  # after the checkpoint actions' own (connected before)
        s.job_failed.connect(self._on_job_failed)
        s.record_removed.connect(self._on_record_removed)
        # After the checkpoint actions' own slots (connected first): Start waited for the weights being read.
        s.checkpoint_read.connect(self._update_controls)
        s.load_failed.connect(self._update_controls)
        self.plots.visibility_changed.connect(self.table.set_hidden)
        self.table.remove_requested.connect(self._remove_runs)
        self.config_panel.changed.connect(self._update_controls)
        self.config_panel.changed.connect(self._show_settings_error)
        self.controls.start_clicked.connect(self.runs.start)
        self.controls.pause_clicked.connect(self.runs.pause)
        self.controls.resume_clicked.connect(self.runs.resume)
        self.controls.stop_clicked.connect(self.runs.stop)
        self.controls.continue_clicked.connect(self.runs.continue_run)
        self.controls.save_clicked.connect(self.checkpoints.save)
        self.controls.load_clicked.connect(self._load)
        self.table.selection_changed.connect(self.plots.set_visible_runs)
        self.table.selection_changed.connect(self._update_controls)
        self.table.selection_changed.connect(self._show_focus)

    # ------------------------------------------------------------------ settings
    def _restore_settings(self) -> None:
        s = self.settings
        self.config_panel.restore_state(s)
        self.plots.restore_state(s)
        geometry = stored_bytes(s, "window/geometry")
        self.geometry_restored = geometry is not None and self.restoreGeometry(geometry)
        for name in SPLITTERS:
            state = stored_bytes(s, f"window/{name}")
            splitter = getattr(self, name)
            if state is not None and splitter_state_whole(state, splitter.count()):
                splitter.restoreState(state)
        self.settings_button.sync()  # the settings column may come back collapsed

    def fit_on(self, available: QRect) -> None:
        """On a first start the default size shrinks to the screen's free area (a laptop's 1366 × 768 holds no
        1500 × 950 window) and the window is centred there; a size and place the user left are kept."""
        if not self.geometry_restored:
            fit_within(self, available)

    def save_settings(self) -> None:
        s = self.settings
        self.run_folders.remember_session(s)
        self.config_panel.save_state(s)
        self.plots.save_state(s)
        s.setValue("window/geometry", self.saveGeometry())
        for name in SPLITTERS:
            s.setValue(f"window/{name}", getattr(self, name).saveState())
        s.sync()

    # ------------------------------------------------------------------ what the session reports
    def _on_record_added(self, record: RunRecord) -> None:
        self.table.add_record(record)
        self.plots.add_run(record.key, record.mark[0], record.label, record.mark[1])
        if record.origin == "live":
            what = f"starting {record.nproc} processes through torchrun" if record.nproc > 1 else "starting"
            self.log.add(f"{record.label}: {what} …")
        self._show_focus()
        self._update_controls()

    def _on_record_changed(self, record: RunRecord) -> None:
        self.table.update_record(record)  # which asks for a fit when a text of its row changed
        self.plots.add_run(record.key, record.mark[0], record.label, record.mark[1])  # its label may name the parent
        self._show_focus()
        self._update_controls()

    def _on_record_removed(self, record: RunRecord) -> None:
        self.table.remove_record(record.key)
        self.plots.remove_run(record.key)
        self._show_focus()
        self._update_controls()

    def _remove_runs(self, keys: set[int]) -> None:
        """Remove rows and curves (the Delete key, the table's context menu); the run folders stay on disk."""
        kept = {key for key in keys if not self.session.removable(key)}
        removed = self.session.remove(keys)
        if removed:
            self.log.add(f"removed {', '.join(r.label for r in removed)} from the table (folders kept on disk)")
        if kept:
            here = any(self.session.active is not None and key == self.session.active.key for key in kept)
            self.status.showMessage("The run training here cannot be removed: stop it first" if here else
                                    "A run still being written cannot be removed: remove it once it ends "
                                    "(or its writer is gone)", 8_000)

    def focus_record(self) -> RunRecord | None:
        """The run the status bar follows: the one that trains, else the one selected, else the latest."""
        session = self.session
        if session.active is not None:
            return session.active
        selected = list(self.table.selected_keys())
        if len(selected) == 1:
            return session.record(selected[0])
        shown = self.table.keys
        return session.record(shown[-1]) if shown else None

    def _show_focus(self, *_) -> None:
        record = self.focus_record()
        active = self.session.active
        if active is not None and not active.ended and not active.step:
            self.plots.show_waiting(active.label, active.state, active.preparing)
        elif any(self.session.record(key).step for key in self.table.keys):
            self.plots.show_waiting(None, stepped=True)  # its curves come with the plots' next redraw
        else:
            self.plots.show_waiting(None, listed=bool(self.table.keys))
        if self.session.tuning:  # the bar showed the last run, "finished", while the trials held the torch thread
            self.status.show_idle(TUNING_STATE)
        elif record is None:
            self.status.show_idle("idle")
        else:
            self.status.show_run(record, self.store.recent_step_time(record.key) if record.key in self.store
                                 else None)

    def _on_event_applied(self, record: RunRecord, event: object) -> None:
        if isinstance(event, SampleGenerated):
            self.sample.show_sample(record.label, event.step, event.text)
        if isinstance(event, DataPreparationProgress):  # before the run has an id, the status bar shows this
            self._show_focus()
            return
        if isinstance(event, RunFailed) and record.state == "stopped":  # Stop cancelled its data preparation
            self.log.add(f"{record.label}: stopped before training: {event.message}")
            return
        if isinstance(event, RunStarted):
            self.config_panel.refresh_precision()  # auto's probe is now cached: say what it chose
            if record is self.session.active:
                # Its data is tokenized by now (here, or by the launcher of its processes): the data line looks
                # again where it said it was not.
                self.config_panel.data_prepared()
        elif isinstance(event, MicroBatchChanged) and record is self.session.active:
            panel = self.config_panel  # still showing the split that did not fit: the next run takes the new one
            if (panel.micro_batch.value(), panel.accum.value()) == (event.old_micro, event.old_accum):
                panel.micro_batch.setValue(event.new_micro)
                panel.accum.setValue(event.new_accum)
        line = describe(event)
        if line is None:
            return
        # When it happened: a run folder opened later shows its own times, not the time it was read.
        self.log.add(f"{record.label}: {line.text}", line.level, at=event.at if isinstance(event, Event) else None)
        if line.level == "error":  # the run failed
            key = record.key
            self.status.showMessage(f"{record.label} {line.text}", 15_000, until=lambda r: r.key != key)
            self.tabs.setCurrentWidget(self.log)

    def _on_running_changed(self, running: bool) -> None:
        self._update_controls()
        if not self.session.closing:
            # Kept at each run's start and end, not only at close: a window killed (or a machine that stops)
            # comes back with its settings and its runs' rows.
            self.save_settings()
        if running:
            self._show_focus()  # the new run is the active one now
            return
        if self.session.closing:
            QTimer.singleShot(0, self.close)
        else:
            self._show_focus()

    def _close_after_job(self, *_) -> None:
        """A save or a read of weights has ended: the window closes now if it was asked to meanwhile."""
        if self.session.closing and not self.session.running and not self.session.tuning:
            QTimer.singleShot(0, self.close)

    def _on_tuning_changed(self, tuning: bool) -> None:
        self._update_controls()
        self._show_focus()
        if not tuning and self.session.closing:
            QTimer.singleShot(0, self.close)

    def _on_job_failed(self, job: str, message: str) -> None:
        self.log.add(f"{job} failed: {message}", "error")

    def _load(self) -> None:
        self.checkpoints.load()
        self._update_controls()

    def open_run_folder(self, folder: str | None = None) -> RunRecord | None:
        """Show a run folder's curves (the headless CLI or a torchrun job may still be writing it); without
        ``folder``, the folders picked in a dialog (the first one's record is returned)."""
        records = self.open_run_folders([folder] if folder else None)
        return records[0] if records else None

    def open_run_folders(self, folders: list[str] | None = None) -> list[RunRecord]:
        """Show several run folders (a runs folder opens all inside); without ``folders``, those picked."""
        return self.run_folders.open(folders)

    # ------------------------------------------------------------------ drag and drop
    def _accept_dropped_folders(self) -> None:
        """Run folders dropped anywhere on the window open as File ▸ Open run folders opens them. The plots and the
        read-only texts take drops of their own by default, so Qt gave a drop on them (most of the window) to them
        first; they take none now, and Qt looks no further than the window. The Data field takes a corpus."""
        self.setAcceptDrops(True)
        texts = [t for t in self.findChildren(QPlainTextEdit) if t.isReadOnly()]
        for widget in (*self.plots.plots, *texts):
            widget.setAcceptDrops(False)
            widget.viewport().setAcceptDrops(False)

    def dragEnterEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if dropped_folders(event.mimeData().urls()):
            event.acceptProposedAction()

    def dropEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        folders = dropped_folders(event.mimeData().urls())
        if not folders:
            return
        event.acceptProposedAction()
        # Opened once the drop has returned: a message box inside it would hold the file manager's drag.
        QTimer.singleShot(0, self, lambda: self.open_run_folders(folders))

    # ------------------------------------------------------------------ periodic refresh
    def _on_tick(self) -> None:
        live = self.session.live
        if live != self.plots.live:
            self.plots.live = live
            if not live:
                self.plots.fit_tight()  # nothing grows any more: no headroom on the right
        if self._pacer.due():
            self.plots.refresh(budget=PLOTS_PER_TICK)
        progressed = self.session.take_progressed()
        active = self.session.active
        if active is not None and active.state == "compiling" and active not in progressed:
            progressed.append(active)  # its elapsed compile time moves without events
        for record in progressed:
            if not record.removed:
                self.table.update_record(record)
        self._show_focus()

    def _show_settings_error(self) -> None:
        """A new error of the settings is scrolled into sight: it says why Start is grey (a budget of 0 was
        said under a row scrolled out of view, with nothing on screen but grey buttons)."""
        error = self.config_panel.error
        if error and error != self._error_seen:
            # After the layout has made room for the label (it was hidden until now).
            QTimer.singleShot(0, self._scroll_to_settings_error)
        self._error_seen = error

    def _scroll_to_settings_error(self) -> None:
        label = self.config_panel.error_label()
        if label is not None:
            self.settings_scroll.ensureWidgetVisible(label, 0, 40)

    def _update_controls(self, *_) -> None:
        session = self.session
        running = session.running
        # A folder still being checked may yet show a problem under the Data control: Start waits for its check.
        checking = self.config_panel.checking_source
        valid = self.config_panel.config is not None and not checking
        # Continue takes the training settings only (the parent keeps its model and data), from one run.
        selected = self.table.selected_keys()
        continue_error = self.config_panel.continue_error
        can_continue = not continue_error and not session.tuning and (
            running or session.continue_source(selected) is not None)
        continue_why = (f"Cannot run these settings: {continue_error}" if continue_error
                        else several_selected(len(selected)) if len(selected) > 1 and not running else
                        NOTHING_TO_CONTINUE if not can_continue and not running and not session.tuning else "")
        # The advisor's trials hold the torch thread, which saves and loads: both would wait for them unseen.
        # A torchrun job's weights are in its processes, never in this one: it saves its own checkpoints.
        # Weights being read (Load): the run they are for waits for them and for the question that follows; a Start
        # meanwhile trained without them, and the question then came during its run.
        loading = session.inspecting
        self.controls.set_state(running=running, paused=session.paused,
                                can_start=valid and not session.tuning and not loading,
                                can_continue=can_continue and not loading, stopping=session.stopping or session.ending,
                                can_save=session.can_save and not session.tuning and not session.in_processes
                                and not loading,
                                can_load=not session.tuning and not loading,
                                invalid="" if valid else CHECKING_DATA if checking else self.config_panel.error,
                                continue_why=continue_why,
                                save_why="" if session.can_save else NOTHING_TO_SAVE,
                                in_processes=session.in_processes,
                                busy=TUNING if session.tuning else LOADING if loading else "")
        self.tune_action.setEnabled(not running)
        self.tune_action.setToolTip(TUNE_WAITS if running else TUNE_TIP)
        # The Run menu offers what the buttons offer, enabled alike, with their tooltips (why one is grey).
        for text, button in (("Start", self.controls.start), ("Pause", self.controls.pause),
                             ("Stop", self.controls.stop), ("Continue with these settings", self.controls.continue_),
                             ("Save model…", self.controls.save), ("Load weights…", self.controls.load)):
            self.actions[text].setEnabled(button.isEnabled())
            self.actions[text].setToolTip(button.toolTip())
        self.actions["Pause"].setText("Resume" if session.paused else "Pause")

    # ------------------------------------------------------------------ closing
    def _follow_focus(self, old: QWidget | None, new: QWidget | None) -> None:
        """A settings field that gets the keyboard's focus is scrolled into sight, wherever the focus came from."""
        if new is not None and self.config_panel.isAncestorOf(new):
            self.settings_scroll.ensureWidgetVisible(new, 0, 20)

    def closeEvent(self, event: QCloseEvent) -> None:  # noqa: N802 (Qt's name)
        if self.session.running:
            event.ignore()
            active = self.session.active
            # Before its first step (its compile announced, not begun, included) a stop ends the set-up: nothing kept.
            setting_up = active is not None and active.before_training
            compiling = not setting_up and active is not None and active.compiling
            # A compile cannot be interrupted: say that the wait is for it, not for one optimizer step.
            after = ("the compile in progress and the step after it" if compiling else
                     "its set-up has stopped" if setting_up else "the current optimizer step")
            if self.session.closing:
                # A torchrun job can be ended at once: one of its processes may hang, holding the others' stop.
                if self.session.in_processes and dialogs.confirm_end_job_now(self):
                    self.session.end_processes_now()
                    self.status.showMessage("Ending the job: the window closes once its processes have ended …")
                    return
                self.status.showMessage(f"Still stopping: the window closes after {after} …")
                return
            if self.session.ending or self.session.stopping:  # no question: the run ends already
                if self.session.continue_pending:  # the log's "Continue: …" line is not what happens now
                    self.log.add("Continue cancelled: the window closes once the run has stopped (its final "
                                 "checkpoint is saved; Continue from it in the next session)", "warning")
                self.session.stop_then_close()  # (no second stop is sent)
                self.status.showMessage("The window closes once the run has ended …" if self.session.ending else
                                        f"Stopping: the window closes after {after} …")
                return
            if not dialogs.confirm_stop_and_close(self, compiling, setting_up):
                return
            self.session.stop_then_close()
            self.status.showMessage(f"Stopping: the window closes after {after} …")
            self._update_controls()
            return
        if self.session.tuning:
            # Waiting here for the trials to end would freeze the window for as long as a compile takes.
            event.ignore()
            if not self.session.closing:
                self.session.cancel_tune_then_close()
            self.status.showMessage("Stopping the trials: the window closes after the current trial's step or "
                                    "compile (the report keeps what they measured) …")
            return
        if self.session.pending_save is not None or self.session.inspecting:
            # Waiting here for the torch thread froze the window for as long as the checkpoint takes to write or read.
            event.ignore()
            self.session.close_after_job()
            self.status.showMessage("The window closes once the model is saved …" if self.session.pending_save
                                    else "The window closes once the weights being read are read (not loaded) …")
            return
        self.save_settings()
        self._refresh_timer.stop()
        self.session.shutdown()  # the torch thread ends before the window goes
        event.accept()
