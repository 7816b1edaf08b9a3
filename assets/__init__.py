"""Files the installed application needs beside its code: the window icon and the desktop entry."""

from __future__ import annotations

from pathlib import Path

ASSETS_DIR = Path(__file__).resolve().parent
ICON = ASSETS_DIR / "speedboard.svg"
DESKTOP_ENTRY = ASSETS_DIR / "speedboard.desktop"
