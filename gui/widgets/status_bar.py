"""Progress with ETA, the device and current memory of the active run."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget

from gui.run_record import RunRecord


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


class StatusBar(QStatusBar):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("statusBar")
        self.state = QLabel("idle")
        self.state.setObjectName("stateLabel")
        self.progress = QProgressBar()
        self.progress.setObjectName("progressBar")
        self.progress.setFixedWidth(220)
        self.progress.setTextVisible(True)
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("no run")
        self.eta = QLabel()
        self.eta.setObjectName("etaLabel")
        self.device = QLabel()
        self.device.setObjectName("deviceLabel")
        self.memory = QLabel()
        self.memory.setObjectName("memoryLabel")
        for widget in (self.state, self.progress, self.eta, self.device, self.memory):
            self.addPermanentWidget(widget)

    def show_run(self, record: RunRecord, step_time: float | None) -> None:
        """``record``'s state and progress; the ETA from ``step_time`` (recent seconds per optimizer step)."""
        step, total = record.step, record.total_steps
        self.state.setText(f"{record.label}: {record.state}")
        done, span = max(0, step - record.start_step), max(1, total - record.start_step)
        self.progress.setRange(0, span)
        self.progress.setValue(min(done, span))
        self.progress.setFormat(f"step {step:,} / {total:,}")
        eta = (total - step) * step_time if step_time and total else None
        self.eta.setText(f"ETA {format_duration(eta)}" if eta is not None else "")
        self.device.setText(record.device)
        self.memory.setText(f"{record.mem_gib:.2f} GiB" if record.mem_gib is not None else "")

    def show_idle(self, text: str = "idle") -> None:
        self.state.setText(text)
        self.eta.setText("")
