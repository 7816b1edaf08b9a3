"""Folders this user may not enter or list, met by Save model… and Load…: said in the dialog or a message, never
an exception out of Qt's event loop with no dialog (Python 3.11's ``Path.is_dir`` raises on EACCES)."""

from __future__ import annotations

import json
import sys

from tests.core.test_unreadable_checkpoints import as_a_user

PROBE = """
import json, os, sys
from pathlib import Path
from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QApplication
from gui.checkpoint_actions import RecentFolders
from gui.checkpoint_paths import checkpoint_target, save_target_problem
from gui.dialogs import SaveTargetDialog

app = QApplication([])
root = Path(sys.argv[1])
closed, unlisted = root / "closed", root / "unlisted"
said = {
    "problem in closed": save_target_problem(str(closed / "model")),
    "problem of unlisted": save_target_problem(str(unlisted)),
    "target": checkpoint_target(str(closed / "config.json")),
}
dialog = SaveTargetDialog(None, str(root), "unlisted", save_target_problem)
said["dialog"] = dialog.target_label.text()
dialog = SaveTargetDialog(None, str(closed), "model", save_target_problem)
said["dialog in closed"] = dialog.target_label.text()
settings = QSettings(str(root / "settings.ini"), QSettings.Format.IniFormat)
folders = RecentFolders(settings)
folders.remember(str(closed / "config.json"))
settings.setValue("paths/save_dir", str(closed))
said["remembered"] = settings.value("paths/last_dir")
said["save folder"] = folders.save()
print(json.dumps(said))
"""


def test_folders_that_cannot_be_entered_or_listed_are_said_not_raised(tmp_path):
    closed, unlisted = tmp_path / "closed", tmp_path / "unlisted"
    for folder in (closed, unlisted):
        folder.mkdir()
        (folder / "config.json").write_text("{}")
    closed.chmod(0o600)  # no search bit: nothing in it can be looked at
    unlisted.chmod(0o311)  # can be entered, not listed
    try:
        result = as_a_user([sys.executable, "-c", PROBE, str(tmp_path)])
    finally:
        closed.chmod(0o700)
        unlisted.chmod(0o700)
    assert result.returncode == 0, result.stderr
    said = json.loads(result.stdout)
    assert said["problem in closed"] == f"cannot look into {closed}/model: Permission denied; choose another folder."
    assert said["problem of unlisted"] == f"cannot look into {unlisted}: Permission denied; choose another folder."
    assert said["target"] == f"{closed}/config.json"  # the file as picked: its reading says what is wrong
    assert said["dialog"] == f"Cannot save there: cannot look into {unlisted} (Permission denied)."
    assert said["dialog in closed"] == f"Writes {closed}/model"  # the problem line says why when Save is pressed
    assert said["remembered"] == str(closed)  # its folder, as typed
    assert said["save folder"] == str(closed)
