"""The live monitor: follows the traces while the job runs and proves deadlocks.

Every poll reads the new trace records.  When some rank has stopped making progress,
it rebuilds the wait-for graph; a deadlock set found in two consecutive polls with no
progress by any of its members is a proof (each member waits only on members or on
exited ranks, and none of them moved), so no timeout is involved.  The hang timeout is
only the last resort for hangs outside communication.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from dl2.analysis import analyze
from dl2.analysis.report import Report
from dl2.live.launcher import Job
from dl2.live.launcher import process_alive
from dl2.live.tailer import TraceTailer
from dl2.model.execution_graph import build_execution_graph
from dl2.model.wait_for import build_wait_for_graph
from dl2.trace.session import ALIVE
from dl2.trace.session import EXITED
from dl2.trace.session import FAILED
from dl2.trace.session import Session
from dl2.trace.session import build_session

ON_DEADLOCK = ("abort", "report", "wait")


@dataclass(frozen=True)
class MonitorOptions:
    """How the monitor behaves.

    Attributes:
        poll_interval: seconds between polls.
        hang_timeout: stop the job after this many seconds without progress by any rank.
        suspect_after: report ranks others wait on that are quiet this long.
        on_deadlock: "abort" (stop the job), "report" (print, keep running) or "wait".
    """

    poll_interval: float = 0.2
    hang_timeout: float = 60.0
    suspect_after: float = 60.0
    on_deadlock: str = "abort"


@dataclass(frozen=True)
class Outcome:
    """How the monitored run ended.

    Attributes:
        report: the analysis of the final (or deadlocked) state; None if no rank traced.
        reason: "finished", "deadlock", "hang-timeout", "rank-failed" or "interrupted".
        job_exit_code: the job's own exit status (after a stop: what the processes returned).
        detected_after: seconds from the last progress of the deadlocked ranks to the
            verdict, when a deadlock was proven live.
    """

    report: Report | None
    reason: str
    job_exit_code: int
    detected_after: float | None = None


class Monitor:
    """Follows one job's run directory until the job ends or a verdict stops it."""

    def __init__(
        self,
        run_dir: Path,
        job: Job,
        options: MonitorOptions,
        on_report: Callable[[Report], None] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.job = job
        self.options = options
        self.on_report = on_report
        self.tailer = TraceTailer(run_dir)
        self._alive_at_stop: set[int] = set()
        self._last_change: dict[int, float] = {}
        self._last_progress: dict[int, int] = {}
        self._reported: frozenset[int] = frozenset()

    # -- process states ---------------------------------------------------------------
    def process_states(self) -> dict[int, str]:
        """rank -> ALIVE / EXITED / FAILED as far as this host can tell."""
        states: dict[int, str] = {}
        if self.job.ranked:
            for rank, code in self.job.poll().items():
                if code is None or rank in self._alive_at_stop:
                    states[rank] = ALIVE
                else:
                    states[rank] = EXITED if code == 0 else FAILED
            return states
        ended = {
            t.rank for t in self.tailer.traces() if t.records and t.records[-1].get("k") == "end"
        }
        for rank, pid in self.tailer.pids().items():
            if rank in self._alive_at_stop or process_alive(pid):
                states[rank] = ALIVE
            else:
                states[rank] = EXITED if rank in ended else FAILED
        return states

    def session(self) -> Session:
        return build_session(
            self.tailer.traces(),
            self.process_states(),
            run_dir=str(self.run_dir),
            warnings=list(self.tailer.errors),
        )

    def quiet(self, now: float) -> dict[int, float]:
        return {rank: now - t for rank, t in self._last_change.items()}

    def analyze(self, session: Session) -> Report:
        return analyze(
            session,
            quiet=self.quiet(time.monotonic()),
            suspect_after=self.options.suspect_after,
        )

    # -- the loop ---------------------------------------------------------------------
    def _note_progress(self, now: float) -> bool:
        """Update per-rank progress clocks; True if any rank progressed."""
        moved = False
        for rank, count in self.tailer.progress().items():
            if self._last_progress.get(rank) != count:
                self._last_progress[rank] = count
                self._last_change[rank] = now
                moved = True
        return moved

    def stop_job(self) -> None:
        states = self.process_states()
        self._alive_at_stop = {r for r, s in states.items() if s == ALIVE}
        self.job.stop(
            extra_pids=[p for r, p in self.tailer.pids().items() if r in self._alive_at_stop]
        )

    def run(self) -> Outcome:
        """Follow the job; returns when it ends or a verdict stopped it."""
        opts = self.options
        candidate: tuple[frozenset[int], dict[int, int]] | None = None
        last_any_progress = time.monotonic()
        next_check = 0.0
        try:
            while True:
                finished = self.job.finished()
                self.tailer.refresh()
                now = time.monotonic()
                if self._note_progress(now):
                    last_any_progress = now
                if finished:
                    break
                states = self.process_states()
                if self.job.ranked and FAILED in states.values():
                    # Like torchrun: a failed rank ends the job; analyse what the others do.
                    self.stop_job()
                    return self._final("rank-failed")
                quiet_now = [
                    r for r, t in self._last_change.items() if now - t >= opts.poll_interval / 2
                ]
                if now >= next_check and (quiet_now or any(s != ALIVE for s in states.values())):
                    session = build_session(self.tailer.traces(), states)
                    graph = build_execution_graph(session)
                    deadlocked = build_wait_for_graph(session, graph).deadlocked
                    # Keep the monitor's share of a core small on long traces.
                    next_check = now + 4 * (time.monotonic() - now)
                    snapshot = {r: self._last_progress.get(r, 0) for r in deadlocked}
                    if deadlocked and candidate is not None and candidate == (deadlocked, snapshot):
                        outcome = self._on_deadlock(deadlocked, session, now)
                        if outcome is not None:
                            return outcome
                    candidate = (deadlocked, snapshot) if deadlocked else None
                if now - last_any_progress >= opts.hang_timeout and self._last_change:
                    self.stop_job()
                    return self._final("hang-timeout")
                time.sleep(opts.poll_interval)
        except KeyboardInterrupt:
            self.stop_job()
            return self._final("interrupted")
        return self._final("finished")

    def _on_deadlock(
        self, deadlocked: frozenset[int], session: Session, now: float
    ) -> Outcome | None:
        if deadlocked == self._reported or self.options.on_deadlock == "wait":
            return None
        latest = max(self._last_change.get(r, now) for r in deadlocked)
        report = self.analyze(session)
        if self.options.on_deadlock == "report":
            self._reported = deadlocked
            if self.on_report is not None:
                self.on_report(report)
            return None
        self.stop_job()
        return Outcome(report, "deadlock", self.job.exit_code(), detected_after=now - latest)

    def _final(self, reason: str) -> Outcome:
        self.tailer.refresh()
        self._note_progress(time.monotonic())
        session = self.session()
        report = self.analyze(session) if session.traces else None
        return Outcome(report, reason, self.job.exit_code())
