"""The live monitor: follows the traces while the job runs and proves deadlocks.

Every poll reads the new trace records into the incremental model
(:mod:`dl2.live.tailer`), shares them with the other nodes' monitors
(:mod:`dl2.live.multinode`) and notes which ranks progressed (:mod:`dl2.live.progress`).
When some rank sits in a communication call without progress, it takes a snapshot of
the wait-for graph (taken again only when something was read since the last one; it
costs the blocked ranks, not the history) and goes on with the deadlock proof
(:mod:`dl2.live.proof`: two consecutive snapshots in which no member of the deadlock
set moved), the hang suspects and the hang timeout (:mod:`dl2.live.hang`).  The proof's
snapshot is the one analysed for the report.

Faults degrade, never stop, the monitoring: a truncated record is read when complete;
a dead rank is an exited rank whose waits are orphaned; a lost store (multi-node) means
local-only analysis; a full trace directory means post-mortem analysis only, because
ranks may have stopped recording (:mod:`dl2.live.faults`).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING
from typing import Any

from dl2.analysis import analyze
from dl2.analysis.ending import cycle_despite_threads
from dl2.live.faults import recording_fault
from dl2.live.hang import HangSuspects
from dl2.live.hang import all_stuck
from dl2.live.launcher import Job
from dl2.live.launcher import has_children
from dl2.live.launcher import process_alive
from dl2.live.launcher import starting_ranks
from dl2.live.multinode import NodeLink
from dl2.live.progress import ProgressClocks
from dl2.live.proof import DeadlockProof
from dl2.live.proof import Snapshot
from dl2.live.proof import Snapshots
from dl2.live.proof import Step
from dl2.live.proof import ranks_text
from dl2.live.shared import SharedState
from dl2.live.tailer import TraceTailer
from dl2.model.incremental import DEFAULT_WINDOW
from dl2.model.stuck import RankStatus
from dl2.model.wait_for import other_threads
from dl2.notice import notice as default_notice
from dl2.record.writer import read_exits
from dl2.record.writer import rendezvous_mark
from dl2.report import Report
from dl2.report import Verdict
from dl2.trace.session import ALIVE
from dl2.trace.session import ENDED_BADLY
from dl2.trace.session import EXITED
from dl2.trace.session import FAILED
from dl2.trace.session import KILLED
from dl2.trace.session import Session
from dl2.trace.session import build_session

if TYPE_CHECKING:
    from dl2.model.execution_graph import ExecutionGraph

ON_DEADLOCK = ("abort", "report", "wait")

#: signals that end a rank from outside (its launcher, the scheduler, the user), as
#: opposed to its own crash (SIGSEGV, SIGABRT, ...)
OUTSIDE = frozenset({signal.SIGTERM, signal.SIGKILL, signal.SIGINT, signal.SIGHUP})

#: seconds to the second snapshot of a deadlock candidate (the proof does not depend on
#: the gap: it needs only that the second read of each file follows the first)
CONFIRM_S = 0.05
#: seconds the other ranks of a ``-n`` job get to end on their own after one failed
FAILED_GRACE_S = 1.0
#: seconds a deadlock set must stay unchanged when a member seems inside an async call:
#: the recorder holds back the return of an async op to share the next write, and its
#: watchdog writes it within 0.2 s when none follows, so such a member may be running
#: (its peers stopped a correct job 0.05 s after it issued an all_reduce, async_op=True)
ISSUE_GRACE_S = 1.0
#: seconds a deadlock set must stay unchanged when a member is held only by one look of
#: its watchdog (a ``state`` record saying "comm": stalled on pending works): one look
#: is one instant, and a rank that runs on is seen to within a period (0.2 s), when the
#: next look writes what it does then
STATE_GRACE_S = 0.5


def _held_by_state(graph: ExecutionGraph, rank: int) -> bool:
    """Whether the rank is held only by a watchdog ``state`` record (no open call) that
    one look may have made: "comm" (a frame of a wait, seen once).  "backward" and
    "poll" are already the word of several looks (still for 2 s, polls in 5 ticks)."""
    timeline = graph.timelines.get(rank)
    if timeline is None or timeline.blocked is None or timeline.blocked.how != "stall":
        return False
    state = timeline.last_state
    return state is not None and state.where == "comm"


def _issuing(graph: ExecutionGraph, rank: int) -> bool:
    """Whether the rank seems inside the issue of async ops (recorded, not returned)."""
    timeline = graph.timelines.get(rank)
    blocked = timeline.blocked if timeline is not None else None
    return (
        blocked is not None
        and blocked.how == "call"
        and all(op.is_async and not op.issued for op in blocked.ops)
    )


@dataclass(frozen=True)
class MonitorOptions:
    """How the monitor behaves.

    Attributes:
        poll_interval: seconds between polls.
        hang_timeout: stop the job after this many seconds in which every live rank
            sat in communication with no progress and no deadlock could be proven.
        suspect_after: report ranks others wait on that are quiet this long.
        on_deadlock: "abort" (stop the job), "report" (print, keep running) or "wait".
        low_space_bytes: below this much free space in the trace directory, ranks may
            lose records: live verdicts stop, the traces are analysed after the job.
        ack_timeout: seconds the reporting node waits for the other nodes' monitors to
            see its verdict before stopping its own ranks.
        window: ops the model keeps before it folds finished history (see
            :class:`dl2.model.incremental.Model`): the monitor's memory bound.
        hazards: also report hazards the run did not hit (see :func:`dl2.analysis.analyze`).
    """

    poll_interval: float = 0.2
    hang_timeout: float = 60.0
    suspect_after: float = 60.0
    on_deadlock: str = "abort"
    low_space_bytes: int = 1 << 20
    ack_timeout: float = 5.0
    window: int | None = DEFAULT_WINDOW
    hazards: bool = True


@dataclass(frozen=True)
class Outcome:
    """How the monitored run ended.

    Attributes:
        report: the analysis of the final (or deadlocked) state; None if no rank traced.
        reason: "finished", "deadlock", "hang-timeout", "rank-failed", "interrupted" or
            "remote-verdict" (another node's monitor reported and stopped the job).
        job_exit_code: the job's own exit status (after a stop: what the processes returned).
        detected_after: seconds from the last progress of the deadlocked ranks to the
            verdict, when a deadlock was proven live.
        verdict_wall_time: ``time.time()`` when the deadlock was proven live.
        notes: what degraded the monitoring (for the report's warnings).
        remote: the verdict another node's monitor published (reason "remote-verdict").
        remote_report: that monitor's JSON report, if it published one.
        deadlocked: the deadlock set proven live (reason "deadlock").
        states: every rank's process state at the end (ALIVE: stopped by dl2).
        quiet: seconds since each rank's last progress, at the end.
        graph: the execution graph of the traces as last read (for the HTML report's
            timeline); nothing reads the traces after it was taken.
        stop_note: why dl2 stopped the job, when more is known than ``reason`` says.
        read_upto: when dl2 stopped the job, file name -> the bytes of it read then
            (all the analysis read: see :func:`dl2.trace.session.read_limits`).
    """

    report: Report | None
    reason: str
    job_exit_code: int
    detected_after: float | None = None
    verdict_wall_time: float | None = None
    notes: tuple[str, ...] = ()
    remote: Mapping[str, Any] | None = None
    remote_report: str | None = None
    deadlocked: tuple[int, ...] = ()
    states: Mapping[int, str] | None = None
    quiet: Mapping[int, float] | None = None
    graph: ExecutionGraph | None = None
    stop_note: str | None = None
    read_upto: Mapping[str, int] | None = None


class Monitor:
    """Follows one job's run directory until the job ends or a verdict stops it.

    Args:
        run_dir: where the job's ranks write their traces.
        job: the launched processes.
        options: see :class:`MonitorOptions`.
        on_report: shows a report while the job keeps running (``--on-deadlock report``).
        notice: prints a one-line status message (default: ``dl2: ...`` on stderr).
        shared: the link to the other nodes' monitors (multi-node jobs), or None.
        render_json: renders a report as JSON, to publish it to the other nodes.
    """

    def __init__(
        self,
        run_dir: Path,
        job: Job,
        options: MonitorOptions,
        on_report: Callable[[Report], None] | None = None,
        notice: Callable[[str], None] | None = None,
        shared: SharedState | None = None,
        render_json: Callable[[Report], str] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.job = job
        self.options = options
        self.on_report = on_report
        self.notice = notice or default_notice
        self.shared = shared
        self.tailer = TraceTailer(run_dir, keep_outbox=shared is not None, window=options.window)
        self.notes: list[str] = []
        self.clocks = ProgressClocks(time.monotonic())
        self.snapshots = Snapshots()
        #: rank -> (its oldest open call, when the monitor first saw it open)
        self._oldest_calls: dict[int, tuple[int, float]] = {}
        self.proof = DeadlockProof()
        self.suspects = HangSuspects(self.notice)
        self.nodes = NodeLink(
            shared,
            self.tailer,
            self.notice,
            self.notes,
            on_drop=self._drop_ranks,
            render_json=render_json,
            ack_timeout=options.ack_timeout,
        )
        self._alive_at_stop: set[int] = set()
        self._frozen = False  # dl2 stopped the job: what ranks write after is not read
        self._read_upto: dict[str, int] | None = None  # the bytes read of each file then
        self._reported: frozenset[int] = frozenset()
        self._degraded: str | None = None
        self._failed_at: float | None = None
        self._confirm_soon = False
        self._behind_noted = False  # ranks outlived the launched command: said once
        self._starting_noted = False  # processes not yet ranks held the hang timeout

    # -- process states ---------------------------------------------------------------
    def process_states(self) -> dict[int, str]:
        """rank -> ALIVE / EXITED / FAILED / KILLED as far as this host can tell (KILLED:
        a child rank ended by a signal from outside; other ranks' signals are unknown)."""
        states: dict[int, str] = {}
        if self.job.ranked:
            for rank, code in self.job.poll().items():
                if code is None or rank in self._alive_at_stop:
                    states[rank] = ALIVE
                else:
                    states[rank] = EXITED if code == 0 else KILLED if -code in OUTSIDE else FAILED
            return states
        # ended cleanly: an ``end`` record without an uncaught exception (Python exits
        # with status 1 after one)
        raised = self.tailer.raised()
        ended = self.tailer.ended() - raised
        if self._launcher_succeeded():
            # torchrun and mp.spawn exit 0 only when every rank did: a rank gone without
            # an end record left by os._exit(0), not by a crash
            ended = set(self.tailer.pids()) - raised
        exits: dict[int, int] | None = None
        for rank, pid in self.tailer.pids().items():
            if rank in self._alive_at_stop or process_alive(pid):
                states[rank] = ALIVE
            elif rank in ended:
                states[rank] = EXITED
            else:
                if exits is None:  # read once a rank is gone without an end
                    exits = read_exits(str(self.run_dir))
                code = exits.get(pid)
                # its launcher saw it end by a signal from outside (torchrun, mp.spawn)
                killed = code is not None and code < 0 and -code in OUTSIDE
                states[rank] = KILLED if killed else FAILED
        return states

    def _left_behind(self, local: Mapping[int, str]) -> list[int]:
        """Traced ranks of this host still alive once the command dl2 launched ended."""
        if self.job.ranked:
            return []
        return sorted(r for r, s in local.items() if s == ALIVE and r not in self._alive_at_stop)

    def _launcher_succeeded(self) -> bool:
        """The command dl2 launched (a launcher of the ranks) ended by itself with 0."""
        if self.job.stopped_by_dl2:
            return False
        try:
            codes = self.job.poll()
        except Exception:
            return False
        return bool(codes) and all(code == 0 for code in codes.values())

    def all_states(self, local: Mapping[int, str] | None = None) -> dict[int, str]:
        """Every rank's state: the other nodes' as they pushed them, this node's own."""
        return {**self.nodes.remote.states, **(self.process_states() if local is None else local)}

    def session(self, ending: str | None = None) -> Session:
        """Everything read so far, with every rank's state and the read errors."""
        return build_session(
            self.tailer.traces(),
            self.all_states(),
            run_dir=str(self.run_dir),
            warnings=list(self.tailer.errors),
            ending=ending,
        )

    def quiet(self, now: float) -> dict[int, float]:
        """rank -> seconds since its last progress."""
        return self.clocks.quiet(now)

    def analyze(self, session: Session, snapshot: Snapshot | None = None) -> Report:
        """Analyse ``session``, with the graphs of ``snapshot`` when it is its snapshot."""
        return analyze(
            session,
            quiet=self.quiet(time.monotonic()),
            suspect_after=self.options.suspect_after,
            graph=snapshot.graph if snapshot is not None else self.tailer.model.graph(),
            wait_for=snapshot.wfg if snapshot is not None else None,
            hazards=self.options.hazards,
        )

    # -- the loop ---------------------------------------------------------------------
    def _note_progress(self, now: float) -> None:
        """Update the progress clocks; a rank that moved is no longer a suspect."""
        self.suspects.forget(self.clocks.update(self.tailer.progress(), now))

    def _drop_ranks(self, ranks: set[int]) -> None:
        """Forget the other nodes' ranks (the link to them is gone)."""
        self.clocks.forget(ranks)
        self.snapshots.clear()
        self.proof.reset()

    def stop_job(self) -> None:
        """Stop every rank still alive; their states stay ALIVE for the analysis.

        The traces are read one last time first and never again: what the ranks write
        while they are being stopped (gloo's "Connection closed by peer" when a peer
        dies first, the exit hook's ``end``) would tell of the stop, not of the job.
        """
        self._freeze()
        states = self.process_states()
        self._alive_at_stop = {r for r, s in states.items() if s == ALIVE}
        self.job.stop(
            extra_pids=[p for r, p in self.tailer.pids().items() if r in self._alive_at_stop]
        )

    def _freeze(self, refresh: bool = True) -> None:
        """Read the traces one last time (unless ``refresh`` is False: the verdict's
        snapshot was the last read) and never again; what was read is what a later
        ``dl2 analyze`` reads (``read_upto``)."""
        if self._frozen:
            return
        if refresh:
            self.tailer.refresh()
            self._note_progress(time.monotonic())
        self._frozen = True
        self._read_upto = self.tailer.offsets()

    def run(self) -> Outcome:
        """Follow the job; returns when it ends or a verdict stopped it."""
        try:
            while True:
                outcome = self.step()
                if outcome is not None:
                    return outcome
                pause = self.options.poll_interval
                if self._confirm_soon:
                    self._confirm_soon = False
                    pause = min(pause, CONFIRM_S)
                time.sleep(pause)
        except KeyboardInterrupt:
            self.stop_job()
            return self._final("interrupted")

    def step(self) -> Outcome | None:
        """One poll: read, share, check; an Outcome when the run is over."""
        finished = self.job.finished()
        local = self.process_states()  # before reading: an exited rank's file is complete
        now = time.monotonic()
        self.tailer.refresh(now)
        self.nodes.sync(local)
        self._note_progress(now)
        if finished:
            behind = self._left_behind(self.process_states())  # the files now read
            if not behind:
                return self._final("finished")
            code = self.job.exit_code()
            if code != 0:
                # the launcher was killed (SIGKILL leaves its ranks behind) or failed:
                # the job was ended from outside; its ranks get the grace a failed
                # rank's peers get to end on their own, then are stopped
                if self._failed_at is None:
                    self._failed_at = now
                if now - self._failed_at < FAILED_GRACE_S:
                    return None
                self.stop_job()
                status = f"signal {-code}" if code < 0 else f"status {code}"
                return self._final(
                    "interrupted",
                    f"the launched command ended ({status}) while {ranks_text(behind)} "
                    "still ran: dl2 stopped them",
                )
            if not self._behind_noted:  # a launcher that exits first: followed
                self._behind_noted = True
                self.notice(
                    f"the launched command ended, but {ranks_text(behind)} still run: "
                    "following them"
                )
        followed = self._follow_remote()
        if followed is not None:
            return followed
        if any(s in ENDED_BADLY for s in local.values()):
            # A rank died.  Its peers usually fail on their own within a second (gloo:
            # "Connection closed by peer"), and a launcher that kills its job kills every
            # rank at once, each dying in its own time: give them that second, so that
            # each rank's state is its own and ranks killed together read as such.
            if self._failed_at is None:
                self._failed_at = now
            if now - self._failed_at < FAILED_GRACE_S:
                return None
            if self.job.ranked:  # like torchrun: a failed rank ends the job
                self.stop_job()
                return self._final("rank-failed")
        self._check_faults(now, local)
        if self._degraded is not None or not self.nodes.reporting():
            return None
        return self._check(now, self.all_states(local))

    def _follow_remote(self) -> Outcome | None:
        """Stop this node's ranks on the verdict another node's monitor published."""
        remote = self.nodes.remote_verdict()
        if remote is None:
            return None
        verdict, report_json = remote
        self.stop_job()
        wall = verdict.get("wall_time")
        return Outcome(
            None,
            "remote-verdict",
            self.job.exit_code(),
            verdict_wall_time=float(wall) if isinstance(wall, int | float) else None,
            notes=tuple(self.notes),
            remote=verdict,
            remote_report=report_json,
            read_upto=self._read_upto,
        )

    def _check_faults(self, now: float, local: Mapping[int, str]) -> None:
        if self._degraded is not None:
            return
        why = recording_fault(self.run_dir, self.tailer, local, now, self.options.low_space_bytes)
        if why is not None:
            self._degraded = why
            self.proof.reset()
            message = (
                f"{why}: ranks may have stopped recording, so live detection is off; "
                "dl2 will analyse the traces after the job ends (post-mortem)"
            )
            self.notes.append(message)
            self.notice(message)

    # -- the checks on a snapshot -------------------------------------------------------
    def _check(self, now: float, states: dict[int, str]) -> Outcome | None:
        opts = self.options
        quiet_blocked = [
            r
            for r in self.tailer.possibly_blocked()
            if now - self.clocks.changed_at.get(r, now) >= opts.poll_interval / 2
        ]
        if not quiet_blocked:
            self.proof.reset()
            return self._stalled_cycle(now, states)
        model = self.tailer.model
        key = (model.version, tuple(sorted(states.items())))
        snapshot = self.snapshots.take(key, now, self.tailer.traces, states, model)
        if snapshot is None:
            return None  # keep the monitor's share of a core small on long traces
        self.suspects.report(snapshot, self.quiet(now), self.clocks.counts, opts.suspect_after)
        outcome = self._prove(snapshot, now)
        if outcome is not None:
            return outcome
        if (
            now - self.clocks.any_at >= opts.hang_timeout
            and self.clocks.changed_at
            and all_stuck(snapshot, states, self._in_rendezvous())
            and not self._ranks_starting(snapshot, states)
        ):
            return self._hang_timeout(snapshot, states)
        return self._stalled_cycle(now, states)

    def _in_rendezvous(self) -> set[int]:
        """The ranks dl2 launched that have entered torch's rendezvous (their trace may
        not exist yet: the rank hosting the store waits there for all the others)."""
        if not self.job.ranked:
            return set()
        try:
            return {
                rank
                for rank, proc in self.job.procs.items()
                if os.path.exists(rendezvous_mark(str(self.run_dir), proc.pid))
            }
        except Exception:
            return set()

    def _ranks_starting(self, snapshot: Snapshot, states: Mapping[int, str]) -> bool:
        """Under a launcher dl2 does not know the ranks of (torchrun, mp.spawn, a
        script), whether a rank without a trace may still be starting: a process of the
        job on this host, alive, that looks like a rank before ``init_process_group``
        (:func:`~dl2.live.launcher.starting_ranks`: a slow data preparation, a model
        loaded first).  The traced ranks then wait on it, as they would without dl2;
        said once."""
        if self.job.ranked or not any(
            node.status is RankStatus.NO_TRACE and states.get(rank) is None
            for rank, node in snapshot.wfg.nodes.items()
        ):
            return False
        try:
            root = next(iter(self.job.procs.values()))
            if root.poll() is not None:
                return False
            pids = starting_ranks(root.pid, self.tailer.pids().values(), self.run_dir)
        except Exception:
            return False
        if pids and not self._starting_noted:
            self._starting_noted = True
            self.notice(
                f"{len(pids)} process(es) of the job (pid {', '.join(map(str, pids))}) have "
                "not reached init_process_group yet: the hang timeout waits for them"
            )
        return bool(pids)

    def _stalled_cycle(self, now: float, states: dict[int, str]) -> Outcome | None:
        """The hang timeout of ranks blocked on each other while another of their
        threads keeps communicating (a heartbeat): their progress hides the hang from
        the job-wide clock, so each rank's oldest open call is aged on its own, and a
        cycle of calls all open for ``hang_timeout`` seconds ends the job as a hang."""
        model = self.tailer.model
        oldest: dict[int, tuple[int, float]] = {}
        for rank in self.tailer.possibly_blocked():
            rank_model = model.rank_model(rank)
            if rank_model is None or not rank_model.open_calls:
                continue
            call = next(iter(rank_model.open_calls))
            seen = self._oldest_calls.get(rank)
            oldest[rank] = seen if seen is not None and seen[0] == call else (call, now)
        self._oldest_calls = oldest
        aged = {r for r, (_, since) in oldest.items() if now - since >= self.options.hang_timeout}
        if not aged:
            return None
        key = (model.version, tuple(sorted(states.items())))
        snapshot = self.snapshots.take(key, now, self.tailer.traces, states, model)
        if snapshot is None:
            return None
        found = cycle_despite_threads(snapshot.graph, snapshot.wfg)
        if not found or not set(found[0].ranks) <= aged:
            return None
        changed = self.clocks.changed_at
        if any(
            other_threads(snapshot.graph, r) and changed.get(r, now) <= oldest[r][1]
            for r in found[0].ranks
        ):
            # a rank whose other threads wrote nothing since its call opened: they work
            # outside communication (an uploader, an evaluator) and may yet release it,
            # after any time (a hang suspect, never stopped); a heartbeat would have
            return None
        note = (
            f"dl2 stopped the job: {ranks_text(found[0].ranks)} sat blocked on each "
            f"other for {self.options.hang_timeout:g} s while other threads of theirs kept "
            "communicating"
        )
        return self._hang_timeout(snapshot, states, note)

    def _prove(self, snapshot: Snapshot, now: float) -> Outcome | None:
        deadlocked = snapshot.wfg.deadlocked
        if deadlocked and self._store_keys_may_come_from_outside(snapshot):
            deadlocked = frozenset()
        graph = snapshot.graph
        grace = (
            ISSUE_GRACE_S
            if any(_issuing(graph, r) for r in deadlocked)
            else STATE_GRACE_S
            if any(_held_by_state(graph, r) for r in deadlocked)
            else 0.0
        )
        step = self.proof.observe(
            deadlocked,
            self.clocks.counts,
            writing=self.tailer.partial,
            fresh=self.nodes.fresh,
            bump=self.nodes.bump,
            now=now,
            grace=grace,
        )
        if step is Step.CANDIDATE:
            self._confirm_soon = True
        if step is not Step.PROVEN:
            return None
        return self._on_deadlock(snapshot.wfg.deadlocked, snapshot, now)

    def _store_keys_may_come_from_outside(self, snapshot: Snapshot) -> bool:
        """The deadlock set waits only on store keys, and a rank here has a child process
        alive, which may set them (a helper a rank started): no proof then; the hang
        timeout still ends a job that stays stuck."""
        wfg = snapshot.wfg
        nodes = [wfg.nodes[r] for r in wfg.deadlocked]
        if not all(c.reason == "store" for node in nodes for c in node.clauses):
            return False
        return any(has_children(pid) for pid in self.tailer.pids().values())

    def _on_deadlock(
        self, deadlocked: frozenset[int], snapshot: Snapshot, now: float
    ) -> Outcome | None:
        if deadlocked == self._reported or self.options.on_deadlock == "wait":
            return None
        wall = time.time()
        latest = max(self.clocks.changed_at.get(r, now) for r in deadlocked)
        keep_running = self.options.on_deadlock == "report"
        # a job that ends here is read as a later `dl2 analyze` of the run reads it (its
        # ending "deadlock": ranks blocked beside the cycle are hangs too)
        session = snapshot.session if keep_running else replace(snapshot.session, ending="deadlock")
        report = self.analyze(session, snapshot)
        self._reported = deadlocked
        verdict = {
            "reason": "deadlock",
            "exit_code": report.exit_code,
            "verdict": report.verdict.value,
            "ranks": sorted(deadlocked),
            "wall_time": wall,
        }
        if keep_running:
            self.notice(
                f"deadlock proven among {ranks_text(deadlocked)}; the job keeps running "
                "(--on-deadlock report)"
            )
            if self.on_report is not None:
                self.on_report(report)
            self.nodes.publish(dict(verdict, action="report"), report)
            return None
        # the snapshot proven is what a later analysis reads: not what the ranks write
        # once the other nodes' monitors, told below, stop theirs ("Connection closed")
        self._freeze(refresh=False)
        self.nodes.publish(dict(verdict, action="abort"), report)
        self.stop_job()
        return Outcome(
            report,
            "deadlock",
            self.job.exit_code(),
            detected_after=now - latest,
            verdict_wall_time=wall,
            notes=tuple(self.notes),
            deadlocked=tuple(sorted(deadlocked)),
            graph=self.tailer.model.graph(),
            read_upto=self._read_upto,
        )

    def _hang_timeout(
        self, snapshot: Snapshot, states: Mapping[int, str], note: str | None = None
    ) -> Outcome:
        if self.nodes.sharing:  # the other nodes get this snapshot's report
            # read before they stop their ranks, whose peers here then fail
            self._freeze()
            report = self.analyze(snapshot.session, snapshot)
            self.nodes.publish(
                {
                    "action": "abort",
                    "reason": "hang-timeout",
                    "exit_code": report.exit_code if report.verdict is not Verdict.OK else 1,
                    "ranks": sorted(r for r, s in states.items() if s == ALIVE),
                    "wall_time": time.time(),
                },
                report,
            )
        self.stop_job()
        return self._final("hang-timeout", note)

    # -- the end ------------------------------------------------------------------------
    def _final(self, reason: str, stop_note: str | None = None) -> Outcome:
        if not self._frozen:
            self.tailer.refresh()
            self._note_progress(time.monotonic())
        if reason == "finished":
            self.nodes.finish()
        session = self.session(ending=reason)
        report = self.analyze(session) if session.traces else None
        return Outcome(
            report,
            reason,
            self.job.exit_code(),
            notes=tuple(self.notes),
            states=dict(session.process_states),
            quiet=self.quiet(time.monotonic()),
            graph=self.tailer.model.graph(),
            stop_note=stop_note,
            read_upto=self._read_upto,
        )
