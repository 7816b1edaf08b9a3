"""Every question and error the window puts to the user, in one place.

They use ``QMessageBox`` static functions (tests replace them), except the
load-mode question, which needs its own button labels (tests replace
``ask_load_mode`` itself).
"""

from __future__ import annotations

from PySide6.QtWidgets import QMessageBox, QWidget


def show_error(parent: QWidget | None, title: str, message: str) -> None:
    QMessageBox.warning(parent, title, message)


def confirm_stop_and_close(parent: QWidget | None) -> bool:
    answer = QMessageBox.question(
        parent, "Stop the run and quit?",
        "A run is in progress. Stop it at the next optimizer step and close Speedboard?\n\n"
        "Its metrics are already in its run folder, and a final checkpoint is saved.",
        QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.No)
    return answer == QMessageBox.StandardButton.Yes


def offer_fitting_split(parent: QWidget | None, reason: str, micro: int, accum: int, sequences: int) -> bool:
    """Before Start: train with the split that fits (True), or start as set (False)?"""
    answer = QMessageBox.question(
        parent, "Micro-batch does not fit",
        f"The {reason}.\n\nTrain with micro-batch {micro} × accumulation {accum} instead? The effective batch "
        f"({sequences:,} sequences per optimizer step) stays the same, and so do the updates.\n\n"
        f"Yes sets these in the settings and starts; No starts as set.",
        QMessageBox.StandardButton.Yes | QMessageBox.StandardButton.No, QMessageBox.StandardButton.Yes)
    return answer == QMessageBox.StandardButton.Yes


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
