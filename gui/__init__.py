"""The Speedboard dashboard (PySide6 + pyqtgraph)."""
