"""The real window, offscreen, with micro-sized runs; every dialog replaced so nothing can block."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("PySide6")
pytest.importorskip("pytestqt")

from PySide6.QtCore import QObject, QSettings, Qt  # noqa: E402
from PySide6.QtWidgets import QFileDialog, QMessageBox  # noqa: E402

from tests.conftest import micro_config  # noqa: E402

RUN_TIMEOUT_MS = 90_000


class Dialogs:
    """Records every message box and answers every file dialog the window opens."""

    def __init__(self) -> None:
        self.messages: list[tuple[str, str, str]] = []  # (kind, title, text)
        self.question_answer = QMessageBox.StandardButton.Yes
        self.load_mode: str | None = "init"
        self.load_questions: list[str] = []
        self.files: dict[str, str] = {}
        self.file_calls: list[str] = []
        self.save_dialog: tuple[str, str] | None = None  # what the Save dialog was opened with: folder, name

    def warnings(self) -> list[str]:
        return [f"{title}: {text}" for kind, title, text in self.messages if kind in ("warning", "critical")]

    def questions(self) -> list[str]:
        return [text for kind, _, text in self.messages if kind == "question"]


@pytest.fixture(autouse=True)
def dialogs(monkeypatch) -> Dialogs:
    from gui import dialogs as gui_dialogs

    d = Dialogs()

    def box(kind):
        def show(parent, title, text, *args, **kwargs):
            d.messages.append((kind, title, text))
            return d.question_answer if kind == "question" else QMessageBox.StandardButton.Ok
        return staticmethod(show)

    for kind in ("warning", "critical", "information", "question"):
        monkeypatch.setattr(QMessageBox, kind, box(kind))

    def ask_load_mode(parent, description):
        d.load_questions.append(description)
        return d.load_mode

    monkeypatch.setattr(gui_dialogs, "ask_load_mode", ask_load_mode)

    def ask_save_target(parent, folder, name, check=None):
        d.file_calls.append("ask_save_target")
        d.save_dialog = (folder, name)
        return d.files.get("ask_save_target") or None

    monkeypatch.setattr(gui_dialogs, "ask_save_target", ask_save_target)

    def pick_run_folders(parent, start):
        d.file_calls.append("pick_run_folders")
        return list(d.files.get("pick_run_folders") or [])

    monkeypatch.setattr(gui_dialogs, "pick_run_folders", pick_run_folders)

    def file_dialog(name):
        def answer(*args, **kwargs):
            d.file_calls.append(name)
            path = d.files.get(name, "")
            return path if name == "getExistingDirectory" else (path, "")
        return staticmethod(answer)

    for name in ("getSaveFileName", "getOpenFileName", "getExistingDirectory"):
        monkeypatch.setattr(QFileDialog, name, file_dialog(name))
    return d


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Micro models gain nothing from intra-op threads, and on a busy machine they only contend."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def settings_path(tmp_path) -> Path:
    return tmp_path / "settings.ini"


@pytest.fixture
def make_window(qtbot, tmp_path, settings_path):
    """``make_window(**micro_overrides)``: a shown MainWindow with the ``micro`` preset selected."""
    from gui.main_window import MainWindow

    windows = []

    def stop_run(window) -> None:
        # pytest-qt closes and deletes the window before any fixture's teardown: a run still active then would
        # report its end to a controller already gone, and be waited for in vain.
        window.session.controller.stop()
        qtbot.waitUntil(lambda: not window.session.controller.running, timeout=RUN_TIMEOUT_MS)

    def make(**overrides):
        settings = QSettings(str(settings_path), QSettings.Format.IniFormat)
        window = MainWindow(settings=settings, extra_presets={"micro": micro_config(tmp_path, **overrides)})
        qtbot.addWidget(window, before_close_func=stop_run)
        window.show()
        child(window, "presetCombo").setCurrentText("micro")
        windows.append(window)
        return window

    yield make
    for window in windows:  # no test leaves a thread behind, whatever it did
        stop_run(window)
        window.close()
        assert window.session.controller.thread_finished


@pytest.fixture
def window(make_window):
    return make_window()


# --------------------------------------------------------------------------- helpers
def child(window, name: str):
    found = window.findChild(QObject, name)
    assert found is not None, f"no widget named {name!r}"
    return found


def click(window, name: str) -> None:
    button = child(window, name)
    assert button.isEnabled(), f"{name} is disabled"
    button.click()


def wait_idle(qtbot, window, timeout: int = RUN_TIMEOUT_MS) -> None:
    """Until the torch thread has left the run (its RunJobEnded reply was handled)."""
    qtbot.waitUntil(lambda: not window.session.controller.running, timeout=timeout)


def run_once(qtbot, window):
    """Click Start, wait for the run to end, return its record."""
    count = len(window.session.records)
    click(window, "startButton")
    assert len(window.session.records) == count + 1
    wait_idle(qtbot, window)
    return window.session.records[-1]


def wait_steps(qtbot, window, n: int, timeout: int = RUN_TIMEOUT_MS):
    record = window.session.records[-1]
    qtbot.waitUntil(lambda: record.step >= n and record.run_id is not None, timeout=timeout)
    return record


def read_jsonl(run_dir: str | Path) -> list[dict]:
    with open(Path(run_dir) / "metrics.jsonl", encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def drop_paths(widget, paths, *, enter_only: bool = False) -> bool:
    """Drag ``paths`` (local files or folders, as a file manager drags them) over ``widget`` and drop them there;
    whether the widget accepted the drag (nothing is dropped where it did not). ``enter_only``: ask the widget
    alone whether it takes the drag (Qt hands a drag it ignores on to its parents)."""
    from PySide6.QtCore import QMimeData, QPoint, QPointF, QUrl
    from PySide6.QtGui import QDragEnterEvent, QDropEvent
    from PySide6.QtWidgets import QApplication

    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    centre = widget.rect().center()
    enter = QDragEnterEvent(QPoint(centre), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                            Qt.KeyboardModifier.NoModifier)
    enter.ignore()
    if enter_only:
        widget.dragEnterEvent(enter)
        return enter.isAccepted()
    QApplication.sendEvent(widget, enter)
    if not enter.isAccepted():
        return False
    drop = QDropEvent(QPointF(centre), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton,
                      Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, drop)
    return True
