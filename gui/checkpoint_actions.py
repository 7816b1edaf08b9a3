"""Save model… and Load weights…: the dialogs, the checks before the torch thread is asked, and the answers.

The window's menus and buttons call ``save`` and ``load``; the session's
replies (``checkpoint_read``, ``save_finished``, ``save_failed``,
``load_failed``) come here and become dialogs, log lines and the settings
panel's "start from" choice. A loaded checkpoint feeds one run: the choice is
cleared once that run has started from it.
"""

from __future__ import annotations

import os
from pathlib import Path

from PySide6.QtCore import QObject, QSettings
from PySide6.QtWidgets import QFileDialog, QWidget

from core.checkpoint import is_speedboard_checkpoint
from core.config import RunConfig
from core.errors import SpeedboardError
from gui import dialogs
from gui.checkpoint_paths import (
    LOAD_FILTER,
    architecture_note,
    checkpoint_target,
    describe_checkpoint,
    fit_message,
    save_target_problem,
)
from gui.controller import CheckpointSummary
from gui.run_record import RunRecord
from gui.session import RunSession
from gui.stored_settings import stored_text
from gui.widgets.config_panel import ConfigPanel
from gui.widgets.log_view import LogView
from gui.widgets.status_bar import StatusBar


class RecentFolders:
    """Where the file dialogs open: the folder last picked by Load, the last save's parent, and the folder of the
    run folders last opened (Open run folders opened inside the checkpoint folder Load had picked)."""

    def __init__(self, settings: QSettings) -> None:
        self.settings = settings

    def last(self) -> str:
        folder = stored_text(self.settings, "paths/last_dir")
        return folder if folder and os.path.isdir(folder) else str(Path.home())

    def save(self) -> str:
        folder = stored_text(self.settings, "paths/save_dir")
        return folder if folder and os.path.isdir(folder) else self.last()

    def remember(self, path: str) -> None:
        folder = Path(path).expanduser()  # (isdir, never is_dir: a folder that cannot be entered raised)
        self.settings.setValue("paths/last_dir", str(folder if os.path.isdir(folder) else folder.parent))

    def remember_save(self, path: str) -> None:
        self.settings.setValue("paths/save_dir", str(Path(path).parent))

    def runs(self, *fallbacks: Path) -> str:
        """Where Open run folders starts: the folder of the run folders opened last, else the first of
        ``fallbacks`` that is a folder (the latest run's, the runs folder), else the home folder."""
        folder = stored_text(self.settings, "paths/runs_dir")
        if folder and os.path.isdir(folder):
            return folder
        return str(next((f for f in fallbacks if os.path.isdir(f)), Path.home()))

    def remember_runs(self, folder: str) -> None:
        self.settings.setValue("paths/runs_dir", folder)


class CheckpointActions(QObject):
    """Save and Load for the window (``parent``, which owns the dialogs), through the run session."""

    def __init__(self, parent: QWidget, session: RunSession, panel: ConfigPanel, folders: RecentFolders,
                 log: LogView, status: StatusBar) -> None:
        super().__init__(parent)
        self._window = parent
        self.session, self.panel, self.folders, self.log, self.status = session, panel, folders, log, status
        self._fed: tuple[RunRecord | None, tuple[str, str] | None] = (None, None)
        """The run started from a loaded checkpoint, and that choice (cleared once the run has loaded it)."""
        session.checkpoint_read.connect(self._on_checkpoint_read)
        session.load_failed.connect(self._on_load_failed)
        session.save_finished.connect(self._on_save_finished)
        session.save_failed.connect(self._on_save_failed)
        session.record_changed.connect(self._on_record_changed)

    def started(self, record: RunRecord, cfg: RunConfig) -> None:
        """A run has been started with ``cfg``: when it starts from the loaded checkpoint, remember which."""
        if cfg.init_from or cfg.resume:
            self._fed = (record, self.panel.start_from)

    def _on_record_changed(self, record: RunRecord) -> None:
        fed, start_from = self._fed
        if record is fed and (record.run_id or record.ended):
            # Started (its weights are loaded): the next run starts afresh. A run that failed before
            # loading them keeps the choice, so a fixed setting can simply start again.
            self._fed = (None, None)
            if record.run_id and self.panel.start_from == start_from:
                self.panel.clear_start_from()

    # ------------------------------------------------------------------ save
    def save(self) -> None:
        session, window = self.session, self._window
        if session.in_processes:
            dialogs.show_error(window, "Save from the run folder",
                               "A multi-process run saves its checkpoints into its run folder (a final one when "
                               "it ends or is stopped); load one of those.")
            return
        if not session.can_save:
            dialogs.show_error(window, "Nothing to save", "There is no model yet: start a run first.")
            return
        if session.pending_save is not None:
            dialogs.show_error(window, "Save in progress", f"The model is being saved to {session.pending_save}.")
            return
        path = dialogs.ask_save_target(window, self.folders.save(), session.save_name(), save_target_problem)
        if not path:
            return
        problem = save_target_problem(path)  # again: the place may have changed since the dialog checked it
        if problem:
            dialogs.show_error(window, "Cannot save there", problem)
            return
        if is_speedboard_checkpoint(path) and not dialogs.confirm_replace(window, path):
            return
        deferred = session.save(path)
        self.status.showMessage("Saving at the next optimizer step …" if deferred else "Saving …", 10_000)

    def _on_save_finished(self, path: str) -> None:
        self.folders.remember_save(path)  # the next Save opens here; a place that failed is not remembered
        self.status.showMessage(f"Model saved to {path}", 10_000)

    def _on_save_failed(self, path: str, message: str) -> None:
        self.status.clearMessage()  # "Saving …" is over
        self.log.add(f"save failed: {message}", "error")
        dialogs.show_error(self._window, "Save failed", f"The model was not saved:\n{message}")

    # ------------------------------------------------------------------ load
    def load(self) -> None:
        if self.session.running:
            dialogs.show_error(self._window, "Cannot load during a run",
                               "Weights cannot be loaded while a run is training. Stop the run (or wait until it "
                               "ends), then load; the next run starts from the loaded weights.")
            return
        if self.session.inspecting:
            return
        path, _ = QFileDialog.getOpenFileName(
            self._window,
            "Load weights: a .pt/.pth/.bin/.ckpt/.safetensors file, or config.json in a checkpoint folder",
            self.folders.last(), LOAD_FILTER)
        if not path:
            return
        self.folders.remember(path)
        self.session.inspect(checkpoint_target(path), self.panel.preset_config().model)
        self.status.showMessage(f"Reading {path} …", 5_000)

    def _on_load_failed(self, path: str, message: str) -> None:
        self.log.add(f"load failed: {message}", "error")
        if self.session.closing:  # read as the window closes: nothing was to be loaded any more
            return
        dialogs.show_error(self._window, "Cannot load", f"Could not load {Path(path).name or path}:\n{message}")

    def _on_checkpoint_read(self, info: CheckpointSummary) -> None:
        if self.session.closing:  # the window closes: asked meanwhile, its question would hold the closing
            self.log.add(f"{info.path} was read as the window closed: not loaded")
            return
        description = describe_checkpoint(info)
        if info.fit_problem:  # refused now, not after Start; the choice made before stays
            self.log.add(f"not loaded: {info.fit_problem}", "error")
            dialogs.show_error(self._window, "These weights do not fit", fit_message(info, self.panel.preset_name))
            return
        if info.start_problem:
            self.log.add(f"not loaded: {info.start_problem}", "error")
            dialogs.show_error(self._window, "Cannot start from these weights",
                               f"{info.start_problem}.\n\nThe next run's start is unchanged.")
            return
        mode = "init"
        if info.resumable:
            mode = dialogs.ask_load_mode(self._window, description)
            if mode is None:
                self.log.add(f"load of {info.path} cancelled")
                return
        schedule = info.schedule if mode == "resume" else None
        if mode == "resume" and info.run_config:
            try:
                # A budget in epochs, which the panel has no unit for, is shown as the tokens it came to.
                self.panel.set_from_config(RunConfig.from_dict(info.run_config),
                                           schedule["schedule"]["end_tokens"] if schedule else None)
            except (SpeedboardError, TypeError, ValueError):
                pass  # an older or foreign config: the panel keeps its settings
        resume_state = (info.step, info.tokens, schedule) if schedule and info.step is not None and \
            info.tokens is not None else None
        self.panel.set_start_from(info.path, mode, description, info.model_config, info.lineage, resume_state)
        what = "resumes it exactly" if mode == "resume" else "starts from its weights"
        self.log.add(f"loaded {description}: the next run {what}{architecture_note(info)}")
        self.status.showMessage(f"Loaded {description}", 10_000)
