"""Where the config panel shows a validation error: under the row of the setting it names (its field)."""

from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from core.errors import ConfigError, DataError
from gui.widgets.config_panel import ConfigPanel, presets_with
from tests.conftest import micro_config
from tests.gui.conftest import child

ROWS = ("preset", "source", "layout", "seq_len", "micro_batch", "accum_steps", "compile_mode", "compile_scope",
        "precision", "device", "processes", "lr", "warmup", "budget", "seed")


@pytest.fixture
def panel(qtbot, tmp_path):
    panel = ConfigPanel(presets_with({"micro": micro_config(tmp_path)}), ["cpu"])
    qtbot.addWidget(panel)
    panel.show()
    panel.preset.setCurrentIndex(panel.preset.findData("micro"))
    assert panel.config is not None, panel.error
    return panel


def shown(panel) -> list[str]:
    """Names of the error labels on screen."""
    names = [f"{row}Error" for row in ROWS if child(panel, f"{row}Error").isVisibleTo(panel)]
    if child(panel, "configErrorLabel").isVisibleTo(panel):
        names.append("configErrorLabel")
    return names


def fail_with(panel, monkeypatch, error: Exception) -> None:
    def build_config():
        raise error

    monkeypatch.setattr(panel, "build_config", build_config)
    panel.seed.setValue(panel.seed.value() + 1)  # any change validates again


@pytest.mark.parametrize(("field", "label"), [
    ("warmup_ratio", "warmupError"), ("min_lr", "lrError"), ("lr", "lrError"), ("nproc", "processesError"),
    ("budget_kind", "budgetError"), ("micro_batch", "micro_batchError"), ("accum_steps", "accum_stepsError"),
    ("compile_mode", "compile_modeError"), ("compile_scope", "compile_scopeError"), ("seq_len", "seq_lenError"),
    ("precision", "precisionError"), ("device", "deviceError"), ("layout", "layoutError"), ("seed", "seedError"),
    ("budget", "budgetError"), ("source", "sourceError"),
    ("eval_every", "configErrorLabel"), (None, "configErrorLabel"),
])
def test_an_error_goes_under_the_row_its_field_names(panel, monkeypatch, field, label):
    # The message names other settings on purpose: the field decides, never the words.
    message = "the data layout, device, precision, budget and warmup of this run do not fit"
    fail_with(panel, monkeypatch, ConfigError(message, field))
    assert panel.config is None and panel.error == message and panel.error_field == field
    assert shown(panel) == [label]
    assert child(panel, label).text() == message


def test_a_data_error_is_about_the_source_and_the_error_clears(panel, monkeypatch):
    fail_with(panel, monkeypatch, DataError("the corpus is too small"))
    assert shown(panel) == ["sourceError"]
    monkeypatch.undo()
    panel.seed.setValue(panel.seed.value() + 1)
    assert panel.config is not None and panel.error == "" and panel.error_field is None
    assert shown(panel) == []


def test_a_plain_value_error_goes_to_the_general_label(panel, monkeypatch):
    fail_with(panel, monkeypatch, ValueError("invalid literal"))
    assert shown(panel) == ["configErrorLabel"]


@pytest.mark.parametrize(("query", "label"), [("device.resolve_device", "deviceError"),
                                              ("precision.check_precision", "precisionError")])
def test_device_queries_that_name_no_field_are_about_their_setting(panel, monkeypatch, query, label):
    def refuse(*args):
        raise ConfigError("not on this machine")

    monkeypatch.setattr(f"core.{query}", refuse)
    panel.seed.setValue(panel.seed.value() + 1)
    assert panel.error == "not on this machine"
    assert shown(panel) == [label]


def test_a_missing_data_file_is_shown_under_the_data_row(panel, tmp_path):
    panel.set_source(str(tmp_path / "gone.txt"))
    assert panel.error_field == "source" and "does not exist" in panel.error
    assert shown(panel) == ["sourceError"]


def test_a_long_data_path_in_an_error_wraps_instead_of_widening_the_panel(panel, tmp_path):
    """The path is one word to a word-wrapped label: the panel grew as wide as it, and the settings column
    scrolled sideways, its labels out of view."""
    narrow = panel.minimumSizeHint().width()
    deep = tmp_path / ("a_folder_with_a_long_name_" * 4) / ("and_another_one_" * 4)
    panel.set_source(str(deep / "corpus_of_a_long_name.txt"))
    label = child(panel, "sourceError")
    assert "does not exist" in panel.error and label.text() == panel.error  # as set: the breaks are the view's
    assert panel.minimumSizeHint().width() <= narrow + 10
    assert label.heightForWidth(300) > label.fontMetrics().height()  # wrapped onto several lines
    from PySide6.QtCore import Qt

    assert label.textFormat() == Qt.TextFormat.PlainText  # a name holding "<b>" is shown, not taken as markup


def test_the_auto_precision_item_says_what_a_job_of_several_cpu_processes_will_choose(panel, monkeypatch, tmp_path):
    """Each of its processes trains on its share of the cores, where the probe (cached per thread count) may
    choose otherwise: the item said fp32 while the 2-process job trained in bf16."""
    from core import precision as prec

    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    model, cpu = panel.config.model, prec.torch.device("cpu")
    shapes = prec.probe_shapes(model)
    for threads, result in ((prec.torch.get_num_threads(), prec.ProbeResult(100e9, 98e9, shapes)),
                            (2, prec.ProbeResult(50e9, 100e9, shapes))):
        prec._write_cache(prec._probe_path(model, cpu, threads=threads), result.to_dict())
    combo, auto = panel.precision, panel.precision.findData("auto")
    panel.processes.setMaximum(max(panel.processes.maximum(), 2))
    panel.processes.setValue(1)
    panel.refresh_precision()
    assert combo.itemText(auto).startswith("auto (fp32")
    panel.processes.setValue(2)  # 4 cores: 2 threads each
    assert combo.itemText(auto) == "auto (bf16: training 2.0× faster than fp32 on this CPU)"


def test_the_auto_precision_item_says_what_auto_chose_without_measuring(panel, monkeypatch, tmp_path):
    from PySide6.QtCore import Qt

    from core import precision as prec

    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(tmp_path / "cache"))

    def never(*args, **kwargs):
        raise AssertionError("the GUI thread never measures")

    monkeypatch.setattr(prec, "probe_bf16_speedup", never)
    monkeypatch.setattr(prec, "measure_gemm_peak", never)
    combo = panel.precision
    auto = combo.findData("auto")
    panel.seed.setValue(panel.seed.value() + 1)
    assert combo.itemText(auto) == "auto (decided at start)"
    # A run's start measured the probe on the torch thread and cached it: the panel reads it.
    result = prec.ProbeResult(192e9, 1074e9, prec.probe_shapes(panel.config.model))
    prec._write_cache(prec._probe_path(panel.config.model, prec.torch.device("cpu")), result.to_dict())
    panel.refresh_precision()
    assert combo.itemText(auto) == "auto (bf16: training 5.6× faster than fp32 on this CPU)"
    assert f"{prec.BF16_MIN_SPEEDUP}×" in combo.itemData(auto, Qt.ItemDataRole.ToolTipRole)
    assert panel.config.train.precision == "auto"  # the setting stays auto: decided again at each start


def test_the_auto_precision_item_says_a_resume_keeps_its_parents_precision(panel, monkeypatch, tmp_path):
    """A bf16 parent loaded to resume: the item said the cached probe's fp32 while the run trained in bf16
    (auto is decided once per lineage), and the memory fit estimated fp32."""
    from core import precision as prec
    from core.memory_budget import fit_run_config

    monkeypatch.setenv("SPEEDBOARD_CACHE_DIR", str(tmp_path / "cache"))
    model = panel.config.model
    slow = prec.ProbeResult(100e9, 98e9, prec.probe_shapes(model))
    prec._write_cache(prec._probe_path(model, prec.torch.device("cpu")), slow.to_dict())
    combo, auto = panel.precision, panel.precision.findData("auto")
    parent = tmp_path / "parent"
    parent.mkdir()
    panel.set_start_from(str(parent), "resume", "parent at step 3", None, ("bf16", "cpu"))
    assert combo.itemText(auto) == "auto (bf16: as its parent trained (auto is decided once per lineage))"
    assert panel.start_lineage == ("bf16", "cpu")
    seen = []
    monkeypatch.setattr("core.memory_budget.fit_split", lambda model, micro, accum, seq, precision, *a: seen.append(
        precision))
    fit_run_config(panel.config, 1, panel.start_lineage)
    assert seen == ["bf16"]
    panel.set_start_from(str(parent), "init", "parent at step 3", None, ("bf16", "cpu"))  # weights only: anew
    assert combo.itemText(auto).startswith("auto (fp32: bf16 trains only 0.98×") and panel.start_lineage is None
    panel.set_start_from(str(parent), "resume", "parent at step 3", None, ("bf16", "cpu"))
    panel.clear_start_from()
    assert combo.itemText(auto).startswith("auto (fp32")


def _wheel(widget, notches: int) -> None:
    from PySide6.QtCore import QPoint, QPointF, Qt
    from PySide6.QtGui import QWheelEvent
    from PySide6.QtWidgets import QApplication

    at = QPointF(widget.rect().center())
    event = QWheelEvent(at, QPointF(widget.mapToGlobal(at.toPoint())), QPoint(), QPoint(0, -120 * notches),
                        Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier, Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, event)


def test_the_wheel_over_a_field_scrolls_the_settings_and_leaves_the_field_alone(qtbot, tmp_path):
    """Scrolling the settings column with the pointer on the Precision box turned auto into fp16, unseen."""
    from PySide6.QtWidgets import QScrollArea

    panel = ConfigPanel(presets_with({"micro": micro_config(tmp_path)}), ["cpu"])
    scroll = QScrollArea()
    qtbot.addWidget(scroll)
    scroll.setWidgetResizable(True)
    scroll.setWidget(panel)
    scroll.resize(400, 200)  # the panel is taller: the column scrolls
    scroll.show()
    bar = scroll.verticalScrollBar()
    assert bar.maximum() > 0 and bar.value() == 0
    before = {name: child(panel, name).value() for name in ("microBatchSpin", "lrSpin", "seqLenSpin")}
    precision = panel.precision.currentData()
    for name in ("precisionCombo", "microBatchSpin", "lrSpin", "seqLenSpin"):
        _wheel(child(panel, name), 3)
    assert panel.precision.currentData() == precision
    assert {name: child(panel, name).value() for name in before} == before
    assert bar.value() > 0  # the turns scrolled the column
    panel.micro_batch.setFocus()  # chosen by a click or Tab: the wheel is the field's
    qtbot.waitUntil(panel.micro_batch.hasFocus)
    _wheel(panel.micro_batch, -1)
    assert panel.micro_batch.value() != before["microBatchSpin"]


def type_into(qtbot, field, text: str) -> None:
    """What a user does: select the field's text, type, press Return."""
    from PySide6.QtCore import Qt

    field.setFocus()
    field.lineEdit().selectAll()
    qtbot.keyClicks(field.lineEdit(), text)
    qtbot.keyClick(field.lineEdit(), Qt.Key.Key_Return)


@pytest.mark.parametrize(("typed", "lr"), [("1e-4", 1e-4), ("3E-4", 3e-4), ("0.00025", 2.5e-4), ("0,001", 1e-3),
                                           ("1e-7", 1e-7), ("6e-4", 6e-4)])
def test_the_learning_rate_takes_what_is_typed(qtbot, panel, typed, lr):
    """Scientific notation and small rates are the rate typed (a five-decimal spin box once kept "1" of "1e-4",
    0.00002 of 0.000025, and 1.0 of "0,001")."""
    type_into(qtbot, panel.lr, typed)
    assert panel.config is not None and panel.config.train.lr == pytest.approx(lr, rel=1e-12)
    assert panel.config.train.min_lr == pytest.approx(lr * 0.1, rel=1e-9)  # the preset's ratio


def test_a_rate_of_zero_is_refused_under_its_field_and_the_arrows_walk_one_two_five(qtbot, panel):
    type_into(qtbot, panel.lr, "0")
    assert panel.config is None and shown(panel) == ["lrError"] and "must be positive" in panel.error
    type_into(qtbot, panel.lr, "3e-4")
    panel.lr.stepBy(1)
    assert panel.lr.text() == "0.0005"
    panel.lr.stepBy(-2)
    assert panel.lr.text() == "0.0001"
    panel.lr.stepBy(-1)
    assert panel.lr.text() == "5e-05" and panel.config.train.lr == pytest.approx(5e-5)


@pytest.mark.parametrize(("typed", "budget"), [("3000000000", 3_000_000_000), ("3,000,000,000", 3_000_000_000),
                                               ("10B", 10_000_000_000), ("2.5M", 2_500_000), ("5e9", 5_000_000_000)])
def test_a_token_budget_past_two_billion_is_the_budget_typed(qtbot, panel, typed, budget):
    panel.budget_kind.setCurrentIndex(panel.budget_kind.findData("tokens"))
    type_into(qtbot, panel.budget, typed)
    assert panel.config is not None and panel.config.train.budget == budget
    assert panel.budget.text() == f"{budget:,}"


def test_seeds_keep_every_digit_and_counts_typed_past_their_range_become_its_bound(qtbot, panel):
    """Not the first digits of what was typed: 2048 accumulation steps became 204 in Qt's own spin box."""
    for field, typed, value in ((panel.seed, "4294967295", 4294967295), (panel.micro_batch, "5000", 4096),
                                (panel.accum, "2048", 1024), (panel.warmup, "51", 51), (panel.warmup, "120", 99)):
        type_into(qtbot, field, typed)
        assert field.value() == value, field.objectName()
    assert panel.config is not None
    assert (panel.config.train.seed, panel.config.train.micro_batch, panel.config.train.accum_steps) == \
        (4294967295, 4096, 1024)
    assert panel.config.train.warmup_ratio == 0.99
    type_into(qtbot, panel.budget, "1.5")  # not silently one step
    assert panel.config is None and shown(panel) == ["budgetError"] and "whole number, got 1.5" in panel.error


def test_switching_between_steps_and_tokens_keeps_the_length_of_the_run(qtbot, panel):
    type_into(qtbot, panel.budget, "30")
    per_step = panel.config.tokens_per_step()
    panel.budget_kind.setCurrentIndex(panel.budget_kind.findData("tokens"))
    assert panel.config.train.budget == 30 * per_step
    type_into(qtbot, panel.budget, str(30 * per_step + 1))  # not a whole number of steps: rounded up
    panel.budget_kind.setCurrentIndex(panel.budget_kind.findData("steps"))
    assert panel.config.train.budget == 31


def test_fp16_on_a_cpu_says_it_is_for_gpus(panel):
    fp16 = panel.precision.findData("fp16")
    assert panel.precision.itemText(fp16) == "fp16 + loss scaling (for GPUs: most CPUs emulate it, slowly)"


def test_loaded_weights_train_under_their_own_presets_name(panel):
    """As train --init-from: a model of the micro preset's architecture is not recorded as "tiny"."""
    micro_model = panel.preset_config("micro").model.to_dict()
    panel.preset.setCurrentIndex(panel.preset.findData("tiny"))
    panel.set_start_from("/ckpt/micro", "init", "micro checkpoint", micro_model)
    assert panel.preset.currentData() == "micro" and panel.config is not None  # chosen with the weights
    panel.preset.setCurrentIndex(panel.preset.findData("tiny"))
    assert panel.config is None and shown(panel) == ["presetError"]
    assert panel.error == "the loaded weights have the micro preset's architecture, not the tiny preset's: " \
                          "choose micro, or Clear them"
    panel.clear_start_from()
    assert panel.config is not None and panel.config.preset == "tiny"
    # Weights of no preset's architecture (a Hugging Face folder) train under any preset's name.
    custom = {**micro_model, "hidden_size": 48, "max_position_embeddings": 256}
    panel.set_start_from("/ckpt/hf", "init", "a Hugging Face folder", custom)
    assert panel.preset.currentData() == "tiny" and panel.config is not None, panel.error


@pytest.mark.parametrize(("field", "typed", "value"), [
    ("lr", "2000", 1e3), ("lr", "1e9", 1e3), ("lr", "5e3", 1e3),
    ("budget", "1e16", 2**53 - 1), ("seed", "12345678901234567890", 2**53 - 1),
])
def test_a_number_typed_past_a_fields_range_is_its_bound_never_its_first_digits(qtbot, panel, field, typed, value):
    """Qt kept the value of the digits typed so far: a learning rate of 2000 trained at 200, a budget of 1e16
    steps was 10."""
    widget = getattr(panel, field)
    type_into(qtbot, widget, typed)
    assert widget.value() == value and widget.text() == widget.textFromValue(value)


@pytest.mark.parametrize(("field", "typed", "says"), [
    ("lr", "-1", "learning rate must be positive, got -1"), ("budget", "-5", "budget must be positive, got -5"),
    ("lr", "-3e-4", "learning rate must be positive, got -0.0003"),
    ("seed", "-7", "seed must be between 0 and 2**63 - 1, got -7"),  # 0 is a seed: -7 was silently seed 0
])
def test_a_negative_number_is_refused_under_its_field_not_taken_without_its_sign(qtbot, panel, field, typed, says):
    widget = getattr(panel, field)
    type_into(qtbot, widget, typed)
    assert panel.config is None and shown(panel) == [f"{field}Error"]
    assert widget.value() < 0 and says in child(panel, f"{field}Error").text()
    type_into(qtbot, widget, "5")
    assert panel.config is not None and shown(panel) == []
    widget.setValue(0)
    assert not widget.stepEnabled() & widget.StepEnabledFlag.StepDownEnabled  # the arrows stop at 0


@pytest.mark.parametrize(("field", "typed", "value"), [
    ("micro_batch", "-2", 1), ("seq_len", "-64", 2), ("warmup", "-1", 0),  # a negative count: its lowest bound
    ("accum", "3.5", 2), ("micro_batch", "1.5", 2), ("accum", "", 2), ("accum", "-", 2),  # no whole number: as it was
    ("seed", "", 7), ("seed", "-", 7),  # a seed field left empty was seed 0
    ("accum", "1,5", 2), ("warmup", "1,5", 3), ("seq_len", "1,5", 128),  # a decimal comma: 1.5, not 15
    ("seq_len", "1,024", 1024), ("seed", "1,5", 7),  # a whole group of three is a group
])
def test_a_count_typed_with_a_sign_a_fraction_or_nothing_is_never_taken_from_its_digits(qtbot, panel, field, typed,
                                                                                         value):
    """Qt refused the keystrokes it could not hold: -2 became a micro-batch of 2, an accumulation of 3.5
    became 35 (ten times the effective batch)."""
    widget = getattr(panel, field)
    widget.setValue({"accum": 2, "micro_batch": 2, "seed": 7, "warmup": 3, "seq_len": 128}[field])
    type_into(qtbot, widget, typed)
    assert widget.value() == value and widget.cleanText() == widget.textFromValue(value)


@pytest.mark.parametrize(("field", "typed", "value"), [
    ("micro_batch", "5e9", 4096), ("seq_len", "2k", 2000), ("accum", "1e1", 10),  # whole numbers, as written
    ("seq_len", "0x10", 64), ("micro_batch", "1e400", 2), ("lr", "2.5M", 1e-3), ("lr", "abc", 1e-3),  # none
])
def test_no_keystroke_is_dropped_to_keep_the_rest(qtbot, panel, field, typed, value):
    """Qt refused the keystroke it could not hold and kept the others: "5e9" became a micro-batch of 59, "0x10"
    a sequence length of 10, "2.5M" a learning rate of 2.5; Start stayed enabled each time."""
    widget = getattr(panel, field)
    widget.setValue({"micro_batch": 2, "seq_len": 64, "accum": 2, "lr": 1e-3}[field])
    widget.setFocus()
    widget.lineEdit().selectAll()
    qtbot.keyClicks(widget.lineEdit(), typed)
    assert widget.lineEdit().text().strip() == typed  # shown as typed while the field is being edited
    qtbot.keyClick(widget.lineEdit(), Qt.Key.Key_Return)
    assert widget.value() == value and widget.cleanText() == widget.textFromValue(value)


@pytest.mark.parametrize("typed", ["50%", "50 %"])
def test_a_percentage_typed_with_its_sign_over_the_number_is_taken(qtbot, panel, typed):
    """Ctrl+A in a spin box selects the number, not its suffix: "50%" typed over it read "50% %", and the warmup
    went back to what it was, without a word."""
    panel.warmup.setValue(3)
    panel.warmup.setFocus()
    edit = panel.warmup.lineEdit()
    edit.setSelection(0, len(panel.warmup.cleanText()))  # what Ctrl+A selects
    qtbot.keyClicks(edit, typed)
    assert edit.text() == f"{typed}{panel.warmup.suffix()}"  # " % of budget"
    qtbot.keyClick(edit, Qt.Key.Key_Return)
    assert panel.warmup.value() == 50


@pytest.mark.parametrize(("field", "typed", "value"), [("budget", "+5", 5), ("seed", "+9", 9), ("lr", "+2e-3", 2e-3),
                                                     ("accum", "+4", 4), ("budget", "+-5", 300), ("lr", "-+1", 1e-3)])
def test_a_leading_plus_is_read_by_every_field(qtbot, panel, field, typed, value):
    """The count boxes took "+4" as 4; the budget, the seed and the learning rate gave back the value before."""
    widget = getattr(panel, field)
    widget.setValue({"budget": 300, "seed": 7, "lr": 1e-3, "accum": 2}[field])
    type_into(qtbot, widget, typed)
    assert widget.value() == value


def test_switching_steps_and_tokens_keeps_the_length_while_another_setting_is_invalid(qtbot, panel):
    """The conversion used the validated settings, which a refused learning rate left empty: 200 steps became
    200 tokens."""
    type_into(qtbot, panel.budget, "200")
    per_step = panel.config.tokens_per_step()
    type_into(qtbot, panel.lr, "0")
    assert panel.config is None
    panel.budget_kind.setCurrentIndex(panel.budget_kind.findData("tokens"))
    assert panel.budget.number() == 200 * per_step
    panel.budget_kind.setCurrentIndex(panel.budget_kind.findData("steps"))
    assert panel.budget.number() == 200


def test_a_fraction_gives_back_the_value_of_the_last_edit_not_the_one_before_the_field_was_entered(qtbot, panel):
    """The field stays focused between edits ended by Return: "3.5" after "4" gave back 2, the value it had when
    it was entered; so did one after the arrows."""
    from PySide6.QtCore import Qt

    panel.accum.setValue(2)
    type_into(qtbot, panel.accum, "4")
    assert panel.accum.value() == 4
    type_into(qtbot, panel.accum, "3.5")
    assert panel.accum.value() == 4
    qtbot.keyClick(panel.accum.lineEdit(), Qt.Key.Key_Up)
    type_into(qtbot, panel.accum, "")
    assert panel.accum.value() == 5
    panel.lr.setValue(1e-3)
    panel.lr.setFocus()
    qtbot.keyClick(panel.lr.lineEdit(), Qt.Key.Key_Up)  # the 1-2-5 ladder
    type_into(qtbot, panel.lr, "1e")
    assert panel.lr.value() == 2e-3


@pytest.mark.parametrize(("field", "typed", "value"), [("accum", "2048", 1024), ("micro_batch", "-2", 1),
                                                     ("lr", "2000", 1e3), ("accum", "3.5", 2)])
def test_a_number_still_being_typed_counts_as_left_when_the_settings_are_taken(qtbot, panel, field, typed, value):
    """A shortcut (Ctrl+Return: Start) does not leave the field: Qt's value was the longest prefix in range,
    and a run started with accumulation 204 while the field read 2048."""
    widget = getattr(panel, field)
    widget.setValue(2)
    widget.setFocus()
    widget.lineEdit().selectAll()
    qtbot.keyClicks(widget.lineEdit(), typed)
    cfg = panel.committed_config()
    assert widget.value() == value and widget.cleanText() == widget.textFromValue(value)
    assert cfg is not None and cfg == panel.config
    taken = {"accum": cfg.train.accum_steps, "micro_batch": cfg.train.micro_batch, "lr": cfg.train.lr}[field]
    assert taken == value


def test_every_group_s_fields_start_at_one_indent(panel):
    """Each group's form sized its own label column: Preset's, torch.compile's and Learning rate's fields started
    at three different places."""
    from PySide6.QtWidgets import QFormLayout, QGroupBox

    panel.resize(420, 1200)
    starts = set()
    for box in panel.findChildren(QGroupBox):
        form = box.layout()
        for i in range(form.rowCount()):
            label, field = (form.itemAt(i, role) for role in (QFormLayout.ItemRole.LabelRole,
                                                              QFormLayout.ItemRole.FieldRole))
            if label is not None and field is not None and field.widget().isVisibleTo(panel):
                starts.add(field.widget().mapTo(panel, field.widget().rect().topLeft()).x())
    assert len(starts) == 1, starts
