"""Settings of the next run, checked on every change.

The panel builds a ``RunConfig`` whenever a control changes; the core's own
validation (``__post_init__``) decides what is valid, and its message is shown
under the control it is about, before Start, not after a crash.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QSettings, Qt, Signal
from PySide6.QtWidgets import (
    QAbstractSpinBox,
    QApplication,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from core.checkpoint import latest_checkpoint
from core.config import (
    BUILTIN_CORPUS,
    COMPILE_MODES,
    LAYOUTS,
    PRECISIONS,
    DataConfig,
    ModelConfig,
    RunConfig,
    config_from_preset,
)
from core.errors import ConfigError, DataError, SpeedboardError
from core.event_text import counted, skipped_files
from core.launch import check_nproc, process_capacity
from core.precision import BF16_MIN_SPEEDUP
from core.prepare import SourceInfo, describe_source, too_little_text
from core.schedule import Position, make_schedule
from core.sources import DEFAULT_TEXT_FIELD
from core.tokenizer import TOKENIZER_FILE
from gui.stored_settings import stored_number, stored_text
from gui.widgets.eliding_combo import ElidingComboBox
from gui.widgets.number_fields import EXACT_INTEGERS, BoundedSpin, NumberField
from gui.widgets.wheel_guard import guard_wheel
from gui.widgets.wrapping_label import WrappingLabel
from gui.window_words import in_window_words

COMPILE_MODE_TEXT = {"off": "off (eager)", "default": "default", "reduce-overhead": "reduce-overhead",
                     "max-autotune": "max-autotune", "max-autotune-no-cudagraphs": "max-autotune-no-cudagraphs"}
SCOPE_TEXT = {"model": "whole model", "block": "per block"}
PRECISION_TEXT = {"auto": "auto (decided at start)", "fp32": "fp32", "bf16": "bf16 autocast",
                  "fp16": "fp16 + loss scaling"}
AUTO_TOOLTIP = ("auto: bf16 on a GPU that supports it; on a CPU bf16 only where a one-time probe on this machine "
                f"measured training at least {BF16_MIN_SPEEDUP}× faster in bf16 than in fp32 (cached), else fp32")
BUDGET_KINDS = ("steps", "tokens")
CPU_TINY_STEPS = 200
"""The first run's budget on a CPU for ``tiny``: 410k tokens, about 50 s at the 8,000 tokens/s tiny trains at on an
idle 2-core CPU (README, Responsiveness); its loss falls from about 7.6 to below 5 (4.80 at step 150, measured).
The other presets get the same work in FLOPs (at least 10 steps); on a GPU every preset keeps its own budget."""

# One line each: what the setting does to speed, memory and the math.
TOOLTIPS = {
    "accum": "Sums the gradients of k micro-batches before each optimizer step: a k× larger batch at the memory of "
             "one micro-batch (plus one gradient buffer), each step k× longer; the loss is normalised over the whole "
             "window, so the update equals that of the k× batch.",
    "compile_mode": "torch.compile turns the model into fused kernels: faster steps after a warm-up compile (shown "
                    "apart, seconds to minutes), usually less activation memory; the same math up to float rounding. "
                    "reduce-overhead/max-autotune add CUDA graphs (GPU only, accumulation 1).",
    "compile_scope": "Whole model: one graph, the most fusion, the longest first compile; per block: each decoder "
                     "block compiled alone (identical blocks share the code), quicker to compile, a little less "
                     "fusion; about the same memory and the same math either way.",
    "precision": "bf16/fp16 autocast runs matrix products in 16 bits: faster where the hardware has 16-bit units "
                 "(GPUs), less activation memory; weights and optimizer stay fp32, results differ by rounding (fp16 "
                 "adds loss scaling against underflow). fp32 is the exact reference.",
}


def first_run_budget(cfg: RunConfig, gpu: bool) -> int:
    """Steps a built-in preset starts with in the window: on a CPU about a minute of training (``CPU_TINY_STEPS`` of
    tiny, the same FLOPs for the others), so the first run shows a falling loss soon; on a GPU the preset's own."""
    if gpu:
        return int(cfg.train.budget)
    from core.device import training_flops_per_token

    def flops_per_step(c: RunConfig) -> float:
        return training_flops_per_token(c.model, c.data.seq_len) * c.tokens_per_step()

    steps = CPU_TINY_STEPS * flops_per_step(config_from_preset("tiny")) / flops_per_step(cfg)
    return max(10, min(int(cfg.train.budget), round(steps / 10) * 10))

# A validation error's field (``SpeedboardError.field``) -> the row it is shown under, where the names differ;
# a field with no row here or among the rows goes to the general error label.
_FIELD_ROWS = {"warmup_ratio": "warmup", "min_lr": "lr", "nproc": "processes", "budget_kind": "budget"}


@contextmanager
def _about(field: str):
    """Errors of a check that is about one setting but does not say so (device queries, process counts)."""
    try:
        yield
    except SpeedboardError as exc:
        if exc.field is None:
            exc.field = field
        raise


def _combo(name: str, items: dict[str, str]) -> QComboBox:
    combo = ElidingComboBox()
    combo.setObjectName(name)
    # A combo is as wide as its longest item by default: "auto (bf16: training 3.2× faster than fp32 on this
    # CPU)" then made the whole settings panel scroll sideways. It shrinks to the panel instead, eliding
    # its text, and its popup shows the items in full.
    combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    combo.setMinimumContentsLength(10)
    combo.view().setTextElideMode(Qt.TextElideMode.ElideNone)
    for value, text in items.items():
        combo.addItem(text, value)
    _fit_popup(combo)
    return combo


def _fit_popup(combo: QComboBox) -> None:
    """The popup as wide as the longest item."""
    metrics = combo.view().fontMetrics()
    widest = max((metrics.horizontalAdvance(combo.itemText(i)) for i in range(combo.count())), default=0)
    combo.view().setMinimumWidth(widest + 40)  # room for the item's margins and a scroll bar


def _spin(name: str, lo: int, hi: int, step: int = 1) -> QSpinBox:
    return BoundedSpin(name, lo, hi, step)


def _set_combo(combo: QComboBox, value: Any) -> bool:
    index = combo.findData(value)
    if index >= 0:
        combo.setCurrentIndex(index)
    return index >= 0


class _FolderCheck(QObject):
    """Carries a folder's ``describe_source`` result from its worker thread to the window's thread (queued)."""

    done = Signal(int, object, object)  # check number, SourceInfo or None, problem or None


class PathDropEdit(QLineEdit):
    """The read-only Data field, which takes one file or folder dropped on it (a file manager's drag)."""

    path_dropped = Signal(str)

    def __init__(self) -> None:
        super().__init__()
        self.setAcceptDrops(True)  # read-only fields refuse drops of text; this one takes a path

    @staticmethod
    def _dropped_path(event) -> str | None:
        urls = event.mimeData().urls()
        return urls[0].toLocalFile() if len(urls) == 1 and urls[0].isLocalFile() else None

    def dragEnterEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        if self._dropped_path(event):
            event.acceptProposedAction()
        else:
            event.ignore()

    def dragMoveEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        self.dragEnterEvent(event)

    def dropEvent(self, event) -> None:  # noqa: N802 (Qt's name)
        path = self._dropped_path(event)
        if path:
            event.acceptProposedAction()
            self.path_dropped.emit(path)


class ConfigPanel(QWidget):
    changed = Signal()
    """Any setting changed; ``config`` and ``error`` are up to date."""

    def __init__(self, presets: dict[str, RunConfig], devices: list[str], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._presets = presets
        self._source = BUILTIN_CORPUS
        self._source_info: SourceInfo | None = None
        self._source_problem: str | None = None
        self._checked_folder = False
        """The data was a folder when it was last checked."""
        # A folder is described off the window's thread: listing and fingerprinting thousands of files takes
        # seconds. Each check has a number, so a late answer about an earlier choice is dropped.
        self._check_number = 0
        self._checked_text_field: str | None = None
        """The text field the data's current check was made with."""
        self.checking_source = False
        self._checked_tokenizer: str | None = None
        """The tokenizer file the data's current check judged "tokenized yet" by (a loaded checkpoint's)."""
        self._folder_check = _FolderCheck(self)
        self._folder_check.done.connect(self._folder_checked)
        self._data_dir = str(Path.home())
        """Why the chosen data cannot be used (missing, unreadable, empty), found when it was chosen or at Start."""
        self._start_from: tuple[str, str] | None = None  # (path, "init" | "resume")
        self._start_stamp: tuple | None = None
        """The start checkpoint's files as Load checked them (``_stamp``): one changed since is loaded again."""
        self._start_model: dict | None = None
        self._start_lineage: tuple[object, object] | None = None
        self._resume_state: tuple[int, int, dict] | None = None
        self._updating = False
        self._config: RunConfig | None = None
        self._error = ""
        self._continue_config: RunConfig | None = None
        self._continue_error = ""
        self._error_field: str | None = None
        self._error_rows: dict[str, tuple[QFormLayout, QLabel]] = {}

        self.preset = _combo("presetCombo", {name: name for name in presets})
        self.source_edit = PathDropEdit()
        self.source_edit.setObjectName("dataSourceEdit")
        self.source_edit.setAccessibleName("Data")  # its form label names the row's box of buttons, not the field
        self.source_edit.setReadOnly(True)
        self.file_button = QPushButton("File…")
        self.file_button.setObjectName("dataFileButton")
        self.folder_button = QPushButton("Folder…")
        self.folder_button.setObjectName("dataFolderButton")
        self.builtin_button = QPushButton("Built-in")
        self.builtin_button.setObjectName("dataBuiltinButton")
        # The column or field of JSONL, Parquet, Arrow and hub data that holds the text (--text-field).
        self.text_field = QLineEdit(DEFAULT_TEXT_FIELD)
        self.text_field.setObjectName("textFieldEdit")
        self.text_field.setToolTip("The field of each JSONL line, or the column of Parquet, Arrow and Hugging Face "
                                   "data, that holds the text (--text-field); plain text files have none")
        self.source_info = WrappingLabel()
        self.source_info.setObjectName("dataInfoLabel")
        self.source_info.setStyleSheet("color: #606060;")
        self.layout_combo = _combo("layoutCombo", {v: v for v in LAYOUTS})
        self.seq_len = _spin("seqLenSpin", 2, 65536, 16)
        self.micro_batch = _spin("microBatchSpin", 1, 4096)
        self.accum = _spin("accumStepsSpin", 1, 1024)
        self.effective = QLabel()
        self.effective.setObjectName("effectiveBatchLabel")
        self.compile_mode = _combo("compileModeCombo", {m: COMPILE_MODE_TEXT.get(m, m) for m in COMPILE_MODES})
        self.compile_scope = _combo("compileScopeCombo", SCOPE_TEXT)
        self.precision = _combo("precisionCombo", {p: PRECISION_TEXT.get(p, p) for p in PRECISIONS})
        self.device = _combo("deviceCombo", {"auto": "auto", **{d: d for d in devices}})
        # More than one process trains through torchrun (DDP): GPUs when CUDA has several, else CPU processes.
        self.process_kind, most = process_capacity()
        self.processes = _spin("processesSpin", 1, max(1, most))
        self.processes.setToolTip(f"Processes (one per {'GPU' if self.process_kind == 'cuda' else 'CPU process'}); "
                                  f"more than one trains with DistributedDataParallel through torchrun")
        self.lr = NumberField("lrSpin", 1e3, integer=False)  # 3e-4 or 0.0003; the arrows walk 1-2-5 per decade
        self.lr.setToolTip("Peak learning rate (after warmup; the cosine decays it to a tenth): type 3e-4 or 0.0003")
        self.warmup = _spin("warmupSpin", 0, 99)  # percent of the budget
        self.warmup.setSuffix(" % of budget")  # said in the field: a label of its own set every group's indent
        self.warmup.setToolTip("Warmup: the share of the budget over which the learning rate rises linearly to its "
                               "peak, before the cosine decay")
        self.budget = NumberField("budgetSpin", EXACT_INTEGERS, integer=True)  # 5e9, 10B or 10,000,000,000
        self.budget.setAccessibleName("Budget")
        self.budget.setSingleStep(10)
        self.budget_kind = _combo("budgetKindCombo", {k: k for k in BUDGET_KINDS})
        self._budget_kind_shown = self.budget_kind.currentData()
        self.seed = NumberField("seedSpin", EXACT_INTEGERS, integer=True)
        self.seed.setValue(float(presets[next(iter(presets))].train.seed))  # the CLI's default seed
        self.seed.setToolTip("Seeds the weights' initialisation and the sample order: the same settings and seed "
                             "give the same run here and in `speedboard train` (default 1337 in both).")
        self.accum.setToolTip(TOOLTIPS["accum"])
        self.compile_mode.setToolTip(TOOLTIPS["compile_mode"])
        self.compile_scope.setToolTip(TOOLTIPS["compile_scope"])
        self.precision.setToolTip(TOOLTIPS["precision"])
        gpu = any(d.startswith("cuda") for d in devices)
        budget_note = ("the built-in presets start with their own budget on this GPU machine" if gpu else
                       f"on this CPU-only machine the built-in presets start at about a minute of training "
                       f"(tiny: {CPU_TINY_STEPS} steps), so the first loss curve falls soon")
        self.budget.setToolTip("How long the run trains, in optimizer steps or tokens (tokens stay comparable when "
                               "accumulation changes); no effect on speed or memory; warmup and the cosine decay of "
                               f"the learning rate span it. {budget_note[0].upper()}{budget_note[1:]}.")
        self.start_from_label = WrappingLabel("random initialisation")
        self.start_from_label.setObjectName("startFromLabel")
        self.clear_start_button = QPushButton("Clear")
        self.clear_start_button.setObjectName("clearStartFromButton")
        self.clear_start_button.setEnabled(False)
        self.general_error = WrappingLabel()
        self.general_error.setObjectName("configErrorLabel")
        self.general_error.setStyleSheet("color: #b00020;")
        self.general_error.hide()

        self._build_layout()
        guard_wheel(self)  # scrolling the settings column over a field scrolls it; it changed the field
        self._connect()
        self._fill_from_preset(self.preset.currentData())

    # ------------------------------------------------------------------ layout
    def _error_label(self) -> QLabel:
        label = WrappingLabel()  # a long data path wraps: it pushed the column sideways, its labels out of view
        label.setStyleSheet("color: #b00020;")
        return label

    def _row(self, form: QFormLayout, key: str, text: str, widget: QWidget) -> None:
        form.addRow(text, widget)
        label = self._error_label()
        label.setObjectName(f"{key}Error")
        form.addRow(label)
        form.setRowVisible(label, False)
        self._error_rows[key] = (form, label)

    def _group(self, title: str) -> tuple[QGroupBox, QFormLayout]:
        box = QGroupBox(title)
        form = QFormLayout(box)
        self._forms.append(form)
        form.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
        # In a narrow panel a field goes below its label rather than the panel scrolling sideways.
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        form.setLabelAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return box, form

    def _build_layout(self) -> None:
        self._forms: list[QFormLayout] = []
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)

        box, form = self._group("Model and data")
        self._row(form, "preset", "Preset", self.preset)
        source_box = QWidget()
        column = QVBoxLayout(source_box)
        column.setContentsMargins(0, 0, 0, 0)
        column.setSpacing(2)
        column.addWidget(self.source_edit)
        row = QHBoxLayout()
        for button in (self.file_button, self.folder_button, self.builtin_button):
            button.setAutoDefault(False)
            row.addWidget(button)
        column.addLayout(row)
        column.addWidget(self.source_info)
        self._row(form, "source", "Data", source_box)
        self._row(form, "text_field", "Text field", self.text_field)
        self._row(form, "layout", "Layout", self.layout_combo)
        self._row(form, "seq_len", "Sequence length", self.seq_len)
        outer.addWidget(box)

        box, form = self._group("Batch")
        self._row(form, "micro_batch", "Micro-batch", self.micro_batch)
        self._row(form, "accum_steps", "Accumulation", self.accum)
        form.addRow("Effective batch", self.effective)
        outer.addWidget(box)

        box, form = self._group("Speed-ups")
        self._row(form, "compile_mode", "torch.compile", self.compile_mode)
        self._row(form, "compile_scope", "Compile scope", self.compile_scope)
        self._row(form, "precision", "Precision", self.precision)
        self._row(form, "device", "Device", self.device)
        self._row(form, "processes", "Processes", self.processes)
        outer.addWidget(box)

        box, form = self._group("Schedule")
        self._row(form, "lr", "Learning rate", self.lr)
        self._row(form, "warmup", "Warmup", self.warmup)
        budget_row = QWidget()
        row = QHBoxLayout(budget_row)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.budget, 1)
        row.addWidget(self.budget_kind)
        self._row(form, "budget", "Budget", budget_row)
        self._row(form, "seed", "Seed", self.seed)
        outer.addWidget(box)

        box, form = self._group("Start from")
        start_row = QWidget()
        row = QHBoxLayout(start_row)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.start_from_label, 1)
        self.clear_start_button.setAutoDefault(False)
        row.addWidget(self.clear_start_button)
        form.addRow(start_row)
        outer.addWidget(box)
        outer.addWidget(self.general_error)
        outer.addStretch(1)
        self._align_labels()

    def _align_labels(self) -> None:
        """One label column for every group: each form sized its own, and the fields started at a different
        place in each group (Preset's, torch.compile's and Learning rate's fields at three indents)."""
        labels = [item.widget() for form in self._forms for i in range(form.rowCount())
                  if (item := form.itemAt(i, QFormLayout.ItemRole.LabelRole)) is not None and item.widget()]
        width = max(label.sizeHint().width() for label in labels)
        for label in labels:
            label.setMinimumWidth(width)
            label.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)  # as the forms align

    def _connect(self) -> None:
        self.preset.currentIndexChanged.connect(self._on_preset)
        for combo in (self.layout_combo, self.compile_mode, self.compile_scope, self.precision, self.device):
            combo.currentIndexChanged.connect(self._on_changed)
        self.budget_kind.currentIndexChanged.connect(self._on_budget_kind)
        for spin in (self.seq_len, self.micro_batch, self.accum, self.warmup, self.budget, self.seed,
                     self.processes):
            spin.valueChanged.connect(self._on_changed)
        self.lr.valueChanged.connect(self._on_changed)
        self.source_edit.path_dropped.connect(self._choose)
        self.file_button.clicked.connect(self._choose_file)
        self.folder_button.clicked.connect(self._choose_folder)
        self.builtin_button.clicked.connect(lambda: self.set_source(BUILTIN_CORPUS))
        self.text_field.editingFinished.connect(self._on_text_field)
        self.clear_start_button.clicked.connect(self.clear_start_from)

    # ------------------------------------------------------------------ state in, state out
    @property
    def config(self) -> RunConfig | None:
        """The next run's config, or None while a setting is invalid (see ``error``)."""
        return self._config

    def committed_config(self) -> RunConfig | None:
        """``config`` with the field being typed in taken as if it were left: a command run by its shortcut does
        not leave the field, and while typing its value is the longest prefix in range (2048 reads 204)."""
        self._commit_typing()
        return self._config

    @property
    def continue_error(self) -> str:
        """Why the training settings cannot continue a run; "" when they can."""
        return self._continue_error

    def committed_continue_config(self) -> RunConfig | None:
        """The settings Continue takes (``build_continue_config``), with the field being typed in taken as
        ``committed_config`` takes it; None while they are invalid (see ``continue_error``)."""
        self._commit_typing()
        return self._continue_config

    def shown_model_and_data(self) -> dict[str, Any]:
        """The preset, data, layout and sequence length the panel shows (for Start), valid or not."""
        return {"preset": self.preset.currentData(), "source": self._source,
                "layout": self.layout_combo.currentData(), "seq_len": self.seq_len.value()}

    def _commit_typing(self) -> None:
        focused = QApplication.focusWidget()
        if focused is not None and self.isAncestorOf(focused):
            spin = focused if isinstance(focused, QAbstractSpinBox) else focused.parentWidget()
            if isinstance(spin, QAbstractSpinBox):
                spin.interpretText()  # the bound, or the value before the edit, as leaving the field gives
            elif focused is self.text_field:
                self._on_text_field()

    @property
    def error(self) -> str:
        return self._error

    @property
    def source(self) -> str:
        return self._source

    @property
    def preset_name(self) -> str:
        return self.preset.currentData()

    def preset_config(self, name: str | None = None) -> RunConfig:
        return self._presets[name or self.preset.currentData()]

    def set_source(self, source: str) -> None:
        self._source = source or BUILTIN_CORPUS
        builtin = self._source == BUILTIN_CORPUS
        self.source_edit.setText("built-in corpus (Python documentation)" if builtin else self._source)
        self.source_edit.setToolTip("" if builtin else self._source)
        self._check_source()
        self._on_changed()

    def recheck_source(self) -> bool:
        """Look at the chosen data again (at Start: a file may have gone since it was chosen); True when the
        settings are still valid. A problem is shown under the Data control.

        A folder that is still there keeps what its check found (or is still finding): describing it again
        would hold the window for seconds, and the run's preparation fingerprints it anyway."""
        still_the_folder = self._is_folder() and self._checked_folder  # not a file replaced by a folder since
        if not (still_the_folder and (self.checking_source or self._source_info is not None)):
            self._check_source()
        self._on_changed()
        return self._config is not None

    def data_prepared(self) -> None:
        """A run of this window has just tokenized its corpus: a grey line that says the chosen data is not
        tokenized yet looks again (it said so until the data was chosen again)."""
        if self._source_info is not None and not self._source_info.prepared and not self.checking_source:
            self._check_source()
            self._on_changed()

    def _check_source(self) -> None:
        """What the data is and whether it can be read (``describe_source``: a listing, headers and a sampled
        fingerprint, no tokenizing): a file here, a folder in a worker thread. A hub dataset is looked up
        when the run prepares it (it needs the network)."""
        self._check_number += 1
        self._source_info, self._source_problem = None, None  # before the field: the last data's kind is gone
        self._checked_text_field = self._text_field()
        self._checked_tokenizer = self._start_tokenizer()
        self.checking_source = False
        self._checked_folder = self._is_folder()
        if not self._source.startswith("hf:"):
            data = replace(self.preset_config().data, source=self._source, tokenizer=self._checked_tokenizer,
                           text_field=self._text_field())
            if self._is_folder():
                self.checking_source = True
                threading.Thread(target=self._describe_folder, args=(self._check_number, data), daemon=True,
                                 name="speedboard-folder-check").start()
            else:
                self._source_info, self._source_problem = _described(data)
        self._show_source_summary()

    def _start_tokenizer(self) -> str | None:
        """The tokenizer file of the checkpoint Load chose, which a run started from it takes: whether the data is
        tokenized yet depends on it (the grey line judged it by the tokenizer a run would train)."""
        if self._start_from is None:
            return None
        try:
            found = latest_checkpoint(self._start_from[0])
        except (SpeedboardError, OSError):
            return None
        file = found / TOKENIZER_FILE
        return str(file) if found.is_dir() and file.is_file() else None

    def _recheck_for_tokenizer(self) -> None:
        if self._start_tokenizer() != self._checked_tokenizer:
            self._check_source()

    def _is_folder(self) -> bool:
        return self._source != BUILTIN_CORPUS and Path(self._source).is_dir()

    def _describe_folder(self, number: int, data: DataConfig) -> None:
        """Worker thread: files and a Rust tokenizer only, no torch and no widget."""
        try:
            info, problem = _described(data)
        except Exception as exc:  # noqa: BLE001 - anything else still ends the check, as one line
            info, problem = None, f"cannot read {data.source}: {type(exc).__name__}: {exc}"
        try:
            self._folder_check.done.emit(number, info, problem)
        except RuntimeError:  # the window closed meanwhile: nobody to tell
            pass

    def _folder_checked(self, number: int, info: SourceInfo | None, problem: str | None) -> None:
        if number != self._check_number:
            return  # about a folder chosen before the current data
        self.checking_source = False
        self._source_info, self._source_problem = info, problem
        self._show_source_summary()
        self._on_changed()

    def _text_field(self) -> str:
        """The field a run reads: the default where the data has none, whatever the greyed control still holds
        (the engine refuses a field named for plain text rather than ignore it)."""
        if self._plain_text():
            return DEFAULT_TEXT_FIELD
        return self.text_field.text().strip() or DEFAULT_TEXT_FIELD

    def _plain_text(self) -> bool:
        """The data has no fields: the built-in corpus, a .txt/.md file, a folder its check found text in."""
        if self._source == BUILTIN_CORPUS:
            return True
        if self._source_info is not None:
            return self._source_info.kind == "text"
        return Path(self._source).suffix.lower() in (".txt", ".md") and not self._is_folder()

    def _on_text_field(self) -> None:
        if self._text_field() != self._checked_text_field:
            self.set_source(self._source)  # the data is looked at again for the new field

    def _show_source_summary(self) -> None:
        text = ("checking the folder: listing and fingerprinting its files…" if self.checking_source else
                _source_summary(self._source_info, self._source_problem))
        self.source_info.setText(text)
        self.source_info.setVisible(bool(text))
        self.text_field.setEnabled(not self._plain_text())  # plain text has no fields: the control is off for it

    def set_start_from(self, path: str, mode: str, description: str, model_config: dict | None = None,
                       lineage: tuple[object, object] | None = None,
                       resume_state: tuple[int, int, dict] | None = None) -> None:
        """The next run starts from this checkpoint: ``init`` (weights) or ``resume`` (exact continuation).
        ``lineage``: the precision and device type it was trained in, which ``auto`` keeps on resume;
        ``resume_state``: its step, tokens and saved schedule (``core.checkpoint.peek_schedule``), against which
        Start checks the budget of a resume."""
        self._start_from = (path, mode)
        self._start_stamp = _stamp(path)
        self._start_model = model_config
        self._start_lineage = lineage
        self._resume_state = resume_state
        presets = self._presets_of(model_config)
        if presets and self.preset.currentData() not in presets:
            _set_combo(self.preset, presets[0])  # its sizes and schedule too, as train --init-from takes them
        verb = "resume" if mode == "resume" else "weights of"
        self.start_from_label.setText(f"{verb} {description}")
        self.start_from_label.setToolTip(path)
        self.clear_start_button.setEnabled(True)
        self._recheck_for_tokenizer()
        self._on_changed()

    def clear_start_from(self) -> None:
        self._start_from = None
        self._start_model = None
        self._start_lineage = None
        self._resume_state = None
        self.start_from_label.setText("random initialisation")
        self.start_from_label.setToolTip("")
        self.clear_start_button.setEnabled(False)
        self._recheck_for_tokenizer()
        self._on_changed()

    @property
    def start_from(self) -> tuple[str, str] | None:
        return self._start_from

    @property
    def start_lineage(self) -> tuple[object, object] | None:
        """The precision and device type of the checkpoint the next run resumes (None unless it resumes one)."""
        return self._start_lineage if self._start_from is not None and self._start_from[1] == "resume" else None

    def start_from_problem(self) -> str | None:
        """Why the checkpoint chosen by Load cannot start the next run as it was checked: gone, or changed since
        (a file deleted or rewritten between Load and Start became a failed run at each Start)."""
        if self._start_from is None:
            return None
        path = self._start_from[0]
        if not os.path.lexists(path):
            return f"{path} no longer exists (moved or deleted since it was loaded): Load it again, or clear it"
        if _stamp(path) != self._start_stamp:
            return f"{path} changed since it was loaded: Load it again, so that it is checked again"
        return None

    def resume_budget_problem(self, cfg: RunConfig) -> str | None:
        """Why ``cfg``'s budget cannot resume the checkpoint chosen by Load, as the run would say it
        (``core.schedule.make_schedule``): already used up, or ending inside the warmup the lineage keeps. Said in
        a dialog at Start: the run said it as a failed row."""
        if self._resume_state is None or self.start_lineage is None:  # none chosen, or its weights alone
            return None
        step, tokens, saved = self._resume_state
        if cfg.train.budget_kind not in BUDGET_KINDS:  # epochs: counted on the data, which the run prepares
            return None
        try:
            make_schedule(cfg.train, Position(step, tokens, cfg.tokens_per_step(self.nproc), 0), saved)
        except ConfigError as exc:
            return str(exc)
        return None

    def set_from_config(self, cfg: RunConfig, budget_tokens: int | None = None) -> None:
        """Show a run's settings (e.g. of a checkpoint being resumed)."""
        self._updating = True
        try:
            if cfg.preset in self._presets:
                _set_combo(self.preset, cfg.preset)
            self._source = cfg.data.source
            self.text_field.setText(cfg.data.text_field)
            self.set_source(cfg.data.source)
            _set_combo(self.layout_combo, cfg.data.layout)
            self.seq_len.setValue(cfg.data.seq_len)
            tc = cfg.train
            self.micro_batch.setValue(tc.micro_batch)
            self.accum.setValue(tc.accum_steps)
            _set_combo(self.compile_mode, tc.compile_mode)
            _set_combo(self.compile_scope, tc.compile_scope)
            _set_combo(self.precision, tc.precision)
            _set_combo(self.device, tc.device)
            self.lr.setValue(tc.lr)
            self.warmup.setValue(round(tc.warmup_ratio * 100))
            if tc.budget_kind in BUDGET_KINDS:
                _set_combo(self.budget_kind, tc.budget_kind)
                self._budget_kind_shown = tc.budget_kind
                self.budget.setValue(float(tc.budget))
            elif budget_tokens is not None:  # epochs, which the panel has no unit for: the same budget in tokens
                _set_combo(self.budget_kind, "tokens")
                self._budget_kind_shown = "tokens"
                self.budget.setValue(float(budget_tokens))
            self.seed.setValue(float(tc.seed))
        finally:
            self._updating = False
        self._on_changed()

    # ------------------------------------------------------------------ QSettings
    _SETTINGS_WIDGETS = ("layout_combo", "compile_mode", "compile_scope", "precision", "device", "budget_kind")
    _SETTINGS_SPINS = ("seq_len", "micro_batch", "accum", "warmup", "processes")
    _SETTINGS_NUMBERS = ("budget", "seed", "lr")

    def save_state(self, settings: QSettings) -> None:
        settings.beginGroup("config")
        settings.setValue("preset", self.preset.currentData())
        settings.setValue("source", self._source)
        settings.setValue("text_field", self.text_field.text().strip() or DEFAULT_TEXT_FIELD)
        settings.setValue("data_dir", self._data_dir)
        for name in self._SETTINGS_WIDGETS:
            settings.setValue(name, getattr(self, name).currentData())
        for name in self._SETTINGS_SPINS:
            settings.setValue(name, getattr(self, name).value())
        for name in self._SETTINGS_NUMBERS:
            settings.setValue(name, getattr(self, name).number())
        settings.endGroup()

    def restore_state(self, settings: QSettings) -> None:
        """Bring back the last session's settings; anything unknown or unreadable keeps its default."""
        settings.beginGroup("config")
        try:
            preset = stored_text(settings, "preset")
            if preset in self._presets:
                _set_combo(self.preset, preset)
            self._updating = True
            data_dir = stored_text(settings, "data_dir")
            if data_dir:
                self._data_dir = data_dir
            source = stored_text(settings, "source")
            if source:
                # Kept also when it is gone (an unmounted drive, a moved dataset): its check says so under the
                # Data control and Start waits, where the built-in corpus in its place would train unnoticed.
                self._source = source
            text_field = stored_text(settings, "text_field")
            if text_field and text_field.strip():
                self.text_field.setText(text_field)
            for name in self._SETTINGS_WIDGETS:
                value = stored_text(settings, name)
                if value is not None:
                    _set_combo(getattr(self, name), value)
            for name in (*self._SETTINGS_SPINS, *self._SETTINGS_NUMBERS):
                spin = getattr(self, name)
                whole = not isinstance(spin, NumberField) or name == "seed"  # a budget may be 1.5 epochs
                value = stored_number(settings, name, spin.minimum(), spin.maximum(), whole)
                if value is not None:
                    spin.setValue(value if isinstance(spin, NumberField) else int(value))
            self._budget_kind_shown = self.budget_kind.currentData()
        finally:
            self._updating = False
            settings.endGroup()
        self.set_source(self._source)

    # ------------------------------------------------------------------ reactions
    def _on_budget_kind(self) -> None:
        """Steps <-> tokens keeps the length of the run: 200 steps of 2,048 tokens become 409,600 tokens (and
        back, rounded up to whole steps), not a budget of 200 tokens, less than one step."""
        kind, before = self.budget_kind.currentData(), self._budget_kind_shown
        self._budget_kind_shown = kind
        if not self._updating and kind != before:
            # From the fields, not the validated config: another setting being invalid must not change the length.
            per_step = self._sequences_per_step() * self.seq_len.value()
            budget = self.budget.number()
            self._updating = True
            try:
                self.budget.setValue(float(budget * per_step if kind == "tokens" else -(-int(budget) // per_step)))
            finally:
                self._updating = False
        self._on_changed()

    def _on_preset(self) -> None:
        self._fill_from_preset(self.preset.currentData())

    def _fill_from_preset(self, name: str) -> None:
        """Sizes and schedule of the preset; speed-ups, data and seed stay as the user set them."""
        cfg = self._presets[name]
        self._updating = True
        try:
            self.seq_len.setValue(cfg.data.seq_len)
            self.micro_batch.setValue(cfg.train.micro_batch)
            self.lr.setValue(cfg.train.lr)
            self.warmup.setValue(round(cfg.train.warmup_ratio * 100))
            if cfg.train.budget_kind in BUDGET_KINDS:
                _set_combo(self.budget_kind, cfg.train.budget_kind)
                self._budget_kind_shown = cfg.train.budget_kind
                self.budget.setValue(float(cfg.train.budget))
        finally:
            self._updating = False
        self.set_source(self._source)

    @property
    def data_dir(self) -> str:
        """Where the Data File…/Folder… dialogs open: where data was last chosen (remembered across sessions)."""
        return self._data_dir if Path(self._data_dir).is_dir() else str(Path.home())

    def _choose_file(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Training text", self.data_dir,
                                              "Corpora (*.txt *.md *.jsonl *.jsonl.gz *.jsonl.zst *.parquet *.arrow);;"
                                              "All files (*)")
        if path:
            self._choose(path)

    def _choose(self, path: str) -> None:
        """A corpus file or folder chosen (File…, Folder…, or dropped on the Data field); the dialogs open where
        it lies next time."""
        self._data_dir = str(Path(path).parent)
        self.set_source(path)

    def _choose_folder(self) -> None:
        path = QFileDialog.getExistingDirectory(
            self, "Folder of .txt/.md, .jsonl, Parquet or Arrow files, or a Hugging Face dataset folder",
            self.data_dir)
        if path:
            self._choose(path)

    def _train_fields(self, base: RunConfig) -> dict[str, Any]:
        """The training settings as the controls show them (the preset's ratio of minimum to peak rate kept)."""
        lr = self.lr.value()
        ratio = base.train.min_lr / base.train.lr if base.train.lr else 0.1
        return {
            "micro_batch": self.micro_batch.value(), "accum_steps": self.accum.value(),
            "compile_mode": self.compile_mode.currentData(), "compile_scope": self.compile_scope.currentData(),
            "precision": self.precision.currentData(), "device": self.device.currentData(),
            "lr": lr, "min_lr": lr * ratio, "warmup_ratio": self.warmup.value() / 100,
            "budget_kind": self.budget_kind.currentData(), "budget": self.budget.number(), "seed": self.seed.number(),
        }

    def build_config(self) -> RunConfig:
        """The config the controls describe; raises ConfigError (a ValueError) when invalid."""
        base = self.preset_config()
        data = {"source": self._source, "layout": self.layout_combo.currentData(), "seq_len": self.seq_len.value(),
                "text_field": self._text_field()}
        overrides: dict[str, Any] = {"data": data, "train": self._train_fields(base), "init_from": None,
                                     "resume": None}
        if self._start_model is not None:
            overrides["model"] = model = ModelConfig.from_dict(self._start_model)  # the checkpoint's architecture
            self._check_preset_fits(model)
            # A tokenizer trained for it (a bare state dict has none) must fit its embedding.
            data["vocab_size"] = min(base.data.vocab_size, model.vocab_size)
        if self._start_from is not None:
            path, mode = self._start_from
            overrides["resume" if mode == "resume" else "init_from"] = path
        cfg = base.replace(**overrides)
        if self._source_problem:
            raise DataError(self._source_problem)
        if self._source_info is not None:
            problem = too_little_text(self._source_info, cfg.data)
            if problem:
                raise DataError(problem)
        return self._with_processes(cfg)

    def build_continue_config(self) -> RunConfig:
        """What Continue takes from the panel: its training settings (batch, accumulation, compile, precision,
        device, learning rate, budget, seed) and processes, on the preset's own model and data. A continued run
        keeps its parent's model and data, so a data path, a sequence length or loaded weights that only Start
        would use do not stop it (they greyed Continue, whose tooltip blamed them). Raises as ``build_config``."""
        base = self.preset_config()
        return self._with_processes(base.replace(train=self._train_fields(base), init_from=None, resume=None))

    def _with_processes(self, cfg: RunConfig) -> RunConfig:
        """``cfg`` checked for this machine's devices and the panel's processes."""
        self._check_device(cfg)
        if self.nproc > 1:
            with _about("nproc"):
                check_nproc(self.nproc, cfg.train.device)
            if cfg.train.device == "auto" and self.process_kind == "cpu":
                cfg = cfg.replace(train={"device": "cpu"})
        return cfg

    def _check_preset_fits(self, model: ModelConfig) -> None:
        """Weights of a preset's architecture train under that preset's name, as the command line does: a tiny
        model is not recorded as "small". Weights of no preset's architecture (a Hugging Face folder) take any."""
        same = self._presets_of(model.to_dict())
        if same and self.preset.currentData() not in same:
            raise ConfigError(f"the loaded weights have the {same[0]} preset's architecture, not the "
                              f"{self.preset.currentData()} preset's: choose {same[0]}, or Clear them", "preset")

    def _presets_of(self, model_config: dict | None) -> list[str]:
        """The presets whose architecture ``model_config`` is (its vocabulary aside)."""
        if model_config is None:
            return []
        model = ModelConfig.from_dict(model_config)
        return [name for name, cfg in self._presets.items() if cfg.model.same_architecture(model)]

    @property
    def nproc(self) -> int:
        """Processes for the next run; more than one starts it through torchrun."""
        return self.processes.value()

    def _check_device(self, cfg: RunConfig) -> None:
        from core.device import resolve_device  # queries only: no tensors
        from core.precision import check_precision

        with _about("device"):
            device = resolve_device(cfg.train.device)
        with _about("precision"):
            check_precision(cfg.train.precision, device)
        self._show_auto_choice(device, cfg.expected_model())

    def _show_auto_choice(self, device, model: ModelConfig) -> None:
        """The ``auto`` item says what it would choose here and why: from the cached probe only, never by
        measuring on the GUI thread (the torch thread probes when a run starts). A CPU job of several processes
        decides at its processes' thread count, where bf16 may pay otherwise; a resume keeps its parent's."""
        from core.launch import worker_threads
        from core.precision import cached_choice

        try:
            choice = cached_choice("auto", device, model, worker_threads(self.processes.value(), str(device)),
                                   self.start_lineage)
        except SpeedboardError:
            choice = None
        text = f"auto ({choice.reason})" if choice else PRECISION_TEXT["auto"]
        index = self.precision.findData("auto")
        if index >= 0 and self.precision.itemText(index) != text:
            self.precision.setItemText(index, text)
        if index >= 0:
            self.precision.setItemData(index, f"{text}\n{AUTO_TOOLTIP}", Qt.ItemDataRole.ToolTipRole)
        fp16 = self.precision.findData("fp16")
        fp16_text = PRECISION_TEXT["fp16"] + (" (for GPUs: most CPUs emulate it, slowly)" if device.type == "cpu"
                                              else "")
        if fp16 >= 0 and self.precision.itemText(fp16) != fp16_text:
            self.precision.setItemText(fp16, fp16_text)
        _fit_popup(self.precision)

    def refresh_precision(self) -> None:
        """Show what ``auto`` chose once a run has measured it (call after a run started)."""
        from core.device import resolve_device

        if self._config is None:
            return
        try:
            device = resolve_device(self._config.train.device)
        except SpeedboardError:
            return
        self._show_auto_choice(device, self._config.model)

    def _sequences_per_step(self) -> int:
        """The effective batch as the fields show it, whatever other setting is invalid."""
        return self.micro_batch.value() * self.accum.value() * self.processes.value()

    def _on_changed(self) -> None:
        if self._updating:
            return
        sequences = self._sequences_per_step()
        self.effective.setText(f"{sequences:,} sequences · {sequences * self.seq_len.value():,} tokens per step")
        try:
            self._config, self._error, self._error_field = self.build_config(), "", None
        except (SpeedboardError, ValueError) as exc:
            self._config, self._error = None, str(exc)
            self._error_field = exc.field if isinstance(exc, SpeedboardError) else None
        self._continue_config, self._continue_error = self._config, ""
        if self._config is None:
            try:
                self._continue_config = self.build_continue_config()
            except (SpeedboardError, ValueError) as exc:
                self._continue_error = str(exc)
        self._show_error(self._error, self._error_field)
        self.changed.emit()

    @property
    def error_field(self) -> str | None:
        """The setting ``error`` is about (``SpeedboardError.field``), when it names one."""
        return self._error_field

    def error_label(self) -> QLabel | None:
        """The label that shows the settings' error now (under its row, or the general one); None when valid."""
        shown = [label for _, label in self._error_rows.values() if label.text()]
        return shown[0] if shown else self.general_error if self.general_error.text() else None

    def _show_error(self, message: str, field: str | None) -> None:
        """The message under its setting's row, or in the general label when no row is about it."""
        row = _FIELD_ROWS.get(field, field) if message and field else None
        target = row if row in self._error_rows else None
        for key, (form, label) in self._error_rows.items():
            show = key == target
            label.setText(message if show else "")
            form.setRowVisible(label, show)
        self.general_error.setText(message if message and target is None else "")
        self.general_error.setVisible(bool(message) and target is None)


def _size(n: int) -> str:
    for unit in ("bytes", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:,} {unit}" if unit == "bytes" else f"{n:.1f} {unit}"
        n /= 1000
    return ""


def _stamp(path: str) -> tuple | None:
    """Sizes and modification times of a checkpoint file, or of a checkpoint folder's files (a run folder, whose
    newest checkpoint moves while it trains, by its existence only)."""
    from core.runs import is_run_dir

    target = Path(path)
    try:
        if target.is_dir():
            if is_run_dir(target):
                return ("run folder",)
            return tuple(sorted((f.name, f.stat().st_size, f.stat().st_mtime_ns) for f in target.iterdir()
                                if f.is_file()))
        st = target.stat()
        return (st.st_size, st.st_mtime_ns)
    except OSError:
        return None


def _described(data: DataConfig) -> tuple[SourceInfo | None, str | None]:
    """``describe_source`` as the Data control shows it: what the data is, or why it cannot be used."""
    try:
        return describe_source(data), None
    except (SpeedboardError, OSError) as exc:
        if isinstance(exc, DataError) and exc.field == "text_field" and data.text_field != DEFAULT_TEXT_FIELD:
            return _described(replace(data, text_field=DEFAULT_TEXT_FIELD))  # a folder of plain text: no field
        if data.tokenizer is not None:  # a loaded checkpoint's tokenizer that cannot be read: Load's business
            return _described(replace(data, tokenizer=None))
        return None, in_window_words(str(exc))


def _source_summary(info: SourceInfo | None, problem: str | None) -> str:
    """One grey line under the Data control: what the data is, and whether it is tokenized yet."""
    if problem or info is None:
        return ""
    files = f"{info.files:,} files, " if info.files > 1 else ""
    size = _size(info.bytes) if info.bytes is not None else "size unknown"
    skipped = f"; not read: {skipped_files(info.ignored)}" if info.ignored else ""
    # Before it is tokenized, the rows its files' metadata counts: a null or blank text is a row, but no document.
    docs = f", {counted(info.documents, 'document' if info.prepared else 'row')}" if info.documents else ""
    if info.prepared and info.tokens is not None:
        return f"{files}{size}{docs}; tokenized: {info.tokens:,} tokens, training starts at once{skipped}"
    return f"{files}{size}{docs}; tokenized once when a run first starts on it{skipped}"


def presets_with(extra: dict[str, RunConfig] | None = None,
                 devices: list[str] | None = None) -> dict[str, RunConfig]:
    """The built-in presets (and any extra named base configs) as RunConfigs; given the machine's ``devices``,
    the built-in presets' budgets are the window's first-run budgets (``first_run_budget``)."""
    from core.config import PRESETS

    presets = {name: config_from_preset(name) for name in PRESETS}
    if devices is not None:
        gpu = any(d.startswith("cuda") for d in devices)
        presets = {name: cfg.replace(train={"budget_kind": "steps", "budget": first_run_budget(cfg, gpu)})
                   for name, cfg in presets.items()}
    presets.update(extra or {})
    return presets
