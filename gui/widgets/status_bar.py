"""The run in focus: its state, progress with ETA, device and memory; and short messages.

The window decides which run is in focus (the one that trains, else the one
selected, else the latest) and calls ``show_run`` on every tick, so the bar never
shows another run's step. Messages (``showMessage``) and a long state are elided
to the room they have, with a gap before the permanent labels, and keep their
full text in a tooltip.
"""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QLabel, QProgressBar, QSizePolicy, QStatusBar, QWidget

from gui.run_record import RunRecord

GAP_PX = 16
"""Room between a message and the state label."""
MAX_STATE_PX = 360
"""The state label's widest beside a message; with none shown, it takes the room it needs."""
ANY_WIDTH = 16_777_215  # Qt's QWIDGETSIZE_MAX


def format_duration(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def memory_text(gib: float) -> str:
    """``1.23 GiB``, or in MiB below a tenth of a GiB: a micro model's 3 MiB read "0.00 GiB", as if not measured."""
    return f"{gib:.2f} GiB" if gib >= 0.1 else f"{gib * 1024:.1f} MiB" if gib < 0.01 else f"{gib * 1024:.0f} MiB"


class ElidedLabel(QLabel):
    """A one-line label that cuts its text with "…" to fit, the whole text in its tooltip."""

    def __init__(self, text: str = "", parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._full = ""
        self._yielding = ""
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.setMinimumWidth(40)
        self.setText(text)

    def full_text(self) -> str:
        return self._full

    def sizeHint(self):  # noqa: N802 (Qt's name)
        """As wide as the whole text (up to the maximum width): the elided text must not shrink it."""
        hint = super().sizeHint()
        hint.setWidth(min(self.maximumWidth(), self.fontMetrics().horizontalAdvance(self._full) + GAP_PX + 4))
        return hint

    def minimumSizeHint(self):  # noqa: N802 (Qt's name)
        hint = super().minimumSizeHint()
        hint.setWidth(self.minimumWidth())
        return hint

    def setText(self, text: str, yielding: str = "") -> None:  # noqa: N802 (Qt's name)
        """``yielding``: a first part of the text (a run's label) that is cut first, to a third of the width, so
        what follows it (the run's state, its compile time) stays in sight."""
        full = " ".join(text.split())  # one line: a multi-line reason reads as one
        yielding = " ".join(yielding.split())
        if not full.startswith(yielding):
            yielding = ""
        if full == self._full and yielding == self._yielding and self.toolTip() == (text if full else ""):
            return  # the same text: no relayout of the bar
        self._full, self._yielding = full, yielding
        self.setToolTip(text if full else "")
        self._elide()
        self.updateGeometry()

    def resizeEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        super().resizeEvent(event)
        self._elide()

    def _elide(self) -> None:
        width = max(0, self.width() - GAP_PX)
        metrics, text = self.fontMetrics(), self._full
        if self._yielding and metrics.horizontalAdvance(text) > width:
            rest = text[len(self._yielding):]
            room = max(width // 3, width - metrics.horizontalAdvance(rest))
            text = metrics.elidedText(self._yielding, Qt.TextElideMode.ElideRight, room) + rest
        super().setText(metrics.elidedText(text, Qt.TextElideMode.ElideRight, width))


PROGRESS_PARTS = 2**31 - 1
"""The most steps the progress bar counts one by one (its range is a C int)."""


class StatusBar(QStatusBar):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setObjectName("statusBar")
        self.message = ElidedLabel()
        self.message.setObjectName("messageLabel")
        self.state = ElidedLabel("idle")
        self.state.setObjectName("stateLabel")
        self.state.setSizePolicy(QSizePolicy.Policy.Preferred, QSizePolicy.Policy.Preferred)
        self.state.setMaximumWidth(ANY_WIDTH)  # capped beside a message (_fit_state)
        self.progress = QProgressBar()
        self.progress.setObjectName("progressBar")
        self.progress.setMinimumWidth(120)
        self.progress.setMaximumWidth(220)
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
        self.addWidget(self.message, 1)
        for widget in (self.state, self.progress, self.eta, self.device, self.memory):
            self.addPermanentWidget(widget)
        self._clear = QTimer(self)
        self._clear.setSingleShot(True)
        self._clear.timeout.connect(self.clearMessage)
        self._shown: tuple | None = None
        self._until: Callable[[RunRecord], bool] | None = None

    # ------------------------------------------------------------------ messages
    def showMessage(self, text: str, timeout: int = 0, *,  # noqa: N802 (QStatusBar's name)
                    until: Callable[[RunRecord], bool] | None = None) -> None:
        """A message left of the run's state, elided to its room; cleared after ``timeout`` ms (0: kept),
        or sooner once ``until(run in focus)`` holds: "Stopping …" must not outlive the stop."""
        self.message.setText(text)
        self._fit_state()
        self._until = until
        if timeout > 0:
            self._clear.start(timeout)
        else:
            self._clear.stop()

    def currentMessage(self) -> str:  # noqa: N802 (QStatusBar's name)
        return self.message.full_text()

    def clearMessage(self) -> None:  # noqa: N802 (QStatusBar's name)
        self._clear.stop()
        self._until = None
        self.message.setText("")
        self._fit_state()

    def _fit_state(self) -> None:
        """The state is capped only while a message shares the bar: "compiling 0:05 (the whole model, mod…" was cut
        with most of the bar empty beside it."""
        self.state.setMaximumWidth(MAX_STATE_PX if self.message.full_text() else ANY_WIDTH)
        self.state.updateGeometry()  # its size hint is capped by the maximum: the bar lays it out again

    # ------------------------------------------------------------------ the run in focus
    def show_run(self, record: RunRecord, step_time: float | None) -> None:
        """``record``'s state and progress; the ETA from ``step_time`` (recent seconds per optimizer step)."""
        if self._until is not None and self._until(record):
            self.clearMessage()
        step, total = record.step, record.total_steps
        # The failure's message too: a torchrun job's launcher names the rank that died after rank 0 failed, and the
        # bar kept rank 0's vaguer line.
        shown = (record.key, record.state, record.label, step, total, record.mem_gib, record.device,
                 record.compile_progress(), record.preparation, round(step_time or 0.0, 3), record.message)
        if shown == self._shown:
            return  # nothing moved: no relayout
        self._shown = shown
        if record.state == "stopping":
            state = ("stopping… (its set-up: nothing is kept)" if record.before_training else
                     "stopping… (after the compile in progress and its step)" if record.compiling else
                     "stopping… (after the current optimizer step; a final checkpoint is saved)")
        elif record.state == "compiling":
            state = record.compile_progress() or "compiling"
        elif record.state == "failed":
            state = record.progress_text()
        elif record.preparing and record.preparation:  # its corpus is tokenized first: say how far
            state = f"{record.preparation} (Stop cancels it)"
        else:
            state = record.state
        self.state.setText(f"{record.label}: {state}", yielding=f"{record.label}: ")
        if record.run_id is None:  # set-up: nothing of it is known yet, and nothing of another run is shown
            self.progress.setRange(0, 1)
            self.progress.setValue(0)
            self.progress.setFormat("not started" if record.ended else
                                     record.progress_text() if record.preparing else
                                     "compiling" if record.compiling else "setting up")  # beside "compiling 0:01"
            self.eta.setText("")
            self.device.setText("")
            self.memory.setText("")
            return
        done, span = max(0, step - record.start_step), max(1, total - record.start_step)
        # QProgressBar counts in a C int: a budget of 5e9 steps raised OverflowError at every refresh. Past it,
        # the bar counts in parts of its span (the text keeps the exact steps).
        parts = min(span, PROGRESS_PARTS)
        self.progress.setRange(0, parts)
        self.progress.setValue(min(done, span) * parts // span)
        self.progress.setFormat(f"step {step:,} / {total:,}")
        live = record.state in ("training", "compiling", "following")
        eta = record.seconds_left(step_time) if live and step_time and total else None
        self.eta.setText(f"ETA {format_duration(eta)}" if eta is not None else "")
        self.device.setText(record.device)
        now, peak = record.mem_gib, record.peak_mem_gib
        self.memory.setText("" if now is None else f"mem {memory_text(now)}" if peak is None else
                            f"mem {memory_text(now)} · peak {memory_text(peak)}")
        rank0 = (f" Rank 0's, one of {record.processes} processes (each holds as much)."
                 if record.processes > 1 else "")
        self.memory.setToolTip("Memory the training holds now, and its peak so far (the run table's Train GiB): "
                               "above what the process held before the model existed." + rank0)

    def show_idle(self, text: str = "idle") -> None:
        self._shown = None
        self.state.setText(text)
        self.eta.setText("")
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.progress.setFormat("no run")
