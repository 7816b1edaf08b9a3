"""Run folders shown in the window: opened by the user (several at once, or a runs folder), and the last
session's runs brought back at start (their folders are remembered in the settings at close)."""

from __future__ import annotations

import json
import os
from pathlib import Path

from PySide6.QtCore import QSettings
from PySide6.QtWidgets import QWidget

from core.errors import SpeedboardError
from core.paths import not_a_file
from core.runs import METRICS_FILE, default_out_dir, is_run_dir
from gui import dialogs
from gui.checkpoint_actions import RecentFolders
from gui.run_record import RunRecord
from gui.session import RunSession
from gui.stored_settings import stored_json_list
from gui.widgets.log_view import LogView
from gui.widgets.plot_panel import PlotPanel
from gui.widgets.status_bar import StatusBar


def dropped_folders(urls) -> list[str]:
    """The folders that dropped ``urls`` (QUrl) name: local ones, a dropped ``metrics.jsonl`` standing for its run
    folder (what a file manager shows inside a run)."""
    folders = []
    for url in urls:
        if not url.isLocalFile():
            continue
        path = Path(url.toLocalFile())
        folders.append(str(path.parent if path.name == "metrics.jsonl" and path.is_file() else path))
    return folders


MAX_REOPENED = 50
"""Runs of the last session shown again at start (the newest)."""
_SESSION_KEY = "session/run_folders"


def _odd_metrics_file(folder: str) -> str | None:
    """Why a folder whose metrics.jsonl is there but no regular file is not read (a named pipe, a folder, a
    device, a broken link); None when there is none. Such a folder was said to have no metrics.jsonl at all."""
    path = Path(folder) / METRICS_FILE
    if not os.path.lexists(path):
        return None
    if path.is_symlink() and not path.exists():
        return f"its {METRICS_FILE} is a broken symbolic link"
    what = not_a_file(path)
    return f"its {METRICS_FILE} is {what}, not a file: a run writes its events there as one" if what else None


class RunFolders:
    """Opens run folders into the session for the window (``parent``, which owns the dialogs)."""

    def __init__(self, parent: QWidget, session: RunSession, folders: RecentFolders, plots: PlotPanel,
                 log: LogView, status: StatusBar) -> None:
        self._window = parent
        self.session, self.folders, self.plots, self.log, self.status = session, folders, plots, log, status

    def open(self, folders: list[str] | None = None) -> list[RunRecord]:
        """Show several run folders; a picked folder that holds run folders (a runs folder) opens them all.
        Without ``folders``, those picked in a dialog."""
        if folders is None:
            latest = [Path(r.folder).parent for r in self.session.records if r.folder][-1:]
            start = self.folders.runs(*latest, default_out_dir())
            folders = dialogs.pick_run_folders(self._window, start)
        runs, refused, unreadable = [], [], []
        for folder in folders:
            try:
                if is_run_dir(folder):
                    runs.append(folder)
                    continue
                if not os.path.lexists(folder):  # dropped or picked, then moved or deleted
                    unreadable.append(f"{folder}: it does not exist (moved or deleted)")
                    continue
                inside = sorted(str(p) for p in Path(folder).iterdir() if p.is_dir() and is_run_dir(p)) \
                    if Path(folder).is_dir() else []
            except OSError as exc:  # a name too long for the system, a folder that cannot be listed
                unreadable.append(f"{folder}: {exc.strerror or exc}")
                continue
            if inside:
                runs.extend(inside)
            elif (why := _odd_metrics_file(folder)) is not None:
                unreadable.append(f"{folder}: {why}")
            else:
                refused.append(folder)
        if runs:
            self.folders.remember_runs(str(Path(runs[-1]).parent))
        records, shown = [], []
        for folder in runs:
            try:
                record, new = self._open_one(folder)
            except (OSError, SpeedboardError) as exc:  # said, and the other folders still open
                unreadable.append(f"{folder}: {exc}")
                continue
            records.append(record)
            if not new and record not in shown:
                shown.append(record)
        if shown:  # one word for one Open: a runs folder opened again said only its last run was shown
            self.status.showMessage(f"{shown[0].label} is already shown" if len(shown) == 1 else
                                    f"{len(shown)} of these runs are already shown ({shown[0].label} … "
                                    f"{shown[-1].label})", 5_000)
        not_runs = [f"{', '.join(refused)}: no metrics.jsonl here or in the folders inside; choose folders that "
                    f"Speedboard runs wrote."] if refused else []
        if not_runs or unreadable:  # one message for one Open, whatever went wrong with which folder
            title = "Not a run folder" if not unreadable else "Cannot open run folder"
            dialogs.show_error(self._window, title, "\n".join(not_runs + unreadable))
        self.plots.refresh()
        return records

    def _open_one(self, folder: str, note: str = "opened", number: int | None = None) -> tuple[RunRecord, bool]:
        """Show one run folder, and whether it was not shown yet; OSError or SpeedboardError when it cannot be
        read."""
        record, new = self.session.follow_folder(folder, number)
        if not new:
            return record, False
        state = ("reading its metrics.jsonl: the curves grow as it is read" if self.session.catching_up(record.key)
                 else "being written: followed live" if record.state == "following" else record.state)
        self.log.add(f"{record.label}: {note} {folder} ({state})")
        return record, True

    def reopen_last_session(self, settings: QSettings) -> None:
        """The rows of the last session come back, read from their run folders (those that still exist)."""
        # Each row as [folder, its number] (a folder alone, as earlier versions kept them: numbered anew).
        rows = [(row, None) if isinstance(row, str) else tuple(row) for row in stored_json_list(settings, _SESSION_KEY)
                if isinstance(row, str) or (isinstance(row, list) and len(row) == 2 and isinstance(row[0], str)
                                            and type(row[1]) is int and row[1] >= 1)]
        rows = [(folder, number) for folder, number in rows if is_run_dir(folder)][-MAX_REOPENED:]
        for folder, number in rows:
            try:
                self._open_one(folder, "from the last session:", number)
            except (OSError, SpeedboardError) as exc:  # damaged since: no dialog before the window shows
                self.log.add(f"cannot open {folder}: {exc}", "error")
        if rows:
            self.plots.refresh()

    def remember_session(self, settings: QSettings) -> None:
        """Keep the folders of the runs shown now (the newest ``MAX_REOPENED``) for the next start; a removed
        row does not come back."""
        rows = list({r.folder: [r.folder, r.number] for r in self.session.records
                     if r.folder and not r.removed}.values())
        settings.setValue(_SESSION_KEY, json.dumps(rows[-MAX_REOPENED:]))
