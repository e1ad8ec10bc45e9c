"""The wait-for graph over the ranks' final blocked state, and the deadlock set.

A blocked rank waits on the ranks that have not posted the matching part of the op it
is stuck in: the missing (or mismatched) members of a collective and the peer of a
send or receive (AND), any possible sender of a wildcard receive (OR), the members of a
group being created that have not created it.  The deadlock set is what graph reduction
leaves: repeatedly release every blocked rank whose waits can all be met by ranks that
can still make progress; the blocked ranks never released wait only on each other or on
exited ranks, and nothing can release them.  A rank that will leave its wait by itself
(a monitored_barrier with a short timeout, a loop polling is_completed()) counts as able
to make progress: it is never part of a deadlock.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import networkx as nx

from dl2.model.execution_graph import ExecutionGraph
from dl2.model.execution_graph import op_key
from dl2.model.ops import Blocked
from dl2.model.ops import Op
from dl2.trace.session import EXITED
from dl2.trace.session import FAILED
from dl2.trace.session import Session

BLOCKED = "blocked"
#: polling is_completed() on pending works in a loop: waits like a blocked rank, but
#: may leave its loop at any time, so it is never part of a deadlock set
SPINNING = "spinning"
RUNNING = "running"
EXITED_STATUS = "exited"
FAILED_STATUS = "failed"
NO_TRACE = "no-trace"


@dataclass(frozen=True)
class Clause:
    """One unmet condition of a blocked rank.

    Attributes:
        op: the op that cannot complete yet.
        targets: ranks that must act (post their part) for it to complete.
        any_of: True if any one target suffices (wildcard receive), else all must.
        reason: "unmatched" (P2P), "missing" or "mismatch" (collective), "group".
    """

    op: Op
    targets: tuple[int, ...]
    any_of: bool
    reason: str


@dataclass(frozen=True)
class RankNode:
    """A rank in the wait-for graph: its status and, if blocked, its unmet clauses."""

    rank: int
    status: str
    blocked: Blocked | None = None
    clauses: tuple[Clause, ...] = ()

    @property
    def targets(self) -> tuple[int, ...]:
        return tuple(sorted({t for c in self.clauses for t in c.targets}))


@dataclass(frozen=True)
class WaitForGraph:
    """Who waits on whom, and the ranks that can never be released.

    Attributes:
        nodes: rank -> its node.
        deadlocked: the deadlock set (empty when every blocked rank can still be released).
    """

    nodes: Mapping[int, RankNode]
    deadlocked: frozenset[int]

    def waits_on_exited(self, rank: int) -> tuple[int, ...]:
        """Targets of a rank that have exited or failed: its orphaned waits."""
        gone = (EXITED_STATUS, FAILED_STATUS)
        return tuple(t for t in self.nodes[rank].targets if self.status(t) in gone)

    def status(self, rank: int) -> str:
        node = self.nodes.get(rank)
        return node.status if node is not None else NO_TRACE

    def shortest_cycle(self) -> tuple[int, ...]:
        """The shortest wait cycle inside the deadlock set, starting at its lowest rank."""
        graph = nx.DiGraph()
        graph.add_nodes_from(sorted(self.deadlocked))
        for rank in sorted(self.deadlocked):
            for target in self.nodes[rank].targets:
                if target in self.deadlocked:
                    graph.add_edge(rank, target)
        best: list[int] | None = None
        for start in sorted(graph.nodes):
            for nxt in sorted(graph.successors(start)):
                if not nx.has_path(graph, nxt, start):
                    continue
                path = nx.shortest_path(graph, nxt, start)
                cycle = [start, *path[:-1]] if nxt != start else [start]
                if best is None or len(cycle) < len(best):
                    best = cycle
        return tuple(best or ())


def clause_for(graph: ExecutionGraph, op: Op) -> Clause | None:
    """The unmet condition of an op, or None if it will complete (or has)."""
    if op.completed or (op.eager and (op.issued or not op.deferred)):
        return None  # an eager send completes on issue (a deferred one at its launch)
    rank = op.rank
    if op.kind == "p2p":
        partner = graph.p2p_partner.get(op_key(op))
        if partner is not None:
            if partner.deferred and not partner.issued and partner.error is None:
                # Its partner belongs to a fused batch that has not launched yet.
                return Clause(op, (partner.rank,), False, "unmatched")
            return None
        if op.op == "recv" and op.peer is None:
            others = tuple(r for r in graph.group_members(op.gid) if r != rank)
            return Clause(op, others, any_of=True, reason="unmatched")
        return Clause(op, (op.peer,) if op.peer is not None else (), False, "unmatched")
    if op.kind == "group":
        members = op.ranks or ()
        created = {
            r
            for r, tl in graph.timelines.items()
            if any(
                o.op == "create_group" and o.gid == op.gid and o.ranks == op.ranks for o in tl.ops
            )
        }
        targets = tuple(r for r in members if r != rank and r not in created)
        return Clause(op, targets, False, "group") if targets else None
    slot = graph.slot_of(op)
    if slot is None:
        return None
    if slot.mismatched:
        others = tuple(r for r in graph.group_members(op.gid) if r != rank)
        return Clause(op, others, False, "mismatch")
    missing = tuple(r for r in slot.missing if r != rank)
    return Clause(op, missing, False, "missing") if missing else None


#: gloo's default timeout; a monitored_barrier given a shorter one was meant to fail fast
DEFAULT_TIMEOUT_S = 1800.0


def _bounded(node: RankNode) -> bool:
    """Blocked in a monitored_barrier with a timeout shorter than the default: it will
    raise, naming the missing ranks, instead of waiting forever."""
    blocked = node.blocked
    return (
        blocked is not None
        and len(blocked.ops) == 1
        and blocked.ops[0].op == "monitored_barrier"
        and blocked.ops[0].timeout is not None
        and blocked.ops[0].timeout < DEFAULT_TIMEOUT_S
    )


def _status(session: Session, graph: ExecutionGraph, rank: int) -> str:
    state = session.process_state(rank)
    if state == FAILED:
        return FAILED_STATUS
    timeline = graph.timelines.get(rank)
    if state == EXITED or (timeline is not None and timeline.ended is not None):
        return EXITED_STATUS
    if timeline is None:
        return NO_TRACE
    return BLOCKED if timeline.blocked is not None else RUNNING


def build_wait_for_graph(session: Session, graph: ExecutionGraph) -> WaitForGraph:
    """Build the wait-for graph of the final state and reduce it to the deadlock set."""
    nodes: dict[int, RankNode] = {}
    for rank in range(max(graph.world_size, max(graph.timelines, default=-1) + 1)):
        status = _status(session, graph, rank)
        timeline = graph.timelines.get(rank)
        if status == BLOCKED and timeline is not None and timeline.blocked is not None:
            clauses = tuple(
                c for c in (clause_for(graph, op) for op in timeline.blocked.ops) if c is not None
            )
            if timeline.blocked.how == "poll":
                nodes[rank] = RankNode(rank, SPINNING, timeline.blocked, clauses)
                continue
            if clauses:
                nodes[rank] = RankNode(rank, BLOCKED, timeline.blocked, clauses)
                continue
            status = RUNNING  # its op is matched: it is about to complete
        nodes[rank] = RankNode(rank, status)

    free = {
        r
        for r, n in nodes.items()
        if n.status in (RUNNING, NO_TRACE, SPINNING) or (n.status == BLOCKED and _bounded(n))
    }
    changed = True
    while changed:
        changed = False
        for rank, node in nodes.items():
            if node.status != BLOCKED or rank in free:
                continue
            if all(
                (
                    any(t in free for t in c.targets)
                    if c.any_of
                    else all(t in free for t in c.targets)
                )
                for c in node.clauses
            ):
                free.add(rank)
                changed = True
    deadlocked = frozenset(r for r, n in nodes.items() if n.status == BLOCKED and r not in free)
    return WaitForGraph(nodes=nodes, deadlocked=deadlocked)
