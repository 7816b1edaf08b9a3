"""Start, Pause, Resume, Stop and Continue for the window: the checks and questions before the session is asked
(the settings, a micro-batch that cannot fit, what Continue keeps and trains), and what the status bar says."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QObject
from PySide6.QtWidgets import QWidget

from core.config import RunConfig
from core.errors import SpeedboardError
from core.memory_budget import fit_run_config
from gui import dialogs
from gui.checkpoint_actions import CheckpointActions
from gui.run_record import RunRecord
from gui.session import RunSession, parent_data_gone
from gui.widgets.config_panel import ConfigPanel
from gui.widgets.log_view import LogView
from gui.widgets.run_table import RunTable
from gui.widgets.status_bar import StatusBar


class RunActions(QObject):
    """The Run menu's commands and their buttons, through the run session; ``update_controls`` after each."""

    def __init__(self, parent: QWidget, session: RunSession, panel: ConfigPanel, table: RunTable,
                 checkpoints: CheckpointActions, log: LogView, status: StatusBar,
                 update_controls: Callable[[], None]) -> None:
        super().__init__(parent)
        self._window = parent
        self.session, self.panel, self.table, self.checkpoints = session, panel, table, checkpoints
        self.log, self.status, self._update_controls = log, status, update_controls
        session.continue_failed.connect(self._on_continue_failed)

    def _on_continue_failed(self, message: str) -> None:
        dialogs.show_error(self._window, "Cannot continue", message)

    def _settings_or_explain(self) -> RunConfig | None:
        cfg = self.panel.committed_config()
        if cfg is None:
            dialogs.show_error(self._window, "Invalid settings", self.panel.error)
        return cfg

    def start(self) -> None:
        if self.session.running or self.session.tuning or self.panel.checking_source:
            return  # Start is greyed meanwhile; a shortcut pressed as it greys changes nothing
        if not self.panel.recheck_source() and self.panel.error_field == "source":
            return  # the data went away or changed since it was chosen: said under the Data control
        if self.panel.checking_source:  # a file chosen is a folder now: its check (off this thread) comes first
            return
        if (problem := self.panel.start_from_problem()) is not None:  # a dialog, not a failed row per Start
            dialogs.show_error(self._window, "Cannot start", problem)
            return
        cfg = self._settings_or_explain()
        if cfg is None:
            return
        if (problem := self.panel.resume_budget_problem(cfg)) is not None:  # as Continue says it: no failed row
            dialogs.show_error(self._window, "Cannot start", problem)
            return
        cfg = self._offer_fitting_split(cfg)
        if cfg is None:
            return
        try:
            record = self.session.start(cfg, self.panel.nproc)
        except SpeedboardError as exc:
            dialogs.show_error(self._window, "Cannot start", str(exc))
            return
        self.checkpoints.started(record, cfg)

    def _offer_fitting_split(self, cfg: RunConfig) -> RunConfig | None:
        """When the micro-batch cannot fit, offer the largest that does with the same effective batch:
        Yes sets it in the settings, No starts as set (and the run says why it cannot)."""
        nproc = self.panel.nproc
        try:
            # Arithmetic, and the device's memory: no tensor, no probe. On a CPU a split fits in half the free RAM
            # (core.memory_budget.CPU_RAM_SHARE): a run of one process trains in this one, which running out
            # of RAM would end.
            fit = fit_run_config(cfg, nproc, self.panel.start_lineage)
        except SpeedboardError:
            return cfg  # not even micro-batch 1 fits, or no such device: the run explains it
        if not fit.changed:
            return cfg
        sequences = cfg.train.sequences_per_step(nproc)
        if not dialogs.offer_fitting_split(self._window, fit.reason, fit.micro_batch, fit.accum_steps, sequences,
                                           fit.refused):
            return None if fit.refused else cfg  # as set it would only fail: nothing starts
        self.panel.micro_batch.setValue(fit.micro_batch)
        self.panel.accum.setValue(fit.accum_steps)
        self.log.add(f"micro-batch {cfg.train.micro_batch} × accumulation {cfg.train.accum_steps} does not fit: "
                     f"set to {fit.micro_batch} × {fit.accum_steps}, the same effective batch")
        return self._settings_or_explain()

    def _note_what_continue_keeps(self, parent: RunRecord) -> None:
        """Continue trains the parent's model on the parent's data with the panel's training settings: where the
        panel shows another preset or other data, the log says which values the continued run keeps."""
        data, shown = parent.config.get("data", {}), self.panel.shown_model_and_data()
        kept = [f"{what} {theirs}" for what, theirs, ours in (
            ("preset", parent.config.get("preset"), shown["preset"]),
            ("data", data.get("source"), shown["source"]),
            ("layout", data.get("layout"), shown["layout"]),
            ("sequence length", data.get("seq_len"), shown["seq_len"])) if theirs is not None and theirs != ours]
        if kept:
            self.log.add(f"Continue keeps {parent.label}'s model and data ({', '.join(kept)}); the settings shown "
                         f"for them apply to Start")

    def pause(self) -> None:
        self.session.pause()
        key = self.session.active.key if self.session.active is not None else None
        self.status.showMessage("Pausing after the current optimizer step …", 5_000,
                                until=lambda r: r.key != key or r.state == "paused" or r.ended
                                or not self.session.paused)  # or withdrawn: Resume before the pause came
        self._update_controls()

    def pause_or_resume(self) -> None:
        if self.session.running and not self.session.in_processes:
            (self.resume if self.session.paused else self.pause)()

    def resume(self) -> None:
        self.session.resume()
        self._update_controls()

    def stop(self) -> None:
        if not self.session.running or self.session.ending or self.session.stopping:  # (a shortcut, the menu)
            return
        self.session.stop()
        # The run's state in the status bar says what the stop does (a message beside it said it again: both
        # were cut to fit).
        self.status.clearMessage()
        self._update_controls()

    def continue_run(self) -> None:
        settings = self.panel.committed_continue_config()  # the training settings: the parent keeps its model and data
        if settings is None:
            dialogs.show_error(self._window, "Invalid settings", self.panel.continue_error)
            return
        if self.session.running:
            active = self.session.active
            key = active.key if active is not None else None
            if active is not None and active.before_training:  # stopped now, it would leave nothing to go on from
                paused_before = " (paused before its first step)" if active.state == "paused" else ""
                dialogs.show_error(self._window, "Cannot continue",
                                   f"{active.label} is still being set up{paused_before}: it has trained no step, "
                                   f"so there is nothing to continue from yet. Wait for its first step, or stop it "
                                   f"and start again.")
                return
            if active is not None:
                # Judged before the run is stopped: a budget it has already passed, or its data gone, stops nothing.
                plan, problem = continue_plan(active, settings, self.panel.nproc)
                problem = problem or parent_data_gone(active)
                if problem:
                    dialogs.show_error(self._window, "Cannot continue", problem)
                    return
                self._note_what_continue_keeps(active)
                self.log.add(plan)
            self.session.stop_then_continue(settings, self.panel.nproc)
            self.status.showMessage("Stopping; the run then continues with these settings …", 10_000,
                                    until=lambda r: r.key != key)  # the continued run is in focus
            self._update_controls()
            return
        selected = self.table.selected_keys()
        if len(selected) > 1:  # (Continue is greyed then; its shortcut as the selection grows)
            dialogs.show_error(self._window, "Cannot continue", several_selected(len(selected)))
            return
        source = self.session.continue_source(selected)
        if len(selected) == 1 and (source is None or source.key not in selected):
            # The run picked cannot be continued: said, not another run's weights taken in its stead.
            # Ended with a checkpoint, it would be the source: it has not ended, or it saved none.
            picked = self.session.record(next(iter(selected)))
            last = (f"; its last one, {picked.checkpoints[-1]}, can be resumed (File, Load weights…)"
                    if picked.checkpoints else "")  # periodic ones, but not the final one Continue starts from
            if picked.state == "not running":  # its writer is gone without an ending: it never will end
                why = ("it is not running and recorded no ending (killed, or its machine stopped), so it has no "
                       "final checkpoint" + (last or " and it saved no other"))
            elif not picked.ended:
                why = "it is still training"
            elif last:
                why = f"it {picked.state} at step {picked.step:,} without a final checkpoint{last}"
            else:
                why = "it saved no checkpoint (it failed or was stopped before its first one)"
            dialogs.show_error(self._window, "Cannot continue",
                               f"{picked.label} cannot be continued: {why}. Select a run that has a final "
                               f"checkpoint, or none to continue the latest.")
            return
        if source is None:
            dialogs.show_error(self._window, "Nothing to continue", "Finish or stop a run first: Continue starts from "
                                                            "its final checkpoint.")
            return
        plan, problem = continue_plan(source, settings, self.panel.nproc)
        try:
            cfg = None if problem else self.session.continue_config(source, settings)
        except SpeedboardError as exc:
            problem = str(exc)
        if problem:  # refused before anything is said in the log of what Continue trains
            dialogs.show_error(self._window, "Cannot continue", problem)
            return
        self._note_what_continue_keeps(source)
        self.log.add(plan)
        try:
            self.session.start(cfg, self.panel.nproc, source)
        except SpeedboardError as exc:  # its processes could not be set up: the log's plan line is answered
            self.log.add(f"Continue did not start: {exc}", "error")
            dialogs.show_error(self._window, "Cannot continue", str(exc))


def several_selected(count: int) -> str:
    """Why Continue does not start with several runs selected: which of them it would go on from is not said."""
    return f"{count} runs are selected: select the one to continue, or none to continue the latest"


def continue_plan(parent: RunRecord, settings: RunConfig, nproc: int = 1) -> tuple[str, str]:
    """What Continue will train (as ``core.schedule.make_schedule`` decides it), and why it cannot (or "").

    A parent that finished its budget gets one more budget, a new cosine from the peak learning rate without
    warmup; one that stopped early goes on to its own budget, or to a new total given in the same unit. Both
    horizons are in tokens: a new effective batch changes the steps they take, which the plan counts."""
    tc, theirs = settings.train, parent.train
    budget = f"{tc.budget:,g} {tc.budget_kind}"
    # The continued run keeps the parent's sequence length; the panel's batch and processes apply.
    per_step = tc.sequences_per_step(nproc) * (parent.config.get("data", {}).get("seq_len") or settings.data.seq_len)

    def counted(how_much: str) -> str:
        # A parent still training goes on until it stops, a step or (several processes) a few later: no count yet.
        return how_much if parent.ended else "from the step it stops at"

    def more(tokens: int) -> str:
        return counted(f"{tokens:,} tokens more: {-(-tokens // per_step):,} steps of {per_step:,} tokens")

    if parent.state == "finished":
        return (f"Continue: {budget} more after {parent.label}'s step {parent.step:,}, a new cosine from the peak "
                f"learning rate {tc.lr:g} without warmup"), ""
    if (theirs.get("budget_kind"), theirs.get("budget")) == (tc.budget_kind, tc.budget):
        if parent.budget_tokens > parent.tokens:
            return (f"Continue: {parent.label} goes on to its budget of {parent.budget_tokens:,} tokens "
                    f"({more(parent.budget_tokens - parent.tokens)})"), ""
        return f"Continue: {parent.label} goes on to its budget", ""
    where = "stopped at" if parent.ended else "is at"
    if tc.budget_kind == "steps" and tc.budget <= parent.step:
        return "", (f"a budget of {budget} is already used up: {parent.label} {where} step {parent.step:,}; "
                    f"give a larger budget (the steps in all, counted from its start)")
    if tc.budget_kind == "tokens" and tc.budget <= parent.tokens:
        return "", (f"a budget of {budget} is already used up: {parent.label} {where} {parent.tokens:,} tokens "
                    f"(step {parent.step:,}); give a larger budget (the tokens in all, counted from its start)")
    # A new total inside the warmup the lineage keeps is refused by the run (core.schedule): said here, before the
    # run is stopped. Where the warmup ends is the parent's own record (its lineage's, for a continued one); a
    # folder of an older writer that did not record it: its own warmup, unless it was itself continued.
    warmed = parent.warmup_end_tokens
    if warmed is None and not parent.config.get("resume"):
        warmed = int(float(theirs.get("warmup_ratio") or 0.0) * parent.budget_tokens)
    if warmed is not None and tc.budget_kind in ("steps", "tokens"):
        end = (parent.tokens + (int(tc.budget) - parent.step) * per_step if tc.budget_kind == "steps"
               else int(tc.budget))
        if end <= warmed:
            return "", (f"a budget of {budget} ends inside {parent.label}'s learning-rate warmup (to {warmed:,} "
                        f"tokens): it would never reach its peak or decay; give a budget past the warmup")
    plan = f"Continue: {parent.label} goes on along its schedule to {budget} in all"
    if tc.budget_kind == "steps":
        return f"{plan} ({counted(f'{int(tc.budget) - parent.step:,} steps more')})", ""
    if tc.budget_kind == "tokens":
        return f"{plan} ({more(int(tc.budget) - parent.tokens)})", ""
    return plan, ""
