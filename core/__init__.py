"""Speedboard's training engine. Never imports Qt or pyqtgraph."""
