"""Analyses: pure functions from a Session to findings, bundled into a Report.

``analyze(session)`` builds the execution graph and the wait-for graph once, runs every
analysis of ``ANALYSES`` over them and decides the verdict.  Nothing here does I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from dataclasses import replace

from dl2.analysis.deadlock import busy_poll_findings
from dl2.analysis.deadlock import deadlock_findings
from dl2.analysis.deadlock import failed_call_findings
from dl2.analysis.deadlock import failed_op_findings
from dl2.analysis.deadlock import hang_suspect_findings
from dl2.analysis.deadlock import timed_out_deadlock_findings
from dl2.analysis.describe import exit_cause
from dl2.analysis.describe import history_gap
from dl2.analysis.describe import op_ref
from dl2.analysis.describe import rank_list
from dl2.analysis.describe import thread_deaths
from dl2.analysis.ending import cut_off_ranks
from dl2.analysis.ending import hang_findings
from dl2.analysis.ending import stalled_calls_findings
from dl2.analysis.ending import timeout_findings
from dl2.analysis.hazards import order_inversion_findings
from dl2.analysis.matching import collective_findings
from dl2.analysis.matching import group_findings
from dl2.analysis.matching import nonmember_findings
from dl2.analysis.matching import p2p_findings
from dl2.analysis.matching import p2p_mismatch_findings
from dl2.analysis.prediction.findings import potential_deadlock_findings
from dl2.analysis.prediction.fusion import fusion_findings
from dl2.analysis.races import wildcard_size_findings
from dl2.analysis.unwaited import unwaited_work_findings
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.execution_graph import build_execution_graph
from dl2.model.stuck import RankStatus
from dl2.model.wait_for import WaitForGraph
from dl2.model.wait_for import build_wait_for_graph
from dl2.report import Finding
from dl2.report import FindingKind
from dl2.report import RankState
from dl2.report import Report
from dl2.report import Verdict
from dl2.trace.session import ALIVE
from dl2.trace.session import EXITED
from dl2.trace.session import Session

__all__ = ["ANALYSES", "Context", "analyze"]


@dataclass(frozen=True)
class Context:
    """What every analysis reads: the session and the graphs built from it once."""

    session: Session
    graph: ExecutionGraph
    wait_for: WaitForGraph
    job_ended: bool
    quiet: Mapping[int, float]
    suspect_after: float
    #: the job was ended from outside (by dl2, the user, or a kill of all its ranks)
    ended_outside: bool = False
    #: warnings analyses add for the report (a search cut short, a step skipped)
    notes: list[str] = field(default_factory=list)
    #: look for hazards the run did not hit (predictions, cross-group orders)
    hazards: bool = True


def _prediction(context: Context) -> list[Finding]:
    """Potential deadlocks under other backend configurations, if none happened."""
    if not context.hazards:
        return []
    findings, notes = potential_deadlock_findings(context.session, context.graph, context.wait_for)
    context.notes.extend(notes)
    return findings


def _fusion(context: Context) -> list[Finding]:
    """Fusion passes that the run shows fused two ways (over the whole history only)."""
    gap = history_gap(context.graph)
    if gap is not None:
        context.notes.append(f"fusion check skipped: {gap}")
        return []
    return fusion_findings(context.graph)


#: name -> analysis; each takes the shared context and returns its findings.
ANALYSES: dict[str, Callable[[Context], list[Finding]]] = {
    "deadlock": lambda c: deadlock_findings(c.graph, c.wait_for),
    # a deadlock the job's end broke (its timeouts, a kill from outside)
    "timed-out-deadlock": lambda c: timed_out_deadlock_findings(c.graph, c.wait_for),
    "hang": lambda c: hang_findings(
        c.graph, c.wait_for, c.session.ending, c.ended_outside, c.quiet
    ),
    # a mismatched send/recv pair before the failures it causes (gloo aborts on it)
    "p2p-mismatch": lambda c: p2p_mismatch_findings(c.graph),
    "failed-ops": lambda c: failed_op_findings(c.graph, c.wait_for),
    "timeouts": lambda c: timeout_findings(c.graph, c.wait_for),
    "collectives": lambda c: collective_findings(c.graph, c.wait_for, c.job_ended),
    "groups": lambda c: group_findings(c.graph),
    "nonmember": lambda c: nonmember_findings(c.graph),
    "p2p": lambda c: p2p_findings(c.graph, c.job_ended),
    "busy-poll": lambda c: busy_poll_findings(c.graph, c.wait_for),
    "unwaited-work": lambda c: unwaited_work_findings(c.graph, c.wait_for),
    "hang-suspects": lambda c: hang_suspect_findings(c.graph, c.wait_for, c.quiet, c.suspect_after),
    "prediction": _prediction,
    # collectives of different groups issued in orders NCCL cannot complete
    "order-inversion": lambda c: order_inversion_findings(c.graph, c.wait_for) if c.hazards else [],
    # fusion passes the run itself shows to depend on each rank's ready order
    "fusion": _fusion,
    # wildcard receives of different sizes that another arrival order pairs wrongly
    "wildcard-sizes": lambda c: wildcard_size_findings(c.graph) if c.hazards else [],
}

#: findings that follow from a rank's failure rather than explain one: the waits it
#: orphaned, the collectives and messages it never sent (a collective mismatch makes gloo
#: abort the rank that sees it; a call rejected on its rank ends that rank's program)
_CONSEQUENCES = frozenset(
    {FindingKind.ORPHANED_WAIT, FindingKind.COLLECTIVE_MISSING, FindingKind.P2P_UNMATCHED}
)


def _mismatches_first(findings: list[Finding]) -> list[Finding]:
    """The collective mismatches before the consequences listed ahead of them (the
    report leads with the cause), in order otherwise."""
    first_mismatch = next(
        (i for i, f in enumerate(findings) if f.kind is FindingKind.COLLECTIVE_MISMATCH), None
    )
    first = next((i for i, f in enumerate(findings) if f.kind in _CONSEQUENCES), None)
    if first_mismatch is None or first is None or first > first_mismatch:
        return findings
    mismatches = [f for f in findings if f.kind is FindingKind.COLLECTIVE_MISMATCH]
    rest = [f for f in findings if f.kind is not FindingKind.COLLECTIVE_MISMATCH]
    return rest[:first] + mismatches + rest[first:]


_DEFECT_KINDS = {
    FindingKind.COLLECTIVE_MISMATCH,
    FindingKind.COLLECTIVE_MISSING,
    FindingKind.P2P_UNMATCHED,
    FindingKind.GROUP_MISMATCH,
    FindingKind.NONMEMBER_CALL,
    FindingKind.POTENTIAL_DEADLOCK,
    FindingKind.POTENTIAL_MISMATCH,
    FindingKind.UNWAITED_WORK,
}


def _verdict(
    wfg: WaitForGraph,
    findings: list[Finding],
    any_failed: bool,
    left: frozenset[int],
    session: Session,
    killed: bool,
    gaps: list[str],
) -> Verdict:
    """The one word for the run: the first rule that applies (docs/design.md, "Verdicts")."""
    kinds = {f.kind for f in findings}
    if FindingKind.DEADLOCK in kinds:
        return Verdict.DEADLOCK
    if FindingKind.BUSY_POLL in kinds and not any_failed:
        # the spinning rank and those waiting on it, unless a rank it waits on is outside
        # communication (running Python code): that rank is the culprit, a hang
        return Verdict.HANG if _spins_on_running(wfg) else Verdict.DEADLOCK
    if FindingKind.HANG in kinds:
        return Verdict.HANG
    if session.ending == "hang-timeout" and not any_failed and _blocked(wfg):
        # dl2's hang timeout stops a job only once every live rank sat in communication
        # without progress: it hung, whatever the findings say caused it
        return Verdict.HANG
    if session.ending == "interrupted":
        return Verdict.INTERRUPTED  # the user stopped dl2 while no rank was stuck
    if kinds & {
        FindingKind.COLLECTIVE_MISMATCH,
        FindingKind.P2P_MISMATCH,
        FindingKind.GROUP_MISMATCH,
        FindingKind.NONMEMBER_CALL,
        FindingKind.FAILED_CALL,
    }:
        return Verdict.DEFECT
    # A rank that left cleanly while others needed it: gloo fails their ops with
    # "Connection closed by peer" rather than hanging, so this is a defect, not a hang.
    # Leaving cleanly is the process exiting with status 0 or the trace's ``end`` record
    # of an ended program: a process that then dies in interpreter teardown (gloo's
    # threads abort now and then when a peer's op is still open) has still left.
    if any(
        f.kind in (FindingKind.ORPHANED_WAIT, FindingKind.COLLECTIVE_MISSING)
        # the ranks that left, not those whose ops the finding names (the waiters: with
        # three ranks or more, a waiter that raised and exited is not the one that left)
        and any(
            wfg.status(r) is RankStatus.EXITED or r in left
            for r in f.ranks
            if r not in {o.rank for o in f.ops}
        )
        for f in findings
    ):
        return Verdict.DEFECT
    if FindingKind.UNWAITED_WORK in kinds:
        return Verdict.DEFECT  # a dropped work explains a peer's failure ("Connection closed")
    if any_failed:
        return Verdict.JOB_FAILED
    if wfg.deadlocked:
        return Verdict.DEADLOCK
    if kinds & _DEFECT_KINDS:
        return Verdict.DEFECT
    if killed:
        return Verdict.INTERRUPTED  # killed from outside while no rank was stuck
    if gaps:
        return Verdict.INCOMPLETE
    return Verdict.OK


def _spins_on_running(wfg: WaitForGraph) -> bool:
    """A rank polling in a loop waits on a rank that is running outside communication."""
    return any(
        wfg.status(target) is RankStatus.RUNNING
        for node in wfg.waiting.values()
        if node.status is RankStatus.SPINNING
        for target in node.targets
    )


def _blocked(wfg: WaitForGraph) -> bool:
    """Some rank is blocked in communication."""
    return any(node.status is RankStatus.BLOCKED for node in wfg.waiting.values())


def _gaps(session: Session, graph: ExecutionGraph) -> list[str]:
    """What the session lacks: ranks without a readable trace, skipped records."""
    gaps = []
    missing = session.missing_ranks()
    if missing:
        gaps.append(f"no readable trace from rank(s) {', '.join(map(str, missing))}")
    corrupt = session.corrupt_records()
    if corrupt:
        gaps.append(f"{corrupt} corrupt record{'s' if corrupt > 1 else ''} skipped")
    # a process that exited cleanly writes its end record: a trace that stops in a
    # partial record before it was cut short (a full disk), and its end is unknown
    cut = [
        rank
        for rank, trace in sorted(session.traces.items())
        if trace.truncated
        and session.process_states.get(rank) == EXITED
        and (timeline := graph.timelines.get(rank)) is not None
        and timeline.ended is None
    ]
    if cut:
        gaps.append(f"the trace of rank(s) {', '.join(map(str, cut))} stops before its end")
    return gaps


def _rank_states(wfg: WaitForGraph) -> tuple[RankState, ...]:
    states = []
    for rank, node in sorted(wfg.nodes.items()):
        waiting = node.status in (RankStatus.BLOCKED, RankStatus.SPINNING)
        if waiting and node.blocked is not None and node.blocked.ops:
            op = node.clauses[0].op if node.clauses else node.blocked.ops[0]
            states.append(
                RankState(
                    rank=rank,
                    status=node.status,
                    op=op_ref(op),
                    waits_on=node.targets,
                    any_of=all(c.any_of for c in node.clauses),
                )
            )
        else:
            states.append(RankState(rank=rank, status=node.status))
    return tuple(states)


def analyze(
    session: Session,
    *,
    quiet: Mapping[int, float] | None = None,
    suspect_after: float = 60.0,
    job: Mapping[str, object] | None = None,
    graph: ExecutionGraph | None = None,
    wait_for: WaitForGraph | None = None,
    hazards: bool = True,
) -> Report:
    """Analyse a session: match ops, find deadlocks and defects, decide the verdict.

    Args:
        session: the loaded traces and process states.
        quiet: seconds since each rank last made progress (from a live monitor); ranks
            others wait on that are quiet for ``suspect_after`` seconds become hang suspects.
        job: facts about the run to carry into the report (command, exit status).
        graph, wait_for: the session's graphs when the caller built them already (the
            live monitor does, to find the deadlock set); built here otherwise.
        hazards: also report what would deadlock under another backend configuration
            (the prediction, cross-group order inversions); False: only what happened.
    """
    if graph is None:
        graph = build_execution_graph(session)
    cut_off = cut_off_ranks(session, graph)
    unknown_end = bool(cut_off) and session.ending is None and not session.process_states
    if cut_off:  # killed together from outside: each stood where its trace stops
        states = {**session.process_states, **{r: ALIVE for r in cut_off}}
        session = replace(session, process_states=states)
        wait_for = None
    wfg = wait_for if wait_for is not None else build_wait_for_graph(session, graph)
    statuses = [wfg.status(r) for r in range(session.world_size)]
    job_ended = bool(statuses) and all(s.gone for s in statuses)
    ended_outside = session.stopped_from_outside or bool(cut_off)
    context = Context(
        session,
        graph,
        wfg,
        job_ended,
        quiet or {},
        suspect_after,
        ended_outside=ended_outside,
        hazards=hazards,
    )
    findings: list[Finding] = []
    for analysis in ANALYSES.values():
        findings.extend(analysis(context))
    findings = _mismatches_first(findings)
    if not findings and session.ending == "hang-timeout":
        # nothing else explains why dl2's hang timeout found the ranks still in calls
        findings.extend(stalled_calls_findings(graph, quiet or {}))
    any_failed = RankStatus.FAILED in statuses or RankStatus.KILLED in statuses
    if any_failed and not findings:
        findings.extend(failed_call_findings(graph))
    elif any_failed and all(f.kind in _CONSEQUENCES for f in findings):
        # only what a failure left behind (waits orphaned, collectives never issued): a
        # call rejected on its own rank is the cause, and leads
        findings[:0] = failed_call_findings(graph)
    warnings = list(session.warnings) + context.notes
    if unknown_end:
        warnings.append(
            "nothing says how the job ended (no run.json, and no rank's trace ends): each "
            "rank is read where its trace stops, as if the job was killed there (it may "
            "still be running)"
        )
    for rank in sorted(graph.timelines):  # a helper thread that died, if no finding says
        warnings.extend(
            d for d in thread_deaths(graph, rank) if not any(d in f.message for f in findings)
        )
    # ranks whose program ended (the recorder's exit hook ran) whatever their exit status
    left = frozenset(r for r, tl in graph.timelines.items() if tl.ended == "exit")
    for rank in sorted(left):
        cause = exit_cause(graph, rank)
        error = graph.timelines[rank].exit_error
        if cause is not None and any(op.error == error for op in graph.failed_ops(rank)):
            pass  # it raised out of a recorded call, whose failure the findings give
        elif cause is not None:
            warnings.append(f"rank {rank}'s program ended with an uncaught {cause}")
        elif wfg.status(rank) is RankStatus.FAILED:
            warnings.append(
                f"rank {rank} failed at interpreter exit, after its program had ended; "
                "its communication counts as finished"
            )
    if cut_off and not unknown_end:
        warnings.append(
            f"{rank_list(sorted(cut_off))} ended without a trace of an error: killed from "
            "outside, each read where its trace stops"
        )
    missing = session.missing_ranks()
    if missing:
        warnings.append(f"no trace from rank(s) {', '.join(map(str, missing))}")
    gaps = _gaps(session, graph)
    return Report(
        verdict=_verdict(wfg, findings, any_failed, left, session, bool(cut_off), gaps),
        findings=tuple(findings),
        ranks=_rank_states(wfg),
        world_size=session.world_size,
        warnings=tuple(warnings),
        job=dict(job or {}),
        gaps=tuple(gaps),
    )
