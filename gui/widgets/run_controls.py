"""Start, Pause/Resume, Stop, Continue with these settings, Save and Load."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QGridLayout, QPushButton, QWidget


def _button(name: str, text: str, tip: str) -> QPushButton:
    button = QPushButton(text)
    button.setObjectName(name)
    button.setToolTip(tip)
    button.setAutoDefault(False)
    return button


class RunControls(QWidget):
    start_clicked = Signal()
    pause_clicked = Signal()
    resume_clicked = Signal()
    stop_clicked = Signal()
    continue_clicked = Signal()
    save_clicked = Signal()
    load_clicked = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.start = _button("startButton", "Start", "Start a new run with these settings")
        self.pause = _button("pauseButton", "Pause", "Pause between optimizer steps / resume")
        self.stop = _button("stopButton", "Stop", "Stop at the next optimizer step (a final checkpoint is saved)")
        self.continue_ = _button(
            "continueButton", "Continue with these settings",
            "A new run from the selected (or last) run's weights, optimizer state and schedule, with the training "
            "settings set here (compile, precision, micro-batch and accumulation, learning rate, budget, seed, "
            "device); its model and data (preset, corpus, layout, sequence length) stay the parent's. During a "
            "run, stops it first")
        self.save = _button("saveButton", "Save model…",
                            "Save the current model as a checkpoint folder (during a run: at the next step)")
        self.load = _button("loadButton", "Load weights…", "Load weights (any supported checkpoint) into the next run")
        self.start.setStyleSheet("font-weight: bold;")
        self._tips = {"start": self.start.toolTip(), "continue": self.continue_.toolTip(),
                      "pause": self.pause.toolTip(), "save": self.save.toolTip(), "load": self.load.toolTip()}
        grid = QGridLayout(self)
        grid.setContentsMargins(0, 0, 0, 0)
        grid.addWidget(self.start, 0, 0)
        grid.addWidget(self.pause, 0, 1)
        grid.addWidget(self.stop, 0, 2)
        grid.addWidget(self.continue_, 1, 0, 1, 3)
        grid.addWidget(self.save, 2, 0, 1, 2)
        grid.addWidget(self.load, 2, 2)
        self._paused = False
        self.start.clicked.connect(self.start_clicked)
        self.pause.clicked.connect(self._on_pause)
        self.stop.clicked.connect(self.stop_clicked)
        self.continue_.clicked.connect(self.continue_clicked)
        self.save.clicked.connect(self.save_clicked)
        self.load.clicked.connect(self.load_clicked)
        self.set_state(running=False, paused=False, can_start=True, can_continue=False, can_save=False)

    def _on_pause(self) -> None:
        (self.resume_clicked if self._paused else self.pause_clicked).emit()

    def set_state(self, *, running: bool, paused: bool, can_start: bool, can_continue: bool,
                  can_save: bool, can_load: bool = True, stopping: bool = False, invalid: str = "",
                  in_processes: bool = False, busy: str = "", continue_why: str | None = None,
                  save_why: str = "") -> None:
        """``invalid``: why the settings cannot run, said in the tooltips of the buttons it greys;
        ``continue_why``: why Continue cannot, where it differs (it takes the training settings only, from one
        run); None: as Start;
        ``in_processes``: the run is a torchrun job, whose ranks are stopped, never paused, and save their own
        checkpoints (said in the tooltips of Pause and Save); ``busy``: what holds the torch thread (the speed
        advisor's trials), said in the tooltips of the buttons that wait for it; ``save_why``: why there is nothing
        to save (said in Save's tooltip)."""
        self._paused = paused
        self.start.setToolTip(busy or (f"Cannot run these settings: {invalid}" if invalid else self._tips["start"]))
        if continue_why is None:
            continue_why = f"Cannot run these settings: {invalid}" if invalid else ""
        self.continue_.setToolTip(busy or continue_why or self._tips["continue"])
        self.pause.setToolTip("A run in several processes is stopped, never paused" if in_processes else
                              self._tips["pause"])
        self.save.setToolTip(busy or ("A run in several processes saves its own checkpoints (its run folder's "
                                      "checkpoints/); Load weights… reads them" if in_processes else
                                      save_why or self._tips["save"]))
        self.load.setToolTip(busy or self._tips["load"])
        self.start.setEnabled(can_start and not running)
        self.pause.setEnabled(running and not stopping and not in_processes)
        self.pause.setText("Resume" if paused else "Pause")
        self.stop.setEnabled(running and not stopping)
        self.continue_.setEnabled(can_continue and not stopping)
        self.save.setEnabled(can_save)
        self.load.setEnabled(can_load)  # during a run it explains why it cannot load
