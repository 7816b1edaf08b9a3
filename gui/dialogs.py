"""Every question and error the window puts to the user, in one place.

They use ``QMessageBox`` static functions (tests replace them), except the
load-mode question, which needs its own button labels (tests replace
``ask_load_mode`` itself), and the Save dialog, a folder and a name
(``SaveTargetDialog``; tests replace ``ask_save_target``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from PySide6.QtWidgets import (
    QAbstractItemView,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPushButton,
    QWidget,
)

from core.paths import unnameable, user_path


def show_error(parent: QWidget | None, title: str, message: str) -> None:
    QMessageBox.warning(parent, title, message)


def _yes(parent: QWidget | None, title: str, text: str, default_yes: bool = False) -> bool:
    """A Yes/No question; True for Yes."""
    yes, no = QMessageBox.StandardButton.Yes, QMessageBox.StandardButton.No
    return QMessageBox.question(parent, title, text, yes | no, yes if default_yes else no) == yes


def confirm_end_job_now(parent: QWidget | None) -> bool:
    """Closed again while a torchrun job stops: end its processes now instead of waiting for their step?"""
    return _yes(parent, "End the job now?",
                "The job is still stopping: its processes finish their current step first, and a process that hangs "
                "holds the others until the collective timeout (SPEEDBOARD_DIST_TIMEOUT, 300 s by default).\n\n"
                "End every process now and close Speedboard? The run keeps the checkpoints it has saved; the step "
                "in progress is not saved.")


def confirm_stop_and_close(parent: QWidget | None, compiling: bool = False, setting_up: bool = False) -> bool:
    """Quit while a run is active? ``setting_up``: it has not trained a step (its data is being prepared, its model
    built): stopping keeps nothing, and there is no run folder or checkpoint to promise."""
    if setting_up:
        return _yes(parent, "Stop the run and quit?",
                    "A run is being set up (its data prepared, its model built), or paused before its first step. "
                    "Stop it and close Speedboard?\n\n"
                    "It has not trained a step yet: nothing of it is kept.")
    wait = ("\n\nIt is compiling: torch.compile cannot be cut short, so the window stays until the compile is "
            "done (seconds to minutes, more for a large model or max-autotune)." if compiling else "")
    return _yes(parent, "Stop the run and quit?",
                "A run is in progress. Stop it at the next optimizer step and close Speedboard?\n\n"
                f"Its metrics are already in its run folder, and a final checkpoint is saved.{wait}")


def offer_fitting_split(parent: QWidget | None, reason: str, micro: int, accum: int, sequences: int,
                        refused: bool = False) -> bool:
    """Before Start: train with the split that fits (True), or start as set (False)? ``refused``: as set it
    needs more than all the memory, so No starts nothing (it started a run that failed at once)."""
    cannot = ("\n\nAs set it cannot start at all: that is more than all of the memory." if refused else "")
    no = "No changes nothing." if refused else "No starts as set."
    return _yes(parent, "Micro-batch does not fit",
                f"The {reason}.{cannot}\n\nTrain with micro-batch {micro} × accumulation {accum} instead? The "
                f"effective batch ({sequences:,} sequences per optimizer step) stays the same, and so do the "
                f"updates.\n\nYes sets these in the settings and starts; {no}", default_yes=True)


def confirm_apply_other(parent: QWidget | None, differences: list[str]) -> bool:
    """Apply a tuning report's pick, measured for other settings than those shown?"""
    return _yes(parent, "Apply a pick measured for other settings?",
                f"This report was measured for {'; '.join(differences)}.\n\nIts pick may not be the fastest for "
                f"the settings here, and its micro-batch × accumulation, in one process, sets the report's effective "
                f"batch. Apply it anyway?")


def ask_load_mode(parent: QWidget | None, description: str) -> str | None:
    """``resume`` (weights, optimizer and schedule), ``init`` (weights only) or None (cancel)."""
    box = QMessageBox(parent)
    box.setIcon(QMessageBox.Icon.Question)
    box.setWindowTitle("Load checkpoint")
    box.setText(f"{description}\n\nIt holds the optimizer and schedule state too. Resume that training exactly, "
                f"or start a new run from its weights only?")
    resume = box.addButton("Resume training", QMessageBox.ButtonRole.AcceptRole)
    init = box.addButton("Weights only", QMessageBox.ButtonRole.ActionRole)
    box.addButton(QMessageBox.StandardButton.Cancel)
    box.setDefaultButton(resume)
    box.exec()
    clicked = box.clickedButton()
    if clicked is resume:
        return "resume"
    if clicked is init:
        return "init"
    return None


class SaveTargetDialog(QDialog):
    """Where to write a checkpoint folder: a parent folder (chosen with a folder dialog) and a name.

    A file dialog cannot pick a folder that does not exist yet, and typing an existing folder's name in
    one opens it instead of choosing it; here an existing checkpoint is a target like any other (the
    window asks before replacing it).
    """

    def __init__(self, parent: QWidget | None, folder: str, name: str,
                 check: Callable[[str], str | None] | None = None) -> None:
        super().__init__(parent)
        self._check = check
        """Why a target cannot be written (a missing folder, a file in the way), said in the dialog at Save: it
        closed, a message box said why, and what was typed was lost."""
        self.setWindowTitle("Save the model as a checkpoint folder")
        self.setObjectName("saveTargetDialog")
        self.folder = QLineEdit(folder)
        self.folder.setObjectName("saveFolderEdit")
        self.browse = QPushButton("Browse…")
        self.browse.setObjectName("saveBrowseButton")
        self.browse.setAutoDefault(False)
        self.name = QLineEdit(name)
        self.name.setObjectName("saveNameEdit")
        self.target_label = QLabel()
        self.target_label.setObjectName("saveTargetLabel")
        self.target_label.setWordWrap(True)
        self.problem_label = QLabel()
        self.problem_label.setObjectName("saveProblemLabel")
        self.problem_label.setWordWrap(True)
        self.problem_label.setStyleSheet("color: #b00020;")
        self.problem_label.hide()
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save | QDialogButtonBox.StandardButton.Cancel)
        row = QHBoxLayout()
        row.addWidget(self.folder, 1)
        row.addWidget(self.browse)
        form = QFormLayout(self)
        form.addRow("In folder", row)
        form.addRow("Name", self.name)
        form.addRow(self.target_label)
        form.addRow(self.problem_label)
        form.addRow(self.buttons)
        self.browse.clicked.connect(self._browse)
        self.folder.textChanged.connect(self._update)
        self.name.textChanged.connect(self._update)
        self.buttons.accepted.connect(self._accept_if_writable)
        self.buttons.rejected.connect(self.reject)
        self.resize(560, self.sizeHint().height())
        self.name.setFocus()
        self.name.selectAll()
        self._update()

    def target(self) -> str | None:
        """The checkpoint folder to write, or None while the folder or the name is not usable."""
        name, folder = self.name.text().strip(), self.folder.text().strip()
        if not name or not folder or name in (".", "..") or "/" in name or "\\" in name or _has_control(name):
            return None
        # A relative folder would be taken from the working directory the window was started in, unseen here.
        if not Path(folder).expanduser().is_absolute():
            return None
        return str(user_path(Path(folder).expanduser() / name))  # "a/../b" is shown as the folder it names

    def _accept_if_writable(self) -> None:
        target = self.target()
        problem = self._check(target) if target is not None and self._check is not None else None
        if problem:  # said here: the dialog stays open with what was typed
            self.problem_label.setText(f"Cannot save there: {problem}")
            self.problem_label.show()
            self._fit_height()
            return
        self.accept()

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Folder to save the checkpoint in", self.folder.text())
        if folder:
            self.folder.setText(folder)

    def _update(self) -> None:
        self.problem_label.hide()  # said of what was typed before
        target = self.target()
        save = self.buttons.button(QDialogButtonBox.StandardButton.Save)
        save.setEnabled(target is not None)
        if target is None:
            self.target_label.setText("Name a folder to write: a name without slashes, line breaks or tabs, in an "
                                      "existing folder given by its full path.")
        elif (why := unnameable(target)) is not None:  # else looking at it raises "File name too long"
            self.target_label.setText(f"Cannot save there: {why}.")
        elif isinstance(listed := _listing(target), str):
            self.target_label.setText(f"Cannot save there: cannot look into {target} ({listed}).")
        elif listed:
            self.target_label.setText(f"Replaces {target} (you are asked first)")
        else:
            self.target_label.setText(f"Writes {target}")
        self._fit_height()

    def _fit_height(self) -> None:
        """As tall as its wrapped lines need at its width: a window keeps the height it opened with, and a second
        line of the label squeezed both into the height of one, clipped at the top and bottom."""
        layout = self.layout()
        need = layout.heightForWidth(self.width()) if layout.hasHeightForWidth() else layout.sizeHint().height()
        self.setMinimumHeight(need)
        if self.height() < need:
            self.resize(self.width(), need)

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        if event.size().width() != event.oldSize().width():  # narrower: more lines
            self._fit_height()


def _listing(target: str) -> bool | str | None:
    """Whether ``target`` is a folder with something in it (None: no folder there), or why it cannot be looked
    into: on each keystroke, where a folder that cannot be listed raised out of the dialog, which never opened."""
    if not os.path.isdir(target):
        return None
    try:
        with os.scandir(target) as entries:
            return next(entries, None) is not None
    except OSError as exc:
        return exc.strerror or str(exc)


def _has_control(name: str) -> bool:
    """A line break, a tab or another control character: every line that names the folder would break."""
    return any(ord(c) < 0x20 or ord(c) == 0x7F for c in name)


def ask_save_target(parent: QWidget | None, folder: str, name: str,
                    check: Callable[[str], str | None] | None = None) -> str | None:
    """The checkpoint folder to write (it may exist), or None when cancelled; ``check`` says, in the dialog,
    why a target cannot be written, and the dialog stays open."""
    dialog = SaveTargetDialog(parent, folder, name, check)
    return dialog.target() if dialog.exec() == QDialog.DialogCode.Accepted else None


def confirm_replace(parent: QWidget | None, path: str) -> bool:
    return _yes(parent, "Replace the checkpoint?",
                f"{path} already holds a Speedboard checkpoint. Replace it with the current model?\n\n"
                f"The old one stays whole until the new one is written.")


def run_folder_dialog(parent: QWidget | None, start: str) -> QFileDialog:
    """Qt's own folder dialog with multiple selection: the platform's folder dialogs choose one folder only."""
    dialog = QFileDialog(parent, "Open run folders (select several with Ctrl or Shift)", start)
    dialog.setObjectName("runFolderDialog")
    dialog.setFileMode(QFileDialog.FileMode.Directory)
    dialog.setOption(QFileDialog.Option.ShowDirsOnly, True)
    dialog.setOption(QFileDialog.Option.DontUseNativeDialog, True)
    for view in dialog.findChildren(QAbstractItemView):  # its list and detail views
        view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
    return dialog


def pick_run_folders(parent: QWidget | None, start: str) -> list[str]:
    """Run folders to open, several at once (Ctrl/Shift-click); [] when cancelled."""
    dialog = run_folder_dialog(parent, start)
    return dialog.selectedFiles() if dialog.exec() == QDialog.DialogCode.Accepted else []
