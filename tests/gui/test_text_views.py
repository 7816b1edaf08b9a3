"""The log and the sample view show text as written, at a length they lay out at once."""

from __future__ import annotations

from gui.widgets.log_view import LogView
from gui.widgets.sample_view import SampleView
from gui.widgets.shown_text import LOG_MESSAGE_CHARS


def test_a_huge_log_message_is_cut_saying_how_much_was_left_out(qtbot):
    """A 200,000-character line without a space took the log seconds to lay out, again at every later line and
    every resize (a minute at a million)."""
    log = LogView()
    qtbot.addWidget(log)
    log.add("w" * 200_000, "warning")
    (line,) = log.messages()
    assert len(line) < LOG_MESSAGE_CHARS + 100
    assert line.endswith(f"w … ({200_000 - LOG_MESSAGE_CHARS:,} characters more)")
    log.add("short")
    assert log.messages()[-1].endswith(" short")


def test_direction_controls_do_not_reorder_a_sample_or_a_log_line(qtbot):
    """U+202E in a model's sample showed the words after it reversed ("evil" as "live")."""
    sample, log = SampleView(), LogView()
    qtbot.addWidget(sample)
    qtbot.addWidget(log)
    sample.show_sample("#1", 4, "good \u202eevil\u202c text")
    assert sample.text.toPlainText() == "good <U+202E>evil<U+202C> text"
    log.add("file \u2067name\u2069.txt")
    assert log.messages()[-1].endswith("file <U+2067>name<U+2069>.txt")


def test_the_log_follows_its_newest_line_across_resizes_until_the_user_scrolls_up(qtbot):
    """After a resize the log stayed on an old line: its rewrapping moved the end away from the scroll bar, and
    Qt follows new lines only while the bar is at its end (a finished run's lines never came into view)."""
    from PySide6.QtWidgets import QAbstractSlider

    log = LogView()
    qtbot.addWidget(log)
    log.resize(700, 200)
    log.show()
    bar = log.verticalScrollBar()

    def at_end() -> bool:
        return bar.maximum() > 0 and bar.value() == bar.maximum()

    for i in range(40):
        log.add(f"#1 eager ×1: step {i} of a run whose lines wrap when the log is narrow " * 2)
    assert at_end()
    for width in (260, 900, 300):
        log.resize(width, 200)
        qtbot.waitUntil(lambda width=width: log.width() == width)
        log.add("#2 eager ×1: finished")
        assert at_end(), width
    bar.triggerAction(QAbstractSlider.SliderAction.SliderPageStepSub)  # the user reads back
    qtbot.waitUntil(lambda: not log.following)
    held = bar.value()
    log.add("#3 eager ×1: starting …")
    assert bar.value() == held and not at_end()  # what the user reads stays put
    bar.triggerAction(QAbstractSlider.SliderAction.SliderToMaximum)  # back at the end: following again
    qtbot.waitUntil(lambda: log.following)
    log.add("#3 eager ×1: finished")
    assert at_end()
