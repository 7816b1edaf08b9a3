"""The Data control: what is chosen is checked before Start, again at Start, and its preparation is shown
and can be stopped."""

from __future__ import annotations

import threading

import pytest
from PySide6.QtWidgets import QFileDialog

from tests.gui.conftest import child, click, drop_paths, wait_idle

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda".split()


def _corpus(path, n: int = 80):
    docs = [f"doc {i}: " + " ".join(WORDS[(i + j) % len(WORDS)] for j in range(5 + i % 40)) + "." for i in range(n)]
    path.write_text("\n\n".join(docs), encoding="utf-8")
    return path


def _choose(window, dialogs, path) -> None:
    dialogs.files["getOpenFileName"] = str(path)
    child(window, "dataFileButton").click()


def test_too_little_text_is_said_under_the_data_control_before_start(window, dialogs, tmp_path):
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("just a few words", encoding="utf-8")
    _choose(window, dialogs, tiny)
    error = child(window, "sourceError")
    assert error.isVisibleTo(window) and "too little text" in error.text()
    assert not child(window, "startButton").isEnabled()
    assert window.session.records == []  # no failed row

    empty = tmp_path / "empty.txt"
    empty.write_text("", encoding="utf-8")
    _choose(window, dialogs, empty)
    assert "is empty" in error.text() and not child(window, "startButton").isEnabled()
    blank = tmp_path / "blank.txt"  # nothing but blank lines: as empty, and said as early
    blank.write_text("\n \n" * 4000, encoding="utf-8")
    _choose(window, dialogs, blank)
    assert "is empty (no text)" in error.text() and not child(window, "startButton").isEnabled()

    good = _corpus(tmp_path / "good.txt")
    _choose(window, dialogs, good)
    assert not error.isVisibleTo(window) and child(window, "startButton").isEnabled()
    info = child(window, "dataInfoLabel")
    assert "KB" in info.text() and "tokenized once" in info.text()


def test_a_file_deleted_after_choosing_is_caught_at_start(window, dialogs, tmp_path):
    good = _corpus(tmp_path / "notes.txt")
    _choose(window, dialogs, good)
    assert child(window, "startButton").isEnabled()
    good.unlink()
    click(window, "startButton")
    assert window.session.records == [] and not window.session.running  # nothing started, no failed row
    error = child(window, "sourceError")
    assert error.isVisibleTo(window) and "does not exist" in error.text()
    assert not dialogs.warnings()  # said under the control, not in a dialog
    assert not child(window, "startButton").isEnabled()


def test_a_file_replaced_by_a_folder_after_choosing_is_caught_at_start(qtbot, window, dialogs, tmp_path):
    """The check of the file was kept for the folder now in its place (a folder keeps its check at Start), and
    the run failed: "folder …/notes.txt holds no data files"."""
    good = _corpus(tmp_path / "notes.txt")
    _choose(window, dialogs, good)
    good.unlink()
    good.mkdir()
    click(window, "startButton")
    error = child(window, "sourceError")
    qtbot.waitUntil(lambda: error.isVisibleTo(window))  # a folder is described off the GUI thread
    assert window.session.records == [] and not window.session.running  # nothing started, no failed row
    assert "holds no data files" in error.text() and not dialogs.warnings()


class SlowDescribe:
    """``describe_source`` held until released, recording the thread that runs it."""

    def __init__(self, monkeypatch):
        from core.prepare import describe_source

        self.real, self.release, self.threads = describe_source, threading.Event(), []
        monkeypatch.setattr("gui.widgets.config_panel.describe_source", self)

    def __call__(self, data, *args, **kwargs):
        self.threads.append(threading.current_thread())
        if threading.current_thread() is not threading.main_thread():
            self.release.wait(60)
        return self.real(data, *args, **kwargs)


def _folder(tmp_path, name, files):
    folder = tmp_path / name
    folder.mkdir()
    for file, n in files.items():
        _corpus(folder / file, n)
    return folder


def test_a_folder_is_described_off_the_window_thread(qtbot, window, dialogs, tmp_path, monkeypatch):
    slow = SlowDescribe(monkeypatch)
    dialogs.files["getExistingDirectory"] = str(_folder(tmp_path, "notes", {"a.txt": 80, "b.txt": 80}))
    child(window, "dataFolderButton").click()  # returns at once: the folder is described in a worker thread
    panel, info = window.config_panel, child(window, "dataInfoLabel")
    assert panel.checking_source and "checking the folder" in info.text()
    # Start waits for the check (it started a run that failed on what the check was about to say).
    start = child(window, "startButton")
    assert not start.isEnabled() and "still being checked" in start.toolTip()
    window.actions["Start"].trigger()
    window.runs.start()  # as a shortcut pressed just as Start greys
    assert window.session.records == []
    with qtbot.waitSignal(panel._folder_check.done, timeout=60_000):
        slow.release.set()
    assert slow.threads and threading.main_thread() not in slow.threads
    assert not panel.checking_source and "2 files" in info.text() and "tokenized once" in info.text()
    assert child(window, "startButton").isEnabled()


def test_a_folder_says_which_of_its_files_it_does_not_read(qtbot, window, dialogs, tmp_path):
    pa = pytest.importorskip("pyarrow")
    import pyarrow.parquet as pq

    shards = tmp_path / "shards"
    shards.mkdir()
    pq.write_table(pa.table({"text": [f"document {i} " * 30 for i in range(40)]}), shards / "000.parquet")
    (shards / "README.md").write_text("# a dataset card, not data")
    dialogs.files["getExistingDirectory"] = str(shards)
    with qtbot.waitSignal(window.config_panel._folder_check.done, timeout=60_000):
        child(window, "dataFolderButton").click()
    text = child(window, "dataInfoLabel").text()
    assert "40 rows" in text and "not read: README.md" in text


def test_a_folders_problem_is_said_when_its_check_ends(qtbot, window, dialogs, tmp_path, monkeypatch):
    slow = SlowDescribe(monkeypatch)
    tiny = tmp_path / "tiny"
    tiny.mkdir()
    (tiny / "a.txt").write_text("just a few words", encoding="utf-8")
    dialogs.files["getExistingDirectory"] = str(tiny)
    child(window, "dataFolderButton").click()
    with qtbot.waitSignal(window.config_panel._folder_check.done, timeout=60_000):
        slow.release.set()
    error = child(window, "sourceError")
    assert error.isVisibleTo(window) and "too little text" in error.text()
    assert not child(window, "startButton").isEnabled()


def test_a_folders_problem_names_the_windows_controls_not_command_line_flags(qtbot, window, dialogs, tmp_path):
    """A folder of mixed formats was refused with "point --data at a folder of one format", a flag the window
    does not have."""
    mixed = _folder(tmp_path, "mixed", {"a.txt": 80})
    (mixed / "b.jsonl").write_text('{"text": "x y z"}\n' * 50)
    dialogs.files["getExistingDirectory"] = str(mixed)
    with qtbot.waitSignal(window.config_panel._folder_check.done, timeout=60_000):
        child(window, "dataFolderButton").click()
    error = child(window, "sourceError").text()
    assert "mixes data formats" in error and "point the Data control at a folder of one format" in error, error
    assert "--" not in error
    from gui.window_words import in_window_words

    assert in_window_words("choose one with --text-field") == "choose one with the Text field"
    assert in_window_words("--data-dir and --datafile") == "--data-dir and --datafile"  # other flags stay
    # Advice with values (the speed advisor's "Cannot find settings"): the window's fields, its numbers grouped.
    assert in_window_words("micro-batch 512 × accumulation 8 fits with the same effective batch (--micro-batch 512 "
                           "--accum 8); on a CPU") == ("micro-batch 512 × accumulation 8 fits with the same effective "
                                                      "batch (Micro-batch 512, Accumulation 8); on a CPU")
    assert in_window_words("that takes about 1,007 s; give --budget-seconds 1259 or more") == \
        "that takes about 1,007 s; set the Time budget to 1,259 s or more"
    assert in_window_words("run folder /runs/x already exists; choose another run id") == \
        "run folder /runs/x already exists; start again: a new run takes a new id"


def test_an_unexpected_error_while_describing_a_folder_ends_the_check(qtbot, window, dialogs, tmp_path,
                                                                      monkeypatch):
    def broken(data, *args, **kwargs):
        raise LookupError("unexpected")

    monkeypatch.setattr("gui.widgets.config_panel.describe_source", broken)
    dialogs.files["getExistingDirectory"] = str(_folder(tmp_path, "odd", {"a.txt": 80}))
    with qtbot.waitSignal(window.config_panel._folder_check.done, timeout=60_000):
        child(window, "dataFolderButton").click()
    error = child(window, "sourceError")
    assert not window.config_panel.checking_source
    assert error.isVisibleTo(window) and "LookupError: unexpected" in error.text()


def test_a_late_answer_about_an_earlier_folder_is_dropped(qtbot, window, dialogs, tmp_path, monkeypatch):
    slow = SlowDescribe(monkeypatch)
    dialogs.files["getExistingDirectory"] = str(_folder(tmp_path, "three", {"a.txt": 80, "b.txt": 80, "c.txt": 80}))
    child(window, "dataFolderButton").click()
    _choose(window, dialogs, _corpus(tmp_path / "one.txt"))  # chosen while the folder is still being described
    info = child(window, "dataInfoLabel")
    assert not window.config_panel.checking_source and "files" not in info.text()
    with qtbot.waitSignal(window.config_panel._folder_check.done, timeout=60_000):
        slow.release.set()
    assert "files" not in info.text() and "KB" in info.text()  # still the file's summary
    assert window.config_panel.source.endswith("one.txt")


def test_data_preparation_shows_its_progress_and_stop_cancels_it(qtbot, window, dialogs, tmp_path, monkeypatch,
                                                                  caplog):
    """A corpus that never ends: only Stop ends its preparation, and the run ends stopped, not failed (also on
    stderr, which said "run (not started) failed: data preparation stopped; nothing was kept")."""
    import logging

    from core.sources import Source

    caplog.set_level(logging.INFO, logger="gui.controller")

    release = threading.Event()

    def endless(self, batch_chars=1 << 22):
        done = 0
        while True:
            done += 64
            yield [" ".join(WORDS)], done
            release.wait(0.005)  # a slow disk, on the torch thread

    monkeypatch.setattr(Source, "iter_documents", endless)
    _choose(window, dialogs, _corpus(tmp_path / "slow.txt"))
    click(window, "startButton")
    record = window.session.records[-1]
    qtbot.waitUntil(lambda: record.preparing and record.preparation != "")
    assert "reading the tokenizer's training documents" in child(window, "stateLabel").full_text()
    assert record.progress_text().startswith("preparing data")
    click(window, "stopButton")
    wait_idle(qtbot, window)
    release.set()
    assert record.state == "stopped" and not record.checkpoint
    assert "data preparation stopped" in record.message
    log = window.log.toPlainText()
    assert "stopped before training" in log
    assert "stopping its set-up" in log and "a final checkpoint is saved" not in log  # there is none to save
    assert window.session.continue_source(set()) is None  # nothing to continue from
    said = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "gui.controller"]
    assert ("INFO", "run (not started) stopped: data preparation stopped; nothing was kept") in said
    assert not any(level == "WARNING" for level, _ in said), said


def test_the_data_dialogs_open_where_data_was_last_chosen(make_window, dialogs, tmp_path, monkeypatch):
    folder = tmp_path / "corpora"
    folder.mkdir()
    window = make_window()
    _choose(window, dialogs, _corpus(folder / "a.txt"))
    opened: list[str] = []

    def record_open(parent, caption, directory, *args, **kwargs):
        opened.append(directory)
        return "", ""

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(record_open))
    child(window, "dataFileButton").click()
    assert opened == [str(folder)]
    window.close()

    again = make_window()  # the next session too
    child(again, "dataFileButton").click()
    assert opened == [str(folder), str(folder)]


def test_data_gone_since_the_last_session_is_said_not_swapped_for_the_built_in_corpus(make_window, dialogs, tmp_path):
    """An unmounted drive or a moved dataset: the next session shows the path with its problem, and Start
    waits; the built-in corpus in its place would train unnoticed."""
    gone = _corpus(tmp_path / "vanish.txt")
    window = make_window()
    _choose(window, dialogs, gone)
    window.close()
    gone.unlink()

    again = make_window()
    assert child(again, "dataSourceEdit").text() == str(gone)
    error = child(again, "sourceError")
    assert error.isVisibleTo(again) and "does not exist" in error.text()
    assert not child(again, "startButton").isEnabled()


def test_jsonl_text_under_another_field_is_said_and_trains_once_the_text_field_names_it(qtbot, window, dialogs,
                                                                                      tmp_path):
    """A field the data lacks is said under the Data control before Start (it failed as a run's row, naming a
    command-line flag the window lacked); the Text field control names another, as --text-field does."""
    import json

    from PySide6.QtCore import Qt

    lines = _corpus(tmp_path / "docs.txt").read_text(encoding="utf-8").split("\n\n")
    data = tmp_path / "docs.jsonl"
    data.write_text("".join(json.dumps({"content": line, "id": i}) + "\n" for i, line in enumerate(lines)))
    field = child(window, "textFieldEdit")
    _choose(window, dialogs, tmp_path / "docs.txt")
    assert not field.isEnabled()  # plain text has no fields
    _choose(window, dialogs, data)
    error = child(window, "sourceError")
    assert error.isVisibleTo(window) and "needs a string field 'text' (its keys: content, id)" in error.text()
    assert field.isEnabled() and not child(window, "startButton").isEnabled()

    field.setFocus()
    field.selectAll()
    qtbot.keyClicks(field, "content")
    qtbot.keyClick(field, Qt.Key.Key_Return)
    assert not error.isVisibleTo(window) and child(window, "startButton").isEnabled()
    assert window.config_panel.config.data.text_field == "content"
    click(window, "startButton")
    wait_idle(qtbot, window)
    (record,) = window.session.records
    assert record.state == "finished", record.message


def test_a_field_named_for_earlier_data_is_not_applied_to_plain_text(qtbot, window, dialogs, tmp_path):
    """The engine refuses a text field for plain text (it was recorded and ignored): the window keeps what the
    greyed control holds for the next JSONL or Parquet data, and runs plain text, a file or a folder, without it."""
    import json

    from PySide6.QtCore import Qt

    jsonl = tmp_path / "docs.jsonl"
    jsonl.write_text("".join(json.dumps({"content": f"document {i} " * 20}) + "\n" for i in range(40)))
    _choose(window, dialogs, jsonl)
    field = child(window, "textFieldEdit")
    field.setFocus()
    field.selectAll()
    qtbot.keyClicks(field, "content")
    qtbot.keyClick(field, Qt.Key.Key_Return)
    panel, error = window.config_panel, child(window, "sourceError")
    _choose(window, dialogs, _corpus(tmp_path / "docs.txt"))
    assert not field.isEnabled() and field.text() == "content"
    assert not error.isVisibleTo(window) and panel.config.data.text_field == "text"
    folder = tmp_path / "texts"
    folder.mkdir()
    _corpus(folder / "a.txt")
    _corpus(folder / "b.md")
    dialogs.files["getExistingDirectory"] = str(folder)
    with qtbot.waitSignal(panel._folder_check.done, timeout=60_000):
        child(window, "dataFolderButton").click()
    assert not error.isVisibleTo(window) and "2 files" in child(window, "dataInfoLabel").text()
    assert not field.isEnabled() and panel.config.data.text_field == "text"
    click(window, "startButton")
    wait_idle(qtbot, window)
    (record,) = window.session.records
    assert record.state == "finished", record.message


def test_a_prepared_source_still_says_how_many_documents_it_holds(qtbot, window, dialogs, tmp_path):
    """Once tokenized the line said only its tokens: the documents, shown before, were gone. Before, the rows its
    metadata counts, called documents though a null or blank text is none."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from core.prepare import prepare_corpus

    path = tmp_path / "docs.parquet"
    text = _corpus(tmp_path / "docs.txt").read_text(encoding="utf-8").split("\n\n")
    pq.write_table(pa.table({"text": [*text, None, "  "]}), path)
    _choose(window, dialogs, path)
    info = child(window, "dataInfoLabel")
    qtbot.waitUntil(lambda: not window.config_panel.checking_source)
    assert "82 rows; tokenized once" in info.text()
    prepared = prepare_corpus(window.config_panel.config.data)
    _choose(window, dialogs, path)  # looked at again, as a later start of the window would
    qtbot.waitUntil(lambda: not window.config_panel.checking_source)
    assert f"80 documents; tokenized: {prepared.store.num_tokens:,} tokens, training starts at once" in info.text()


def test_a_run_that_fails_on_its_data_names_the_windows_controls(qtbot, window, dialogs, tmp_path):
    """A line past what the Data control's check reads (the first 64 KiB) fails the run: its row said
    "choose another text field (--text-field)", a flag the window does not have."""
    import json

    good = "".join(json.dumps({"text": f"document {i}: " + " ".join(WORDS)}) + "\n" for i in range(1_200))
    data = tmp_path / "late.jsonl"
    data.write_text(good + json.dumps({"content": "hello there"}) + "\n", encoding="utf-8")
    assert len(good) > 64 * 1024
    _choose(window, dialogs, data)
    assert child(window, "startButton").isEnabled()
    click(window, "startButton")
    wait_idle(qtbot, window)
    (record,) = window.session.records
    assert record.state == "failed" and "needs a string field 'text'" in record.message, record.message
    assert "(the Text field)" in record.message and "--text-field" not in record.message


def test_the_data_line_says_tokenized_once_a_run_has_tokenized_it(qtbot, window, dialogs, tmp_path):
    """It kept saying "tokenized once when a run first starts on it" after the first run had."""
    _choose(window, dialogs, _corpus(tmp_path / "docs.txt"))
    info = child(window, "dataInfoLabel")
    assert "tokenized once when a run first starts" in info.text()
    click(window, "startButton")
    wait_idle(qtbot, window)
    assert window.session.records[0].state == "finished", window.session.records[0].message
    assert "tokenized: " in info.text() and "training starts at once" in info.text(), info.text()


def test_the_data_line_judges_tokenized_by_the_loaded_checkpoints_tokenizer(qtbot, window, dialogs, tmp_path):
    """A run started from a checkpoint takes its tokenizer: the data was tokenized with it, training started at
    once, and the line said "tokenized once when a run first starts on it" (judged by a tokenizer to train)."""
    import json

    from core.config import DataConfig
    from core.prepare import prepare_corpus
    from core.tokenizer import train_bpe

    corpus = _corpus(tmp_path / "docs.txt")
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({}))
    tok = train_bpe(corpus.read_text(encoding="utf-8").split("\n\n"), 300)
    tok.save(checkpoint)
    prepared = prepare_corpus(DataConfig(source=str(corpus), tokenizer=str(checkpoint / "tokenizer.json")))
    _choose(window, dialogs, corpus)
    info = child(window, "dataInfoLabel")
    assert "tokenized once when a run first starts" in info.text()
    window.config_panel.set_start_from(str(checkpoint), "init", "checkpoint")
    assert f"tokenized: {prepared.store.num_tokens:,} tokens" in info.text(), info.text()
    window.config_panel.clear_start_from()
    assert "tokenized once when a run first starts" in info.text()


def test_a_corpus_dropped_on_the_data_field_is_chosen_and_checked(window, dialogs, tmp_path):
    field = child(window, "dataSourceEdit")
    (tmp_path / "drop").mkdir()
    good = _corpus(tmp_path / "drop" / "good.txt")
    assert drop_paths(field, [good])
    assert window.config_panel.build_config().data.source == str(good)
    assert child(window, "startButton").isEnabled()
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("just a few words", encoding="utf-8")
    assert drop_paths(field, [tiny])
    assert "too little text" in child(window, "sourceError").text()
    assert window.config_panel.data_dir == str(tmp_path)  # File… opens where data was last dropped
    assert not drop_paths(field, [good, tiny], enter_only=True)  # one corpus at a time
