"""Progress with ETA, the device and current memory of the active run."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QProgressBar, QStatusBar, QWidget


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

    def show_run(self, *, label: str, state: str, step: int, start_step: int, total_steps: int,
                 eta_s: float | None, device: str, mem_gib: float | None) -> None:
        self.state.setText(f"{label}: {state}")
        done, total = max(0, step - start_step), max(1, total_steps - start_step)
        self.progress.setRange(0, total)
        self.progress.setValue(min(done, total))
        self.progress.setFormat(f"step {step:,} / {total_steps:,}")
        self.eta.setText(f"ETA {format_duration(eta_s)}" if eta_s is not None else "")
        self.device.setText(device)
        self.memory.setText(f"{mem_gib:.2f} GiB" if mem_gib is not None else "")

    def show_idle(self, text: str = "idle") -> None:
        self.state.setText(text)
        self.eta.setText("")
