"""A run trained by several processes (torchrun), followed through its run folder.

The dashboard starts ``python -m core.cli train --config … --nproc N`` with
``QProcess``; the CLI hands over to torchrun, rank 0 appends every event to the
run folder's ``metrics.jsonl``, and this object tails that file on a timer and
re-emits the events, the same plain dataclasses an in-process run sends; the
launcher's own events before the run folder exists (preparing the corpus) come
as lines of its output (``core.launch.event_line``). Stop
sends SIGINT to the launcher: every rank agrees to stop after the same step and
rank 0 saves a final checkpoint.
"""

from __future__ import annotations

import codecs
import contextlib

from PySide6.QtCore import QObject, QProcess, QProcessEnvironment, QTimer, Signal

from core.launch import FAILURE_SUMMARY, LaunchSpec, end_launch, event_from_line, stop_launch
from core.runs import EventTail

POLL_MS = 100


class ProcessRun(QObject):
    event = Signal(object)
    """A core event read from the run folder."""
    ended = Signal(int, str)
    """Exit code (0 finished or stopped, 1 failed, 2 bad settings) and the error line, if any."""

    def __init__(self, spec: LaunchSpec, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.spec = spec
        self.tail = EventTail(spec.metrics_file)
        self.output: list[str] = []
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._partial = ""  # a line whose end has not arrived yet
        self.process = QProcess(self)
        self.process.setProgram(spec.argv[0])
        self.process.setArguments(spec.argv[1:])
        env = QProcessEnvironment.systemEnvironment()
        for key, value in spec.env.items():
            env.insert(key, value)
        self.process.setProcessEnvironment(env)
        self.process.setProcessChannelMode(QProcess.ProcessChannelMode.MergedChannels)
        self.process.readyReadStandardOutput.connect(self._read_output)
        self.process.finished.connect(self._on_finished)
        self.process.errorOccurred.connect(self._on_error)
        self.crashed = False
        """The launcher ended by a signal it did not handle (kill -9), or a crash."""
        self.timer = QTimer(self)
        self.timer.setInterval(POLL_MS)
        self.timer.timeout.connect(self.poll)

    @property
    def running(self) -> bool:
        return self.process.state() != QProcess.ProcessState.NotRunning

    def start(self) -> None:
        self.process.start()
        self.timer.start()

    def stop(self) -> None:
        """Every rank stops after the same optimizer step; rank 0 saves and reports ``finished`` (stopped)."""
        pid = self.process.processId()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                stop_launch(pid)

    def end(self) -> None:
        """Every rank ends now (SIGTERM to the launcher, which torchrun passes on); recorded as terminated."""
        pid = self.process.processId()
        if pid:
            with contextlib.suppress(ProcessLookupError):
                end_launch(pid)

    def wait(self, msecs: int) -> bool:
        return self.process.waitForFinished(msecs)

    def poll(self) -> None:
        for event in self.tail.poll():
            self.event.emit(event)

    def _read_output(self, final: bool = False) -> None:
        text = self._partial + self._decoder.decode(bytes(self.process.readAllStandardOutput()), final)
        lines = text.split("\n")
        self._partial = "" if final else lines.pop()
        for line in lines:
            event = event_from_line(line)
            if event is not None:
                self.event.emit(event)
            elif line.strip():
                self.output.append(line.rstrip("\r"))
        del self.output[:-200]  # keep the tail: enough for the last error line

    def error_line(self) -> str:
        """The launcher's last word: its line on which ranks failed and how, else a refusal (``speedboard:
        error: …``), else its own line on how the job ended (a signal), else nothing. A rank's own error line
        (rank 0's "another process of this job failed") is not preferred to the launcher's naming of the rank
        that died: the window repeated rank 0's line, and never said rank 1 was killed."""
        lines = [line for line in self.output if line.startswith("speedboard: ")]
        summary = next((line for line in reversed(lines) if FAILURE_SUMMARY.match(line)), None)
        if summary is not None:
            return summary.removeprefix("speedboard: ").strip()
        for line in reversed(lines):
            if line.startswith("speedboard: error:"):
                return line.removeprefix("speedboard: error:").strip()
        return lines[-1].removeprefix("speedboard: ").strip() if lines else ""

    def _on_error(self, error: QProcess.ProcessError) -> None:
        """A launcher that never started (its Python gone, or not executable) sends no ``finished``: the job
        stayed "running" for good, and no run could be started in the window again."""
        if error != QProcess.ProcessError.FailedToStart:
            return  # a crash or a lost pipe: ``finished`` follows
        self.timer.stop()
        with contextlib.suppress(OSError):
            self.spec.config_file.unlink()
        self.output.append(f"speedboard: error: the training processes could not be started ({self.spec.argv[0]}: "
                           f"{self.process.errorString()})")
        self.ended.emit(1, self.error_line())

    def _on_finished(self, code: int, status: QProcess.ExitStatus) -> None:
        self._read_output(final=True)
        self.timer.stop()
        self.poll()  # the last events rank 0 wrote before exiting
        with contextlib.suppress(OSError):
            self.spec.config_file.unlink()
        self.crashed = status == QProcess.ExitStatus.CrashExit
        if self.crashed:  # killed (kill -9) or crashed: it said nothing itself
            code = code or 1
            self.output.append("speedboard: error: the launcher of the job was killed or crashed, and its processes "
                               "ended with it")
        self.ended.emit(code, self.error_line())
