"""How a job ended, and the ``hang`` finding of a job ended while ranks were stuck.

A job that did not run to its end was *ended from outside* when dl2 stopped it (a
proven deadlock, its hang timeout, a failed rank, the user's interrupt: the session's
``ending``) or when its ranks were killed together by something else (their launcher's
timeout, the scheduler, the user's ``kill``).  The second shows in the traces alone: every
rank that did not end cleanly stopped writing without an ``end`` record and without a
failed operation (:func:`cut_off_ranks`).  Such a rank is read where its trace stops,
blocked or running, as if still alive; a rank that raised or exited with an error failed
on its own, and its peers' waits on it are orphaned instead.

A job ended from outside while ranks were blocked in communication that waits on a rank
outside communication (running Python code, computing, waiting on a file, a queue or a
lock of its own) *hung*: :func:`hang_findings` names the blocked ranks, their operation
and line, and the ranks they wait on with where those were.
"""

from __future__ import annotations

from collections.abc import Mapping

from dl2.analysis.deadlock import WHERE_TEXT
from dl2.analysis.deadlock import broken_waits
from dl2.analysis.deadlock import cycle_order
from dl2.analysis.deadlock import late_matches
from dl2.analysis.deadlock import silently_gone
from dl2.analysis.deadlock import suspect_stack
from dl2.analysis.deadlock import suspect_where
from dl2.analysis.deadlock import timed_out_deadlock
from dl2.analysis.deadlock import timed_out_waits
from dl2.analysis.deadlock import waiting_parts
from dl2.analysis.describe import op_ref
from dl2.analysis.describe import phrase
from dl2.analysis.describe import rank_list
from dl2.analysis.describe import where
from dl2.model.execution_graph import ExecutionGraph
from dl2.model.ops import Op
from dl2.model.stuck import RankStatus
from dl2.model.stuck import deadlock_set
from dl2.model.stuck import strongly_connected_components
from dl2.model.wait_for import Clause
from dl2.model.wait_for import WaitForGraph
from dl2.model.wait_for import clause_for
from dl2.model.wait_for import other_threads
from dl2.report import Finding
from dl2.report import FindingKind
from dl2.trace.session import ENDED_BADLY
from dl2.trace.session import EXITED
from dl2.trace.session import FAILED
from dl2.trace.session import KILLED
from dl2.trace.session import UNKNOWN
from dl2.trace.session import Session

#: a rank blocked at least this long when the job was ended from outside hung; shorter
#: waits are a healthy job caught mid-step (dl2's hang timeout needs no such margin)
HANG_AFTER_S = 3.0


def cut_off_ranks(session: Session, graph: ExecutionGraph) -> frozenset[int]:
    """Ranks killed together from outside dl2, read where their traces stop.

    Empty when dl2 itself ended the job (its ranks are alive at the stop already), while
    some rank still runs (or nothing is known of the processes), when some rank's
    program reached its exit hook (the others were ended because of it), or when some
    rank failed on its own: an op of it raised, or the signals are known and one rank
    crashed while the others were killed (the killed ranks then died of that failure's
    consequences, or alone: their peers' waits on them are orphaned).
    """
    if session.stopped_from_outside:
        return frozenset()
    timelines = graph.timelines
    states = {rank: session.process_state(rank) for rank in timelines}
    if (
        session.ending is None
        and session.run_dir is not None  # a directory read after the fact, not a snapshot
        and states
        and all(state == UNKNOWN for state in states.values())
        and not any(timeline.ended for timeline in timelines.values())
        and any(timeline.blocked is not None for timeline in timelines.values())
    ):
        # traces alone, none of which ends (its ranks killed by a scheduler's timeout,
        # or still running): each rank stood where its trace stops
        return frozenset(timelines)
    if any(state not in (EXITED, FAILED, KILLED) for state in states.values()):
        return frozenset()  # the job has not ended, or nothing is known of its processes
    if any(timeline.ended == "exit" for timeline in timelines.values()):
        # a rank's program ran to its exit hook (finished, or raised and exited): a
        # launcher that kills the others then (torchrun, mp.spawn) reacts to that rank
        return frozenset()
    silent = frozenset(rank for rank, state in states.items() if state in ENDED_BADLY)
    if not silent or not all(silently_gone(graph, rank) for rank in silent):
        return frozenset()  # it ended its program, or an op of it raised: on its own
    if {states[rank] for rank in silent} >= {KILLED, FAILED}:
        return frozenset()  # the signals are known: one rank crashed, the others were killed
    return silent


def _roots(wfg: WaitForGraph, graph: ExecutionGraph) -> dict[int, tuple[int, ...]]:
    """For each blocked rank outside the deadlock set, the ranks outside communication its
    wait leads to (directly or through other blocked ranks), ascending.  A blocked rank
    with other threads of the user's code alive is one of its own roots: those threads,
    which dl2 does not see in communication, may be what it waits for.

    One pass over the blocked ranks' strongly connected components, sinks first (a
    component's roots are its own free targets and those of the components it reaches):
    O(blocked ranks + their wait edges), whatever the world size.
    """
    blocked = {
        rank
        for rank, node in wfg.waiting.items()
        if node.status is RankStatus.BLOCKED and rank not in wfg.deadlocked
    }
    inner = {r: [t for t in wfg.nodes[r].targets if t in blocked] for r in blocked}
    roots: dict[int, frozenset[int]] = {}
    for component in strongly_connected_components(inner):
        members = set(component)
        found: set[int] = set()
        for rank in component:
            if other_threads(graph, rank):
                found.add(rank)
            for target in wfg.nodes[rank].targets:
                if target in blocked:
                    if target not in members:
                        found |= roots[target]
                elif target not in wfg.deadlocked and not wfg.status(target).gone:
                    found.add(target)
        shared = frozenset(found)
        for rank in component:
            roots[rank] = shared
    return {rank: tuple(sorted(found)) for rank, found in roots.items()}


def _root_text(graph: ExecutionGraph, wfg: WaitForGraph, rank: int) -> str:
    """Where a rank others waited on was: its watchdog's view, else its last op."""
    status = wfg.status(rank)
    threads = other_threads(graph, rank) if status is RankStatus.BLOCKED else 0
    if threads:
        return (
            f"rank {rank}'s other thread{'s' if threads > 1 else ''} of the user's code "
            f"({threads} alive, outside recorded communication)"
        )
    if status is RankStatus.NO_TRACE:
        return f"rank {rank} (which left no trace)"
    if status is RankStatus.SPINNING:
        return f"rank {rank} (polling is_completed() in a loop)"
    timeline = graph.timelines.get(rank)
    blocked = timeline.blocked if timeline is not None else None
    if blocked is not None and blocked.ops and not blocked.ops[0].completed:
        # inside a recorded call the model saw matched (every member issued it), which
        # still never completed: gloo paired it otherwise (a peer's call moved no data)
        op = blocked.ops[0]
        return (
            f"rank {rank} (still inside its {phrase(op)} at {where(op)}, which every "
            "member issued: it never completed)"
        )
    stack = suspect_stack(graph, rank)
    state = WHERE_TEXT.get(suspect_where(graph, rank) or "", "outside communication")
    if stack:
        frame = stack[0]
        at = f"{frame.file.rsplit('/', 1)[-1]}:{frame.line}"
        return f"rank {rank} ({state} at {at} in {frame.function})"
    timeline = graph.timelines.get(rank)
    ops = timeline.ops if timeline is not None else ()
    if ops:
        return f"rank {rank} ({state}, after its {phrase(ops[-1])} at {where(ops[-1])})"
    return f"rank {rank} ({state})"


def hang_findings(
    graph: ExecutionGraph,
    wfg: WaitForGraph,
    ending: str | None,
    ended_outside: bool,
    quiet: Mapping[int, float],
) -> list[Finding]:
    """The ranks blocked when the job was ended from outside, grouped by whom they wait on.

    Args:
        ending: the session's ending ("hang-timeout" needs no minimum wait).
        ended_outside: the job was ended from outside (see the module's docstring).
        quiet: seconds since each rank's last progress; a blocked rank counts when
            quiet for :data:`HANG_AFTER_S`, or when unknown (a post-mortem trace).
    """
    if not ended_outside:
        return []
    # ranks with other threads alive whose oldest calls wait only on each other: the
    # cycle explains it, whatever call a thread that kept communicating was in last
    threaded = cycle_despite_threads(graph, wfg)
    if threaded:
        return threaded
    groups: dict[tuple[int, ...], list[int]] = {}
    roots_of = _roots(wfg, graph)
    for rank, node in wfg.waiting.items():
        if node.status is not RankStatus.BLOCKED or rank in wfg.deadlocked or not node.clauses:
            continue
        if ending != "hang-timeout" and quiet.get(rank, HANG_AFTER_S) < HANG_AFTER_S:
            continue
        if roots_of.get(rank):
            groups.setdefault(roots_of[rank], []).append(rank)
    findings = []
    for key, stuck in groups.items():
        roots = list(key)  # the ranks outside communication they wait on
        # a stuck rank that is itself a root (its blocked thread aside, another of its
        # threads is outside communication) is named after those that wait on it
        stuck.sort(key=lambda r: r in key)
        ops = [wfg.nodes[r].clauses[0].op for r in stuck]
        parts = waiting_parts(ops, 3)
        waited = "; ".join(_root_text(graph, wfg, r) for r in roots[:3])
        long = [quiet[r] for r in stuck if r in quiet]
        during = f" for {max(long):.0f} s" if long and max(long) >= 1 else ""
        message = (
            f"{'; '.join(parts)}: blocked{during} until the job was ended, waiting on "
            f"{waited}. The communication {'it' if len(stuck) == 1 else 'they'} waited for "
            "had not been issued by then."
        )
        first = ops[0]
        if len({(phrase(o), where(o)) for o in ops}) == 1:
            who = rank_list(stuck)  # all in the same call
        else:
            who = f"rank {first.rank} (and {len(stuck) - 1} more)"
        findings.append(
            Finding(
                kind=FindingKind.HANG,
                ranks=tuple(sorted({*stuck, *roots})),
                ops=tuple(op_ref(o) for o in ops),
                message=message[0].upper() + message[1:],
                hint=(
                    f"Look at what {rank_list(roots)} was doing at that line: every rank "
                    "must reach the same communication calls; a rank waiting on a file, a "
                    "queue, a lock or a sleep loop of its own leaves its peers blocked."
                ),
                group=ops[0].gid,
                summary=(f"{who} blocked in {phrase(first)} ({where(first)}) waiting on {waited}"),
            )
        )
    if not findings:
        findings.extend(_group_creation_findings(graph, ending, quiet))
    return findings


def stalled_calls_findings(graph: ExecutionGraph, quiet: Mapping[int, float]) -> list[Finding]:
    """Ranks still inside calls the model saw matched (every member issued the
    collective, the peer posted the message) when dl2's hang timeout ended the job, each
    quiet for a while: gloo paired their messages otherwise, so the calls never
    completed."""
    stuck = []
    for rank in sorted(graph.timelines):
        blocked = graph.timelines[rank].blocked
        if (
            blocked is not None
            and blocked.ops
            and not blocked.ops[0].completed
            and quiet.get(rank, 0.0) >= HANG_AFTER_S
        ):
            stuck.append(blocked.ops[0])
    if not stuck:
        return []
    listed = "; ".join(waiting_parts(stuck, 4))
    return _stuck_finding(
        stuck,
        f"Blocked until dl2's hang timeout ended the job: {listed}. Every call they wait on "
        "was issued on the other side too, yet none completed: gloo paired their messages "
        "with other operations.",
        "Look before these calls for an operation gloo matched otherwise than the program "
        "meant: an isend/irecv whose work was dropped or waited on twice, collectives of one "
        "group issued from two threads, or a group created in another order on some rank.",
        f"{rank_list([o.rank for o in stuck])} stalled in matched calls",
    )


def _oldest_unmet(graph: ExecutionGraph, rank: int) -> Clause | None:
    """The clause of the oldest op the rank is inside of or waits on, in any thread,
    that cannot complete yet."""
    for op in graph.open_ops(rank):
        if op.error is not None:
            continue
        clause = clause_for(graph, op)
        if clause is not None and clause.targets:
            return clause
    return None


def cycle_despite_threads(graph: ExecutionGraph, wfg: WaitForGraph) -> list[Finding]:
    """Ranks that were blocked waiting only on each other when the job was ended, a
    deadlock but for their other threads of the user's code (which might have released
    them, so nothing was proven; a thread that keeps communicating, a heartbeat, also
    keeps their progress clock fresh)."""
    blocked = {
        rank: node.clauses
        for rank, node in wfg.waiting.items()
        if node.status is RankStatus.BLOCKED and node.clauses
    }
    # a rank with other threads reads as its innermost open call, which may be another
    # thread's call about to complete (a heartbeat): its oldest awaited op that cannot
    # complete yet says what its stuck thread waits for
    for rank in graph.waiting_ranks():
        if rank not in blocked and other_threads(graph, rank) and not wfg.status(rank).gone:
            clause = _oldest_unmet(graph, rank)
            if clause is not None:
                blocked[rank] = (clause,)
    if not blocked or not any(other_threads(graph, r) for r in blocked):
        return []
    free = [
        r
        for r in {t for clauses in blocked.values() for c in clauses for t in c.targets}
        if r not in blocked and wfg.status(r).can_progress
    ]
    members = deadlock_set(blocked, free)
    if not members:
        return []
    cycle, shown = cycle_order(
        {r: tuple(sorted({t for c in blocked[r] for t in c.targets})) for r in members}
    )
    ops = [blocked[r][0].op for r in shown]
    parts = waiting_parts(ops, 4)
    threads = sorted(r for r in members if other_threads(graph, r))
    return [
        Finding(
            kind=FindingKind.HANG,
            ranks=tuple(sorted(members)),
            ops=tuple(op_ref(o) for o in ops),
            message=(
                f"{rank_list(sorted(members)).capitalize()} were blocked waiting on each "
                f"other when the job was ended: {'; '.join(parts)}. A deadlock, unless "
                f"another thread of {rank_list(threads)} (alive, outside these calls) "
                "was going to release it; dl2 cannot prove that it would not."
            ),
            hint=(
                "Look at the cycle's calls first (a send/recv order, a skipped collective): "
                "a thread that keeps communicating on its own group (a heartbeat) does not "
                "release the others."
            ),
            cycle=cycle,
            group=ops[0].gid if len({o.gid for o in ops}) == 1 else None,
            summary=f"{rank_list(sorted(members))} blocked on each other: " + "; ".join(parts[:2]),
        )
    ]


def _group_creation_findings(
    graph: ExecutionGraph, ending: str | None, quiet: Mapping[int, float]
) -> list[Finding]:
    """Ranks still inside a group creation (init_process_group, new_group) that every
    member had entered, when the job was ended: the backend never connected them."""
    stuck: list[Op] = []
    for rank in graph.waiting_ranks():
        blocked = graph.timelines[rank].blocked
        if blocked is None or len(blocked.ops) != 1 or blocked.ops[0].op != "create_group":
            continue
        if ending != "hang-timeout" and quiet.get(rank, HANG_AFTER_S) < HANG_AFTER_S:
            continue
        # every member is in it (and it is no group whose name other ranks gave to
        # another group: the group findings say why that one never connects)
        if clause_for(graph, blocked.ops[0], settled=True) is None:
            stuck.append(blocked.ops[0])
    if not stuck:
        return []
    first = stuck[0]
    ranks = [o.rank for o in stuck]
    call = first.api or "new_group"
    return [
        Finding(
            kind=FindingKind.HANG,
            ranks=tuple(ranks),
            ops=tuple(op_ref(o) for o in stuck),
            message=(
                f"{rank_list(ranks).capitalize()} stayed inside {call} ({where(first)}) until "
                "the job was ended, though every member of the group had called it: the "
                "backend never connected them."
            ),
            hint=(
                "The group's ranks could not reach each other: keys left in the store by an "
                "earlier attempt or generation (a restart, destroy_process_group then "
                "init_process_group again), a wrong MASTER_ADDR or port, a firewall. Use a "
                "fresh store or port for a new generation."
            ),
            group=first.gid,
            summary=f"{rank_list(ranks)} stuck inside {call} ({where(first)})",
        )
    ]


def timeout_findings(graph: ExecutionGraph, wfg: WaitForGraph) -> list[Finding]:
    """Calls that raised when their timeout (the process group's, ``timeout=`` of
    ``init_process_group``, or a wait's) ran out while ranks they needed had not issued
    the matching operation: the job hung, and the timeout ended it.  One finding per
    group of ranks waited on, naming where those ranks were."""
    groups: dict[tuple[int, ...], list[Op]] = {}
    waits = timed_out_waits(graph)
    in_deadlock = timed_out_deadlock(broken_waits(graph, wfg))  # timed_out_deadlock_findings
    late: list[tuple[Op, Clause]] = []
    for rank, (op, clause) in waits.items():
        if rank in wfg.deadlocked or rank in in_deadlock:
            continue
        if clause.reason == "late":
            late.append((op, clause))
            continue
        alive = tuple(
            t for t in clause.targets if not wfg.status(t).gone or silently_gone(graph, t)
        )
        if alive:
            groups.setdefault(alive, []).append(op)
    findings = [_late_finding(graph, op, clause) for op, clause in late]
    for roots, ops in groups.items():
        parts = [f"rank {o.rank}'s {phrase(o)} ({where(o)})" for o in ops[:3]]
        if len(ops) > 3:
            parts.append(f"{len(ops) - 3} more")
        listed = "; ".join(parts)
        waited = "; ".join(_root_text(graph, wfg, r) for r in roots[:3])
        if len(roots) > 3:
            waited += f" and {len(roots) - 3} more"
        first = ops[0]
        findings.append(
            Finding(
                kind=FindingKind.HANG,
                ranks=tuple(sorted({*(o.rank for o in ops), *roots})),
                ops=tuple(op_ref(o) for o in ops),
                message=(
                    f"{listed[0].upper()}{listed[1:]} timed out waiting on {waited}, which had not "
                    f"issued the matching operation: {first.error}"
                ),
                hint=(
                    f"Look at what {rank_list(list(roots))} was doing at that line: a rank "
                    "that never reaches the call leaves its peers blocked until the timeout; "
                    "a rank that is only slow there (loading data, saving a checkpoint) "
                    "needs a longer timeout (init_process_group(timeout=...)) or the slow "
                    "work moved out of the step."
                ),
                group=first.gid,
                summary=f"{phrase(first)} ({where(first)}) timed out waiting on {waited}",
            )
        )
    return findings


def _late_finding(graph: ExecutionGraph, op: Op, clause: Clause) -> Finding:
    """A call that timed out while the ranks it needed were still on their way: they
    issued their match only after it (theirs then failed on the connection it closed)."""
    matches = late_matches(graph, op)
    late = rank_list(list(clause.targets))
    theirs = "; ".join(f"rank {m.rank}'s at {where(m)}" for m in matches[:3])
    return Finding(
        kind=FindingKind.HANG,
        ranks=tuple(sorted({op.rank, *clause.targets})),
        ops=tuple(op_ref(o) for o in (op, *matches[:3])),
        message=(
            f"Rank {op.rank}'s {phrase(op)} ({where(op)}) timed out waiting on {late}, "
            f"which issued the matching call only after the timeout ({theirs}; it failed "
            f"there as the connection was closed): {op.error}"
        ),
        hint=(
            f"{late.capitalize()} reached the call too late, not never: look at what it did "
            "before it (loading data, saving a checkpoint, a slow first step). Give the "
            "group a longer timeout (init_process_group(timeout=...)) or move the slow work "
            "out of the step; a timed-out group is broken: catching the error and going on "
            "with it fails again."
        ),
        group=op.gid,
        summary=f"{phrase(op)} ({where(op)}) timed out waiting on {late}, which came late",
    )


def _stuck_finding(stuck: list[Op], message: str, hint: str, summary: str = "") -> list[Finding]:
    """The one hang finding of ranks stuck in ``stuck`` (one op each)."""
    return [
        Finding(
            kind=FindingKind.HANG,
            ranks=tuple(o.rank for o in stuck),
            ops=tuple(op_ref(o) for o in stuck),
            message=message,
            hint=hint,
            group=stuck[0].gid,
            summary=summary,
        )
    ]
