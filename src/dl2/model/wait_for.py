"""The wait-for graph over the ranks' final blocked state, and the deadlock set.

A blocked rank waits on the ranks that have not posted the matching part of the op it
is stuck in: the missing (or mismatched) members of a collective and the peer of a
send or receive (AND), any possible sender of a wildcard receive (OR), the members of a
group being created that have not created it (AND), and, for a c10d store call that
waits for keys no rank has set (``store.get``, ``store.wait``), any other rank of the
job, since any of them may set them (OR).  The deadlock set is what graph
reduction (:func:`dl2.model.stuck.deadlock_set`, where the AND/OR rule is stated) leaves
of the blocked ranks, starting from the ranks that can progress.  A rank that will leave
its wait by itself (a monitored_barrier with a short timeout, a loop polling
is_completed()), or that has other threads of the user's code alive (one of them may
release it), counts as able to make progress: it is never part of a deadlock.

Only the ranks that may wait (:meth:`ExecutionGraph.waiting_ranks`) get clauses; the
node of any other rank is built when it is read.  Building the graph so costs what the
blocked ranks and their clauses cost, whatever the length of the history and the size
of the world.
"""

from __future__ import annotations

from collections.abc import Iterator
from collections.abc import Mapping
from dataclasses import dataclass
from dataclasses import field
from functools import cached_property

from dl2.model.execution_graph import ExecutionGraph
from dl2.model.execution_graph import call_key
from dl2.model.execution_graph import op_key
from dl2.model.ops import Blocked
from dl2.model.ops import Op
from dl2.model.ops import store_key
from dl2.model.program import world_ranks
from dl2.model.stuck import RankStatus
from dl2.model.stuck import deadlock_set
from dl2.model.stuck import shortest_cycle
from dl2.trace.session import ALIVE
from dl2.trace.session import ENDED_BADLY
from dl2.trace.session import EXITED
from dl2.trace.session import KILLED
from dl2.trace.session import Session

#: id of a targets tuple -> (it, it sorted without repeats): see :func:`sorted_targets`
_SORTED: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = {}


def sorted_targets(targets: tuple[int, ...]) -> tuple[int, ...]:
    """``targets`` ascending without repeats: the same tuple when it is so already,
    worked out once per tuple (the ranks blocked in one collective share theirs)."""
    known = _SORTED.get(id(targets))
    if known is None or known[0] is not targets:
        ordered = tuple(sorted(set(targets)))
        if ordered == targets:
            ordered = targets
        if len(_SORTED) >= 4096:
            _SORTED.clear()
        known = _SORTED[id(targets)] = (targets, ordered)
    return known[1]


@dataclass(frozen=True)
class Clause:
    """One unmet condition of a blocked rank (a :class:`dl2.model.stuck.Condition`).

    Attributes:
        op: the op that cannot complete yet.
        targets: ranks that must act (post their part) for it to complete.
        any_of: True if any one target suffices (wildcard receive), else all must.
        reason: "unmatched", "dropped" (P2P: its partner's work was dropped) or
            "no-rank" (P2P: its peer is no rank of its group), "rewait" (a second
            wait on a send or receive whose first returned: gloo never ends it),
            "missing" or "mismatch" (collective), "group",
            "store" (keys no rank has set).
    """

    op: Op
    targets: tuple[int, ...]
    any_of: bool
    reason: str


@dataclass(frozen=True)
class RankNode:
    """A rank in the wait-for graph: its status and, if blocked, its unmet clauses."""

    rank: int
    status: RankStatus
    blocked: Blocked | None = None
    clauses: tuple[Clause, ...] = ()

    @cached_property
    def targets(self) -> tuple[int, ...]:
        """Every rank it waits on, ascending (the one clause's own tuple when it is
        sorted already: shared with the other ranks blocked in the same slot)."""
        if len(self.clauses) == 1:
            return sorted_targets(self.clauses[0].targets)
        return tuple(sorted({t for c in self.clauses for t in c.targets}))


@dataclass(frozen=True)
class WaitForGraph:
    """Who waits on whom, and the ranks that can never be released.

    Attributes:
        nodes: rank -> its node, for every rank of the job.
        deadlocked: the deadlock set (empty when every blocked rank can still be released).
        waiting: the nodes of the blocked and spinning ranks, ascending: the only ones
            with clauses.
    """

    nodes: Mapping[int, RankNode]
    deadlocked: frozenset[int]
    waiting: Mapping[int, RankNode]
    #: id of a targets tuple -> (the tuple, its gone targets): ranks blocked in one slot
    #: share their targets, which are checked once
    _gone: dict[int, tuple[tuple[int, ...], tuple[int, ...]]] = field(
        default_factory=dict, compare=False, repr=False
    )

    def waits_on_exited(self, rank: int) -> tuple[int, ...]:
        """Targets of a rank that have exited or failed: its orphaned waits."""
        targets = self.nodes[rank].targets
        known = self._gone.get(id(targets))
        if known is None or known[0] is not targets:
            known = self._gone[id(targets)] = (
                targets,
                tuple(t for t in targets if self.status(t).gone),
            )
        return known[1]

    def status(self, rank: int) -> RankStatus:
        node = self.nodes.get(rank)
        return node.status if node is not None else RankStatus.NO_TRACE

    def shortest_cycle(self) -> tuple[int, ...]:
        """The shortest wait cycle inside the deadlock set (see
        :func:`dl2.model.stuck.shortest_cycle`)."""
        return shortest_cycle({r: self.nodes[r].targets for r in self.deadlocked})


def clause_for(graph: ExecutionGraph, op: Op, settled: bool = False) -> Clause | None:
    """The unmet condition of an op, or None if it will complete (or has).

    ``settled``: the job has ended (or was stopped), so an op still inside a group
    creation or collective that every member issued did not complete; on a group whose
    name the ranks gave to different member lists, it waits on the ranks that created
    that name as another group (reason "group-views")."""
    if op.completed or (op.eager and (op.issued or not op.deferred)):
        return None  # an eager send completes on issue (a deferred one at its launch)
    rank = op.rank
    if op.kind == "p2p":
        partner = graph.p2p_partner.get(op_key(op))
        if partner is not None:
            if partner.deferred and not partner.issued and partner.error is None:
                # Its partner belongs to a fused batch that has not launched yet.
                return Clause(op, (partner.rank,), False, "unmatched")
            if partner.dropped:
                # gloo never moves a message whose work one side dropped: the op waits
                # on that rank for good (read as a wait on it, it never makes a deadlock
                # of a rank that can still move)
                return Clause(op, (partner.rank,), False, "dropped")
            return None
        if op.op == "recv" and op.peer is None:
            others = tuple(r for r in graph.group_members(op.gid) if r != rank)
            return Clause(op, others, any_of=True, reason="unmatched")
        if op.peer is not None and not 0 <= op.peer < max(graph.world_size, 1):
            # a peer that is no rank (negative, past the group or the world): no rank can
            # ever match it, the op waits for good (an OR over no one is never met)
            return Clause(op, (), any_of=True, reason="no-rank")
        return Clause(op, (op.peer,) if op.peer is not None else (), False, "unmatched")
    if op.kind == "store":
        return _store_clause(graph, op)
    if op.kind == "group":
        members = op.ranks or ()
        created = graph.group_creators(op.gid, op.ranks)
        targets = tuple(r for r in members if r != rank and r not in created)
        if targets:
            return Clause(op, targets, False, "group")
        return _other_views(graph, op) if settled else None
    slot = graph.slot_of(op)
    if slot is None:
        return _other_views(graph, op) if settled else None
    if slot.mismatched:
        # it waits on the members that issued another collective here (or none yet):
        # those in the same call as it are stuck beside it, not what it waits for (the
        # same ranks for every rank of that call: one tuple, built once, shared)
        mine = call_key(op)
        key = (slot.gid, slot.index, mine)
        shared = getattr(graph, "shared_targets", None)  # (a graph a test builds: none)
        found: tuple[int, ...] | None = shared.get(key) if shared is not None else None
        if found is not None:
            others = found
        else:
            ops = slot.ops
            others = tuple(
                r for r in graph.group_members(op.gid) if r not in ops or call_key(ops[r]) != mine
            )
            if shared is not None:
                shared[key] = others
        own = slot.ops.get(rank)
        if not others or own is None or call_key(own) != mine:
            others = tuple(r for r in others if r != rank)
            if not others:  # they disagree on what each alone holds (an exchange's sizes)
                others = tuple(r for r in graph.group_members(op.gid) if r != rank)
        return Clause(op, others, False, "mismatch")
    # the slot's own tuple, shared by every rank blocked in it (a rank that posted its
    # op is not among the missing)
    missing = slot.missing if rank in slot.ops else tuple(r for r in slot.missing if r != rank)
    if missing:
        return Clause(op, missing, False, "missing")
    return _other_views(graph, op) if settled else None


def _other_views(graph: ExecutionGraph, op: Op) -> Clause | None:
    """The clause of an op on a group whose name the ranks gave to different member
    lists: it waits on the ranks that created the name as another group (those never
    join its rendezvous), if any."""
    views = getattr(graph, "group_views", None)  # (a graph a test builds: none)
    if views is None or op.gid is None:
        return None
    found = views(op.gid)
    if len(found) < 2:
        return None
    others = sorted({r for creators in found.values() if op.rank not in creators for r in creators})
    return Clause(op, tuple(others), False, "group-views") if others else None


def _store_clause(graph: ExecutionGraph, op: Op) -> Clause | None:
    """A store call waiting for keys: met once every key is set.  While one is not, any
    other rank of the job may still set it (OR).  A key some rank set (or may have set,
    before a checkpoint) is taken to be there; a store dl2 cannot tell has no clause:
    who sets its keys is unknown."""
    if op.gid == "?" or not op.keys:
        return None
    if all(graph.store_key_may_exist(store_key(op.gid, key)) for key in op.keys):
        return None
    others = tuple(r for r in world_ranks(graph.world_size, graph.traced[-1:]) if r != op.rank)
    return Clause(op, others, any_of=True, reason="store")


#: gloo's default timeout; a monitored_barrier given a shorter one was meant to fail fast
DEFAULT_TIMEOUT_S = 1800.0


def _bounded(graph: ExecutionGraph, node: RankNode) -> bool:
    """Blocked in a monitored_barrier, or a store wait(keys, timeout), with a timeout
    shorter than the default: it will raise instead of waiting forever.  Only the
    group's first rank enforces a monitored_barrier's timeout (gloo: the others send to
    it and wait for its answer without one): another member is bounded only while that
    rank waits in a bounded monitored_barrier of the group too (its failure ends them)."""
    op = _bounded_op(node.blocked)
    if op is None or op.op != "monitored_barrier":
        return op is not None
    members = graph.group_members(op.gid)
    if not members or members[0] == op.rank:
        return True
    coordinator = graph.timelines.get(members[0])
    other = _bounded_op(coordinator.blocked) if coordinator is not None else None
    return other is not None and other.op == "monitored_barrier" and other.gid == op.gid


def _bounded_op(blocked: Blocked | None) -> Op | None:
    """The monitored_barrier or store wait a rank is blocked in, if it has a timeout
    shorter than the default."""
    if blocked is None or len(blocked.ops) != 1:
        return None
    op = blocked.ops[0]
    if op.op not in ("monitored_barrier", "store_wait"):
        return None
    if op.timeout is None or op.timeout >= DEFAULT_TIMEOUT_S:
        return None
    return op


def other_threads(graph: ExecutionGraph, rank: int) -> int:
    """Threads of the user's code the rank has alive besides its main one: while there
    are, another of them may yet issue what releases a blocked one (never proven stuck)."""
    timeline = graph.timelines.get(rank)
    return timeline.threads if timeline is not None else 0


def _status(session: Session, graph: ExecutionGraph, rank: int) -> RankStatus:
    state = session.process_state(rank)
    timeline = graph.timelines.get(rank)
    if state == KILLED and (timeline is None or timeline.ended is None):
        return RankStatus.KILLED  # by a signal from outside, in the middle of its program
    if state in ENDED_BADLY:
        return RankStatus.FAILED
    if timeline is None:
        return RankStatus.NO_TRACE  # exited or not, what it issued is unknown
    if timeline.ended is not None and timeline.exit_error is not None and state != EXITED:
        return RankStatus.FAILED  # its program ended with an error: its status says so
    if state == EXITED or timeline.ended is not None:
        return RankStatus.EXITED
    return RankStatus.BLOCKED if timeline.blocked is not None else RankStatus.RUNNING


def _settled(session: Session) -> bool:
    """The job has ended or was stopped (or only its traces are known): what a rank is
    inside of now, it stays inside of.  False while a live monitor watches it."""
    return session.ending is not None or not any(
        session.process_state(rank) == ALIVE for rank in session.traces
    )


def _node(session: Session, graph: ExecutionGraph, rank: int, settled: bool) -> RankNode:
    """A rank's status and, if it waits, its unmet clauses."""
    status = _status(session, graph, rank)
    timeline = graph.timelines.get(rank)
    if status is not RankStatus.BLOCKED or timeline is None or timeline.blocked is None:
        return RankNode(rank, status)
    blocked = timeline.blocked
    if blocked.how == "rewait":
        # a second wait on a send or receive whose first returned: an OR over no one,
        # never met (no rank can release it)
        return RankNode(
            rank, RankStatus.BLOCKED, blocked, (Clause(blocked.ops[0], (), True, "rewait"),)
        )
    clauses = tuple(
        c for c in (clause_for(graph, op, settled) for op in blocked.ops) if c is not None
    )
    if blocked.how == "poll":
        return RankNode(rank, RankStatus.SPINNING, blocked, clauses)
    if clauses:
        return RankNode(rank, RankStatus.BLOCKED, blocked, clauses)
    return RankNode(rank, RankStatus.RUNNING)  # its op is matched: it is about to complete


class _Nodes(Mapping[int, RankNode]):
    """Every rank's node: those of the ranks that may wait built up front, the others
    (running, exited, failed, without trace: no clauses) when read."""

    def __init__(self, session: Session, graph: ExecutionGraph, known: dict[int, RankNode]) -> None:
        self._session = session
        self._graph = graph
        self._known = known
        self._world = world_ranks(graph.world_size, graph.traced[-1:])

    def __getitem__(self, rank: int) -> RankNode:
        node = self._known.get(rank)
        if node is None:
            if rank not in self._world:
                raise KeyError(rank)
            node = self._known[rank] = RankNode(rank, _status(self._session, self._graph, rank))
        return node

    def __iter__(self) -> Iterator[int]:
        return iter(self._world)

    def __len__(self) -> int:
        return len(self._world)


def build_wait_for_graph(session: Session, graph: ExecutionGraph) -> WaitForGraph:
    """Build the wait-for graph of the final state and reduce it to the deadlock set."""
    settled = _settled(session)
    known = {rank: _node(session, graph, rank, settled) for rank in graph.waiting_ranks()}
    nodes = _Nodes(session, graph, known)
    waiting = {
        r: n for r, n in known.items() if n.status in (RankStatus.BLOCKED, RankStatus.SPINNING)
    }
    blocked = {r: n.clauses for r, n in waiting.items() if n.status is RankStatus.BLOCKED}
    # Only the waiting ranks and their targets matter to the reduction (a targets tuple
    # the ranks blocked in one slot share is read once)
    distinct = {id(clause.targets): clause.targets for c in blocked.values() for clause in c}
    concerned = set(waiting).union(*distinct.values())
    free = (
        r
        for r in concerned
        if (node := nodes.get(r)) is not None
        and (
            node.status.can_progress
            or (
                node.status is RankStatus.BLOCKED
                and (_bounded(graph, node) or other_threads(graph, r) > 0)
            )
        )
    )
    return WaitForGraph(nodes=nodes, deadlocked=deadlock_set(blocked, free), waiting=waiting)
