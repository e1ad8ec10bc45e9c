"""The live monitor: follows the traces while the job runs and proves deadlocks.

Every poll reads the new trace records.  When some rank sits in a communication call
without progress, it rebuilds the wait-for graph (only when something was read since
the last build).  A deadlock set found in two consecutive snapshots with no progress by
any of its members, the second read after the first, is a proof: each member waits only
on members or on exited ranks, and the members' records, unchanged between the two
reads, describe them all at one instant between the reads (each op is recorded before
it is issued, so no member can have matched another's op unseen).  No timeout is
involved, and the second snapshot is taken ``CONFIRM_S`` after the first.

A rank others wait on that is itself outside communication (computing, in I/O, on a
lock) is a *hang suspect*: reported once, with its stack, after ``suspect_after``
seconds; it never produces a verdict and never stops the job.  The hang timeout stops
a job only when every live rank has sat in communication with no progress for that
long and no deadlock could be proven (a hang dl2 cannot explain).

Faults degrade, never stop, the monitoring: a truncated record is read when complete;
a dead rank is an exited rank whose waits are orphaned; a lost store (multi-node) means
local-only analysis; a full trace directory means post-mortem analysis only, because
ranks may have stopped recording.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from pathlib import Path
from typing import Any

from dl2.analysis import analyze
from dl2.analysis.deadlock import hang_suspect_findings
from dl2.analysis.deadlock import suspect_stack
from dl2.live.launcher import Job
from dl2.live.launcher import process_alive
from dl2.live.shared import CONNECT_DEADLINE_S
from dl2.live.shared import SharedState
from dl2.live.tailer import TraceTailer
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.execution_graph import build_execution_graph
from dl2.model.wait_for import WaitForGraph
from dl2.model.wait_for import build_wait_for_graph
from dl2.notice import notice as default_notice
from dl2.report import Finding
from dl2.report import Report
from dl2.report import Verdict
from dl2.trace.session import ALIVE
from dl2.trace.session import EXITED
from dl2.trace.session import FAILED
from dl2.trace.session import Session
from dl2.trace.session import build_session

ON_DEADLOCK = ("abort", "report", "wait")

#: a trace file that ends in a partial line this long, its rank alive, lost a write
PARTIAL_WRITE_S = 2.0
#: seconds to the second snapshot of a deadlock candidate (the proof does not depend on
#: the gap: it needs only that the second read of each file follows the first)
CONFIRM_S = 0.05
#: seconds the other ranks of a ``-n`` job get to end on their own after one failed
FAILED_GRACE_S = 1.0
#: stack frames printed with a hang suspect
SUSPECT_STACK_FRAMES = 8


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
    """

    poll_interval: float = 0.2
    hang_timeout: float = 60.0
    suspect_after: float = 60.0
    on_deadlock: str = "abort"
    low_space_bytes: int = 1 << 20
    ack_timeout: float = 5.0


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


@dataclass(frozen=True)
class _Candidate:
    """A deadlock set seen once, with its members' progress counts at that read."""

    deadlocked: frozenset[int]
    counts: tuple[tuple[int, int], ...]
    req: int  # the store's ``req`` value published after this snapshot (multi-node)


@dataclass
class _Built:
    """The graphs of the last snapshot, and what it was built from."""

    key: tuple[Any, ...]
    session: Session
    graph: ExecutionGraph
    wfg: WaitForGraph


@dataclass
class _Remote:
    """What the other nodes' monitors last pushed."""

    states: dict[int, str] = field(default_factory=dict)
    seen: dict[int, int] = field(default_factory=dict)
    nodes: dict[int, int] = field(default_factory=dict)


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
        self.render_json = render_json
        self.tailer = TraceTailer(run_dir, keep_outbox=shared is not None)
        self.notes: list[str] = []
        self._alive_at_stop: set[int] = set()
        self._last_change: dict[int, float] = {}
        self._last_progress: dict[int, int] = {}
        self._reported: frozenset[int] = frozenset()
        self._suspects: dict[int, int] = {}  # rank -> its progress count when reported
        self._degraded: str | None = None
        self._remote = _Remote()
        self._built: _Built | None = None
        self._candidate: _Candidate | None = None
        self._next_check = 0.0
        self._all_blocked = False
        self._last_any_progress = time.monotonic()
        self._shared_started = False
        self._ranks_seen_at: float | None = None
        self._store_gone = False
        self._failed_at: float | None = None
        self._confirm_soon = False

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
        ended = self.tailer.ended()
        for rank, pid in self.tailer.pids().items():
            if rank in self._alive_at_stop or process_alive(pid):
                states[rank] = ALIVE
            else:
                states[rank] = EXITED if rank in ended else FAILED
        return states

    def all_states(self, local: Mapping[int, str] | None = None) -> dict[int, str]:
        """Every rank's state: the other nodes' as they pushed them, this node's own."""
        return {**self._remote.states, **(self.process_states() if local is None else local)}

    def session(self) -> Session:
        return build_session(
            self._traces(),
            self.all_states(),
            run_dir=str(self.run_dir),
            warnings=list(self.tailer.errors),
        )

    def _traces(self) -> list[Any]:
        return self.tailer.traces()

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
                self._suspects.pop(rank, None)
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
        self._sync(local)
        if self._note_progress(now):
            self._last_any_progress = now
        if finished:
            return self._final("finished")
        followed = self._follow_remote()
        if followed is not None:
            return followed
        if self.job.ranked and FAILED in local.values():
            # Like torchrun: a failed rank ends the job.  Its peers usually fail on their
            # own within a second (gloo: "Connection closed by peer"); give them that, so
            # each rank's state is its own, then stop the rest and analyse.
            if self._failed_at is None:
                self._failed_at = now
            if now - self._failed_at < FAILED_GRACE_S:
                return None
            self.stop_job()
            return self._final("rank-failed")
        self._check_faults(now, local)
        if self._degraded is not None or not self._reporting():
            return None
        return self._check(now, self.all_states(local))

    # -- multi-node ---------------------------------------------------------------------
    def _sync(self, local: Mapping[int, str]) -> None:
        shared = self.shared
        if shared is None:
            return
        if not self._shared_started:
            shared.start()  # importing torch takes seconds: start at once
            self._shared_started = True
        if not shared.ready and shared.lost is None and self.tailer.local_ranks():
            if self._ranks_seen_at is None:
                self._ranks_seen_at = time.monotonic()
            elif time.monotonic() - self._ranks_seen_at > CONNECT_DEADLINE_S:
                failed = shared.give_up()
                self._store_gone = True
                self._drop_remote(f"cannot reach the job's store at {shared.address} ({failed})")
                self.notice(
                    f"cannot reach the job's store at {shared.address} ({failed}); "
                    "local-only analysis of this node's ranks"
                )
        if shared.lost is None:
            pulled = shared.sync(self.tailer, local, read_files=0 in self.tailer.local_ranks())
            if pulled is not None:
                self._remote.states = dict(pulled.states)
                self._remote.seen = dict(pulled.seen)
                self._remote.nodes = dict(pulled.rank_nodes)
                return
        if shared.lost is not None and not self._store_gone:
            self._store_gone = True
            mine = self.tailer.local_ranks()
            if mine and mine <= self.tailer.ended() | {r for r, s in local.items() if s != ALIVE}:
                return  # this node's ranks are done: the store went with the job
            self._drop_remote(f"the job's store at {shared.address} was lost ({shared.lost})")
            self.notice(
                f"lost the job's store at {shared.address} ({shared.lost}); continuing with "
                "local-only analysis of this node's ranks"
            )

    def _drop_remote(self, why: str) -> None:
        names = self.shared.remote_names() if self.shared is not None else set()
        if names or self._remote.states:
            self.tailer.forget(names)
            for rank in self._remote.states:
                if rank not in self.tailer.local_ranks():
                    self._last_change.pop(rank, None)
                    self._last_progress.pop(rank, None)
            self._remote = _Remote()
            self._built = None
            self._candidate = None
        note = f"{why}: local-only analysis of this node's ranks"
        if note not in self.notes:
            self.notes.append(note)

    def _sharing(self) -> bool:
        return self.shared is not None and self.shared.ready

    def _reporting(self) -> bool:
        """True if this monitor analyses and reports (False: another node's does)."""
        shared = self.shared
        if shared is None or shared.lost is not None:
            return True
        if not shared.ready:
            return False  # connecting: wait, rather than report twice
        return 0 in self.tailer.local_ranks()

    def _follow_remote(self) -> Outcome | None:
        """Act on a verdict another node's monitor published."""
        shared = self.shared
        if shared is None or not shared.ready or 0 in self.tailer.local_ranks():
            return None
        verdict = shared.verdict()
        if verdict is None:
            return None
        report_json = shared.report_json()
        shared.ack()
        if verdict.get("action") != "abort":
            self.notice(_pointer(verdict, stopped=False))
            return None
        self.stop_job()
        return Outcome(
            None,
            "remote-verdict",
            self.job.exit_code(),
            verdict_wall_time=_float(verdict.get("wall_time")),
            notes=tuple(self.notes),
            remote=verdict,
            remote_report=report_json,
        )

    def _fresh(self, deadlocked: frozenset[int], req: int) -> bool:
        """True if every member on another node was read after the candidate snapshot."""
        if not self._sharing():
            return True
        local = self.tailer.local_ranks()
        for rank in deadlocked:
            if rank in local:
                continue
            node = self._remote.nodes.get(rank)
            if node is None or self._remote.seen.get(node, -1) < req:
                return False
        return True

    # -- faults -------------------------------------------------------------------------
    def _check_faults(self, now: float, local: Mapping[int, str]) -> None:
        if self._degraded is not None:
            return
        try:
            stat = os.statvfs(self.run_dir)
            free = stat.f_bavail * stat.f_frsize
        except OSError:
            free = None
        why = None
        if free is not None and free < self.options.low_space_bytes:
            why = f"the trace directory is nearly full ({free // 1024} KiB free)"
        else:
            partial = {
                r: s
                for r, s in self.tailer.stuck_partial(now, PARTIAL_WRITE_S).items()
                if local.get(r) == ALIVE
            }
            if partial:
                rank = min(partial)
                why = f"rank {rank}'s trace has ended in a partial record for {partial[rank]:.0f} s"
        if why is not None:
            self._degraded = why
            self._candidate = None
            message = (
                f"{why}: ranks may have stopped recording, so live detection is off; "
                "dl2 will analyse the traces after the job ends (post-mortem)"
            )
            self.notes.append(message)
            self.notice(message)

    # -- the proof ----------------------------------------------------------------------
    def _check(self, now: float, states: dict[int, str]) -> Outcome | None:
        opts = self.options
        quiet_blocked = [
            r
            for r in self.tailer.possibly_blocked()
            if now - self._last_change.get(r, now) >= opts.poll_interval / 2
        ]
        if not quiet_blocked:
            self._candidate = None
            self._all_blocked = False
            return None
        key = (self.tailer.records_seen(), tuple(sorted(states.items())))
        built = self._built
        if built is None or built.key != key:
            if now < self._next_check:
                return None  # keep the monitor's share of a core small on long traces
            started = time.monotonic()
            session = build_session(self._traces(), states)
            graph = build_execution_graph(session)
            wfg = build_wait_for_graph(session, graph)
            built = self._built = _Built(key, session, graph, wfg)
            self._next_check = now + 4 * (time.monotonic() - started)
        wfg = built.wfg
        # For the hang timeout every rank inside a recorded blocking call counts as stuck
        # (blocked, spinning, or matched by the model but never returning: gloo may have
        # paired it otherwise, e.g. groups created in different orders).
        timelines = built.graph.timelines
        self._all_blocked = all(
            rank in timelines and timelines[rank].blocked is not None
            for rank, node in wfg.nodes.items()
            if states.get(rank, ALIVE) == ALIVE and node.status != "no-trace"
        )
        self._report_suspects(built, now)
        outcome = self._prove(built, now)
        if outcome is not None:
            return outcome
        if (
            self._all_blocked
            and now - self._last_any_progress >= opts.hang_timeout
            and self._last_change
        ):
            report = self.analyze(built.session)
            self._publish(
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
            return self._final("hang-timeout")
        return None

    def _prove(self, built: _Built, now: float) -> Outcome | None:
        deadlocked = built.wfg.deadlocked
        if not deadlocked:
            self._candidate = None
            return None
        counts = tuple(sorted((r, self._last_progress.get(r, 0)) for r in deadlocked))
        candidate = self._candidate
        same = (
            candidate is not None
            and candidate.deadlocked == deadlocked
            and candidate.counts == counts
        )
        if candidate is not None and same:
            if deadlocked & self.tailer.partial():
                return None  # a member is writing a record: it moves, or PARTIAL_WRITE_S
            if not self._fresh(deadlocked, candidate.req):
                return None  # another node has not re-read its files yet
            return self._on_deadlock(deadlocked, built.session, now)
        req = self.shared.bump() if self._sharing() and self.shared is not None else 0
        self._candidate = _Candidate(deadlocked, counts, req)
        self._confirm_soon = True
        return None

    def _on_deadlock(
        self, deadlocked: frozenset[int], session: Session, now: float
    ) -> Outcome | None:
        if deadlocked == self._reported or self.options.on_deadlock == "wait":
            return None
        wall = time.time()
        latest = max(self._last_change.get(r, now) for r in deadlocked)
        report = self.analyze(session)
        self._reported = deadlocked
        verdict = {
            "reason": "deadlock",
            "exit_code": report.exit_code,
            "verdict": report.verdict.value,
            "ranks": sorted(deadlocked),
            "wall_time": wall,
        }
        if self.options.on_deadlock == "report":
            self.notice(
                f"deadlock proven among {_ranks(deadlocked)}; the job keeps running "
                "(--on-deadlock report)"
            )
            if self.on_report is not None:
                self.on_report(report)
            self._publish(dict(verdict, action="report"), report)
            return None
        self._publish(dict(verdict, action="abort"), report)
        self.stop_job()
        return Outcome(
            report,
            "deadlock",
            self.job.exit_code(),
            detected_after=now - latest,
            verdict_wall_time=wall,
            notes=tuple(self.notes),
            deadlocked=tuple(sorted(deadlocked)),
        )

    def _publish(self, verdict: dict[str, Any], report: Report | None = None) -> None:
        shared = self.shared
        if shared is None or not shared.ready:
            return
        text = self.render_json(report) if report is not None and self.render_json else None
        shared.publish_verdict(verdict, text)
        if verdict.get("action") == "abort":
            shared.wait_for_acks(self.options.ack_timeout)

    # -- hang suspects ------------------------------------------------------------------
    def _report_suspects(self, built: _Built, now: float) -> None:
        findings = hang_suspect_findings(
            built.graph, built.wfg, self.quiet(now), self.options.suspect_after
        )
        for finding in findings:
            rank = finding.ranks[0]
            if rank in self._suspects:
                continue
            self._suspects[rank] = self._last_progress.get(rank, 0)
            self.notice(_suspect_text(finding, built.graph, rank))

    # -- the end ------------------------------------------------------------------------
    def _drop_incomplete_remote(self) -> None:
        """Leave out other nodes' ranks whose mirrored trace stops short of their end.

        The store closes with the job, possibly before another node's monitor pushed
        the last records: such a rank would look blocked in an op it in fact completed.
        """
        shared = self.shared
        if shared is None:
            return
        ended = self.tailer.ended()
        mine = self.tailer.local_ranks()
        partial = {
            rank
            for rank, state in self._remote.states.items()
            if rank not in mine and rank not in ended and state == ALIVE
        }
        names = {name for name in shared.remote_names() if self.tailer.rank_of(name) in partial}
        if partial:
            self.tailer.forget(names)
            for rank in partial:
                self._remote.states.pop(rank, None)
            self.notes.append(
                f"{_ranks(partial)} on other nodes: mirrored trace incomplete when the job's "
                "store closed; left out of the analysis"
            )

    def _final(self, reason: str) -> Outcome:
        self.tailer.refresh()
        self._note_progress(time.monotonic())
        if reason == "finished":
            self._drop_incomplete_remote()
            if self.shared is not None and not self._store_gone and not self._reporting():
                self.notes.append(
                    "multi-node: this report covers this node's ranks; the monitor of rank 0's "
                    "node reports on the whole job"
                )
        session = self.session()
        report = self.analyze(session) if session.traces else None
        return Outcome(report, reason, self.job.exit_code(), notes=tuple(self.notes))


def _suspect_text(finding: Finding, graph: ExecutionGraph, rank: int) -> str:
    lines = [f"hang suspect (not a deadlock): {finding.message}"]
    stack = suspect_stack(graph, rank)
    if stack:
        lines.append(f"  rank {rank}'s stack, innermost first:")
        for frame in stack[:SUSPECT_STACK_FRAMES]:
            lines.append(f"    {frame.file}:{frame.line} in {frame.function}")
    return "\n".join(lines)


def _pointer(verdict: Mapping[str, Any], stopped: bool) -> str:
    where = f"{verdict.get('host')}, run dir {verdict.get('run_dir')}"
    ranks = _ranks(verdict.get("ranks") or ())
    what = {
        "deadlock": f"a deadlock among {ranks}",
        "hang-timeout": f"a hang of {ranks} (hang timeout)",
    }.get(str(verdict.get("reason")), str(verdict.get("reason")))
    tail = "; dl2 stopped this node's ranks" if stopped else ""
    return f"the dl2 monitor of rank 0's node ({where}) found {what}: see its report{tail}"


def pointer_line(verdict: Mapping[str, Any]) -> str:
    """The one line a non-reporting node prints about another node's verdict."""
    return _pointer(verdict, stopped=True)


def _ranks(ranks: Any) -> str:
    items = sorted(int(r) for r in ranks)
    return ("rank " if len(items) == 1 else "ranks ") + ",".join(map(str, items))


def _float(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def report_json_dict(text: str | None) -> dict[str, Any] | None:
    """A published JSON report parsed back, or None."""
    if not text:
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None
